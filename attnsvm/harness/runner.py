"""The runner of the experiments behind ``attnsvm reproduce``: the registry, and running them.

Each experiment is a function ``(size, seed, jobs, device, progress) → ExperimentResult`` (the
result types are in :mod:`attnsvm.harness.results`) that computes its numbers, tables and figure
data, and checks the claims of the theory it is about. Experiments are independent of each other
and are registered with :func:`register_experiment`, which records the modules they need; an
experiment whose modules are missing is reported as *not available*, never faked. The built-in
experiments are the modules of :mod:`attnsvm.harness.experiments`.

Sizes: ``"small"`` (the default; the whole report in ≤ 3 minutes on 2 CPU cores),
``"paper"`` (the published sizes: n=6, T=8, d=10 with unit-norm rows, 100 seeds, 2000
normalized-GD steps at lr 0.1) and ``"tiny"`` (seconds; for the test suite only).

References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596; Tarzanagh, Li, Thrampoulidis,
Oymak, arXiv 2308.16898; Kim, Papamakarios, Mnih, ICML 2021.
"""

from __future__ import annotations

from .._deps import require

require("mpmath", feature="attnsvm.harness.runner (the reproduce experiments)")  # pragma: no mutate

import importlib
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import AttnSVMError, RenamedSettingError, unknown_name
from .results import ExperimentResult

__all__ = [
    "SIZES",
    "ProgressFn",
    "no_progress",
    "ExperimentFn",
    "ExperimentSpec",
    "EXPERIMENT_REGISTRY",
    "register_experiment",
    "experiment_status",
    "run_experiment",
    "run_experiments",
    "load_extra_experiments",
    "EXTRA_EXPERIMENTS_ENV",
    "OLD_EXTRA_EXPERIMENTS_ENV",
    "RenamedSettingError",
]

SIZES = ("tiny", "small", "paper")

#: ``progress(done, total)``: called by an experiment as its work advances.
ProgressFn = Callable[[int, int], None]


def no_progress(done: int, total: int) -> None:
    """The default progress callback: does nothing."""


ExperimentFn = Callable[[str, int, int, str, ProgressFn], ExperimentResult]


@dataclass(frozen=True)
class ExperimentSpec:
    """A registered experiment: its function and the ``module:attribute`` names it needs."""

    name: str
    title: str
    description: str
    run: ExperimentFn
    requires: tuple[str, ...] = ()
    order: int = 100


EXPERIMENT_REGISTRY: dict[str, ExperimentSpec] = {}


def register_experiment(
    name: str, title: str, description: str, requires: Sequence[str] = (), order: int = 100
) -> Callable[[ExperimentFn], ExperimentFn]:
    """Register an experiment (a decorator).

    Args:
      name: short identifier, used in file names and ``results.json``.
      title, description: shown in the report.
      requires: for plug-in experiments (``ATTNSVM_EXTRA_EXPERIMENTS``) that need optional third-party
        modules: ``"module:attribute"`` (or ``"module"``) names; when one is missing the experiment is
        reported as not available instead of run. The built-in experiments need nothing beyond attnsvm.
      order: position in the report (ascending).
    """

    def deco(fn: ExperimentFn) -> ExperimentFn:
        EXPERIMENT_REGISTRY[name] = ExperimentSpec(name, title, description, fn, tuple(requires), order)
        return fn

    return deco


#: Environment variable: comma-separated importable modules that register extra experiments.
EXTRA_EXPERIMENTS_ENV = "ATTNSVM_EXTRA_EXPERIMENTS"
#: The variable's old name (before the reproduce "families" were renamed "experiments"); refused when set.
OLD_EXTRA_EXPERIMENTS_ENV = "ATTNSVM_EXTRA_FAMILIES"


