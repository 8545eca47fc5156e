"""Experiments as Dask tasks: ``attnsvm reproduce --scheduler dask | tcp://host:port``.

``scheduler="dask"`` starts an in-process :class:`distributed.LocalCluster` of ``jobs`` worker
*processes* with one thread each; ``scheduler="tcp://host:port"`` connects a
:class:`distributed.Client` to a running scheduler (``dask scheduler`` on one machine,
``dask worker tcp://host:port --nthreads 1`` on each of the others, every machine with the same
attnsvm installed). Each experiment is one task, submitted with the arguments the serial run gives
:func:`attnsvm.harness.runner.run_experiment` (``jobs = 1``); the experiments are seeded on their own and
each worker computes with one torch thread, as the serial run does, so the results are bitwise
those of the serial run (tested in ``tests/test_distributed.py``).

Progress: each task sends its experiment's ``progress(done, total)`` through a Dask queue (at most
every :data:`PROGRESS_INTERVAL_S` seconds), and an experiment's bar completes when its task does.
Needs the ``distributed`` extra: ``pip install 'attnsvm[distributed]'``.

GD batches as Dask tasks. Inside an experiment's task, a batched GD run of ``B ≥ 2·GD_CHUNK`` instances
(:func:`attnsvm.harness.experiments._common.segmented_batch`, used by the convergence and local-vs-global
experiments) is split into chunks of at least :data:`GD_CHUNK` instances, at most one per worker thread of the
cluster (:func:`gd_chunk_bounds`); each segment of each chunk is one Dask task (a
chain per chunk: a segment starts from its chunk's previous end point), submitted through
:func:`distributed.worker_client` (the experiment's task gives its worker slot back while it waits), and
the experiment's progress moves when every chunk has passed a mark. A local run never splits and never
imports dask: :func:`gd_batch_runner` is ``None`` outside a Dask experiment task.

Why the chunks give bitwise the whole batch's iterates (tested in ``tests/test_distributed.py``):
GD updates each instance from its own data, and the chunk task makes the very call the serial run
makes (``segmented_batch`` on the chunk, one torch thread). What can still differ is *how* torch
computes an element, which depends on its position along the batch-major axes: its CPU kernels
vectorise along contiguous ``(B,)``, ``(B, n)`` and ``(B, d, d)`` runs in blocks of 8 to 32 float64
and compute the remainder with other code (measured: a sum over the tokens adds them in another order
there, so a chunk of 1 or 2 instances differs from the batch in the last bits). Chunk boundaries at
multiples of :data:`GD_ALIGN` = 32 instances put every element at the same position relative to
those blocks (the last chunk ends where the batch ends), so each element is computed by the same code
path. Two conditions remain. (i) The fused CPU kernel (:mod:`attnsvm.gd._fused`, the engine's default
where it applies: unmasked batches of the logistic or exponential loss, a C compiler found) decides every
instance alone and works in blocks of 16 instances, of which ``GD_ALIGN`` is a multiple: a chunk is bitwise
its batch, saturated or not (tested). Only the instances it hands to the eager log-domain path (exact score
ties, log weights beyond 2^11, a gradient below 2^−1000 or near its rounding level) and the data's
rescaling when some instance has entries beyond 2^±64 are decided with the rest of the batch. With the eager
paths (masked batches, other losses, no compiler, CUDA) the batched engine (:func:`attnsvm.gd.run_gd_batch`)
makes a few more decisions over the whole batch: the switch of the whole batch to the log-domain path when
more than half of it is saturated, the tie-free form of that path, and the norm's rescaling when some
instance's ``||∇L||`` leaves [1e-140, 1e140]. A chunk may then decide otherwise than the batch, and the two
paths agree to ~1e-14, not bitwise (pinned by an expected failure in the tests: 32 unsaturated instances
beside 64 saturated ones differ by 1.5e-16 relative after 10 steps); every experiment's runs meet it
(measured at sizes small and paper: the linear-domain path for every instance at every step, on moderate
unit-norm data without exact score ties). (ii) The same CPU kernels: a cluster whose machines differ in
``torch.backends.cpu.get_cpu_capability()`` or torch version may differ in the last bits (as a serial
run on those machines would). A batch that fails raises the error of the first chunk (in batch
order) that failed, its instance numbered in the batch; where several instances fail, the serial run
may name another one (the first to fail in the whole batch).
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import math
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import AttnSVMError

__all__ = [
    "DistributedError",
    "GD_ALIGN",
    "GD_CHUNK",
    "SCHEDULERS",
    "check_scheduler",
    "gd_batch_runner",
    "gd_chunk_bounds",
    "run_experiments_dask",
]

#: The ``--scheduler`` values besides a ``tcp://host:port`` address.
SCHEDULERS = ("local", "dask")
#: Seconds to wait for an existing scheduler (``tcp://``) to answer before giving up.
CONNECT_TIMEOUT_S = 30
INSTALL_HINT = "pip install 'attnsvm[distributed]'"
#: Seconds between two progress messages of one experiment's task (the bars need no more).
PROGRESS_INTERVAL_S = 0.5
#: Chunk boundaries of a GD batch fall on multiples of this many instances: torch's CPU kernels
#: vectorise along the batch-major axes in blocks of at most 32 float64 (AVX-512: 2 vectors of 8 per
#: elementwise step; the token sum: 4 vectors of 4), every block width divides 32, so every element
#: of a chunk sits where it sits in the whole batch relative to those blocks (see the module docstring).
GD_ALIGN = 32
#: The fewest instances a Dask task of a split GD batch gets (a multiple of GD_ALIGN); a batch is split
#: into at most as many chunks as the cluster has worker threads. The batched engine is dispatch-bound
#: at the experiments' sizes (n=6, T=8, d=10, one thread: 0.41 ms per step at 32 instances, 0.78 at 100,
#: 1.22 at 200): a chunk costs nearly what the whole batch does, so chunks only pay on free workers.
GD_CHUNK = 32


class DistributedError(AttnSVMError):
    """The Dask scheduler cannot be used: dask is not installed, or the scheduler cannot be reached."""


def check_scheduler(scheduler: str) -> str:
    """Validate a ``--scheduler`` value: ``local``, ``dask`` or ``tcp://host:port``; returns it.

    Raises:
      DistributedError: any other value, or ``dask``/``tcp://`` without dask.distributed installed.
    """
    if scheduler == "local":
        return scheduler
    host, _, port = scheduler.removeprefix("tcp://").rpartition(":")
    if scheduler == "dask" or (scheduler.startswith("tcp://") and host and port.isdigit()):
        _import_distributed()  # before any work: a missing extra is named now, not after the first experiment
        return scheduler
    raise DistributedError(
        f"--scheduler must be local, dask or tcp://host:port (an existing Dask scheduler); got {scheduler!r}"
    )


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise DistributedError(
            f"--scheduler dask needs dask.distributed, which is not installed ({exc}): {INSTALL_HINT}"
        ) from None
    return distributed


def _experiment_task(
    module: str,
    name: str,
    size: str,
    seed: int,
    device: str,
    queue: str | None = None,
    gd_chunk: int = GD_CHUNK,
) -> Any:
    """One experiment on a Dask worker: what the serial run computes, with one torch thread; its progress
    goes to the Dask queue named ``queue`` (at most every :data:`PROGRESS_INTERVAL_S` seconds), and its
    GD batches of ``≥ 2·gd_chunk`` instances run as chunk tasks (:func:`gd_batch_runner`)."""
    import torch

    from . import runner as E

    # One torch thread, as the serial run and the --jobs pool: the same arithmetic, bitwise.
    torch.set_num_threads(1)
    importlib.import_module(
        module
    )  # registers the experiment (a built-in or an ATTNSVM_EXTRA_EXPERIMENTS one)
    progress = None
    if queue is not None:
        q = _import_distributed().Queue(queue)
        last = [-math.inf]

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL_S:  # throttled: one message per interval at most
                last[0] = now
                q.put((name, done, total))

    token = _GD_RUNNER.set(_DaskGDRunner(gd_chunk, name))  # the experiment's GD batches become Dask tasks
    try:
        return E.run_experiment(E.EXPERIMENT_REGISTRY[name], size, seed, 1, device, progress)
    finally:
        _GD_RUNNER.reset(token)


def run_experiments_dask(
    specs: Sequence[Any],
    size: str,
    seed: int,
    device: str,
    *,
    scheduler: str,
    jobs: int,
    progress: Mapping[str, Callable[[int, int], None]],
    on_result: Callable[[Any], None] | None = None,
    gd_chunk: int = GD_CHUNK,
) -> dict[str, Any]:
    """Run the experiments ``specs`` as Dask tasks; returns ``{name: ExperimentResult}``.

    Args:
      specs: the :class:`~attnsvm.harness.runner.ExperimentSpec` to run.
      size, seed, device: as :func:`attnsvm.harness.runner.run_experiment`.
      scheduler: ``"dask"`` (a LocalCluster of ``jobs`` processes) or ``"tcp://host:port"``.
      jobs: worker processes of the LocalCluster (ignored for an existing scheduler).
      progress: each experiment's ``progress(done, total)``, fed from the tasks; ``(1, 1)`` when it finishes.
      on_result: called in this process with each result as it arrives (e.g. to checkpoint it).
      gd_chunk: instances per GD chunk task inside an experiment (rounded up to a multiple of
        :data:`GD_ALIGN`); a batch smaller than two chunks runs in its experiment's task.

    Raises:
      DistributedError: dask missing, the scheduler unreachable, or a task lost (a worker died).
    """
    gd_chunk = _check_chunk(gd_chunk)
    distributed = _import_distributed()
    cluster = None
    # Dask's nanny leaves MKL_NUM_THREADS, OPENBLAS_NUM_THREADS, PYTHONHASHSEED, ... set in this
    # process's environment (for the workers it spawns): restored when the cluster closes, so that the
    # run's report (its thread settings) and what runs next in this process see the environment given.
    environ = dict(os.environ)
    try:
        if scheduler == "dask":
            cluster = distributed.LocalCluster(
                n_workers=jobs,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
            client = distributed.Client(cluster)
        else:
            try:
                client = distributed.Client(scheduler, timeout=CONNECT_TIMEOUT_S)
            except OSError as exc:  # includes TimeoutError: nothing answers at the address
                raise DistributedError(
                    f"--scheduler {scheduler}: no Dask scheduler answers there within {CONNECT_TIMEOUT_S} s "
                    f"({exc}); start one (`dask scheduler`) or use --scheduler dask"
                ) from None
        try:
            run_id = uuid.uuid4().hex[:12]  # keys unique per run: a shared scheduler may hold others' tasks
            queue = distributed.Queue(f"attnsvm-progress-{run_id}", client=client)
            results: dict[str, Any] = {}

            def drain() -> None:
                for name, done, total in queue.get(batch=True):
                    if name not in results:  # a late message must not undo a finished bar
                        progress[name](done, total)

            futures = {
                client.submit(
                    _experiment_task,
                    s.run.__module__,
                    s.name,
                    size,
                    seed,
                    device,
                    queue.name,
                    gd_chunk,
                    pure=False,
                    key=f"attnsvm-{s.name}-{run_id}",
                ): s.name
                for s in specs
            }
            pending = set(futures)
            while pending:
                try:
                    distributed.wait(
                        list(pending), timeout=PROGRESS_INTERVAL_S, return_when="FIRST_COMPLETED"
                    )
                except TimeoutError:
                    pass
                drain()
                for fut in [f for f in pending if f.done()]:
                    pending.discard(fut)
                    name = futures[fut]
                    try:
                        res = fut.result()
                    except (
                        Exception
                    ) as exc:  # a task lost with its worker; run_experiment catches the experiment's own
                        raise DistributedError(
                            f"experiment {name!r} was lost on the Dask cluster "
                            f"({type(exc).__name__}: {exc}); finished experiments are saved: rerun with --resume"
                        ) from None
                    results[name] = res
                    if on_result is not None:
                        on_result(res)
                    progress[name](1, 1)
            return results
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()
            _restore_environ(environ)


def _restore_environ(saved: Mapping[str, str]) -> None:
    """Put ``os.environ`` back to ``saved`` (variables added since are removed)."""
    for key in [k for k in os.environ if k not in saved]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


# ------------------------------------------------------------------ GD batches as Dask tasks
#: The runner of the experiment task running in this thread (``None``: not inside a Dask experiment task).
_GD_RUNNER: contextvars.ContextVar[_DaskGDRunner | None] = contextvars.ContextVar(
    "attnsvm_gd_runner", default=None
)


def _check_chunk(chunk: int) -> int:
    """``chunk`` rounded up to a multiple of :data:`GD_ALIGN`; a positive integer is required."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise DistributedError(f"gd_chunk must be a positive integer (instances per task); got {chunk!r}")
    return -(-chunk // GD_ALIGN) * GD_ALIGN


def gd_chunk_bounds(batch: int, chunk: int = GD_CHUNK, *, tasks: int | None = None) -> list[tuple[int, int]]:
    """Chunks ``[(start, stop), ...]`` of a GD batch of ``batch`` instances, in order.

    ``k = ⌊batch / chunk⌋`` chunks (at most ``tasks``; at least one), ``chunk`` rounded up to a
    multiple of :data:`GD_ALIGN`; chunk ``i`` starts at ``i·batch/k`` rounded down to a multiple of
    :data:`GD_ALIGN` (the condition for bitwise equality with the whole batch, see the module
    docstring), so every chunk has at least ``chunk`` instances and the last one ends the batch.
    """
    size = _check_chunk(chunk)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise DistributedError(f"batch must be a positive number of instances; got {batch!r}")
    k = max(1, batch // size)
    if tasks is not None:
        # no more chunks than the cluster has slots: the engine is dispatch-bound, so each extra chunk
        # adds nearly a whole batch's per-step cost (see GD_CHUNK)
        k = max(1, min(k, tasks))
    starts = [GD_ALIGN * ((i * batch) // (k * GD_ALIGN)) for i in range(k)]
    return list(zip(starts, [*starts[1:], batch], strict=True))


def gd_batch_runner(batch: int) -> Callable[..., list[tuple[int, Any, Any]]] | None:
    """The runner of a segmented GD batch of ``batch`` instances as Dask chunk tasks, or ``None``.

    ``None`` outside a Dask experiment task (a local run: dask is not imported), or when the batch is
    one chunk. The runner takes the arguments of
    :func:`attnsvm.harness.experiments._common.segmented_batch` and returns what it returns, bitwise (see the module docstring).
    """
    runner = _GD_RUNNER.get()
    if runner is None or len(gd_chunk_bounds(batch, runner.chunk)) < 2:
        return None
    return runner


def _gd_segment_task(
    instances: Sequence[Any],
    steps: int,
    lr: float,
    normalized: bool,
    loss: str,
    device: str,
    start: tuple[Any, Any] | None,
    offset: int,
) -> tuple[Any, Any]:
    """One segment of one chunk on a Dask worker: ``(W, tokens)`` after ``steps`` GD steps from
    ``start[0]`` (``None``: from 0), by the call the serial run makes, with one torch thread."""
    import torch

    from ..errors import AttnSVMError
    from .experiments._common import segmented_batch

    torch.set_num_threads(1)  # as the experiment's task and the serial run: the same arithmetic, bitwise
    W0 = None if start is None else start[0]
    token = _GD_RUNNER.set(None)  # a chunk runs here, whatever context the worker's thread carries
    try:
        ((_, W, tokens),) = segmented_batch(list(instances), [steps], lr, normalized, loss, device, W0=W0)
    except AttnSVMError as exc:
        # the engine numbers instances within the chunk: name them as the whole batch does
        msg = re.sub(r"\binstance (\d+)", lambda m: f"instance {int(m.group(1)) + offset}", str(exc))
        raise type(exc)(msg) from None
    finally:
        _GD_RUNNER.reset(token)
    return W, tokens


class _DaskGDRunner:
    """Runs an experiment's segmented GD batch as chains of chunk tasks (see :func:`gd_batch_runner`)."""

    def __init__(self, chunk: int, experiment: str) -> None:
        self.chunk = _check_chunk(chunk)
        self.experiment = experiment
        self.submitted = 0  # chunk tasks submitted so far (each segment of each chunk is one)
        self.tasks_per_segment = 0  # chunks of the last batch run

    def __call__(
        self,
        instances: Sequence[Any],
        marks: Sequence[int],
        lr: float,
        normalized: bool,
        loss: str,
        device: str,
        on_mark: Callable[[int], None] | None = None,
        *,
        W0: Any | None = None,
    ) -> list[tuple[int, Any, Any]]:
        import numpy as np

        from .experiments._common import segmented_batch

        distributed = _import_distributed()
        # at most one chunk per worker thread of the cluster (its size now)
        slots = sum(distributed.get_client().nthreads().values())
        bounds = gd_chunk_bounds(len(instances), self.chunk, tasks=slots)
        self.tasks_per_segment = len(bounds)
        if len(bounds) < 2:  # a one-slot cluster: the batch runs here, as in a local run
            token = _GD_RUNNER.set(None)
            try:
                return segmented_batch(list(instances), marks, lr, normalized, loss, device, on_mark, W0=W0)
            finally:
                _GD_RUNNER.reset(token)
        run_id = uuid.uuid4().hex[:12]
        W0a = None if W0 is None else np.asarray(W0)
        out: list[tuple[int, Any, Any]] = []
        # worker_client: this task leaves its worker slot while it waits, so the chunks can run there
        with distributed.worker_client() as client:
            data = client.scatter([list(instances[a:b]) for a, b in bounds], hash=False)
            prev: list[Any] = [None if W0a is None else (W0a[a:b], None) for a, b in bounds]
            segments = []
            last = 0
            for k, m in enumerate(marks):
                futs = [
                    client.submit(
                        _gd_segment_task,
                        data[c],
                        int(m - last),
                        lr,
                        normalized,
                        loss,
                        device,
                        prev[c],
                        a,
                        pure=False,
                        key=f"attnsvm-gd-{self.experiment}-{run_id}-m{k}-c{c}",
                    )
                    for c, (a, _) in enumerate(bounds)
                ]
                self.submitted += len(futs)
                prev = futs  # the next segment of a chunk starts from this one's end point
                segments.append(futs)
                last = int(m)
            for k, (m, futs) in enumerate(zip(marks, segments, strict=True)):
                distributed.wait(futs)
                for f in futs:  # the first chunk (in batch order) that failed names the error
                    if f.status == "error":
                        raise f.exception()
                parts = client.gather(futs)
                out.append(
                    (
                        int(m),
                        np.concatenate([p[0] for p in parts], axis=0),
                        np.concatenate([p[1] for p in parts], axis=0),
                    )
                )
                if on_mark is not None:
                    on_mark(k)
        return out


def _gd_batch_task(
    instances: Sequence[Any],
    marks: Sequence[int],
    lr: float,
    normalized: bool,
    loss: str,
    device: str,
    W0: Any | None = None,
    gd_chunk: int = GD_CHUNK,
) -> tuple[list[tuple[int, Any, Any]], list[int], int]:
    """An experiment's segmented GD batch run from a Dask task as an experiment task runs it (for the tests):
    ``(what segmented_batch returns, the marks reported to on_mark in order, chunk tasks submitted)``."""
    import torch

    from .experiments._common import segmented_batch

    torch.set_num_threads(1)
    runner = _DaskGDRunner(gd_chunk, "gd-batch")
    reported: list[int] = []
    token = _GD_RUNNER.set(runner)
    try:
        out = segmented_batch(list(instances), marks, lr, normalized, loss, device, reported.append, W0=W0)
    finally:
        _GD_RUNNER.reset(token)
    return out, reported, runner.submitted
