"""The Att-SVM rows of ``attnsvm bench``: the dual against the cvxpy programs, and the scale rows (the
working set, the dense dual and scikit-learn's LinearSVC, each in a fresh process for its memory peak).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from ._timing import _times

N, T = 6, 8
SVM_FULL = {"primal": (32, 128, 256), "vector": (32, 128), "dual": (32, 128, 256, 512, 1024)}
SVM_QUICK = {"primal": (32,), "vector": (32,), "dual": (32, 128, 1024)}
SVM_TINY = {"primal": (8,), "vector": (8,), "dual": (8, 16)}  # the test suite's size
#: Never run the cvxpy programs above this dimension (minutes, gigabytes).
MAX_CONIC_D = 256


# ------------------------------------------------------------------------------------ SVM
def bench_svm(
    quick: bool = False, seed: int = 0, repeats: int = 5, tiny: bool = False
) -> list[dict[str, Any]]:
    """Time the Att-SVM methods side by side; one row per ``(method, d)``.

    Keys: ``bench`` (``"svm"``), ``method``, ``n``, ``T``, ``d``, ``time_s`` (median wall time:
    over ``repeats`` calls after a warm-up for the dual, one call for a conic program),
    ``time_range_s`` (``[min, max]``), ``runs``, ``solver_time_s`` (conic solver only),
    ``raw_rel_error`` (conic answer against the certified dual ``W``; ``None`` for the dual),
    ``rel_error`` (final answer against it, ``||W − W_dual||_F / ||W_dual||_F``), ``certified``,
    ``error_bound``, ``time_over_dual`` (method time / median dual time at the same ``d``).
    """
    from ...model._instance import random_instance
    from ...svm import solve_svm

    dims = SVM_TINY if tiny else SVM_QUICK if quick else SVM_FULL
    rows: list[dict[str, Any]] = []

    def row(method: str, d: int, times: list[float], sol: Any, dual: Any, t_dual: float) -> dict[str, Any]:
        t = float(np.median(times))
        return {
            "bench": "svm",
            "method": method,
            "n": N,
            "T": T,
            "d": d,
            "time_s": t,
            "time_range_s": [min(times), max(times)],
            "runs": len(times),
            "solver_time_s": sol.timings.get("solver") if method != "dual" else None,
            "raw_rel_error": sol.raw_rel_error if method != "dual" else None,
            "rel_error": float(np.linalg.norm(sol.W - dual.W) / np.linalg.norm(dual.W)),
            "certified": bool(sol.certified),
            "error_bound": sol.error_bound,
            "time_over_dual": t / t_dual,
        }

    for d in sorted(set(dims["dual"]) | set(dims["primal"]) | set(dims["vector"])):
        inst = random_instance(N, T, d, seed=seed + d)
        dual = solve_svm(inst, method="dual")  # warm-up and reference
        t_duals = _times(lambda: solve_svm(inst, method="dual"), repeats)  # noqa: B023 - called at once
        t_dual = float(np.median(t_duals))
        if d in dims["dual"]:
            rows.append(row("dual", d, t_duals, dual, dual, t_dual))
        for method in ("primal", "vector"):
            if d not in dims[method] or d > MAX_CONIC_D:
                continue
            t0 = time.perf_counter()
            sol = solve_svm(inst, method=method)
            rows.append(row(method, d, [time.perf_counter() - t0], sol, dual, t_dual))
    return rows


# ------------------------------------------------------------------------ SVM at scale
#: Scale rows (issue 16 §1): ``(n, T, d)`` of gaussian instances, ``m = n(T − 1)`` constraints.
SVM_SCALE_SIZES = {
    "full": ((64, 32, 64), (256, 32, 128), (1024, 32, 128)),  # m = 1984, 7936, 31744
    "quick": ((16, 31, 32), (64, 32, 64)),  # m = 480, 1984
    "tiny": ((6, 8, 8),),  # m = 42 (the test suite's size)
}
#: The dense dual is run beside the working set only up to this many constraints (issue 16 measured it
#: at 10.9 s for m = 1984, 117 s for m = 3968 and 545 s for m = 7936 on this machine).
SVM_SCALE_DENSE_MAX_M = {"full": 1984, "quick": 480, "tiny": 42}
#: sklearn's LinearSVC needs the explicit tensor-trick features, ``m × d²`` doubles (liblinear keeps a
#: second copy, about as large): run only while the features take at most this many bytes
#: (m = 7936, d = 128: 1.0 GiB runs; m = 31744, d = 128: 4.2 GB does not).
SKLEARN_MAX_FEATURE_BYTES = 2**31


def _rss_mib(field: str) -> float | None:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last :func:`_reset_peak_rss`) of this process, MiB, from
    ``/proc/self/status``; where that is missing, the lifetime peak ``ru_maxrss`` (``None`` without it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return float(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    import sys

    rss = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


def _reset_peak_rss() -> None:
    """Reset the peak resident set size (Linux ≥ 4.0: ``5`` to ``/proc/self/clear_refs``); else a no-op."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        pass