def load_extra_experiments() -> list[str]:
    """Import the modules named in ``$ATTNSVM_EXTRA_EXPERIMENTS`` (they call :func:`register_experiment`).

    Returns the module names imported.

    Raises:
      RenamedSettingError: ``$ATTNSVM_EXTRA_FAMILIES`` (the old name) is set, even to an empty value: a
        user's setting is never silently ignored; the message names ``ATTNSVM_EXTRA_EXPERIMENTS``.
      AttnSVMError: a module cannot be imported (the message names it).
    """
    import os

    if OLD_EXTRA_EXPERIMENTS_ENV in os.environ:
        raise RenamedSettingError(
            f"{OLD_EXTRA_EXPERIMENTS_ENV} is no longer read: the reproduce families are now called "
            f"experiments; set {EXTRA_EXPERIMENTS_ENV}={os.environ[OLD_EXTRA_EXPERIMENTS_ENV]!r} instead "
            f"and unset {OLD_EXTRA_EXPERIMENTS_ENV}"
        )
    names = [m.strip() for m in os.environ.get(EXTRA_EXPERIMENTS_ENV, "").split(",") if m.strip()]
    for m in names:
        try:
            importlib.import_module(m)
        except ImportError as exc:
            raise AttnSVMError(f"{EXTRA_EXPERIMENTS_ENV}: cannot import {m!r} ({exc})") from exc
    return names


def experiment_status(spec: ExperimentSpec) -> tuple[bool, str]:
    """``(available, reason)``: whether every required module and attribute exists.

    Only a required module that does not exist (or lacks the attribute) makes an experiment
    *not available*. A module that exists but fails to import is a bug, not an absence: the error
    propagates, and :func:`run_experiment` reports it as a failed check.
    """
    for req in spec.requires:
        mod, _, attr = req.partition(":")
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if (
                exc.name is not None
                and mod.startswith(exc.name)
                and (mod == exc.name or mod[len(exc.name)] == ".")
            ):
                return False, f"module {mod} is not available ({exc})"
            raise
        if attr and not hasattr(m, attr):
            return False, f"{mod}.{attr} is not available"
    return True, ""


def run_experiment(
    spec: ExperimentSpec,
    size: str,
    seed: int,
    jobs: int = 1,
    device: str = "cpu",
    progress: ProgressFn | None = None,
) -> ExperimentResult:
    """Run one experiment; an unexpected exception becomes a failed ``ran`` claim, not a crash.

    Args:
      spec: the registered experiment.
      size: ``"tiny"``, ``"small"`` or ``"paper"``.
      seed: base seed; the experiment derives every instance's seed from it.
      jobs: parallelism available to the experiment (the built-in ones run serially).
      device: ``"cpu"`` or ``"cuda"`` for the batched GD engine.
      progress: ``progress(done, total)`` callback.

    Returns:
      The :class:`ExperimentResult` (``available=False`` with a reason when a required module is
      missing), with ``elapsed_s`` set.
    """
    if size not in SIZES:
        raise unknown_name("size", size, SIZES)
    t0 = time.perf_counter()
    try:
        ok, reason = experiment_status(spec)
        if not ok:
            return ExperimentResult(spec.name, spec.title, spec.description, available=False, reason=reason)
        res = spec.run(size, seed, jobs, device, progress or no_progress)
    except Exception as exc:  # reported as a failed claim with its traceback tail
        res = ExperimentResult(spec.name, spec.title, spec.description)
        tb = traceback.format_exc().strip().splitlines()[-3:]
        res.claim(
            "ran",
            "the experiment runs to completion",
            False,
            f"{type(exc).__name__}: {exc} [{' | '.join(tb)}]",
        )
    res.elapsed_s = time.perf_counter() - t0
    return res


def _worker_init() -> None:
    """Worker processes use one torch thread each: the batched GD tensors are small, and two
    threads per process on a loaded 2-core machine were measured 20× slower than one."""
    import torch

    torch.set_num_threads(1)


def _run_in_worker(module: str, name: str, size: str, seed: int, device: str, queue: Any) -> ExperimentResult:
    importlib.import_module(module)  # registers the experiment (and, by import, the built-in ones)

    def progress(done: int, total: int) -> None:
        queue.put((name, done, total))

    return run_experiment(EXPERIMENT_REGISTRY[name], size, seed, 1, device, progress)


