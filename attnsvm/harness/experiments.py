"""The experiment families behind ``attnsvm reproduce``.

Each family is a function ``(size, seed, jobs, device, progress) → FamilyResult`` that
computes its numbers, tables and figure data, and checks the claims of the theory it is
about. Families are independent of each other and are registered with
:func:`register_family`, which records the modules they need; a family whose modules are
missing is reported as *not available*, never faked.

Sizes: ``"small"`` (the default; the whole report in ≤ 3 minutes on 2 CPU cores),
``"paper"`` (the published sizes: n=6, T=8, d=10 with unit-norm rows, 100 seeds, 2000
normalized-GD steps at lr 0.1) and ``"tiny"`` (seconds; for the test suite only).

A claim is an :class:`ExperimentClaim` (not to be confused with the proved identities of
:class:`attnsvm.identities.Claim`): a named statement with ``passed`` and a message giving the
measured numbers. ``severity="check"`` claims are what the package guarantees (a failure
makes ``attnsvm reproduce`` exit non-zero); ``severity="finding"`` claims are conjectures
or statements of the literature that the harness tests and reports either way.

References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596; Tarzanagh, Li, Thrampoulidis,
Oymak, arXiv 2308.16898; Kim, Papamakarios, Mnih, ICML 2021.
"""

from __future__ import annotations

from .._deps import require

require("mpmath", feature="attnsvm.harness.experiments (the reproduce families)")  # pragma: no mutate

import importlib
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ..errors import AttnSVMError, unknown_name

__all__ = [
    "SIZES",
    "ExperimentClaim",
    "Series",
    "Panel",
    "Figure",
    "FamilyResult",
    "FamilySpec",
    "FAMILY_REGISTRY",
    "register_family",
    "family_status",
    "run_family",
    "run_families",
    "load_extra_families",
    "EXTRA_FAMILIES_ENV",
]

SIZES = ("tiny", "small", "paper")

#: ``progress(done, total)``: called by a family as its work advances.
ProgressFn = Callable[[int, int], None]


def no_progress(done: int, total: int) -> None:
    """The default progress callback: does nothing."""


# ----------------------------------------------------------------------------- results
@dataclass(kw_only=True)
class ExperimentClaim:
    """One checked statement: ``passed`` with a message that gives the measured numbers."""

    name: str
    statement: str
    passed: bool
    message: str
    severity: str = "check"  # "check" (guaranteed; failure → exit 1) or "finding" (reported)


