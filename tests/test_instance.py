"""Instance validation, scores, optimal tokens and random families."""

from __future__ import annotations

import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import AttnSVMError, InvalidInstanceError, TiedScoresError, UnknownNameError


def _data(n=3, T=4, d=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, T, d)), np.array([1.0, -1.0, 1.0][:n]), rng.standard_normal(d)


def test_error_hierarchy():
    for cls in (InvalidInstanceError, TiedScoresError, UnknownNameError, A.InfeasibleSVMError):
        assert issubclass(cls, AttnSVMError)
    assert issubclass(AttnSVMError, ValueError)


def test_stores_read_only_float64_copies():
    X, Y, v = _data()
    z = np.ones((3, 5), dtype=np.int64)
    inst = A.Instance(X, Y, v, z)
    for arr in (inst.X, inst.Y, inst.v, inst.z):
        assert arr.dtype == np.float64
        assert not arr.flags.writeable
    assert inst.X is not X and np.array_equal(inst.X, X)
    X[0, 0, 0] = 123.0  # the caller's array stays the caller's
    assert inst.X[0, 0, 0] != 123.0
    with pytest.raises(ValueError):
        inst.X[0, 0, 0] = 1.0


def test_default_query_is_first_token():
    X, Y, v = _data()
    inst = A.Instance(X, Y, v)
    assert inst.self_attention
    np.testing.assert_array_equal(inst.z, X[:, 0, :])
    assert not A.Instance(X, Y, v, X[:, 1, :]).self_attention
    assert (inst.n, inst.T, inst.d) == (3, 4, 5) and inst.shape == (3, 4, 5)
    assert "self-attention" in repr(inst)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("X", np.zeros((3, 4)), "X must have 3 dimension"),
        ("X", np.zeros((0, 4, 5)), "n ≥ 1"),
        ("X", np.zeros((3, 1, 5)), "T ≥ 2"),
        ("X", np.zeros((3, 4, 0)), "d ≥ 1"),
        ("X", np.full((3, 4, 5), 1j), "complex"),
        ("X", np.array([[["a"]]]), "real numbers"),
        ("X", np.zeros((3, 4, 5), dtype=bool), "real numbers"),
        ("X", [[[1.0, 2.0], [3.0]]], "could not convert"),
        ("Y", np.array([1.0, -1.0]), r"Y must have shape \(n,\) = \(3,\)"),
        ("Y", np.array([1.0, 0.0, 1.0]), r"Y\[1\] = 0.0.*2\*y - 1"),
        ("Y", np.array([[1.0, -1.0, 1.0]]), "Y must have 1 dimension"),
        ("v", np.zeros(4), r"v must have shape \(d,\) = \(5,\)"),
        ("z", np.zeros((3, 4)), r"z must have shape \(n, d\) = \(3, 5\)"),
        ("z", np.zeros(5), "z must have 2 dimension"),
    ],
)
def test_bad_input_names_argument(field, value, match):
    X, Y, v = _data()
    args = {"X": X, "Y": Y, "v": v, "z": None}
    args[field] = value
    with pytest.raises(InvalidInstanceError, match=match):
        A.Instance(**args)


