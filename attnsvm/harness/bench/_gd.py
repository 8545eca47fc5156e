"""The GD rows of ``attnsvm bench``: the batched engine's step (both paths, the public ``run_gd_batch``)
against per-instance torch autograd loops, with the machine's bandwidth floor and GEMM rate.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...model._instance import require_unmasked
from ._timing import _load, _times, gemm_rate, median_ratio, memory_bandwidth

#: GD sizes: batch, loop steps per round, batched steps per timing, rounds, warm-up loop steps, and the
#: steps of the long public-API run timed in each round (``run_gd_batch`` with its default 25 records).
GD_SIZES = {
    "full": {
        "batch": 4096,
        "loop_steps": 500,
        "batch_steps": 20,
        "repeat": 5,
        "warmup": 20,
        "api_steps": 200,
    },
    "quick": {"batch": 512, "loop_steps": 100, "batch_steps": 5, "repeat": 3, "warmup": 20, "api_steps": 200},
    "tiny": {"batch": 16, "loop_steps": 10, "batch_steps": 2, "repeat": 2, "warmup": 2, "api_steps": 3},
}
#: The saturated start of the log-domain timing: ``SATURATION·W`` for the random ``W ~ N(0, 1)/d`` (logit
#: gaps of hundreds: every instance's gradient far below the eager fast path's range, where long runs live).
SATURATION = 1000.0
#: Machine probes per size: bytes of the bandwidth copy, GEMM matrix size.
GD_PROBES = {"full": (2**28, 2048), "quick": (2**26, 1024), "tiny": (2**20, 128)}


def lean_autograd_loop(inst: Any, lr: float = 0.1) -> tuple[Callable[[], None], Any]:
    """Per-instance normalized GD with torch autograd and SGD (logistic loss), lean: ``(step, W)``.

    No module: an ``einsum`` for the logits, a stable ``softplus`` loss, the gradient divided by
    its norm, ``torch.optim.SGD``. ``W`` (a leaf tensor, ``requires_grad``) is updated in place
    by each ``step()`` call, from zeros.
    """
    require_unmasked(inst, "attnsvm.harness.bench.lean_autograd_loop")
    import torch

    X = torch.tensor(inst.X)
    Y = torch.tensor(inst.Y)
    z = torch.tensor(inst.z)
    a = X @ torch.tensor(inst.v)
    W = torch.zeros(inst.d, inst.d, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([W], lr=lr)

    def step() -> None:
        opt.zero_grad()
        logits = torch.einsum("ntd,de,ne->nt", X, W, z)
        f = (torch.softmax(logits, dim=-1) * a).sum(-1)
        loss = torch.nn.functional.softplus(-Y * f).mean()  # logistic loss, log(1 + e^{-u}) stably
        loss.backward()
        with torch.no_grad():
            assert W.grad is not None
            W.grad /= W.grad.norm()
        opt.step()

    return step, W


def published_autograd_loop(inst: Any, lr: float = 0.1) -> tuple[Callable[[], None], Any]:
    """Per-instance normalized GD written the way the seed papers' code is: ``(step, W)``.

    The public experiments of Tarzanagh et al. (github.com/ucr-optml/max_margin_attention) train
    an ``nn.Module`` whose key-query weights are bias-free ``nn.Linear`` layers, with the loss
    ``log(1 + e^{−Y f})`` averaged over the sequences, ``loss.backward()``, each parameter's
    gradient divided by ``||grad|| + 1e-12`` and ``torch.optim.SGD``. This is that structure for
    ``W`` (one ``nn.Linear``, float64, from zeros), without the per-step recording those notebooks
    also do. The ``+1e-12`` makes its steps shorter than normalized GD's by a relative
    ``1e-12/||∇L||``.
    """
    require_unmasked(inst, "attnsvm.harness.bench.published_autograd_loop")
    import torch

    class WAttention(torch.nn.Module):
        """``f_i = vᵀ X_iᵀ softmax(X_i W z_i)``, ``W`` the weight of a bias-free ``nn.Linear``."""

        def __init__(self, d: int) -> None:
            super().__init__()
            self.key_query = torch.nn.Linear(d, d, bias=False, dtype=torch.float64)
            torch.nn.init.zeros_(self.key_query.weight)

        def forward(self, X: Any, z: Any, v: Any) -> Any:
            scores = (X @ self.key_query(z).unsqueeze(-1)).squeeze(-1)  # x_itᵀ W z_i
            weights = torch.softmax(scores, dim=-1)
            return (weights.unsqueeze(1) @ X).squeeze(1) @ v

    X, Y, z, v = (torch.tensor(arr) for arr in (inst.X, inst.Y, inst.z, inst.v))
    model = WAttention(inst.d)
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step() -> None:
        opt.zero_grad()
        loss = torch.log(1 + torch.exp(-Y * model(X, z, v))).mean()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            p.grad /= p.grad.norm() + 1e-12
        opt.step()

    return step, model.key_query.weight


def _loop_rate(step: Callable[[], None], steps: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps / (time.perf_counter() - t0)


def autograd_loop_rate(inst: Any, steps: int, lr: float = 0.1, warmup: int = 20) -> float:
    """Instance-steps/s of :func:`lean_autograd_loop` (the headline baseline)."""
    require_unmasked(inst, "attnsvm.harness.bench.autograd_loop_rate")
    return _loop_rate(lean_autograd_loop(inst, lr)[0], steps, warmup)


def published_loop_rate(inst: Any, steps: int, lr: float = 0.1, warmup: int = 20) -> float:
    """Instance-steps/s of :func:`published_autograd_loop`."""
    require_unmasked(inst, "attnsvm.harness.bench.published_loop_rate")
    return _loop_rate(published_autograd_loop(inst, lr)[0], steps, warmup)


def _ratio_row(name: str, med: tuple[float, float, float], note: str) -> dict[str, Any]:
    """A row of a per-round ratio ``med = (median, min, max)`` (:func:`median_ratio`), unit "x"."""
    return _r(name, med[0], "x", note, med[1:])


def _r(name: str, value: Any, unit: str, note: str, rng: Sequence[float] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "range": None if rng is None else list(rng),
        "unit": unit,
        "note": note,
    }


@dataclass(frozen=True)
class _GDPlan:
    """The sizes of one :func:`bench_gd` run.

    ``batch`` instances of ``n × T × d`` (float64), ``repeat`` alternating rounds, the torch thread count
    ``threads``; per round ``loop_steps`` loop steps (after ``warmup`` ones), ``batch_steps`` batched
    steps per timing and the ``api_steps`` of the long public-API run; the probes' ``bw_bytes`` (bandwidth
    copy) and ``gemm_size`` (GEMM matrix side). ``batch`` and ``repeat`` are the size's
    (:data:`GD_SIZES`) unless given; the rest of the steps and the probes (:data:`GD_PROBES`) always are.
    """

    batch: int
    repeat: int
    n: int
    T: int
    d: int
    threads: int
    loop_steps: int
    batch_steps: int
    api_steps: int
    warmup: int
    bw_bytes: int
    gemm_size: int


@dataclass(frozen=True)
class _GDWorkloads:
    """The timed batched workloads of a round (each a no-argument callable) and the default engine's kernel.

    ``fast``/``log``: ``batch_steps`` steps ``W ← W − η ∇̂L(W)`` (``η = 0.1``) of the default engine
    (:attr:`~attnsvm.gd.BatchEngine.kernel` ``kernel``: the fused kernel where it runs) from a random ``W``
    and from ``SATURATION·W`` (every instance saturated: the eager engine's log-domain regime);
    ``eager_fast``/``eager_log``: the eager engine's fast path (auto) and its forced log-domain path from
    the random ``W``; ``engine_run``: the default engine's ``step_`` over ``api_steps`` steps from
    ``W = 0`` (the trajectory the long API run takes); ``api_run``: ``run_gd_batch(insts, api_steps, 0.1)``
    with its default records.
    """

    fast: Callable[[], None]
    log: Callable[[], None]
    eager_fast: Callable[[], None]
    eager_log: Callable[[], None]
    engine_run: Callable[[], None]
    api_run: Callable[[], None]
    kernel: str


@dataclass(frozen=True)
class _GDRounds:
    """Per-round figures in seconds per step, one entry per round: ``loops`` (lean autograd loop,
    one instance), ``fasts``, ``logs``, ``eager_fasts`` and ``eager_logs`` (one batched step, best of 3
    timings), ``pubs`` (the ``nn.Module`` loop), ``engs`` and ``apis`` (the long engine and API runs, one
    timing each)."""

    loops: list[float]
    pubs: list[float]
    fasts: list[float]
    logs: list[float]
    eager_fasts: list[float]
    eager_logs: list[float]
    engs: list[float]
    apis: list[float]


@dataclass(frozen=True)
class _GDMedians:
    """The medians of :class:`_GDRounds` (``t_* = median``, seconds per step) and the per-round ratios as
    ``(median, min, max)`` (:func:`median_ratio`): ``ratio = batch·loop/fast``, ``ratio_pub =
    batch·pub/fast``, ``ratio_log = batch·loop/log``, ``log_over_fast = log/fast``, ``api_over_step =
    api/eng``, ``ratio_eager = batch·loop/eager_fast``, ``ratio_eager_log = batch·loop/eager_log``,
    ``kernel_gain = eager_fast/fast``."""

    ratio: tuple[float, float, float]
    ratio_pub: tuple[float, float, float]
    ratio_log: tuple[float, float, float]
    log_over_fast: tuple[float, float, float]
    api_over_step: tuple[float, float, float]
    ratio_eager: tuple[float, float, float]
    ratio_eager_log: tuple[float, float, float]
    kernel_gain: tuple[float, float, float]
    t_loop: float
    t_pub: float
    t_step: float
    t_log: float
    t_eager: float
    t_eager_log: float
    t_eng_long: float
    t_api_long: float


@dataclass(frozen=True)
class _GDCosts:
    """Figures measured once after the rounds: ``t_setup`` (``BatchEngine.from_instances``, best of 3,
    seconds), ``t_api`` (``run_gd_batch`` over ``batch_steps`` steps and one record, set-up included,
    seconds per step), the copy bandwidth ``bw`` (bytes/s) and the GEMM rate ``gemm`` (flop/s)."""

    t_setup: float
    t_api: float
    bw: float
    gemm: float


@dataclass(frozen=True)
class _GDMeasured:
    """Everything :func:`_gd_measure` timed: the ``rounds``, their ``medians``, the one-off ``costs`` and the
    default engine's ``kernel`` ("fused" or "eager")."""

    rounds: _GDRounds
    medians: _GDMedians
    costs: _GDCosts
    kernel: str


def _gd_plan(
    quick: bool, tiny: bool, batch: int | None, repeat: int | None, n: int, T: int, d: int, threads: int
) -> _GDPlan:
    """The :class:`_GDPlan` of size ``tiny`` / ``quick`` / ``full`` (the first that applies)."""
    size = "tiny" if tiny else "quick" if quick else "full"
    cfg = GD_SIZES[size]
    bw_bytes, gemm_size = GD_PROBES[size]
    return _GDPlan(
        batch=cfg["batch"] if batch is None else batch,
        repeat=cfg["repeat"] if repeat is None else repeat,
        n=n,
        T=T,
        d=d,
        threads=threads,
        loop_steps=cfg["loop_steps"],
        batch_steps=cfg["batch_steps"],
        api_steps=cfg["api_steps"],
        warmup=cfg["warmup"],
        bw_bytes=bw_bytes,
        gemm_size=gemm_size,
    )


def _gd_workloads(insts: list[Any], plan: _GDPlan) -> _GDWorkloads:
    """The fast and log-domain engines (logistic loss, CPU) on ``insts``, a random start
    ``W ~ N(0, 1)/d`` (seed 0) and the four workloads of :class:`_GDWorkloads` over them."""
    import torch

    from ...gd import BatchEngine, run_gd_batch

    batch, d, batch_steps, api_steps = plan.batch, plan.d, plan.batch_steps, plan.api_steps
    eng = BatchEngine.from_instances(insts, loss="logistic", device="cpu")
    eager = BatchEngine.from_instances(insts, loss="logistic", device="cpu", kernel="eager")
    eager_log = BatchEngine.from_instances(insts, loss="logistic", device="cpu", path="log", kernel="eager")
    W = torch.as_tensor(np.random.default_rng(0).standard_normal((batch, d, d)) / d)

    def steps_of(e: Any, start: Any) -> Callable[[], None]:
        # the loop of run_gd_batch: gradient, then one fused in-place update per step
        Wc = start.clone()

        def f() -> None:
            Wc.copy_(start)
            for _ in range(batch_steps):
                e.step_(Wc, 0.1)

        return f

    def engine_run() -> None:
        # the engine's own steps over the trajectory the long API run takes (from W = 0, same lr)
        Wz = torch.zeros((batch, d, d), dtype=torch.float64)
        for _ in range(api_steps):
            eng.step_(Wz, 0.1)

    def api_run() -> None:
        run_gd_batch(insts, api_steps, 0.1)  # what users call: default records (25 points)

    return _GDWorkloads(
        fast=steps_of(eng, W),
        log=steps_of(eng, SATURATION * W),
        eager_fast=steps_of(eager, W),
        eager_log=steps_of(eager_log, W),
        engine_run=engine_run,
        api_run=api_run,
        kernel=eng.kernel,
    )


def _gd_rounds(insts: list[Any], work: _GDWorkloads, plan: _GDPlan) -> _GDRounds:
    """One warm-up call of ``fast``, ``log`` and ``api_run``, then ``repeat`` alternating rounds, each:
    lean loop, fast step, ``nn.Module`` loop, log-domain step, long engine run, long API run (seconds
    per step; a loop's is ``1 / rate`` on ``insts[0]``, a batched step's the best of 3 over ``batch_steps``)."""
    batch_steps, api_steps = plan.batch_steps, plan.api_steps
    for warm in (work.fast, work.log, work.eager_fast, work.eager_log, work.api_run):
        warm()
    loops, pubs, fasts, logs, e_fasts, e_logs, engs, apis = [], [], [], [], [], [], [], []
    for _ in range(plan.repeat):  # alternating rounds: a load burst hits both sides of a round
        loops.append(1.0 / autograd_loop_rate(insts[0], plan.loop_steps, warmup=plan.warmup))
        fasts.append(min(_times(work.fast, 3)) / batch_steps)
        pubs.append(1.0 / published_loop_rate(insts[0], plan.loop_steps, warmup=plan.warmup))
        logs.append(min(_times(work.log, 3)) / batch_steps)
        e_fasts.append(min(_times(work.eager_fast, 3)) / batch_steps)
        e_logs.append(min(_times(work.eager_log, 3)) / batch_steps)
        engs.append(_times(work.engine_run, 1)[0] / api_steps)
        apis.append(_times(work.api_run, 1)[0] / api_steps)
    return _GDRounds(
        loops=loops,
        pubs=pubs,
        fasts=fasts,
        logs=logs,
        eager_fasts=e_fasts,
        eager_logs=e_logs,
        engs=engs,
        apis=apis,
    )


def _gd_medians(r: _GDRounds, batch: int) -> _GDMedians:
    """The medians and per-round ratios of :class:`_GDMedians` (``ValueError`` with no rounds)."""
    ratio = median_ratio(r.loops, r.fasts, scale=batch)
    ratio_pub = median_ratio(r.pubs, r.fasts, scale=batch)
    ratio_log = median_ratio(r.loops, r.logs, scale=batch)
    log_over_fast = median_ratio(r.logs, r.fasts)
    api_over_step = median_ratio(r.apis, r.engs)
    t_loop, t_pub, t_step, t_log = (float(np.median(a)) for a in (r.loops, r.pubs, r.fasts, r.logs))
    return _GDMedians(
        ratio=ratio,
        ratio_pub=ratio_pub,
        ratio_log=ratio_log,
        log_over_fast=log_over_fast,
        api_over_step=api_over_step,
        ratio_eager=median_ratio(r.loops, r.eager_fasts, scale=batch),
        ratio_eager_log=median_ratio(r.loops, r.eager_logs, scale=batch),
        kernel_gain=median_ratio(r.eager_fasts, r.fasts),
        t_loop=t_loop,
        t_pub=t_pub,
        t_step=t_step,
        t_log=t_log,
        t_eager=float(np.median(r.eager_fasts)),
        t_eager_log=float(np.median(r.eager_logs)),
        t_eng_long=float(np.median(r.engs)),
        t_api_long=float(np.median(r.apis)),
    )


def _gd_costs(insts: list[Any], plan: _GDPlan) -> _GDCosts:
    """The one-off figures of :class:`_GDCosts`, in that order."""
    from ...gd import BatchEngine, run_gd_batch

    batch_steps = plan.batch_steps
    t_setup = min(_times(lambda: BatchEngine.from_instances(insts), 3))  # stacking, checks, constants
    # the public entry point, end to end (stacking, transfers, one record at the end)
    t0 = time.perf_counter()
    run_gd_batch(insts, batch_steps, 0.1, record_at=[batch_steps])
    t_api = (time.perf_counter() - t0) / batch_steps
    return _GDCosts(
        t_setup=t_setup, t_api=t_api, bw=memory_bandwidth(plan.bw_bytes), gemm=gemm_rate(plan.gemm_size)
    )


def _gd_measure(plan: _GDPlan) -> _GDMeasured:
    """With torch's thread count set to ``plan.threads`` (restored afterwards, also on error): the
    ``batch`` instances ``random_instance(n, T, d, seed=s)``, ``s = 0 … batch − 1``, their workloads,
    the rounds, their medians and ratios, then the one-off costs."""
    import torch

    from ...model._instance import random_instance

    old_threads = torch.get_num_threads()
    torch.set_num_threads(plan.threads)
    try:
        insts = [random_instance(plan.n, plan.T, plan.d, seed=s) for s in range(plan.batch)]
        work = _gd_workloads(insts, plan)
        rounds = _gd_rounds(insts, work, plan)
        medians = _gd_medians(rounds, plan.batch)
        costs = _gd_costs(insts, plan)
    finally:
        torch.set_num_threads(old_threads)
    return _GDMeasured(rounds=rounds, medians=medians, costs=costs, kernel=work.kernel)


def _gd_context_rows(plan: _GDPlan, load0: float | None) -> list[dict[str, Any]]:
    """Rows ``load_avg_start`` (``load0``), ``load_avg_end`` (read now), ``threads``, ``batch``, ``rounds``."""
    n, T, d = plan.n, plan.T, plan.d
    return [
        _r("load_avg_start", load0, "", f"1-min load average on {os.cpu_count()} cores, before"),
        _r("load_avg_end", _load(), "", "after; load shares the CPU and the figures"),
        _r("threads", plan.threads, "", "torch.set_num_threads, both engines"),
        _r("batch", plan.batch, "instances", f"n={n}, T={T}, d={d}, float64"),
        _r("rounds", plan.repeat, "", "loop and batched measured alternately; medians and ranges"),
    ]


def _gd_step_rows(plan: _GDPlan, m: _GDMeasured) -> list[dict[str, Any]]:
    """Rows of the loops' and the batched step's times and rates (ms = 10³·s, rates = 1/t or batch/t) and
    ``log_over_fast``; ranges over the rounds."""
    r, md, batch = m.rounds, m.medians, plan.batch
    ms = (1e3 * min(r.loops), 1e3 * max(r.loops))
    return [
        _r("loop_rate", 1.0 / md.t_loop, "instance-steps/s", "autograd + SGD, one instance"),
        _r("batch", batch, "instances", "instances per batched step"),
        _r("loop_step_ms", 1e3 * md.t_loop, "ms", "per-instance step", ms),
        _r(
            "published_loop_step_ms",
            1e3 * md.t_pub,
            "ms",
            "nn.Module loop written as the seed papers' code",
            (1e3 * min(r.pubs), 1e3 * max(r.pubs)),
        ),
        _r(
            "batched_rate",
            batch / md.t_step,
            "instance-steps/s",
            f"the default engine's step (kernel: {m.kernel})",
        ),
        _r(
            "batched_step_ms",
            1e3 * md.t_step,
            "ms",
            f"one step of {batch} instances, the default engine (kernel: {m.kernel}) at a moderate W",
            (1e3 * min(r.fasts), 1e3 * max(r.fasts)),
        ),
        _r(
            "log_step_ms",
            1e3 * md.t_log,
            "ms",
            f"the same engine at {SATURATION:g}·W (saturated: the log-domain regime of long runs)",
            (1e3 * min(r.logs), 1e3 * max(r.logs)),
        ),
        _ratio_row(
            "log_over_fast",
            md.log_over_fast,
            "saturated step / moderate step, median per-round ratio; target <= 1.25 at batch 4096",
        ),
        _r(
            "eager_step_ms",
            1e3 * md.t_eager,
            "ms",
            "the eager engine (kernel='eager'): its linear-domain fast path at the moderate W",
            (1e3 * min(r.eager_fasts), 1e3 * max(r.eager_fasts)),
        ),
        _r(
            "eager_log_step_ms",
            1e3 * md.t_eager_log,
            "ms",
            "the eager engine, its log-domain path forced (path='log'), at the moderate W",
            (1e3 * min(r.eager_logs), 1e3 * max(r.eager_logs)),
        ),
        _ratio_row(
            "kernel_gain",
            md.kernel_gain,
            "eager fast step / default step, median per-round ratio (what the fused kernel buys)",
        ),
    ]


def _gd_api_rows(plan: _GDPlan, m: _GDMeasured) -> list[dict[str, Any]]:
    """Rows of the public entry point: ``api_step_ms``, ``api_setup_ms``, the long runs' per-step times
    and their ratio ``api_over_step``."""
    r, md, c = m.rounds, m.medians, m.costs
    batch_steps, api_steps = plan.batch_steps, plan.api_steps
    return [
        _r(
            "api_step_ms",
            1e3 * c.t_api,
            "ms",
            f"run_gd_batch end to end, {batch_steps} steps and one record, per step (one run; set-up included)",
        ),
        _r(
            "api_setup_ms",
            1e3 * c.t_setup,
            "ms",
            "BatchEngine.from_instances: stacking, checks, constant data",
        ),
        _r(
            "engine_long_step_ms",
            1e3 * md.t_eng_long,
            "ms",
            f"the engine's step_ over {api_steps} steps from W = 0 (the API run's trajectory)",
            (1e3 * min(r.engs), 1e3 * max(r.engs)),
        ),
        _r(
            "api_long_step_ms",
            1e3 * md.t_api_long,
            "ms",
            f"run_gd_batch end to end, {api_steps} steps, its default records (up to 25), per step",
            (1e3 * min(r.apis), 1e3 * max(r.apis)),
        ),
        _ratio_row(
            "api_over_step",
            md.api_over_step,
            f"api_long / engine_long, median per-round ratio ({api_steps} steps); target <= 1.2 at batch 4096",
        ),
    ]


def _gd_ratio_rows(md: _GDMedians) -> list[dict[str, Any]]:
    """Rows of the headline ratios (batched over loop, per round): ``ratio``, ``ratio_published``,
    ``ratio_log_path``."""
    return [
        _ratio_row("ratio", md.ratio, "median per-round ratio; targets >= 200 (issue 4), >= 400 (issue 16)"),
        _ratio_row("ratio_published", md.ratio_pub, "against the nn.Module loop"),
        _ratio_row(
            "ratio_log_path",
            md.ratio_log,
            "median per-round ratio, saturated step; target >= 400 at batch 4096",
        ),
        _ratio_row("ratio_eager", md.ratio_eager, "the eager fast path over the loop"),
        _ratio_row("ratio_eager_log", md.ratio_eager_log, "the eager forced log-domain path over the loop"),
    ]


def _gd_machine_rows(plan: _GDPlan, m: _GDMeasured) -> list[dict[str, Any]]:
    """Rows against the machine: the bandwidth floor ``2·(8·batch·n·T·d)/bw`` (``X`` streamed twice per
    step) and the step's useful flops ``batch·(4·n·d² + 4·n·T·d)`` against the GEMM rate."""
    batch, n, T, d = plan.batch, plan.n, plan.T, plan.d
    t_step, t_log, bw, gemm = m.medians.t_step, m.medians.t_log, m.costs.bw, m.costs.gemm
    floor = 2 * (8 * batch * n * T * d) / bw  # X: batch·n·T·d doubles, streamed twice per step
    flops = batch * (2 * n * d * d + 2 * n * T * d + 2 * n * T * d + 2 * n * d * d)
    return [
        _r("bandwidth", bw / 1e9, "GB/s", "large numpy copy, read+write"),
        _r("floor_step_ms", 1e3 * floor, "ms", "2 * X.nbytes / bandwidth"),
        _r("step_over_floor", t_step / floor, "x", "1 = at the bandwidth floor"),
        _r("log_step_over_floor", t_log / floor, "x", "log-domain step / bandwidth floor"),
        _r("gemm_rate", gemm / 1e9, "GFLOP/s", "torch.matmul float64"),
        _r("step_gflops", flops / t_step / 1e9, "GFLOP/s", "useful flops of the step"),
        _r("gemm_fraction", flops / t_step / gemm, "", "step flop rate / GEMM rate"),
        _r("log_gemm_fraction", flops / t_log / gemm, "", "log-domain step flop rate / GEMM rate"),
    ]


def bench_gd(
    quick: bool = False,
    batch: int | None = None,
    n: int = 6,
    T: int = 8,
    d: int = 10,
    threads: int = 2,
    tiny: bool = False,
    repeat: int | None = None,
) -> list[dict[str, Any]]:
    """Batched GD step against the per-instance autograd loop, alternating rounds; one row per figure.

    Rows: ``{"name", "value", "range", "unit", "note"}``; ``range`` is ``[min, max]`` over the
    rounds for the medians, else ``None``. ``batch`` and ``repeat`` default to the size's
    (4096 and 5 rounds full; 512 and 3 quick; 16 and 2 tiny). The torch thread count is set to
    ``threads`` for both engines and restored afterwards.
    """
    plan = _gd_plan(quick, tiny, batch, repeat, n, T, d, threads)
    load0 = _load()
    m = _gd_measure(plan)
    return (
        _gd_context_rows(plan, load0)
        + _gd_step_rows(plan, m)
        + _gd_api_rows(plan, m)
        + _gd_ratio_rows(m.medians)
        + _gd_machine_rows(plan, m)
    )