@dataclass
class Series:
    """One line of a panel: ``y`` against ``x``, with an optional band ``[lo, hi]``."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    _: KW_ONLY
    lo: Sequence[float] | None = None
    hi: Sequence[float] | None = None
    style: str = "-o"
    color: str | None = None  # a matplotlib colour; None cycles
    #: Drawing order: a higher value is drawn on top (e.g. estimates over the bounds they sit under).
    zorder: float | None = None
    #: Marker size (points); ``None``: the renderer's default.
    ms: float | None = None
    #: Text drawn next to each point (e.g. how many runs the point aggregates); ``None``: none.
    point_labels: list[str] | None = None
    #: Mark the first point (hollow circle, "start") and the last one (filled square, "end").
    mark_ends: bool = False
    #: Hollow markers (so a series drawn on top of this one shows through).
    hollow: bool = False

    def __post_init__(self) -> None:
        for name in ("lo", "hi"):
            val = getattr(self, name)
            if val is not None and (isinstance(val, str) or len(val) != len(self.x)):
                raise TypeError(
                    f"Series {self.label!r}: {name} must be None or as long as x (pass style= by keyword)"
                )
        if len(self.y) != len(self.x):
            raise TypeError(
                f"Series {self.label!r}: x and y differ in length ({len(self.x)} vs {len(self.y)})"
            )
        if self.point_labels is not None and len(self.point_labels) != len(self.x):
            raise TypeError(
                f"Series {self.label!r}: point_labels must be None or as long as x "
                f"({len(self.point_labels)} vs {len(self.x)})"
            )


@dataclass
class Panel:
    """One set of axes."""

    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    _: KW_ONLY
    xlog: bool = False
    ylog: bool = False
    #: Axis limits ``(low, high)``, either ``None`` for automatic (e.g. ``(0, 1.02)``: shares from 0).
    ylim: tuple[float | None, float | None] | None = None
    #: Ticks at exactly these x values, labelled plainly ("4", "16", "0.25"); ``None``: automatic.
    xticks: list[float] | None = None
    #: Horizontal reference lines ``(y, label)`` (dashed grey), e.g. a claim's threshold.
    hlines: list[tuple[float, str]] = field(default_factory=list)
    #: Text in a box inside the axes, e.g. the criterion a claim checks and its outcome.
    note: str = ""
    #: Where the note goes: ``"lower left"``, ``"lower right"``, ``"upper left"``, ``"upper right"``
    #: ``"outside"`` (right of the axes, under an outside legend) or ``"below"`` (under the x label).
    note_loc: str = "lower left"
    #: Legend position: a matplotlib ``loc`` (``"best"``, ``"upper left"``, ...), ``"outside"`` (right
    #: of the axes, clear of every curve) or ``"none"``.
    legend: str = "best"


@dataclass
class Figure:
    """A figure of one or more panels side by side, saved as ``<family>-<name>.png``."""

    name: str
    title: str
    panels: list[Panel]
    _: KW_ONLY
    caption: str = ""
    #: ``"panel"``: one legend in each panel (at its ``Panel.legend``); ``"below"``: one legend for
    #: the whole figure under the panels (the panels' entries merged by label).
    legend: str = "panel"
    #: Panels per row (``None``: all in one row); more panels wrap onto further rows.
    columns: int | None = None


@dataclass
class FamilyResult:
    """What one experiment family produced."""

    name: str
    title: str
    description: str
    _: KW_ONLY
    available: bool = True
    reason: str = ""  # why the family is not available
    numbers: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    claims: list[ExperimentClaim] = field(default_factory=list)
    elapsed_s: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)

    def claim(
        self, name: str, statement: str, passed: bool, message: str, *, severity: str = "check"
    ) -> None:
        """Append an :class:`ExperimentClaim` (for plug-in families; the built-in ones return theirs from a
        ``check_<family>`` function)."""
        self.claims.append(
            ExperimentClaim(
                name=name, statement=statement, passed=bool(passed), message=message, severity=severity
            )
        )

    @property
    def failed(self) -> list[ExperimentClaim]:
        """The ``check`` claims that failed."""
        return [c for c in self.claims if c.severity == "check" and not c.passed]


FamilyFn = Callable[[str, int, int, str, ProgressFn], FamilyResult]


@dataclass(frozen=True)
class FamilySpec:
    """A registered family: its function and the ``module:attribute`` names it needs."""

    name: str
    title: str
    description: str
    run: FamilyFn
    requires: tuple[str, ...] = ()
    order: int = 100


FAMILY_REGISTRY: dict[str, FamilySpec] = {}


def register_family(
    name: str, title: str, description: str, requires: Sequence[str] = (), order: int = 100
) -> Callable[[FamilyFn], FamilyFn]:
    """Register an experiment family (a decorator).

    Args:
      name: short identifier, used in file names and ``results.json``.
      title, description: shown in the report.
      requires: for plug-in families (``ATTNSVM_EXTRA_FAMILIES``) that need optional third-party
        modules: ``"module:attribute"`` (or ``"module"``) names; when one is missing the family is
        reported as not available instead of run. The built-in families need nothing beyond attnsvm.
      order: position in the report (ascending).
    """

    def deco(fn: FamilyFn) -> FamilyFn:
        FAMILY_REGISTRY[name] = FamilySpec(name, title, description, fn, tuple(requires), order)
        return fn

    return deco


#: Environment variable: comma-separated importable modules that register extra families.
EXTRA_FAMILIES_ENV = "ATTNSVM_EXTRA_FAMILIES"


def load_extra_families() -> list[str]:
    """Import the modules named in ``$ATTNSVM_EXTRA_FAMILIES`` (they call :func:`register_family`).

    Returns the module names imported. A module that cannot be imported raises
    :class:`attnsvm.AttnSVMError` naming it.
    """
    import os

    names = [m.strip() for m in os.environ.get(EXTRA_FAMILIES_ENV, "").split(",") if m.strip()]
    for m in names:
        try:
            importlib.import_module(m)
        except ImportError as exc:
            raise AttnSVMError(f"{EXTRA_FAMILIES_ENV}: cannot import {m!r} ({exc})") from exc
    return names


def family_status(spec: FamilySpec) -> tuple[bool, str]:
    """``(available, reason)``: whether every required module and attribute exists.

    Only a required module that does not exist (or lacks the attribute) makes a family *not
    available*. A module that exists but fails to import is a bug, not an absence: the error
    propagates, and :func:`run_family` reports it as a failed check.
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