@pytest.mark.parametrize("field", ["X", "Y", "v", "z"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rejected_with_location(field, bad):
    X, Y, v = _data()
    args = {"X": X.copy(), "Y": Y.copy(), "v": v.copy(), "z": X[:, 0, :].copy()}
    arr = args[field]
    arr.flat[arr.size - 1] = bad
    with pytest.raises(InvalidInstanceError, match=rf"{field} must be finite.*at index"):
        A.Instance(**args)


def test_scores_and_optimal_tokens_match_definition():
    X, Y, v = _data(seed=3)
    inst = A.Instance(X, Y, v)
    gamma = np.array([[Y[i] * v @ X[i, t] for t in range(4)] for i in range(3)])
    np.testing.assert_allclose(inst.scores(), gamma, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(inst.optimal_tokens(), np.argmax(gamma, axis=1))


def test_tie_for_best_score_names_the_sequence():
    X, Y, v = _data(seed=4)
    gamma = Y[:, None] * (X @ v)
    best = int(np.argmax(gamma[2]))
    other = (best + 1) % 4
    X[2, other] = X[2, best]  # duplicate the best token of sequence 2
    inst = A.Instance(X, Y, v)
    with pytest.raises(TiedScoresError, match=r"sequence 2 .*tokens \[.*\]"):
        inst.optimal_tokens()


def test_check_alpha_and_weights():
    inst = A.random_instance(3, 4, 5, seed=0)
    np.testing.assert_array_equal(inst.check_alpha(None), inst.optimal_tokens())
    np.testing.assert_array_equal(inst.check_alpha([0, 3, 1]), [0, 3, 1])
    np.testing.assert_array_equal(inst.check_alpha(np.array([0.0, 3.0, 1.0])), [0, 3, 1])
    with pytest.raises(InvalidInstanceError, match=r"alpha\[1\] = 4 is out of range"):
        inst.check_alpha([0, 4, 1])
    with pytest.raises(InvalidInstanceError, match="out of range"):
        inst.check_alpha([0, -1, 1])
    with pytest.raises(InvalidInstanceError, match=r"shape \(n,\) = \(3,\)"):
        inst.check_alpha([0, 1])
    with pytest.raises(InvalidInstanceError, match="integer token indices"):
        inst.check_alpha([0.5, 1, 1])
    with pytest.raises(InvalidInstanceError, match=r"W must have shape \(d, d\) = \(5, 5\)"):
        inst.check_weights(np.zeros((5, 4)))
    with pytest.raises(InvalidInstanceError, match="W must be finite"):
        inst.check_weights(np.full((5, 5), np.nan))


def test_random_families():
    g = A.random_instance(3, 4, 6, seed=5, family="gaussian")
    assert not g.self_attention
    u = A.random_instance(3, 4, 6, seed=5, family="unit")
    unit_tol = 4 * np.finfo(float).eps  # one division by a norm: a few ulps
    np.testing.assert_allclose(np.linalg.norm(u.X, axis=-1), 1.0, atol=unit_tol)
    np.testing.assert_allclose(np.linalg.norm(u.z, axis=-1), 1.0, atol=unit_tol)
    assert abs(np.linalg.norm(u.v) - 1.0) <= unit_tol
    # unit is the gaussian draw, normalised: same directions
    np.testing.assert_allclose(u.X, g.X / np.linalg.norm(g.X, axis=-1, keepdims=True), atol=unit_tol)
    s = A.random_instance(3, 4, 6, seed=5, family="self_attention")
    assert s.self_attention and np.array_equal(s.z, s.X[:, 0, :])
    assert set(np.unique(g.Y)) <= {-1.0, 1.0}
    # determinism: same seed, same draw; different seed, different draw
    assert np.array_equal(A.random_instance(3, 4, 6, seed=5).X, g.X)
    assert not np.array_equal(A.random_instance(3, 4, 6, seed=6).X, g.X)


def test_random_instance_bad_arguments():
    with pytest.raises(UnknownNameError, match="'gaussian', 'unit', 'self_attention'"):
        A.random_instance(2, 3, 4, family="cauchy")
    with pytest.raises(InvalidInstanceError, match="T must be an integer ≥ 2"):
        A.random_instance(2, 1, 4)
    with pytest.raises(InvalidInstanceError, match="n must be an integer ≥ 1"):
        A.random_instance(0, 3, 4)
    with pytest.raises(InvalidInstanceError, match="d must be an integer"):
        A.random_instance(2, 3, 2.5)


def test_import_does_not_load_torch():
    """``import attnsvm`` (and the CLI's start-up) stays free of torch's ~1 s import: the torch
    engines (batched GD, Lipschitz estimates, benchmarks) import it when first called."""
    import subprocess
    import sys

    code = "import sys, attnsvm, attnsvm.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
