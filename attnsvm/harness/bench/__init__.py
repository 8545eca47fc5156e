"""Benchmarks behind ``attnsvm bench`` (and ``benchmarks/bench_*.py``): Att-SVM solvers and the batched GD engine.

This module is the single home of the benchmark logic; the scripts in ``benchmarks/`` are thin
command-line wrappers over it. Two groups, each measured side by side within one run so that the
ratios compare like with like:

* ``svm`` — for ``n = 6`` sequences of ``T = 8`` tokens (``m = 42`` constraints): the matrix
  primal (cvxpy + Clarabel, ``d²`` variables) at ``d = 32, 128, 256``, the vectorised program at
  ``d = 32, 128`` and the exact factorised dual at ``d = 32 … 1024``, with the relative error of
  the conic solver's own answer and of the final (active-set polished) answer against the
  certified dual solution. The dual is timed ``repeats`` times (median and range); each conic
  program once (seconds to a minute each). Targets (issue 3): dual at ``d = 1024`` in ≤ 0.1 s;
  ≥ 50× faster than the primal at ``d = 128``. The primal at ``d ≥ 512`` takes minutes and
  gigabytes and is never run.
  Scale rows (issue 16 §1, :func:`bench_svm_scale`, run with the group): the certified working-set
  solver (:func:`attnsvm.svm._working_set.solve_svm_working_set`) at ``m = 1984, 7936, 31744``
  constraints (gaussian, ``T = 32``, ``d = 64, 128, 128``), beside the dense dual where it fits in time
  (``m ≤ 1984``) and ``sklearn.svm.LinearSVC`` on the explicit ``m × d²`` features where they fit in
  memory (``m ≤ 7936``; "not installed" without scikit-learn): time and peak memory (each solve in a
  fresh process: the growth of its peak resident set), certificate, and each answer's error against
  the certified one. Targets: ≤ 10 s at ``m = 7936``, ≤ 60 s and
  ≤ 4 GiB at ``m = 31744``. The full scale rows take about two minutes; ``--quick`` runs
  ``m = 480, 1984``.
* ``gd`` — instance-steps per second of the batched engine's step
  (:class:`attnsvm.gd.BatchEngine`, the step of :func:`attnsvm.gd.run_gd_batch`) against a
  per-instance torch autograd + SGD loop (normalized GD, the way published experiments run
  it), same torch thread count (2), batch 4096. Two loops: :func:`autograd_loop_rate`, lean
  (no module, an einsum, a stable softplus: the stricter baseline, the headline ratio), and
  :func:`published_loop_rate`, an ``nn.Module`` loop with the structure of the seed papers'
  public code (reported beside it). The two are measured in alternating rounds
  (each batched figure the best of 3 runs of a few steps, each loop figure one run of many
  steps); the ratio reported is the median of the per-round ratios with their range, so a load
  burst on a shared machine hits both sides of a round. Also: the same step with the
  log-domain path forced (``path="log"``, what a saturated run pays), the public entry point end
  to end, the distance to the memory-bandwidth floor (each step streams ``X`` at least twice)
  and the fraction of the machine's dense float64 GEMM rate the step reaches. Target (issue 4):
  ≥ 200× at ``B = 4096`` on 2 cores. Issue 16 §2: both paths ≥ 400× at ``B = 4096``, the log-domain
  step ≤ 1.25× the fast step (``log_over_fast``, per-round ratio), and the public entry point within
  1.2× of the engine's step (``api_over_step``: :func:`~attnsvm.gd.run_gd_batch` over ``api_steps``
  steps with its default 25 records against the engine's ``step_`` over the same trajectory, from
  ``W = 0``, alternating rounds; its fixed set-up, :meth:`~attnsvm.gd.BatchEngine.from_instances`, is
  reported as ``api_setup_ms``, and the short run of the earlier figure, ``batch_steps`` steps with the
  set-up included, as ``api_step_ms``). Fusing the step's passes with ``torch.compile`` was measured
  separately (``benchmarks/bench_fusion.py``, docs/benchmarks.md) and is not used.

Environment: the 1-min load average before and after each group, the torch thread count and the
thread variables are recorded with the results. Both engines run with the process's OpenMP
settings (the default spinning wait measured fastest for both on a quiet machine, with the
previous engine: loop 0.23 ms, batched 4.97 ms; with ``OMP_WAIT_POLICY=PASSIVE`` 0.55 ms and
8.6 ms, a flattering 262× that comes from slowing the loop). On an oversubscribed machine spinning workers steal the main
thread's CPU (loop 0.2 → 2.3 ms/step at load 5): run the benchmark on a quiet machine, or set
``OMP_WAIT_POLICY=PASSIVE`` for both sides and read the ratio as such. This module changes no
process-wide setting except the torch thread count during :func:`bench_gd`, restored afterwards.

``--quick`` sizes take about ten seconds; ``tiny`` (tests) runs toy sizes whose numbers mean
nothing; the full sizes take minutes and gigabytes and never run in CI.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (Att-SVM, normalized GD);
Gao, Song, Xie, arXiv 2307.02419 (tensor trick).
"""

from __future__ import annotations

from ._gd import (
    GD_PROBES,
    GD_SIZES,
    autograd_loop_rate,
    bench_gd,
    lean_autograd_loop,
    published_autograd_loop,
    published_loop_rate,
)
from ._run import run_benchmarks, script_main
from ._svm import (
    MAX_CONIC_D,
    SKLEARN_MAX_FEATURE_BYTES,
    SVM_FULL,
    SVM_QUICK,
    SVM_SCALE_DENSE_MAX_M,
    SVM_SCALE_SIZES,
    SVM_TINY,
    bench_svm,
    bench_svm_scale,
)
from ._tables import TARGETS, gd_table, svm_scale_table, svm_table, targets
from ._timing import THREAD_VARS, environment, gemm_rate, median_ratio, memory_bandwidth

__all__ = [
    "GD_PROBES",
    "GD_SIZES",
    "MAX_CONIC_D",
    "SKLEARN_MAX_FEATURE_BYTES",
    "SVM_FULL",
    "SVM_QUICK",
    "SVM_SCALE_DENSE_MAX_M",
    "SVM_SCALE_SIZES",
    "SVM_TINY",
    "TARGETS",
    "THREAD_VARS",
    "autograd_loop_rate",
    "bench_gd",
    "bench_svm",
    "bench_svm_scale",
    "environment",
    "gd_table",
    "gemm_rate",
    "lean_autograd_loop",
    "median_ratio",
    "memory_bandwidth",
    "published_autograd_loop",
    "published_loop_rate",
    "run_benchmarks",
    "script_main",
    "svm_scale_table",
    "svm_table",
    "targets",
]