def run_family(
    spec: FamilySpec,
    size: str,
    seed: int,
    jobs: int = 1,
    device: str = "cpu",
    progress: ProgressFn | None = None,
) -> FamilyResult:
    """Run one family; an unexpected exception becomes a failed ``ran`` claim, not a crash.

    Args:
      spec: the registered family.
      size: ``"tiny"``, ``"small"`` or ``"paper"``.
      seed: base seed; the family derives every instance's seed from it.
      jobs: parallelism available to the family (the built-in ones run serially).
      device: ``"cpu"`` or ``"cuda"`` for the batched GD engine.
      progress: ``progress(done, total)`` callback.

    Returns:
      The :class:`FamilyResult` (``available=False`` with a reason when a required module is
      missing), with ``elapsed_s`` set.
    """
    if size not in SIZES:
        raise unknown_name("size", size, SIZES)
    t0 = time.perf_counter()
    try:
        ok, reason = family_status(spec)
        if not ok:
            return FamilyResult(spec.name, spec.title, spec.description, available=False, reason=reason)
        res = spec.run(size, seed, jobs, device, progress or no_progress)
    except Exception as exc:  # reported as a failed claim with its traceback tail
        res = FamilyResult(spec.name, spec.title, spec.description)
        tb = traceback.format_exc().strip().splitlines()[-3:]
        res.claim(
            "ran",
            "the family runs to completion",
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


def _run_in_worker(module: str, name: str, size: str, seed: int, device: str, queue: Any) -> FamilyResult:
    importlib.import_module(module)  # registers the family (and, by import, the built-in ones)

    def progress(done: int, total: int) -> None:
        queue.put((name, done, total))

    return run_family(FAMILY_REGISTRY[name], size, seed, 1, device, progress)


def run_families(
    size: str,
    seed: int = 0,
    jobs: int = 1,
    device: str = "cpu",
    names: Sequence[str] | None = None,
    progress_factory: Callable[[FamilySpec], ProgressFn] | None = None,
    *,
    scheduler: str = "local",
    finished: Mapping[str, FamilyResult] | None = None,
    on_result: Callable[[FamilyResult], None] | None = None,
) -> list[FamilyResult]:
    """Run the registered families (all, or ``names``) and return their results in report order.

    Every family is seeded on its own and computes with one torch thread, so the results do not
    depend on ``jobs`` or ``scheduler``: with ``scheduler="local"`` and ``jobs > 1`` the families
    run in ``jobs`` spawned worker processes; with ``"dask"`` or ``"tcp://host:port"`` each is a
    Dask task (:mod:`attnsvm.harness.distributed`).

    Args:
      size, seed, jobs, device: as :func:`run_family`.
      names: family names to run (``None``: all registered ones).
      progress_factory: called once per family that runs, returns its ``progress(done, total)``.
      scheduler: ``"local"`` (this machine: serial, or a process pool with ``jobs > 1``),
        ``"dask"`` (a Dask LocalCluster of ``jobs`` processes) or ``"tcp://host:port"``.
      finished: results of families already computed (a resumed run): returned as they are, not run.
      on_result: called in this process with each result as it finishes (e.g. to checkpoint it).

    Returns:
      One :class:`FamilyResult` per family, in report order (``FamilySpec.order``).

    Raises:
      UnknownNameError: a name in ``names`` is not registered.
      attnsvm.harness.distributed.DistributedError: the Dask scheduler cannot be used.
    """
    specs = sorted(FAMILY_REGISTRY.values(), key=lambda s: (s.order, s.name))
    if names is not None:
        unknown = [n for n in names if n not in FAMILY_REGISTRY]
        if unknown:
            raise unknown_name("experiment family", unknown[0], tuple(s.name for s in specs))
        specs = [s for s in specs if s.name in names]
    done: dict[str, FamilyResult] = dict(finished or {})
    todo = [s for s in specs if s.name not in done]
    progs = {s.name: (progress_factory(s) if progress_factory is not None else no_progress) for s in todo}

    def finish(res: FamilyResult) -> None:
        done[res.name] = res
        if on_result is not None:
            on_result(res)

    if not todo:
        pass
    elif scheduler != "local":
        from .distributed import run_families_dask

        run_families_dask(
            todo, size, seed, device, scheduler=scheduler, jobs=jobs, progress=progs, on_result=finish
        )
    elif jobs <= 1 or len(todo) <= 1:
        for s in todo:
            finish(run_family(s, size, seed, 1, device, progs[s.name]))
    else:
        _run_in_pool(todo, size, seed, jobs, device, progs, finish)
    return [done[s.name] for s in specs]


def _run_in_pool(
    specs: Sequence[FamilySpec],
    size: str,
    seed: int,
    jobs: int,
    device: str,
    progs: Mapping[str, ProgressFn],
    finish: Callable[[FamilyResult], None],
) -> None:
    """The families in ``jobs`` spawned worker processes (one torch thread each); ``finish`` gets each
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


# Families kept in their own modules register themselves on import (last: they import this module).
from . import families as _families  # noqa: E402, F401
