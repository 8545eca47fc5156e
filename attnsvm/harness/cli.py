"""The ``attnsvm`` command line.

Subcommands:

* ``attnsvm reproduce [--out DIR] [--size small|paper] [--seed N] [--jobs N] [--device cpu|cuda]
  [--scheduler local|dask|tcp://HOST:PORT] [--resume | --force]`` runs the experiments
  (:mod:`attnsvm.harness.experiments`, run by :mod:`attnsvm.harness.runner`; on Dask:
  :mod:`attnsvm.harness.distributed`) and writes the verification report (:mod:`attnsvm.harness.report`),
  saving each finished experiment so that ``--resume`` continues a
  killed run (:mod:`attnsvm.harness.checkpoint`); exit 1 naming the failed claims when a check fails.
* ``attnsvm check`` — a fast self-check of the installed package (symbolic proofs, a short
  property run); exit 0/1.
* ``attnsvm bench [--quick] [--json FILE]`` — the SVM and GD benchmarks, side by side.
* ``attnsvm svm DATA.npz`` and ``attnsvm gd DATA.npz --steps N --lr η`` — on a user's data
  (arrays ``X``, ``Y``, ``v``, optional ``z`` and ``alpha``), JSON on stdout or to a file.

Bad input (a missing file or array, wrong shapes, NaN, an out-of-range option) gives one line on
stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._deps import require
from ..errors import AttnSVMError, MissingDependencyError

if TYPE_CHECKING:
    from ..identities import ClaimReport
    from .checkpoint import RunCheckpoint
    from .results import ExperimentResult

__all__ = ["main", "load_instance", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_FAILED = 1  # a claim or a self-check failed
EXIT_USAGE = 2  # bad input: file, arrays, options


#: The optional packages each command needs beyond the core (numpy, scipy); ``svm`` and ``gd`` need none.
COMMAND_NEEDS: dict[str, tuple[str, ...]] = {
    "reproduce": ("rich", "matplotlib", "mpmath", "sympy", "torch", "cvxpy"),
    "check": ("rich", "sympy", "mpmath", "hypothesis"),
    "bench": ("torch", "cvxpy"),
}


def _require_for(command: str) -> None:
    """Raise :class:`MissingDependencyError` (naming the extra) unless ``command``'s packages import."""
    for package in COMMAND_NEEDS.get(command, ()):
        require(package, feature=f"`attnsvm {command}`")


class InputError(Exception):
    """Bad command-line input; its message is printed as one line and the exit code is 2."""


