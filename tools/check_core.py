"""Check the core install: ``pip install attnsvm`` (numpy and scipy only) imports and solves.

Run by ``tox -e core`` (in the default env list, hence CI) in an environment holding attnsvm without
extras. It fails unless that environment really is core-only, the core computes what it promises, and
each feature of an extra refuses with :class:`attnsvm.MissingDependencyError` naming its extra.

Oracles: the Att-SVM solution is checked from scratch against its definition (every margin
``(x_iα − x_it)ᵀ W z_i ≥ 1`` and a dual certificate: ``vec(W) = Σ λ_r a_r`` with ``λ ≥ 0`` supported on
constraints that are tight), not against the solver's own report.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

OPTIONAL = ("torch", "cvxpy", "sympy", "mpmath", "hypothesis", "matplotlib", "rich", "sklearn", "dask")
#: Margin and certificate tolerance: the exact dual core certifies to ~1e-12 relative at this size
#: (KKT ≤ 1e-9 is the package's contract); 1e-9 leaves that contract as the bar.
TOL = 1e-9


def main() -> int:
    present = [m for m in OPTIONAL if importlib.util.find_spec(m) is not None]
    if present:
        print(f"not a core-only environment: {present} installed", file=sys.stderr)
        return 1

    import numpy as np

    import attnsvm as A

    loaded = sorted({m.partition(".")[0] for m in sys.modules} & set(OPTIONAL))
    assert not loaded, f"`import attnsvm` imported optional packages {loaded}"

    inst = A.random_instance(6, 5, 4, seed=3)
    sol = A.solve_svm(inst)  # method "auto" → the exact dual core
    rows = A.svm_rows(inst, sol.alpha)
    w = A.vec(sol.W)
    margins = rows @ w
    assert margins.min() >= 1 - TOL, f"a margin is below 1: {margins.min()!r}"
    lam = np.asarray(sol.duals)
    assert lam.min() >= 0, "negative multiplier"
    assert np.abs(rows.T @ lam - w).max() <= TOL * np.abs(w).max(), "vec(W) ≠ Σ λ_r a_r"
    assert np.all((lam <= TOL * lam.max()) | (np.abs(margins - 1) <= TOL)), "a multiplier on a slack row"

    traj = A.run_gd(inst, 200, 0.1)
    assert np.isfinite(traj.W).all() and A.risk(inst, traj.W) < A.risk(inst, np.zeros_like(traj.W))

    refusals = {
        "torch": lambda: A.run_gd_batch([inst], 2, 0.1),
        "cvxpy": lambda: A.solve_svm(inst, method="primal"),
    }
    for extra, call in refusals.items():
        try:
            call()
        except A.MissingDependencyError as exc:
            assert f"attnsvm[{extra}]" in str(exc), str(exc)
        else:
            raise AssertionError(f"{extra} feature ran without {extra}")

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "inst.npz"
        np.savez(path, X=inst.X, Y=inst.Y, v=inst.v, z=inst.z)
        out = subprocess.run(
            [sys.executable, "-m", "attnsvm.harness.cli", "svm", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 0 and "certified: yes" in out.stdout, out.stdout + out.stderr
        out = subprocess.run(
            [sys.executable, "-m", "attnsvm.harness.cli", "reproduce"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 2 and "attnsvm[report]" in out.stderr, out.stderr

    print(
        f"core-only install: numpy {np.__version__}; dual Att-SVM certified (min margin {margins.min():.12f}), "
        "run_gd, `attnsvm svm`; torch and cvxpy features refuse naming their extra"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