def _sklearn_linearsvc(inst: Any, C: float) -> tuple[Any, int]:
    """``LinearSVC(dual=True, loss="hinge", fit_intercept=False, C)`` on the explicit rows ``a_r = z_i ⊗ Δ_it``.

    LinearSVC needs two classes: row ``r`` enters as ``(y_r a_r, y_r)`` with ``y_r = ±1`` alternating, and
    ``y_r·wᵀ(y_r a_r) = wᵀa_r``, so the constraints are exactly ``wᵀa_r ≥ 1``. Returns ``W`` (column-major
    unvec of ``coef_``) and the number of liblinear iterations.
    """
    from sklearn.svm import LinearSVC

    from ...model._tensor import svm_rows

    rows = svm_rows(inst)
    y = np.where(np.arange(rows.shape[0]) % 2 == 0, 1.0, -1.0)
    rows *= y[:, None]
    clf = LinearSVC(dual=True, C=C, loss="hinge", fit_intercept=False, max_iter=100_000)
    clf.fit(rows, y)
    return np.asarray(clf.coef_).reshape((inst.d, inst.d), order="F"), int(np.max(clf.n_iter_))


def _scale_child(method: str, n: int, T: int, d: int, seed: int, C: float, w_path: str) -> dict[str, Any]:
    """One scale measurement, meant to run in a fresh process (:func:`_measure`): time and peak memory of
    one solve, ``W`` saved to ``w_path``. Memory: the peak resident set size during the solve (its high-water
    mark reset just before) minus the resident set before it: everything the solve allocates, C libraries
    included, over the process after imports and set-up."""
    from ...model._instance import random_instance
    from ...svm import solve_svm
    from ...svm._working_set import solve_svm_working_set

    inst = random_instance(n, T, d, seed=seed)
    out: dict[str, Any] = {}
    if method == "sklearn-linearsvc":
        import sklearn.svm  # noqa: F401 - imported before the timing

        def run() -> Any:
            W, iters = _sklearn_linearsvc(inst, C)
            out["iterations"] = iters
            return W
    else:
        solver = solve_svm_working_set if method == "working-set" else solve_svm
        kw: dict[str, Any] = {} if method == "working-set" else {"method": "dual"}
        solver(random_instance(3, 3, 4), **kw)  # warm-up: imports, first BLAS calls

        def run() -> Any:
            sol = solver(inst, **kw)
            out.update(
                certified=bool(sol.certified),
                error_bound=float(sol.error_bound),
                kkt_max=None if sol.kkt is None else float(sol.kkt.max()),
                support=len(sol.support),
                max_dual=None if sol.duals is None else float(np.max(sol.duals)),
                solver=sol.solver,
            )
            return sol.W

    _reset_peak_rss()
    rss0 = _rss_mib("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    W = run()
    out["time_s"] = time.perf_counter() - t0
    out["cpu_s"] = time.process_time() - c0  # below time_s when other processes share the cores
    rss1 = _rss_mib("VmHWM")
    out["peak_mib"] = None if rss0 is None or rss1 is None else max(0.0, rss1 - rss0)
    np.save(w_path, W)
    return out


def _measure(
    method: str, shape: tuple[int, int, int], seed: int, C: float = 0.0
) -> tuple[dict[str, Any], Any]:
    """Run :func:`_scale_child` in a fresh Python process (its memory peak is its own; the parent's heap and
    earlier rows do not count); returns its dict and ``W``. The child inherits the environment (BLAS threads)."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        w_path = os.path.join(tmp, "W.npy")
        code = (
            "import json, sys; from attnsvm.harness.bench._svm import _scale_child; "
            "print(json.dumps(_scale_child(*json.loads(sys.argv[1]))))"
        )
        args = json.dumps([method, *shape, seed, C, w_path])
        proc = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"bench child ({method}, {shape}) failed:\n{proc.stderr[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1]), np.load(w_path)


def bench_svm_scale(size: str = "full", seed: int = 0) -> list[dict[str, Any]]:
    """The working-set Att-SVM at scale, beside the dense dual and sklearn's LinearSVC; one row per
    ``(method, m)``, each solve run once, each in a fresh process (:func:`_measure`).

    Keys: ``bench`` (``"svm_scale"``), ``method`` (``"working-set"``, ``"dense-dual"``,
    ``"sklearn-linearsvc"``), ``n``, ``T``, ``d``, ``m``, ``time_s`` (``None`` when not run), ``peak_mib``
    (growth of the process's peak resident memory during the solve), ``certified``, ``error_bound``,
    ``kkt_max``, ``support``, ``rel_error`` (``||W − W_ws||_F/||W_ws||_F`` against the certified
    working-set answer; ``None`` for it), ``note`` (why a row was not run; the solver's rounds; sklearn's
    settings).

    sklearn runs with ``C = 10·max λ`` (the certified multipliers at the data's scale): the soft-margin
    dual's box ``λ ≤ C`` is then inactive, so its exact optimum *is* ``W_mm``, and its error is
    liblinear's own (``tol = 1e-4``).
    """
    rows: list[dict[str, Any]] = []

    def row(method: str, shape: tuple[int, int, int], **kw: Any) -> dict[str, Any]:
        n, T, d = shape
        out = {"bench": "svm_scale", "method": method, "n": n, "T": T, "d": d, "m": n * (T - 1)}
        out.update(
            {
                k: None
                for k in ("time_s", "cpu_s", "peak_mib", "certified", "error_bound", "kkt_max", "support")
            }
        )
        out.update({"rel_error": None, "note": ""})
        out.update(kw)
        return out

    def measured(r: dict[str, Any]) -> dict[str, Any]:
        keys = ("time_s", "cpu_s", "peak_mib", "certified", "error_bound", "kkt_max", "support")
        return {k: r.get(k) for k in keys}

    for shape in SVM_SCALE_SIZES[size]:
        n, T, d = shape
        m = n * (T - 1)
        ws, W_ws = _measure("working-set", shape, seed)
        rows.append(row("working-set", shape, **measured(ws), note=ws["solver"].split("(", 1)[1].rstrip(")")))

        def err(W: Any) -> float:
            return float(np.linalg.norm(W - W_ws) / np.linalg.norm(W_ws))  # noqa: B023 - called at once

        if m <= SVM_SCALE_DENSE_MAX_M[size]:
            dense, W = _measure("dense-dual", shape, seed)
            note = f"solve_svm(method='dual'), run up to m = {SVM_SCALE_DENSE_MAX_M[size]}"
            rows.append(row("dense-dual", shape, **measured(dense), rel_error=err(W), note=note))
        else:
            note = f"not run: m > {SVM_SCALE_DENSE_MAX_M[size]} (issue 16: 117 s at m=3968, 545 s at m=7936)"
            rows.append(row("dense-dual", shape, note=note))
        feature_bytes = 8 * m * d * d
        try:
            import sklearn.svm  # noqa: F401 - only whether it is there
        except ImportError:
            rows.append(row("sklearn-linearsvc", shape, note="not installed (pip install scikit-learn)"))
            continue
        if feature_bytes > SKLEARN_MAX_FEATURE_BYTES or ws["max_dual"] is None:
            why = f"features m*d^2 = {feature_bytes / 1e9:.2g} GB > {SKLEARN_MAX_FEATURE_BYTES / 2**30:g} GiB"
            rows.append(row("sklearn-linearsvc", shape, note=f"not run: {why}"))
            continue
        C = 10.0 * float(ws["max_dual"])
        sk, W = _measure("sklearn-linearsvc", shape, seed, C)
        note = f"dual=True, hinge, C=10*max(lambda)={C:.3g}, tol=1e-4, {sk['iterations']} iterations"
        rows.append(
            row(
                "sklearn-linearsvc",
                shape,
                time_s=sk["time_s"],
                cpu_s=sk["cpu_s"],
                peak_mib=sk["peak_mib"],
                rel_error=err(W),
                note=note,
            )
        )
    return rows