# ------------------------------------------------------------------------------ data
def _load_npz(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file")
    if p.is_dir():
        raise InputError(f"{path}: is a directory, expected a .npz file")
    if not zipfile.is_zipfile(p):
        raise InputError(f"{path}: not a .npz archive (not a zip file); save the arrays with numpy.savez")
    try:
        with np.load(p, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise InputError(f"{path}: a single .npy array, expected a .npz archive with arrays X, Y, v")
            return {k: np.array(data[k]) for k in data.files}
    except InputError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InputError(f"{path}: not a readable .npz archive ({exc})") from None


def load_instance(path: str) -> tuple[Any, Any]:
    """Load ``(Instance, alpha or None)`` from a ``.npz`` with ``X``, ``Y``, ``v``, optional ``z``, ``alpha``.

    Raises :class:`InputError` for file problems and missing arrays and
    :class:`attnsvm.AttnSVMError` for invalid arrays.
    """
    from ..model._instance import Instance

    arrays = _load_npz(path)
    missing = [k for k in ("X", "Y", "v") if k not in arrays]
    if missing:
        have = ", ".join(sorted(arrays)) or "none"
        raise InputError(
            f"{path}: missing array(s) {', '.join(missing)} (found: {have}); "
            "save with numpy.savez(path, X=X, Y=Y, v=v[, z=z, alpha=alpha])"
        )
    z: Any = arrays.get("z")  # None → self-attention (z = first token)
    inst = Instance(arrays["X"], arrays["Y"], arrays["v"], z)
    alpha = arrays.get("alpha")
    return inst, alpha


def _write_json(doc: dict[str, Any], out: str | None) -> None:
    from .report import to_jsonable

    text = json.dumps(to_jsonable(doc), indent=1)
    if out is None or out == "-":
        print(text)
    else:
        try:
            Path(out).write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{out}: cannot write ({exc.strerror or exc})") from None


def _parse_alpha(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return np.array([int(t) for t in text.replace(",", " ").split()], dtype=np.intp)
    except ValueError:
        raise InputError(f"--alpha must be comma-separated integer token indices; got {text!r}") from None


# ------------------------------------------------------------------------------- svm
def _scaled_norms(W: Any) -> tuple[float, float]:
    """``||W||_F`` and ``||W||_*`` of a finite matrix without overflow or underflow in between.

    Computed on ``W·2^−e`` (exact, largest entry in ``[½, 1)``) and scaled back; raises the scale
    contract's error when a norm itself is not a finite double.
    """
    from ..scaling import check_finite_result, ldexp_scale, pow2_exponent

    e = pow2_exponent(W)
    Ws = ldexp_scale(W, e)
    fro, nuc = float(np.linalg.norm(Ws)), float(np.linalg.norm(Ws, "nuc"))
    with np.errstate(over="ignore"):
        out = np.ldexp(np.array([fro, nuc]), e)
    check_finite_result(out, "the norm of the Att-SVM solution W")
    return float(out[0]), float(out[1])


def cmd_svm(args: argparse.Namespace) -> int:
    """Solve Att-SVM(α) for the data in a .npz file.

    Scale: any finite data. The solution is computed on exactly rescaled data
    (``W_mm(aX, bz) = W_mm(X, z)/(ab)``); when ``W`` itself is outside float64's normal range the command
    exits 2 with the one-line :class:`~attnsvm.NumericalError` message. ``duals`` is ``null`` when a
    multiplier is not a normal double; ``duals_scaled`` then gives them as ``mantissa·2^exponent``.
    """
    inst, alpha = load_instance(args.data)
    a_cli = _parse_alpha(args.alpha)
    if a_cli is not None:
        alpha = a_cli
    alpha = inst.check_alpha(alpha)
    from ..errors import SolverError
    from ..svm import local_optimality_report, solve_svm

    t0 = time.perf_counter()
    try:
        sol = solve_svm(inst, alpha=alpha, norm=args.norm, method=args.method)
        elapsed = time.perf_counter() - t0
        W = np.asarray(sol.W)
        norm_fro, norm_nuc = _scaled_norms(W)
        rep: Any = None
        if args.norm == "fro":
            try:
                rep = local_optimality_report(inst, sol.alpha)
            except SolverError as exc:  # uncertified support: undecided, never a guess
                rep = exc
    except AttnSVMError:  # the package's own errors (NumericalError is also an ArithmeticError): as they are
        raise
    except (ArithmeticError, ValueError, np.linalg.LinAlgError) as exc:  # never a traceback
        raise SolverError(
            f"internal numerical failure ({type(exc).__name__}: {exc}); this is a bug in attnsvm: please "
            "report it with the data file"
        ) from exc
    doc: dict[str, Any] = {
        "shape": {"n": inst.n, "T": inst.T, "d": inst.d},
        "norm": args.norm,
        "method": args.method,
        "method_used": getattr(sol, "method", None),
        "alpha": np.asarray(sol.alpha).tolist(),
        "W": W.tolist(),
        "norm_fro": norm_fro,
        "norm_nuc": norm_nuc,
        "support": [
            list(map(int, p)) for p in np.asarray(getattr(sol, "support", []), dtype=np.intp).reshape(-1, 2)
        ],
        "kkt": _as_dict(getattr(sol, "kkt", None)),
        "certified": bool(sol.certified),
        "error_bound": float(sol.error_bound),
        "time_s": elapsed,
    }
    duals = getattr(sol, "duals", None)
    doc["duals"] = None if duals is None else np.asarray(duals).tolist()  # None for the nuclear norm
    if duals is None and sol.duals_mantissa is not None:  # multipliers outside the normal range
        doc["duals_scaled"] = {
            "mantissa": np.asarray(sol.duals_mantissa).tolist(),
            "exponent": int(sol.duals_exponent),
            "meaning": "duals = mantissa * 2**exponent",
        }
    if isinstance(rep, SolverError):
        doc["locally_optimal"] = None
        doc["local_optimality"] = "undecided: " + " ".join(str(rep).split())
    elif rep is not None:
        doc["locally_optimal"] = bool(rep.locally_optimal)
        doc["local_optimality"] = rep.reason
    _emit(doc, args, _svm_summary)
    return EXIT_OK


def _emit(doc: dict[str, Any], args: argparse.Namespace, summary: Any) -> None:
    """``--json``: the document on stdout; ``--out FILE``: the document in FILE; a human summary on
    stdout unless ``--json``."""
    if args.out is not None and args.out != "-":
        _write_json(doc, args.out)
    if args.json or args.out == "-":
        _write_json(doc, None)
    else:
        print(summary(doc))
        if args.out is None:
            print("(the full result, W included: --json, or --out FILE)")


def _svm_summary(doc: dict[str, Any]) -> str:
    """The ``svm`` result for a person: what was solved, the norm of ``W``, the certificate."""
    sh, kkt = doc["shape"], doc["kkt"] or {}
    worst = max((v for v in kkt.values() if isinstance(v, (int, float))), default=None)
    lines = [
        f"Att-SVM ({'Frobenius' if doc['norm'] == 'fro' else 'nuclear'} norm, method {doc['method_used']}) "
        f"on n={sh['n']} sequences, T={sh['T']} tokens, d={sh['d']}",
        f"  selected tokens alpha: {doc['alpha']}",
        f"  ||W||_F = {doc['norm_fro']:.6g}   ||W||_* = {doc['norm_nuc']:.6g}",
        f"  support: {len(doc['support'])} active constraints",
        "  certified: "
        + ("yes" if doc["certified"] else "NO")
        + (f" (largest KKT residual {worst:.3g}" if worst is not None else " (")
        + f", error bound {doc['error_bound']:.3g})",
    ]
    if "locally_optimal" in doc:
        lo = doc["locally_optimal"]
        verdict = "undecided" if lo is None else ("yes" if lo else "no")
        lines.append(f"  locally optimal: {verdict} ({doc['local_optimality']})")
    lines.append(f"  time: {doc['time_s']:.3g} s")
    return "\n".join(lines)


def _as_dict(obj: Any) -> Any:
    """A KKT record (dataclass, NamedTuple, dict or object) as a plain dict."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return dict(obj)
    if hasattr(obj, "_asdict"):
        return dict(obj._asdict())
    import dataclasses

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "__dict__"):
        return {k: v for k, v in vars(obj).items() if not k.startswith("_")}
    return str(obj)


# -------------------------------------------------------------------------------- gd
def cmd_gd(args: argparse.Namespace) -> int:
    """Run GD on the data in a .npz file.

    ``alpha`` (the npz's array or ``--alpha``) is validated as in ``svm`` and, with ``--svm``, names the
    tokens whose Att-SVM solution the final direction is compared with (default: the final tokens).
    """
    inst, alpha = load_instance(args.data)
    a_cli = _parse_alpha(args.alpha)
    if a_cli is not None:
        alpha = a_cli
    if alpha is not None:
        alpha = inst.check_alpha(alpha)
    from ..gd import run_gd

    t0 = time.perf_counter()
    traj = run_gd(inst, steps=args.steps, lr=args.lr, normalized=not args.plain, loss=args.loss)
    elapsed = time.perf_counter() - t0
    W = np.asarray(traj.W)
    doc: dict[str, Any] = {
        "shape": {"n": inst.n, "T": inst.T, "d": inst.d},
        "steps": args.steps,
        "steps_run": int(traj.steps_run),
        "stop_reason": traj.stop_reason,
        "saturated": bool(traj.saturated),
        "lr": args.lr,
        "normalized": not args.plain,
        "loss": args.loss,
        "W": W.tolist(),
        "norm_fro": _scaled_norms(W)[0],  # no overflow from squaring entries above 1e154
        "final_tokens": np.asarray(traj.final_tokens).tolist(),
        "record": [
            {
                "step": int(r.step),
                "norm": r.norm,
                "risk": r.risk,
                "tokens": np.asarray(r.tokens).tolist(),
                "log10_grad_norm": r.log10_grad_norm,
            }
            for r in traj.record
        ],
        "time_s": elapsed,
    }
    if args.svm:
        from ..gd import direction_corr, direction_gap
        from ..svm import solve_svm

        target = traj.final_tokens if alpha is None else alpha
        key = "svm_final_tokens" if alpha is None else "svm_alpha"
        try:
            ref = solve_svm(inst, alpha=target).W
            doc[key] = {
                "alpha": np.asarray(target).tolist(),
                "corr": direction_corr(W, ref),
                "gap": direction_gap(W, ref),
                "W_mm": np.asarray(ref).tolist(),
            }
        except AttnSVMError as exc:
            doc[key] = {"alpha": np.asarray(target).tolist(), "error": " ".join(str(exc).split())}
    _emit(doc, args, _gd_summary)
    return EXIT_OK


def _gd_summary(doc: dict[str, Any]) -> str:
    """The ``gd`` result for a person: the run, where it stopped, and the direction's agreement."""
    sh = doc["shape"]
    kind = "normalized GD" if doc["normalized"] else "plain GD"
    last = doc["record"][-1] if doc["record"] else None
    lines = [
        f"{kind} ({doc['loss']} loss, lr {doc['lr']:g}) on n={sh['n']} sequences, T={sh['T']} tokens, "
        f"d={sh['d']}: {doc['steps_run']} of {doc['steps']} steps ({doc['stop_reason']})",
        f"  ||W||_F = {doc['norm_fro']:.6g}" + (f"   risk = {last['risk']:.6g}" if last else ""),
        f"  final tokens: {doc['final_tokens']}   saturated: {'yes' if doc['saturated'] else 'no'}",
    ]
    for key, what in (("svm_final_tokens", "the final tokens"), ("svm_alpha", "alpha")):
        if key in doc:
            r = doc[key]
            if "error" in r:
                lines.append(f"  W_mm({what} = {r['alpha']}): not available ({r['error']})")
            else:
                lines.append(
                    f"  direction against W_mm({what} = {r['alpha']}): corr {r['corr']:.9f}, gap {r['gap']:.3g}"
                )
    lines.append(f"  time: {doc['time_s']:.3g} s")
    return "\n".join(lines)


# ------------------------------------------------------------------------- reproduce
def _configure_threads() -> None:
    """One torch thread: the batched GD tensors are small, and on a loaded 2-core machine two
    threads were measured 20× slower than one. ``--jobs`` parallelises over experiments instead."""
    import torch

    torch.set_num_threads(1)


#: Width of the summary table when stdout is not a terminal (wide enough for every experiment's row).
REPORT_TABLE_WIDTH = 160
#: The file a finished report always holds; a folder with it holds another run's report.
RESULTS_FILE = "results.json"


def _report_entry(e: Path) -> bool:
    """Whether ``e`` is part of an earlier run: a file, or the checkpoint folder (of either format) holding
    only files."""
    from .checkpoint import EXPERIMENTS_DIR, LEGACY_EXPERIMENTS_DIR

    if e.is_file():
        return True
    return (
        e.name in (EXPERIMENTS_DIR, LEGACY_EXPERIMENTS_DIR)
        and e.is_dir()
        and all(f.is_file() for f in e.iterdir())
    )


def _prepare_out_dir(out_dir: Path, *, force: bool) -> None:
    """Refuse to mix a new run into a folder holding other files; with ``force``, clear a folder that
    holds an earlier report or an interrupted run (its files and checkpoint folder, nothing else)."""
    from .checkpoint import MANIFEST_FILE

    if not out_dir.exists() or not out_dir.is_dir():
        return
    entries = sorted(out_dir.iterdir())
    if not entries:
        return
    names = ", ".join(e.name for e in entries[:3]) + (", ..." if len(entries) > 3 else "")
    if not force:
        hint = " (an interrupted run: --resume continues it)" if (out_dir / MANIFEST_FILE).is_file() else ""
        raise InputError(
            f"--out {out_dir} already holds {len(entries)} files ({names}){hint}; a new report would mix with "
            "them: choose an empty or new folder, or pass --force to clear an earlier report there"
        )
    marked = (out_dir / RESULTS_FILE).is_file() or (out_dir / MANIFEST_FILE).is_file()
    if not marked or not all(_report_entry(e) for e in entries):
        raise InputError(
            f"--out {out_dir} does not look like an attnsvm report folder (no {RESULTS_FILE} or {MANIFEST_FILE}, "
            "or it holds other folders); --force clears only earlier reports: choose an empty or new folder"
        )
    for e in entries:
        if e.is_dir():  # the checkpoint folder (checked above: files only)
            for f in e.iterdir():
                f.unlink()
            e.rmdir()
        else:
            e.unlink()


def _check_reproduce_options(args: argparse.Namespace) -> None:
    """Refuse (:class:`InputError`) a ``--jobs`` below 1, an unknown ``--scheduler``, ``--resume`` with
    ``--force``, and a ``--device`` other than cpu or cuda (cuda: only where torch has it)."""
    from .distributed import DistributedError, check_scheduler

    if args.jobs < 1:
        raise InputError(f"--jobs must be ≥ 1; got {args.jobs}")
    try:
        check_scheduler(args.scheduler)
    except DistributedError as exc:
        raise InputError(str(exc)) from None
    if args.resume and args.force:
        raise InputError("--resume continues the run in --out and --force clears it: pass one of them")
    if args.device not in ("cpu", "cuda"):
        raise InputError(f"--device must be cpu or cuda; got {args.device!r}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda: CUDA is not available in this torch build; use --device cpu")


def _select_experiments(only: str | None) -> tuple[list[str] | None, list[str]]:
    """The experiments of the run: ``(names, selected)``, ``names`` the ``--only`` list as given (``None``:
    all) and ``selected`` the registered experiments it keeps, in report order (``order``, then name).
    Loads ``$ATTNSVM_EXTRA_EXPERIMENTS`` first; an unknown name in ``--only`` raises :class:`InputError`
    listing the known ones."""
    from . import runner as E

    E.load_extra_experiments()
    names = None
    if only:
        names = [s.strip() for s in only.split(",") if s.strip()]
        unknown = [n for n in names if n not in E.EXPERIMENT_REGISTRY]
        if unknown:
            raise InputError(
                f"--only: unknown experiment {unknown[0]!r}; "
                f"known: {', '.join(sorted(E.EXPERIMENT_REGISTRY))}"
            )
    selected = [s.name for s in sorted(E.EXPERIMENT_REGISTRY.values(), key=lambda s: (s.order, s.name))]
    selected = [n for n in selected if names is None or n in names]
    return names, selected


def _open_run_folder(
    args: argparse.Namespace, out_dir: Path, selected: list[str]
) -> tuple[RunCheckpoint, dict[str, ExperimentResult]]:
    """The run's checkpoint in ``out_dir`` and the experiments it already finished (``--resume`` of an
    interrupted run; otherwise none, after :func:`_prepare_out_dir`). Fails now, not after minutes of
    computing, when ``out_dir`` is not writable or a resumed run has other settings (:class:`InputError`)."""
    from .checkpoint import MANIFEST_FILE, CheckpointError, RunCheckpoint, run_settings

    # Resumable: each finished experiment is saved under --out with a manifest of the run's settings.
    ckpt = RunCheckpoint(
        out_dir, run_settings(size=args.size, seed=args.seed, device=args.device, experiments=selected)
    )
    finished: dict[str, ExperimentResult] = {}
    fresh = not (out_dir.is_dir() and any(out_dir.iterdir()))
    if args.resume and not fresh:
        if not (out_dir / MANIFEST_FILE).is_file():
            raise InputError(
                f"--resume: {out_dir} holds no {MANIFEST_FILE} (not an interrupted attnsvm run); choose the "
                "run's own --out, or an empty folder"
            )
        try:
            finished = ckpt.resume()
        except CheckpointError as exc:
            raise InputError(str(exc)) from None
    else:
        if args.resume:
            print(f"--resume: nothing to resume in {out_dir}; starting a new run", file=sys.stderr)
        _prepare_out_dir(out_dir, force=args.force)
    try:  # fail now, not after minutes of computing
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".attnsvm-write-test"
        probe.write_text("")
        probe.unlink()
        if not finished:
            ckpt.start()
    except OSError as exc:
        raise InputError(f"--out {args.out}: cannot write there ({exc.strerror or exc})") from None
    if finished:
        print(
            f"resuming {out_dir}: {len(finished)} of {len(selected)} experiments already finished "
            f"({', '.join(finished)})",
            file=sys.stderr,
        )
    return ckpt, finished


def _run_with_progress(
    args: argparse.Namespace,
    names: list[str] | None,
    ckpt: RunCheckpoint,
    finished: dict[str, ExperimentResult],
) -> list[ExperimentResult]:
    """Run the experiments not yet ``finished`` (:func:`attnsvm.harness.runner.run_experiments`) with a
    progress bar each on stderr (none with ``--quiet``), saving each result to ``ckpt`` as it arrives (a
    result that cannot be saved is a warning) and printing its status line (not with ``--quiet``)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from . import runner as E
    from .checkpoint import CheckpointError
    from .distributed import DistributedError

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description:<36}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        disable=args.quiet,
    ) as progress:

        def factory(spec: E.ExperimentSpec) -> E.ProgressFn:
            task = progress.add_task(spec.title, total=None)

            def cb(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            return cb

        def save(res: ExperimentResult) -> None:
            try:
                ckpt.save(res)
            except (
                CheckpointError,
                OSError,
            ) as exc:  # e.g. an extra experiment's value of an unstorable type
                progress.console.print(f"warning: {res.name} not saved for --resume ({exc}); the run goes on")
            if args.quiet:
                return
            status = "FAIL" if res.failed else ("not available" if not res.available else "done")
            progress.console.print(f"{res.title}: {status} ({res.elapsed_s:.1f} s)")

        try:
            return E.run_experiments(
                args.size,
                args.seed,
                args.jobs,
                args.device,
                names,
                factory,
                scheduler=args.scheduler,
                finished=finished,
                on_result=save,
            )
        except DistributedError as exc:
            raise InputError(str(exc)) from None


def _report_settings(args: argparse.Namespace, elapsed: float) -> dict[str, Any]:
    """The run's settings as the report records them (size, seed, jobs, scheduler, device, elapsed_s)."""
    return {
        "size": args.size,
        "seed": args.seed,
        "jobs": args.jobs,
        "scheduler": args.scheduler,
        "device": args.device,
        "elapsed_s": round(elapsed, 1),
    }


def _print_summary(
    args: argparse.Namespace, results: list[ExperimentResult], elapsed: float, out_dir: Path
) -> None:
    """The summary table on stdout (one row per experiment; not with ``--quiet``), then where the report is."""
    from rich.console import Console
    from rich.table import Table

    from .report import summary_rows

    table = Table(title=f"attnsvm reproduce ({args.size}, {elapsed:.0f} s) → {out_dir}")
    for col in ("experiment", "status", "checks", "findings", "time (s)"):
        table.add_column(col, no_wrap=True)
    for row in summary_rows(results):
        style = {"FAIL": "bold red", "pass": "green"}.get(row["status"], "dim")
        table.add_row(
            row["title"],
            f"[{style}]{row['status']}[/]",
            row["checks"],
            row["findings"],
            f"{row['time_s']:.1f}",
        )
    # Not a terminal (a pipe, a log file): no width to fit, so never wrap a cell mid-word.
    out = Console() if sys.stdout.isatty() else Console(width=REPORT_TABLE_WIDTH, soft_wrap=True)
    if not args.quiet:
        out.print(table)
    print(f"report: {out_dir / 'report.html'} (and report.md, results.json, PNG and CSV files)")


def _report_failures(results: list[ExperimentResult]) -> int:
    """One ``FAILED experiment/claim`` line on stderr per failed check; the exit code (1 if any, else 0)."""
    from .report import failed_claims

    failed = failed_claims(results)
    for name, c in failed:
        print(f"FAILED {name}/{c.name}: {c.statement} — {c.message}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Run the experiments and write the report.

    The phases: check the options, select the experiments, open the run's folder (new or resumed), run
    the experiments with progress, write the report files, print the summary and the failed checks.
    Returns :data:`EXIT_FAILED` when a check failed, else :data:`EXIT_OK`; bad options raise
    :class:`InputError` before anything is computed.
    """
    _require_for("reproduce")
    from .report import write_report

    _check_reproduce_options(args)
    names, selected = _select_experiments(args.only)
    out_dir = Path(args.out).resolve()
    ckpt, finished = _open_run_folder(args, out_dir, selected)
    _configure_threads()
    t0 = time.perf_counter()
    results = _run_with_progress(args, names, ckpt, finished)
    elapsed = time.perf_counter() - t0
    write_report(results, args.out, _report_settings(args, elapsed))
    _print_summary(args, results, elapsed, out_dir)
    return _report_failures(results)


# ----------------------------------------------------------------------------- check
#: Tolerance of the gradient against central differences in the self-check, relative to
#: max(1, ||∇L||): with h = 1e-6 on O(1) data the truncation error is h²·|L‴|/6 ~ 1e-13 and the
#: rounding error eps·|L|/h ~ 2e-10, so 1e-7 leaves a wide margin and still catches any wrong
#: sign, factor or transpose.
CHECK_FD_RTOL = 1e-7
#: Softmax rows sum to 1 up to T roundings of numbers ≤ 1.
CHECK_SUM_ATOL = 64 * float(np.finfo(np.float64).eps)
#: Solutions are certified to ~1e-9 relative (``svm.CERTIFY_RTOL``); margins are checked to 1e-8.
CHECK_MARGIN_TOL = 1e-8
#: Hypothesis examples per property in ``attnsvm check``.
CHECK_EXAMPLES = 15


def _property_checks(examples: int = CHECK_EXAMPLES) -> list[tuple[str, Any]]:
    """Short Hypothesis properties: ``(name, test function)`` pairs (each raises on failure)."""
    from hypothesis import HealthCheck, given, settings

    from .. import strategies as S
    from ..model._attention import attention
    from ..model._grad import normalized_risk_grad, risk, risk_grad

    cfg = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )

    @cfg
    @given(S.instances_and_weights(scale=(1e-2, 1e3)))
    def softmax_rows_sum_to_one(pair: Any) -> None:
        inst, W = pair
        s = attention(inst, W)
        assert np.all(s >= 0) and np.max(np.abs(s.sum(axis=1) - 1)) <= CHECK_SUM_ATOL

    @cfg
    @given(S.instances_and_weights(scale=(1e-2, 1.0)))
    def gradient_matches_central_differences(pair: Any) -> None:
        inst, W = pair
        g = risk_grad(inst, W)
        h = 1e-6
        fd = np.zeros_like(W)
        for j in range(inst.d):
            for k in range(inst.d):
                E = np.zeros_like(W)
                E[j, k] = h
                fd[j, k] = (risk(inst, W + E) - risk(inst, W - E)) / (2 * h)
        assert np.max(np.abs(g - fd)) <= CHECK_FD_RTOL * max(1.0, float(np.linalg.norm(g)))

    @cfg
    @given(S.instances_and_weights(scale=(1e2, 1e4)))
    def normalized_direction_is_unit_and_finite(pair: Any) -> None:
        inst, W = pair
        try:
            dd = normalized_risk_grad(inst, W)
        except AttnSVMError:
            return  # exactly stationary W (e.g. equal token values): documented, not a failure
        assert np.all(np.isfinite(dd.direction)) and abs(np.linalg.norm(dd.direction) - 1) <= CHECK_SUM_ATOL

    checks: list[tuple[str, Any]] = [
        ("softmax rows sum to one", softmax_rows_sum_to_one),
        ("gradient = central differences", gradient_matches_central_differences),
        ("normalized direction finite at saturation", normalized_direction_is_unit_and_finite),
    ]
    from ..model._tensor import svm_margins
    from ..svm import solve_svm

    @settings(
        max_examples=max(1, examples // 2),
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(S.feasible_instances(n=(1, 3), T=(2, 4)))
    def svm_solution_is_feasible_and_tight(inst: Any) -> None:
        sol = solve_svm(inst)
        m = svm_margins(inst, sol.W, sol.alpha)
        assert np.min(m) >= 1 - CHECK_MARGIN_TOL  # feasible
        assert np.min(m) <= 1 + CHECK_MARGIN_TOL  # optimal: some constraint is active

    checks.append(("Att-SVM solution feasible and tight", svm_solution_is_feasible_and_tight))
    return checks


def run_selfcheck(verbose: bool = True, tiny: bool = False) -> bool:
    """Run the self-check: quick symbolic proofs and short property runs.

    ``tiny`` (for the test suite) proves only the first three quick claims and runs three
    examples per property.
    """
    from rich.console import Console

    from ..identities import CLAIMS, prove_all

    console = Console(stderr=True, quiet=not verbose)
    ok = True
    t0 = time.perf_counter()
    names = [c.name for c in CLAIMS if c.quick][:3] if tiny else None
    for report in prove_all(names=names, quick=True):
        ok &= report.ok
        mark = "[green]proved[/]" if report.ok else "[bold red]FAILED[/]"
        console.print(f"  {mark} {report.name}" + ("" if report.ok else f" — {_proof_failure(report)}"))
    console.print(f"symbolic proofs: {time.perf_counter() - t0:.1f} s")
    for name, fn in _property_checks(3 if tiny else CHECK_EXAMPLES):
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # any failure of a property is reported, not raised
            ok = False
            first = " ".join(str(exc).split())[:300]
            console.print(f"  [bold red]FAILED[/] property {name}: {type(exc).__name__}: {first}")
        else:
            console.print(f"  [green]holds[/] property {name} ({time.perf_counter() - t0:.1f} s)")
    console.print("[green]self-check passed[/]" if ok else "[bold red]self-check FAILED[/]")
    return ok


def _proof_failure(report: ClaimReport) -> str:
    """Why a claim failed: the proof's failing step and residual, and/or the code check's error."""
    parts = []
    if not report.proof.proved:
        parts.append(f"{report.proof.failed}: residual {report.proof.residual}")
    if report.code is not None and not report.code.ok:
        parts.append(f"code check: error {report.code.max_error:.3g} > tolerance {report.code.tolerance:.3g}")
    return "; ".join(parts)


def cmd_check(args: argparse.Namespace) -> int:
    """Fast self-check; exit 0 when every part passes."""
    _require_for("check")
    ok = run_selfcheck(verbose=not args.quiet, tiny=args.tiny)
    return EXIT_OK if ok else EXIT_FAILED


# ----------------------------------------------------------------------------- bench
def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmarks side by side; exit 1 when a measured target (:data:`attnsvm.harness.bench.TARGETS`) is
    missed (each is measured only at its own size, so ``--quick`` checks none)."""
    _require_for("bench")
    from .bench import run_benchmarks

    t0 = time.perf_counter()
    doc = run_benchmarks(quick=args.quick, only=args.only, tiny=args.tiny)
    doc["elapsed_s"] = time.perf_counter() - t0
    if args.json:
        _write_json(doc, args.json)
    missed = [t for t in doc["targets"] if not t["met"]]
    for t in missed:
        print(
            f"attnsvm bench: missed target: {t['what']} {t['target']} (measured {t['value']:.3g})",
            file=sys.stderr,
        )
    return EXIT_FAILED if missed else EXIT_OK


# ------------------------------------------------------------------------------ main
def _positive_float(text: str) -> float:
    try:
        val = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(val) or val <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive finite number; got {text!r}")
    return val


def _positive_int(text: str) -> int:
    try:
        val = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if val < 1:
        raise argparse.ArgumentTypeError(f"must be an integer ≥ 1; got {text!r}")
    return val


#: What ``svm`` and ``gd`` read from a ``.npz`` file (numpy.savez(path, X=X, Y=Y, v=v, ...)).
NPZ_HELP = """\
DATA.npz holds (numpy.savez(path, X=X, Y=Y, v=v[, z=z, alpha=alpha])):
  X      (n, T, d)  float   tokens x_it of n sequences of T tokens
  Y      (n,)       ±1      labels
  v      (d,)       float   the fixed head: token score Y_i·vᵀx_it
  z      (n, d)     float   optional queries z_i (default: self-attention, z_i = x_i0, the first token)
  alpha  (n,)       int     optional selected token per sequence (0-based)
Any finite magnitudes: the solution is computed on exactly rescaled data, and a result outside the
double range is refused with a one-line error (exit 2)."""

#: ``gd``'s defaults: the step size of the report's normalized-GD convergence experiment (η = 0.1), and
#: enough steps for its direction to settle on small instances; both are options.
GD_DEFAULT_STEPS = 1000
GD_DEFAULT_LR = 0.1


def _join_negative_option_values(argv: list[str]) -> list[str]:
    """``--alpha -1,0,0`` → ``--alpha=-1,0,0``: argparse takes a value that starts with ``-`` (and is not a
    plain negative number) for an option, so a negative index would never reach the range check."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--alpha" and i + 1 < len(argv) and argv[i + 1].startswith("-") and argv[i + 1] != "-":
            out.append(f"--alpha={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


class _Parser(argparse.ArgumentParser):
    """argparse with exit code 2 and a one-line message on errors (its default, made explicit)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _experiment_names() -> str:
    """The experiment names for ``reproduce --help``, or the extra that brings them (the core lacks it)."""
    try:
        from .runner import EXPERIMENT_REGISTRY
    except MissingDependencyError:
        return "listed once `attnsvm[all]` is installed"
    return ", ".join(sorted(EXPERIMENT_REGISTRY))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``attnsvm`` command."""
    p = _Parser(prog="attnsvm", description="attnsvm: attention as a max-margin token selector — checked.")
    from .. import __version__

    p.add_argument("--version", action="version", version=f"attnsvm {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("reproduce", help="run the experiments and write the verification report")
    r.add_argument("--out", default="attnsvm-report", help="output directory (default: ./attnsvm-report)")
    # "tiny" (seconds) exists for the test suite and is not advertised.
    r.add_argument(
        "--size",
        default="small",
        choices=("small", "paper", "tiny"),
        metavar="{small,paper}",
        help="default: small",
    )
    r.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    r.add_argument(
        "--jobs", type=int, default=1, help="experiments run in this many worker processes (default 1)"
    )
    r.add_argument("--device", default="cpu", help="cpu or cuda, for the batched GD engine (default cpu)")
    r.add_argument(
        "--only",
        default=None,
        help="comma-separated experiments to run (default: all): " + _experiment_names(),
    )
    r.add_argument("--quiet", action="store_true", help="no progress bars or summary table")
    r.add_argument(
        "--scheduler",
        default="local",
        metavar="{local,dask,tcp://HOST:PORT}",
        help="where the experiments run: local (this process, or --jobs worker processes), dask (a Dask "
        "LocalCluster of --jobs processes) or tcp://HOST:PORT (an existing Dask scheduler); the results are "
        "the same (default: local; dask needs pip install 'attnsvm[distributed]')",
    )
    r.add_argument(
        "--force",
        action="store_true",
        help="clear an earlier report or interrupted run in --out first (default: refuse a folder that is "
        "not empty)",
    )
    r.add_argument(
        "--resume",
        action="store_true",
        help="continue the interrupted run in --out: experiments it finished are not run again (its "
        "size, seed, device, experiments and attnsvm version must be the ones given now)",
    )
    r.set_defaults(func=cmd_reproduce)

    c = sub.add_parser("check", help="fast self-check of the installed package (exit 0/1)")
    c.add_argument("--quiet", action="store_true", help="print nothing; the exit status tells")
    c.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # for the test suite
    c.set_defaults(func=cmd_check)

    b = sub.add_parser("bench", help="SVM and GD benchmarks, ratios measured side by side")
    b.add_argument("--quick", action="store_true", help="small sizes, seconds")
    b.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    b.add_argument("--only", default=None, choices=("svm", "gd"), help="run one group")
    b.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # for the test suite
    b.set_defaults(func=cmd_bench)

    s = sub.add_parser(
        "svm",
        help="solve Att-SVM(α) for X, Y, v[, z, alpha] in a .npz file",
        description="Solve the attention SVM  min ||W|| s.t. (x_iα_i − x_it)ᵀ W z_i ≥ 1 for all t ≠ α_i, "
        "certify the solution (KKT residuals) and, for the Frobenius norm, check local optimality.",
        epilog=NPZ_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("data", metavar="DATA.npz", help="the arrays (see below)")
    s.add_argument(
        "--alpha",
        default=None,
        metavar="I,J,...",
        help="selected token index of each sequence, comma-separated (default: the npz's alpha, else "
        "opt_i = argmax_t Y_i·vᵀx_it)",
    )
    s.add_argument(
        "--norm", default="fro", choices=("fro", "nuc"), help="Frobenius or nuclear norm (default: fro)"
    )
    s.add_argument(
        "--method",
        default="auto",
        choices=("auto", "primal", "vector", "dual"),
        help="solver: exact dual core (dual), conic programs (primal, vector), auto picks (default: auto)",
    )
    s.add_argument("--json", action="store_true", help="print the full result as JSON instead of a summary")
    s.add_argument(
        "--out", default=None, metavar="FILE", help="also write the full result as JSON to FILE ('-': stdout)"
    )
    s.set_defaults(func=cmd_svm)

    g = sub.add_parser(
        "gd",
        help="run (normalized) GD on X, Y, v[, z] in a .npz file",
        description="Run gradient descent on the attention weights W from W = 0 and report the direction "
        "it reaches (optionally against the Att-SVM solution).",
        epilog=NPZ_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("data", metavar="DATA.npz", help="the arrays (see below)")
    g.add_argument(
        "--steps",
        type=_positive_int,
        default=GD_DEFAULT_STEPS,
        help=f"GD steps (default: {GD_DEFAULT_STEPS})",
    )
    g.add_argument(
        "--lr", type=_positive_float, default=GD_DEFAULT_LR, help=f"step size η (default: {GD_DEFAULT_LR})"
    )
    g.add_argument(
        "--loss",
        default="logistic",
        choices=("logistic", "exponential", "correlation"),
        help="loss ℓ of Y·f (default: logistic)",
    )
    g.add_argument(
        "--plain",
        action="store_true",
        help="plain GD W ← W − η∇L instead of normalized GD W ← W − η∇L/||∇L||",
    )
    g.add_argument(
        "--alpha",
        default=None,
        metavar="I,J,...",
        help="with --svm: compare with W_mm(alpha) (default: the npz's alpha, else the run's final tokens)",
    )
    g.add_argument("--svm", action="store_true", help="also report the direction's agreement with W_mm")
    g.add_argument("--json", action="store_true", help="print the full result as JSON instead of a summary")
    g.add_argument(
        "--out", default=None, metavar="FILE", help="also write the full result as JSON to FILE ('-': stdout)"
    )
    g.set_defaults(func=cmd_gd)
    return p


#: BLAS thread variables. Multi-threaded BLAS on the small dense systems of the SVM solvers was
#: measured 100× slower on a loaded 2-core machine (dual Att-SVM at d = 64: 116 ms against
#: 0.9 ms single-threaded), so the command runs BLAS single-threaded unless the user set one.
BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_REEXEC_MARK = "ATTNSVM_CLI_REEXEC"


def _reexec_env(argv: list[str]) -> dict[str, str]:
    """The variables the command must re-execute with (empty: none); a user's setting always wins."""
    env: dict[str, str] = {}
    if not any(v in os.environ for v in BLAS_THREAD_VARS):
        env.update({v: "1" for v in BLAS_THREAD_VARS})
    return env


def _reexec_with_env() -> None:
    """Re-run the command once with the variables of :func:`_reexec_env` set, if any are missing.

    BLAS and OpenMP read these variables when they are loaded, which happened when ``attnsvm``
    imported NumPy and torch, so the process re-executes itself once (``os.execve``) with them
    set. Only for command-line use (``main()`` without ``argv``); a user's setting always wins.
    """
    if os.environ.get(_REEXEC_MARK):
        return
    updates = _reexec_env(sys.argv[1:])
    if not updates:
        return
    env = dict(os.environ)
    env.update(updates)
    env[_REEXEC_MARK] = "1"
    try:
        os.execve(sys.executable, [sys.executable, "-m", "attnsvm.harness.cli", *sys.argv[1:]], env)
    except OSError:  # cannot re-execute (unusual platform): run as is
        return


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``attnsvm`` console script; returns the exit code.

    Args:
      argv: the arguments (without the program name); ``None`` means ``sys.argv[1:]``, and then
        BLAS is made single-threaded first (see :data:`BLAS_THREAD_VARS`).
    """
    if argv is None:
        _reexec_with_env()
    parser = build_parser()
    args = parser.parse_args(_join_negative_option_values(sys.argv[1:] if argv is None else list(argv)))
    try:
        return int(args.func(args))
    except InputError as exc:
        print(f"attnsvm {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AttnSVMError as exc:
        msg = " ".join(str(exc).split())
        print(f"attnsvm {args.command}: error: {type(exc).__name__}: {msg}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"attnsvm {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