def run_experiments(
    size: str,
    seed: int = 0,
    jobs: int = 1,
    device: str = "cpu",
    names: Sequence[str] | None = None,
    progress_factory: Callable[[ExperimentSpec], ProgressFn] | None = None,
    *,
    scheduler: str = "local",
    finished: Mapping[str, ExperimentResult] | None = None,
    on_result: Callable[[ExperimentResult], None] | None = None,
) -> list[ExperimentResult]:
    """Run the registered experiments (all, or ``names``) and return their results in report order.

    Every experiment is seeded on its own and computes with one torch thread, so the results do not
    depend on ``jobs`` or ``scheduler``: with ``scheduler="local"`` and ``jobs > 1`` the experiments
    run in ``jobs`` spawned worker processes; with ``"dask"`` or ``"tcp://host:port"`` each is a
    Dask task (:mod:`attnsvm.harness.distributed`).

    Args:
      size, seed, jobs, device: as :func:`run_experiment`.
      names: experiment names to run (``None``: all registered ones).
      progress_factory: called once per experiment that runs, returns its ``progress(done, total)``.
      scheduler: ``"local"`` (this machine: serial, or a process pool with ``jobs > 1``),
        ``"dask"`` (a Dask LocalCluster of ``jobs`` processes) or ``"tcp://host:port"``.
      finished: results of experiments already computed (a resumed run): returned as they are, not run.
      on_result: called in this process with each result as it finishes (e.g. to checkpoint it).

    Returns:
      One :class:`ExperimentResult` per experiment, in report order (``ExperimentSpec.order``).

    Raises:
      UnknownNameError: a name in ``names`` is not registered.
      attnsvm.harness.distributed.DistributedError: the Dask scheduler cannot be used.
    """
    specs = sorted(EXPERIMENT_REGISTRY.values(), key=lambda s: (s.order, s.name))
    if names is not None:
        unknown = [n for n in names if n not in EXPERIMENT_REGISTRY]
        if unknown:
            raise unknown_name("experiment", unknown[0], tuple(s.name for s in specs))
        specs = [s for s in specs if s.name in names]
    done: dict[str, ExperimentResult] = dict(finished or {})
    todo = [s for s in specs if s.name not in done]
    progs = {s.name: (progress_factory(s) if progress_factory is not None else no_progress) for s in todo}

    def finish(res: ExperimentResult) -> None:
        done[res.name] = res
        if on_result is not None:
            on_result(res)

    if not todo:
        pass
    elif scheduler != "local":
        from .distributed import run_experiments_dask

        run_experiments_dask(
            todo, size, seed, device, scheduler=scheduler, jobs=jobs, progress=progs, on_result=finish
        )
    elif jobs <= 1 or len(todo) <= 1:
        for s in todo:
            finish(run_experiment(s, size, seed, 1, device, progs[s.name]))
    else:
        _run_in_pool(todo, size, seed, jobs, device, progs, finish)
    return [done[s.name] for s in specs]


def _run_in_pool(
    specs: Sequence[ExperimentSpec],
    size: str,
    seed: int,
    jobs: int,
    device: str,
    progs: Mapping[str, ProgressFn],
    finish: Callable[[ExperimentResult], None],
) -> None:
    """The experiments in ``jobs`` spawned worker processes (one torch thread each); ``finish`` gets each
    result in this process as it completes."""
    import multiprocessing
    import queue as queue_mod
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as mgr:
        q = mgr.Queue()

        def drain() -> None:
            while True:
                try:
                    name, done, total = q.get_nowait()
                except queue_mod.Empty:
                    return
                progs[name](done, total)

        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init) as ex:
            futs = {
                ex.submit(_run_in_worker, s.run.__module__, s.name, size, seed, device, q): s.name
                for s in specs
            }
            pending = set(futs)
            while pending:
                ready, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                drain()
                for fut in ready:
                    finish(fut.result())
        drain()


# ------------------------------------------------------------------------------ helpers


# The built-in experiments register themselves on import (last: they import this module).
from . import experiments as _experiments  # noqa: E402, F401
