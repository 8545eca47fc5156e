"""The published toy instances: their data, their SVM solutions (derived by hand), GD, and the figure data."""

from __future__ import annotations

import numpy as np
import pytest

from attnsvm.errors import AttnSVMError
from attnsvm.gd import direction_gap, run_gd
from attnsvm.peers import _toys as T
from attnsvm.svm import CERTIFY_RTOL, is_locally_optimal, solve_svm


@pytest.mark.parametrize("c", T.PROMPT_TOY_C)
def test_prompt_toy_data(c):
    inst, W = T.prompt_toy(c)
    assert inst.shape == (1, 3, 3)
    assert np.array_equal(inst.scores()[0], [1.0, 0.9, c])
    assert np.array_equal(W, np.diag([1.0, 1.0, 0.0]))


def test_global_toy_scores_and_svm():
    g = T.global_toy()
    gam = g.scores()
    assert np.all(gam[:, 0] == 1.0) and np.all(gam[:, 1:] == 0.5)  # one optimal token, all others 0.5
    assert np.all(g.X[:, 0] == g.X[0, 0])  # shared across inputs
    sol = solve_svm(g)
    assert sol.kkt.max() <= CERTIFY_RTOL
    # By hand: each constraint is 0.5 u_3 − 0.8(cos θ u_1 + sin θ u_2) ≥ 1 for u = W z_i, six equally
    # spaced θ; their average forces u_3 ≥ 2, and W = c e_3 e_3ᵀ with c z_i3 = c/√2 = 2 meets all.
    expect = np.zeros((3, 3))
    expect[2, 2] = 2 * np.sqrt(2)
    assert np.max(np.abs(sol.W - expect)) <= 1e-9 * expect[2, 2]
    assert len(sol.support) == 18  # every non-optimal token is a support token
    assert is_locally_optimal(g, [0, 0, 0])
    assert not any(is_locally_optimal(g, [t] * 3) for t in range(1, 7))


#: 1000 normalized steps, lr 0.1, from N(0, 4) starts: measured gaps ≤ 7e-16 (all non-optimal tokens
#: share a score, so every sequence's gradient points at W_mm). Threshold 1e-10.
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_global_toy_gd_converges_from_any_start(seed):
    g = T.global_toy()
    W_mm = solve_svm(g).W
    W0 = 2 * np.random.default_rng(seed).standard_normal((3, 3))
    tr = run_gd(g, 1000, 0.1, W0=W0, record_at=[1000])
    assert tr.final_tokens.tolist() == [0, 0, 0]
    assert direction_gap(tr.W, W_mm) <= 1e-10


@pytest.mark.parametrize("c", T.JOINT_TOY_C)
def test_joint_toy_data(c):
    inst, W = T.joint_toy(c)
    assert inst.shape == (3, 2, 2)
    assert not np.any(inst.X[:, 0])  # the zero token
    assert np.array_equal(inst.X[:, 1], [[1, 1], [1, -1], [0.5, c]])
    assert np.array_equal(inst.Y, [1, -1, 1]) and np.array_equal(W, np.eye(2))
    assert inst.optimal_tokens().tolist() == list(T.JOINT_TOY_ALPHA)  # the initial head selects x_i


def test_lp_toy_is_unit_family():
    inst = T.lp_toy(seed=0)
    assert inst.shape == (6, 8, 10)
    assert np.allclose(np.linalg.norm(inst.X, axis=2), 1.0, rtol=0, atol=1e-15)


def test_bad_toy_parameters():
    with pytest.raises(AttnSVMError, match="finite"):
        T.prompt_toy(float("nan"))
    with pytest.raises(AttnSVMError, match="finite"):
        T.joint_toy(float("inf"))


def test_toy_figures_data_structure_and_findings():
    d = T.toy_figures_data(prompt_steps=1000, global_steps=200, joint_steps=300, lp_steps=200)
    assert set(d) == {"prompt", "global", "joint", "lp"}
    c0, c9 = d["prompt"]["c=0.0"], d["prompt"]["c=0.9"]
    assert c0["locally_optimal"][1] and not c9["locally_optimal"][1]
    assert {r["final_token"] for r in c9["runs"].values()} == {0}
    assert {r["final_token"] for r in c0["runs"].values()} == {0, 1}
    for entry in (c0, c9):
        for r in entry["runs"].values():
            assert r["direction"].shape == (len(r["steps"]), 2) and np.all(np.isfinite(r["direction"]))
    assert d["global"]["final_tokens"].tolist() == [0, 0, 0]
    assert d["joint"]["c=1.0"]["support_inputs"].tolist() == [0, 1, 2]
    assert d["joint"]["c=1.5"]["support_inputs"].tolist() == [0, 1]
    for p in T.LP_TOY_P:
        e = d["lp"][f"p={p}"]
        for series in e["bregman"].values():
            assert series.shape == e["steps"].shape and np.all(series >= 0)
