"""The peer papers' published toy examples, as named instances, and the data for their figures.

* :func:`prompt_toy` — one input, prompt model, ``W = diag(1, 1, 0)``, ``v = (0, 0, 1)``, tokens
  ``(−0.1, 1, 1)``, ``(1, 0, 0.9)``, ``(0, 0, c)``, ``c ∈ {0.9, 0}`` (:data:`PROMPT_TOY_C`): the
  second token is a locally optimal choice only when ``c = 0``; GD from ``p₀ = (0, y, 0)``,
  ``y ∈`` :data:`PROMPT_TOY_Y0`, normalized, lr 0.1, 1000 steps (Tarzanagh, Li, Zhang, Oymak,
  arXiv 2306.13596).
* :func:`global_toy` — three inputs of seven tokens in ℝ³ sharing one optimal token (score 1;
  every other token scores 0.5), the condition under which GD converges to the global
  ``W_mm`` (Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898). The published figure's
  coordinates are not reproduced here: this instance is *built to that description* (shared
  optimal token ``(0, 0, 1)``, the others ``(0.8 cos θ, 0.8 sin θ, 0.5)`` at distinct angles,
  unit queries in general position, labels +1).
* :func:`joint_toy` — joint ``(v, p)``: ``X_i = [(0, 0), x_i]``, ``x = (1, 1), (1, −1), (0.5, c)``,
  ``c ∈ {1, 1.5}`` (:data:`JOINT_TOY_C`), labels ``(1, −1, 1)``, ``W = I``; the selected token is
  ``x_i`` (index 1). The initial head :data:`JOINT_TOY_V0` is this package's choice.
* :func:`lp_toy` — the ``unit`` family with ``n = 6, T = 8, d = 10`` for ℓp mirror descent,
  ``p ∈`` :data:`LP_TOY_P` (Julistiono, Tarzanagh, Azizan, arXiv 2410.14581).

:func:`toy_figures_data` runs them all and returns plain arrays for the figures of
``attnsvm reproduce``.

References: arXiv 2306.13596, 2308.16898, 2410.14581.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._types import FloatArray
from ..errors import AttnSVMError
from ..gd import default_record_steps, direction_corr, run_gd
from ..model._instance import Instance, random_instance
from ..svm import solve_svm
from ._joint import run_joint_gd, solve_joint_svm
from ._mirror import bregman_divergence, run_mirror_descent, solve_lp_svm
from ._prompt import run_prompt_gd, solve_prompt_svm

__all__ = [
    "PROMPT_TOY_C",
    "PROMPT_TOY_Y0",
    "PROMPT_TOY_STEPS",
    "PROMPT_TOY_LR",
    "JOINT_TOY_C",
    "JOINT_TOY_V0",
    "JOINT_TOY_ALPHA",
    "LP_TOY_P",
    "prompt_toy",
    "global_toy",
    "joint_toy",
    "lp_toy",
    "toy_figures_data",
]


PROMPT_TOY_C = (0.9, 0.0)
PROMPT_TOY_Y0 = (1.0, 0.5, 0.0, -0.5, -1.0, -1.5)
PROMPT_TOY_STEPS = 1000
PROMPT_TOY_LR = 0.1
JOINT_TOY_C = (1.0, 1.5)
#: Initial head of the joint toy (our choice; small, not parallel to ``v_mm = (0, 1)``).
JOINT_TOY_V0 = (0.05, 0.1)
#: Selected token of every input of the joint toy: ``x_i`` (the zero token is index 0).
JOINT_TOY_ALPHA = (1, 1, 1)
LP_TOY_P = (1.75, 2.0, 3.0)


def prompt_toy(c: float) -> tuple[Instance, FloatArray]:
    """The single-input prompt example: ``(inst, W)`` with tokens ``(−0.1,1,1), (1,0,0.9), (0,0,c)``.

    ``W = diag(1, 1, 0)``, ``v = (0, 0, 1)``, ``Y = (1,)``. Scores ``γ = (1, 0.9, c)``.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (toy figure).
    """
    c = float(c)
    if not np.isfinite(c):
        raise AttnSVMError(f"c must be finite; got {c!r}")
    X = np.array([[[-0.1, 1.0, 1.0], [1.0, 0.0, 0.9], [0.0, 0.0, c]]])
    return Instance(X, np.array([1.0]), np.array([0.0, 0.0, 1.0])), np.diag([1.0, 1.0, 0.0])


def global_toy() -> Instance:
    """Three inputs of seven tokens in ℝ³, one shared optimal token (score 1), all others 0.5.

    Token 0 of every input is ``(0, 0, 1)``; token ``t ≥ 1`` of input ``i`` is
    ``(0.8 cos θ_it, 0.8 sin θ_it, 0.5)`` with ``θ_it = 2π(t−1)/6 + 0.3 i``; queries
    ``z_i = (cos φ_i, sin φ_i, 1)/√2``, ``φ_i = 2π i/3``; ``v = (0, 0, 1)``; ``Y = 1``.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (global convergence when
    the non-optimal tokens share one score).
    """
    n, T = 3, 7
    X = np.zeros((n, T, 3))
    X[:, 0] = (0.0, 0.0, 1.0)
    for i in range(n):
        th = 2 * np.pi * np.arange(T - 1) / (T - 1) + 0.3 * i
        X[i, 1:, 0], X[i, 1:, 1], X[i, 1:, 2] = 0.8 * np.cos(th), 0.8 * np.sin(th), 0.5
    phi = 2 * np.pi * np.arange(n) / n
    z = np.stack([np.cos(phi), np.sin(phi), np.ones(n)], axis=1) / np.sqrt(2.0)
    return Instance(X, np.ones(n), np.array([0.0, 0.0, 1.0]), z)


def joint_toy(c: float) -> tuple[Instance, FloatArray]:
    """The joint ``(v, p)`` example: ``(inst, W = I)`` with ``X_i = [(0,0), x_i]``.

    ``x = (1, 1), (1, −1), (0.5, c)``, ``Y = (1, −1, 1)``, ``inst.v =`` :data:`JOINT_TOY_V0`
    (the initial head). The v-SVM solution is ``(0, 1)``; the third input is a support input
    (margin ``c``) exactly when ``c = 1``.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (joint training toy).
    """
    c = float(c)
    if not np.isfinite(c):
        raise AttnSVMError(f"c must be finite; got {c!r}")
    X = np.zeros((3, 2, 2))
    X[:, 1] = [(1.0, 1.0), (1.0, -1.0), (0.5, c)]
    return Instance(X, np.array([1.0, -1.0, 1.0]), np.array(JOINT_TOY_V0)), np.eye(2)


def lp_toy(seed: int = 0) -> Instance:
    """``random_instance(6, 8, 10, seed=seed, family="unit")``, the ℓp mirror-descent runs' data.

    References: Julistiono, Tarzanagh, Azizan, arXiv 2410.14581.
    """
    return random_instance(6, 8, 10, seed=seed, family="unit")


def _records(steps: int, points: int = 20) -> NDArray[np.int64]:
    return default_record_steps(steps, points)


def toy_figures_data(
    *,
    prompt_steps: int = PROMPT_TOY_STEPS,
    global_steps: int = 1000,
    joint_steps: int = 2000,
    lp_steps: int = 2000,
    lp_seed: int = 0,
) -> dict[str, Any]:
    """Run every toy and return the data of its figure (plain floats, lists and arrays).

    Keys:

    * ``"prompt"``: for each ``c`` in :data:`PROMPT_TOY_C` (key ``f"c={c}"``): ``p_mm`` for each
      token choice that is feasible (``"p_mm"``: ``{alpha: p}``), the local-optimality flags, and
      for each ``y0``: the normalized trajectory ``p_t/||p_t||`` (first two coordinates, shape
      ``(k, 2)``), the final token and ``corr(p_T, p_mm(final token))``.
    * ``"global"``: steps, ``corr(W_t, W_mm)`` with the optimal tokens, final tokens.
    * ``"joint"``: for each ``c`` in :data:`JOINT_TOY_C`: ``v_mm``, ``p_relax``, ``S``, steps,
      ``corr(v_t, v_mm)``, ``corr(p_t, p_relax)``.
    * ``"lp"``: for each ``p`` in :data:`LP_TOY_P`: steps, Bregman divergence to the ℓp-SVM of
      each ``p'`` in :data:`LP_TOY_P` (at the final selected tokens) along the run.

    References: arXiv 2306.13596, 2308.16898, 2410.14581.
    """
    out: dict[str, Any] = {"prompt": {}, "global": {}, "joint": {}, "lp": {}}
    # --- prompt toy
    from ._prompt import prompt_local_optimality

    for c in PROMPT_TOY_C:
        inst, W = prompt_toy(c)
        entry: dict[str, Any] = {"p_mm": {}, "locally_optimal": {}, "runs": {}}
        for a in range(inst.T):
            entry["p_mm"][a] = solve_prompt_svm(inst, W, [a]).p
            entry["locally_optimal"][a] = prompt_local_optimality(inst, W, [a])
        at = _records(prompt_steps)
        for y in PROMPT_TOY_Y0:
            tr = run_prompt_gd(
                inst, W, prompt_steps, PROMPT_TOY_LR, p0=[0.0, y, 0.0], record_at=at, keep_iterates=True
            )
            dirs = np.array([r.p[:2] / np.linalg.norm(r.p) for r in tr.record if r.p is not None])
            tok = int(tr.final_tokens[0])
            pm = entry["p_mm"][tok]
            entry["runs"][y] = {
                "steps": at,
                "direction": dirs,
                "final_token": tok,
                "corr": float(np.dot(tr.p, pm) / (np.linalg.norm(tr.p) * np.linalg.norm(pm))),
            }
        out["prompt"][f"c={c}"] = entry
    # --- global-convergence toy
    g = global_toy()
    W_mm = solve_svm(g).W
    trg = run_gd(g, global_steps, 0.1, record_at=_records(global_steps), reference=W_mm)
    out["global"] = {
        "steps": trg.steps,
        "corr": trg.corrs,
        "final_tokens": trg.final_tokens,
        "optimal_tokens": g.optimal_tokens(),
    }
    # --- joint toy
    for c in JOINT_TOY_C:
        inst, W = joint_toy(c)
        sol = solve_joint_svm(inst, W, JOINT_TOY_ALPHA)
        trj = run_joint_gd(
            inst, W, joint_steps, 0.1, record_at=_records(joint_steps), v_reference=sol.v, p_reference=sol.p
        )
        out["joint"][f"c={c}"] = {
            "v_mm": sol.v,
            "p_relax": sol.p,
            "support_inputs": sol.support_inputs,
            "steps": np.array([r.step for r in trj.record]),
            "v_corr": trj.v_corrs,
            "p_corr": trj.p_corrs,
        }
    # --- lp mirror descent
    lt = lp_toy(seed=lp_seed)
    at = _records(lp_steps)
    for p in LP_TOY_P:
        trm = run_mirror_descent(lt, p, lp_steps, 0.1, record_at=at, keep_iterates=True)
        iterates = [r.W for r in trm.record if r.W is not None]
        final = trm.final_tokens
        sols = {pp: solve_lp_svm(lt, pp, final).W for pp in LP_TOY_P}
        out["lp"][f"p={p}"] = {
            "steps": at,
            "final_tokens": final,
            "bregman": {
                f"p'={pp}": np.array([bregman_divergence(sols[pp], Wt, p) for Wt in iterates]) for pp in sols
            },
            "corr_with_fro": np.array([direction_corr(Wt, sols[2.0]) for Wt in iterates]),
        }
    return out
