"""The report machinery (in process): experiment registry, availability, failures, files written."""

from __future__ import annotations

import json
import math
import re
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import attnsvm as A
from attnsvm.harness import results as R
from attnsvm.harness import runner as E
from attnsvm.harness.experiments import convergence as exp_convergence
from attnsvm.harness.experiments import lipschitz as exp_lipschitz
from attnsvm.harness.experiments import multitoken as exp_multitoken
from attnsvm.harness.experiments import regpath as exp_regpath
from attnsvm.harness.experiments import saturation as exp_saturation
from attnsvm.harness.experiments import textbook_gd as exp_textbook_gd
from attnsvm.harness.experiments import toys as exp_toys
from attnsvm.harness.report import failed_claims, summary_rows, to_jsonable, write_report


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, E.ExperimentSpec]:
    """A private copy of the registry, so test experiments never leak into other tests."""
    reg = dict(E.EXPERIMENT_REGISTRY)
    monkeypatch.setattr(E, "EXPERIMENT_REGISTRY", reg)
    return reg


def _toy(size: str, seed: int, jobs: int, device: str, progress: E.ProgressFn) -> R.ExperimentResult:
    res = R.ExperimentResult("toy", "Toy experiment", "an experiment for tests")
    x = [1.0, 10.0, 100.0]
    res.numbers["nan_value"] = math.nan
    res.numbers["seed"] = seed
    res.tables["rows"] = [{"x": v, "y": 1 / v, "flag": v > 5} for v in x]
    res.figures.append(
        R.Figure(
            "line",
            "toy figure",
            [
                R.Panel(
                    "p",
                    "x",
                    "y",
                    [R.Series("1/x", x, [1 / v for v in x], lo=[0.5 / v for v in x], hi=[2 / v for v in x])],
                    xlog=True,
                    ylog=True,
                )
            ],
        )
    )
    res.claim("holds", "a true statement", True, "ok")
    res.claim("conjecture", "a refuted conjecture", False, "counterexample", severity="finding")
    progress(1, 1)
    return res


def test_to_jsonable_handles_numpy_and_nonfinite() -> None:
    doc = to_jsonable(
        {
            "a": np.float64(1.5),
            "b": np.arange(3),
            "c": [math.inf, -math.inf, math.nan],
            "d": np.bool_(True),
            3: (np.int64(2),),
        }
    )
    assert doc == {"a": 1.5, "b": [0, 1, 2], "c": [None, None, None], "d": True, "3": [2]}
    json.dumps(doc, allow_nan=False)  # strictly valid JSON


def test_write_report_files(tmp_path: Path, registry: dict[str, E.ExperimentSpec]) -> None:
    E.register_experiment("toy", "Toy experiment", "an experiment for tests")(_toy)
    calls: list[tuple[int, int]] = []
    results = E.run_experiments(
        "tiny", seed=5, names=["toy"], progress_factory=lambda spec: lambda d, t: calls.append((d, t))
    )
    assert calls == [(1, 1)]
    doc = write_report(results, tmp_path, {"size": "tiny", "seed": 5})
    for name in ("report.md", "report.html", "results.json", "toy-line.png", "toy-rows.csv"):
        assert (tmp_path / name).is_file(), name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["experiments"]["toy"]["numbers"] == {"nan_value": None, "seed": 5}
    assert on_disk["nonfinite"] == {"/experiments/toy/numbers/nan_value": "nan"}
    assert on_disk["passed"] is True  # a refuted *finding* does not fail the run
    assert doc["files"] == on_disk["files"]
    csv_lines = (tmp_path / "toy-rows.csv").read_text().splitlines()
    assert csv_lines[0] == "x,y,flag" and len(csv_lines) == 4
    md = (tmp_path / "report.md").read_text()
    assert "![toy figure](toy-line.png)" in md and "refuted" in md and "holds" in md
    html = (tmp_path / "report.html").read_text()
    assert "data:image/png;base64," in html and "toy-line.png" not in html


def test_failed_check_is_reported(tmp_path: Path, registry: dict[str, E.ExperimentSpec]) -> None:
    @E.register_experiment("bad", "Bad experiment", "fails a check")
    def bad(size: str, seed: int, jobs: int, device: str, progress: E.ProgressFn) -> R.ExperimentResult:
        res = R.ExperimentResult("bad", "Bad experiment", "fails a check")
        res.claim("wrong", "1 = 2", False, "1 != 2")
        return res

    results = E.run_experiments("tiny", names=["bad"])
    assert [(f, c.name) for f, c in failed_claims(results)] == [("bad", "wrong")]
    assert summary_rows(results)[0]["status"] == "FAIL"
    doc = write_report(results, tmp_path, {})
    assert doc["passed"] is False and doc["failed_claims"] == ["bad/wrong"]
    assert "FAILED" in (tmp_path / "report.md").read_text()


def test_exception_becomes_failed_claim(registry: dict[str, E.ExperimentSpec]) -> None:
    @E.register_experiment("crash", "Crashing experiment", "raises")
    def crash(size: str, seed: int, jobs: int, device: str, progress: E.ProgressFn) -> R.ExperimentResult:
        raise RuntimeError("boom")

    (res,) = E.run_experiments("tiny", names=["crash"])
    assert res.failed and res.failed[0].name == "ran" and "RuntimeError: boom" in res.failed[0].message


def test_missing_module_is_not_available(tmp_path: Path, registry: dict[str, E.ExperimentSpec]) -> None:
    E.register_experiment(
        "ghost", "Ghost", "needs a module that does not exist", requires=("attnsvm.no_such_module:solve",)
    )(_toy)
    E.register_experiment(
        "ghost2", "Ghost 2", "needs a missing attribute", requires=("attnsvm.model._grad:no_such_fn",)
    )(_toy)
    results = E.run_experiments("tiny", names=["ghost", "ghost2"])
    assert [r.available for r in results] == [False, False]
    assert "attnsvm.no_such_module" in results[0].reason and "no_such_fn" in results[1].reason
    assert not failed_claims(results)
    write_report(results, tmp_path, {})
    assert "Not available" in (tmp_path / "report.md").read_text()


def test_unknown_names_raise() -> None:
    with pytest.raises(
        A.UnknownNameError, match=r"^unknown experiment 'no-such-experiment'; expected one of "
    ):
        E.run_experiments("tiny", names=["no-such-experiment"])
    with pytest.raises(A.UnknownNameError, match="size"):
        E.run_experiment(E.EXPERIMENT_REGISTRY["saturation"], "huge", 0)


def test_extra_experiments_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(E.EXTRA_EXPERIMENTS_ENV, "attnsvm.no_such_plugin")
    with pytest.raises(A.AttnSVMError, match="no_such_plugin"):
        E.load_extra_experiments()
    monkeypatch.setenv(E.EXTRA_EXPERIMENTS_ENV, "")
    assert E.load_extra_experiments() == []


def test_old_extra_experiments_variable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ATTNSVM_EXTRA_FAMILIES``, the variable's name before the rename, set at all (a module, or empty)
    raises an AttnSVMError subclass naming ``ATTNSVM_EXTRA_EXPERIMENTS`` (oracle: the literal names), even
    when the new variable is set too: a user's setting is never silently ignored."""
    for new in (None, "attnsvm.harness.experiments.saturation"):
        if new is None:
            monkeypatch.delenv("ATTNSVM_EXTRA_EXPERIMENTS", raising=False)
        else:
            monkeypatch.setenv("ATTNSVM_EXTRA_EXPERIMENTS", new)
        for old in ("my_package.my_experiments", ""):
            monkeypatch.setenv("ATTNSVM_EXTRA_FAMILIES", old)
            with pytest.raises(A.AttnSVMError) as info:
                E.load_extra_experiments()
            assert type(info.value) is E.RenamedSettingError
            msg = str(info.value)
            assert msg.startswith("ATTNSVM_EXTRA_FAMILIES is no longer read"), msg
            assert f"set ATTNSVM_EXTRA_EXPERIMENTS={old!r} instead" in msg, msg
    monkeypatch.delenv("ATTNSVM_EXTRA_FAMILIES")
    assert E.load_extra_experiments() == ["attnsvm.harness.experiments.saturation"]


def test_saturation_experiment_is_deterministic_and_matches_api() -> None:
    spec = E.EXPERIMENT_REGISTRY["saturation"]
    r1 = E.run_experiment(spec, "tiny", 11)
    r2 = E.run_experiment(spec, "tiny", 11)
    assert r1.tables == r2.tables  # same seed, same numbers
    assert not r1.failed
    # Recompute one row's stable relative error directly: the oracle's direction is a unit matrix
    # that the API gradient, normalised, must match to the bound the experiment checks.
    cfg = exp_saturation.SATURATION_SIZES["tiny"]
    row = r1.tables["errors"][0]
    n, T, d = cfg["shape"]
    inst = A.random_instance(n, T, d, seed=11)
    U = np.random.default_rng(11 + 1000).standard_normal((d, d))
    W = row["radius"] * U / np.linalg.norm(U)
    G, _, log_norm = exp_saturation._mp_gradient(inst, W)
    g = A.risk_grad(inst, W)
    expected = float(np.max(np.abs(g - G * math.exp(log_norm))) / np.max(np.abs(G * math.exp(log_norm))))
    assert row["stable_rel_err"] == expected


def test_parallel_jobs_give_the_same_results() -> None:
    names = ["saturation", "symbolic"]
    seq = E.run_experiments("tiny", seed=2, jobs=1, names=names)
    par = E.run_experiments("tiny", seed=2, jobs=2, names=names)
    assert [r.name for r in par] == names

    def untimed(tables: dict) -> dict:  # wall-clock columns (…_s) differ from run to run
        return {
            k: [{c: v for c, v in row.items() if not c.endswith("_s")} for row in rows]
            for k, rows in tables.items()
        }

    for a, b in zip(seq, par, strict=True):
        assert untimed(a.tables) == untimed(b.tables)
        assert [c.passed for c in a.claims] == [c.passed for c in b.claims]


def test_module_that_fails_to_import_is_a_failure(
    tmp_path: Path, registry: dict[str, E.ExperimentSpec], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A required module that exists but cannot be imported is a bug, reported as a failed check
    (not hidden as 'not available')."""
    (tmp_path / "attnsvm_broken_plugin.py").write_text("from attnsvm.model._grad import no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    E.register_experiment("broken", "Broken", "its module is broken", requires=("attnsvm_broken_plugin:x",))(
        _toy
    )
    (res,) = E.run_experiments("tiny", names=["broken"])
    assert res.available and [c.name for c in res.failed] == ["ran"]
    assert "ImportError" in res.failed[0].message and "no_such_name" in res.failed[0].message


def _candidate(seed: int) -> Any:
    """A run of the local/global experiment (unit, n=6, T=8, d=2, 1000 normalized steps at lr 0.1)."""
    from attnsvm.harness.experiments.local_global import CandidateRun

    inst = A.random_instance(6, 8, 2, seed=seed, family="unit")
    tr = A.run_gd(inst, steps=1000, lr=0.1, record_at=[1000])
    alpha = np.argmax(A.attention(inst, tr.W), axis=1)
    return CandidateRun(inst=inst, W=tr.W, alpha=alpha, settled=True, diverging=True)


def test_counterexample_confirmation_separates_artefacts_from_survivors():
    """Seed 20000 is not locally optimal at step 1000 but changes tokens by step 10⁴ (an artefact of
    the finite horizon); seed 20031 keeps its non-locally-optimal tokens and keeps diverging."""
    from attnsvm.harness.experiments.local_global import _confirm_counterexamples
    from attnsvm.svm import is_locally_optimal

    artefact, survivor = _candidate(20000), _candidate(20031)
    for c in (artefact, survivor):
        assert not is_locally_optimal(c.inst, c.alpha)
    assert _confirm_counterexamples([artefact, survivor], steps=1000, device="cpu") == [False, True]


# ----------------------------------------------------------- figures and HTML, as a reader sees them
# These tests draw the experiments' figures (report.draw_figure) and read back what matplotlib put on
# the page: tick labels, legend texts, annotations, axis limits, drawing order. The oracles are the
# experiments' own tables and configurations (what the figure must show), not the figure code.

#: An internal constant's name: an ALL-CAPS word joined by underscores (CONFIRM_FACTOR, TOY_CORR);
#: math such as W_R or K_S (one capital before the underscore) is not one.
CONSTANT_NAME = r"\b[A-Z][A-Z0-9]+(?:_[A-Z0-9]+)+\b"

#: Experiments cheap enough at size "tiny" (< 1 s each) to run in these tests.
CHEAP_EXPERIMENTS = (
    "saturation",
    "textbook_gd",
    "convergence",
    "local_global",
    "regpath",
    "svm",
    "multitoken",
    "seq2seq",
)


class _TextOnly(HTMLParser):
    """Stdlib HTML parser (the oracle): the visible prose, with <code>, <style> and tables' cells of
    data kept apart."""

    def __init__(self) -> None:
        super().__init__()
        self.prose: list[str] = []
        self.code: list[str] = []
        self._stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        while self._stack and self._stack.pop() != tag:
            pass

    def handle_data(self, data: str) -> None:
        if "style" in self._stack:
            return
        (self.code if "code" in self._stack else self.prose).append(data)


def _visible(html_text: str) -> _TextOnly:
    p = _TextOnly()
    p.feed(html_text)
    return p


@pytest.fixture(scope="module")
def cheap_results() -> dict[str, R.ExperimentResult]:
    return {r.name: r for r in E.run_experiments("tiny", seed=0, names=list(CHEAP_EXPERIMENTS))}


def _drawn(fig: R.Figure) -> Any:
    from attnsvm.harness.report import draw_figure

    return draw_figure(fig)


def _close(f: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(f)


def test_html_renders_code_spans_and_names_no_constants(tmp_path: Path) -> None:
    """Oracle: the stdlib HTML parser. Every experiment's description (as a not-available experiment, so no
    experiment runs) and a caption with code spans: the visible prose has no Markdown backtick and no
    internal constant name (an ALL_CAPS identifier); the code spans come out as <code> text."""
    results = [
        R.ExperimentResult(s.name, s.title, s.description, available=False, reason="`x` not installed")
        for s in E.EXPERIMENT_REGISTRY.values()
    ]
    toy = R.ExperimentResult("toy", "Toy", "uses `a < b` and `f(x)`")
    toy.figures.append(
        R.Figure("f", "t", [R.Panel("p", "x", "y", [R.Series("s", [1.0], [1.0])])], caption="see `col`")
    )
    write_report([*results, toy], tmp_path, {})
    page = _visible((tmp_path / "report.html").read_text(encoding="utf-8"))
    prose = "".join(page.prose)
    assert "`" not in prose
    assert not re.findall(CONSTANT_NAME, prose), "internal constant name in prose"
    assert {"a < b", "f(x)", "col", "x"} <= set(page.code)


def test_cheap_experiments_html_prose(
    tmp_path: Path, cheap_results: dict[str, R.ExperimentResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Oracle: the stdlib HTML parser on the report of real runs (claims, captions, descriptions).
    The figures' pixels are not under test here: they are written as empty files."""
    import attnsvm.harness.report as report_mod

    monkeypatch.setattr(report_mod, "render_figure", lambda fig, path: path.write_bytes(b""))
    write_report(list(cheap_results.values()), tmp_path, {"size": "tiny"})
    prose = "".join(_visible((tmp_path / "report.html").read_text(encoding="utf-8")).prose)
    assert "`" not in prose
    assert not re.findall(CONSTANT_NAME, prose)


def test_log_axis_ticks_are_plain_numbers() -> None:
    """Oracle: every tick label parses back (``float``) to its tick's position — no "6×10⁰"."""
    x = [0.5, 0.8, 1.5, 4.0]
    fig = R.Figure(
        "f", "t", [R.Panel("p", "x", "y", [R.Series("s", x, [6.0, 7.0, 9.0, 20.0])], xlog=True, ylog=True)]
    )
    f = _drawn(fig)
    try:
        f.canvas.draw()
        (ax,) = f.axes
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                label = tick.label1.get_text()
                if label and lo <= tick.get_loc() <= hi:
                    assert "times" not in label and float(label) == pytest.approx(tick.get_loc()), label
    finally:
        _close(f)


def test_coinciding_lines_say_so_in_the_legend() -> None:
    """Oracle: the legend text matplotlib drew. A line drawn exactly on an earlier one is named."""
    x = [1.0, 2.0, 3.0]
    fig = R.Figure(
        "f",
        "t",
        [R.Panel("p", "x", "y", [R.Series("a", x, [1.0, 2.0, 3.0]), R.Series("b", x, [1.0, 2.0, 3.0])])],
    )
    f = _drawn(fig)
    try:
        texts = [t.get_text() for t in f.axes[0].get_legend().get_texts()]
        assert texts == ["a", "b (lies on a)"]
    finally:
        _close(f)


def test_convergence_figures_state_size_and_seeds(cheap_results: dict[str, R.ExperimentResult]) -> None:
    """Oracle: each experiment's size configuration. The figure's title names n, T, d and the seeds."""
    cfgs = {
        "saturation": (
            exp_saturation.SATURATION_SIZES["tiny"]["shape"],
            exp_saturation.SATURATION_SIZES["tiny"]["seeds"],
        ),
        "textbook_gd": (
            exp_textbook_gd.TEXTBOOK_GD_SIZES["tiny"]["shape"],
            exp_textbook_gd.TEXTBOOK_GD_SIZES["tiny"]["seeds"],
        ),
        "convergence": (
            exp_convergence.CONVERGENCE_SIZES["tiny"]["shape"],
            exp_convergence.CONVERGENCE_SIZES["tiny"]["seeds"],
        ),
        "regpath": (exp_regpath.REGPATH_SIZES["tiny"]["shape"], exp_regpath.REGPATH_SIZES["tiny"]["seeds"]),
    }
    for name, ((n, T, d), seeds) in cfgs.items():
        for fig in cheap_results[name].figures:
            assert f"n={n}, T={T}, d={d}" in fig.title and f"{seeds} seed" in fig.title, (name, fig.title)


def test_local_global_figure_states_the_criterion(cheap_results: dict[str, R.ExperimentResult]) -> None:
    """Oracle: the experiment's by_d table. The claim's verdict is 'last ≥ first' on the table, its
    statement says so, and the drawn figure starts at 0 and prints both ends with the verdict."""
    res = cheap_results["local_global"]
    rows = res.tables["by_d"]
    (claim,) = [c for c in res.claims if c.name == "global-share-grows-with-d"]
    assert claim.passed == (rows[-1]["share_global"] >= rows[0]["share_global"])
    assert "largest d" in claim.statement and "smallest d" in claim.statement
    (fig,) = res.figures
    f = _drawn(fig)
    try:
        ax = f.axes[0]
        assert ax.get_ylim()[0] == 0.0
        note = " ".join(t.get_text() for t in ax.texts)
        assert f"({rows[-1]['share_global']:.2f})" in note and f"({rows[0]['share_global']:.2f})" in note
        assert ("holds" if claim.passed else "refuted") in note
        monotone = all(b["share_global"] >= a["share_global"] for a, b in zip(rows, rows[1:], strict=False))
        assert ("dips at" in note) == (not monotone)
    finally:
        _close(f)


def test_multitoken_points_show_their_run_counts(cheap_results: dict[str, R.ExperimentResult]) -> None:
    """Oracle: the runs table. Each share point is annotated 'count/out of', counted from the runs."""
    res = cheap_results["multitoken"]
    runs = res.tables["runs"]
    R = exp_multitoken.MULTITOKEN_SIZES["tiny"]["runs"]
    expected = []
    for d in sorted({r["d"] for r in runs}):
        multi = [r for r in runs if r["d"] == d and r["multi"]]
        better = [r for r in multi if r["rel_error_prediction"] < r["rel_error_single"]]
        expected += [f"{len(multi)}/{R}", f"{len(better)}/{len(multi)}"]
    (fig,) = res.figures
    f = _drawn(fig)
    try:
        drawn = sorted(t.get_text() for t in f.axes[1].texts)
        shown = [e for e in expected if not e.endswith("/0")]  # no share point without multi-token runs
        assert drawn == sorted(shown)
    finally:
        _close(f)


def test_svm_times_exclude_each_methods_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Oracle: an injected cost. The first call of each (norm, method) sleeps WARMUP_S; no timed
    solve may include it, and the first-call times reported apart must."""
    import attnsvm.svm as svm_mod

    WARMUP_S = 0.25  # far above a tiny solve (ms), far below the test's budget
    real = svm_mod.solve_svm
    seen: set[tuple[str, str]] = set()

    def slow_first(inst: Any, *args: Any, **kw: Any) -> Any:
        key = (kw.get("norm", "fro"), kw.get("method", "dual"))
        if key not in seen and kw.get("alpha") is None:
            seen.add(key)
            time.sleep(WARMUP_S)
        return real(inst, *args, **kw)

    monkeypatch.setattr(svm_mod, "solve_svm", slow_first)
    res = E.run_experiment(E.EXPERIMENT_REGISTRY["svm"], "tiny", 0)
    assert not res.failed
    assert all(r["time_s"] < WARMUP_S for r in res.tables["solves"])
    for m in ("dual", "vector", "primal", "nuc"):
        assert res.numbers[f"first_call_s/{m}"] >= WARMUP_S
    # One quantity per axis: time, KKT residual, the conic solver's own error.
    (fig,) = res.figures
    assert [p.ylabel for p in fig.panels] == [
        "seconds",
        "max relative KKT residual",
        "||W_raw − W||_F / ||W||_F (worst)",
    ]


def test_lipschitz_estimates_drawn_over_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Oracle: matplotlib's drawing order and tick labels. Every estimate line is drawn above every
    bound line, the legend sits under the panels (over no curve), and the x ticks are the radii."""
    monkeypatch.setitem(
        exp_lipschitz.LIPSCHITZ_SIZES,
        "tiny",
        {**exp_lipschitz.LIPSCHITZ_SIZES["tiny"], "samples": 1, "steps": 1},
    )
    res = E.run_experiment(E.EXPERIMENT_REGISTRY["lipschitz"], "tiny", 0)
    (fig,) = res.figures
    f = _drawn(fig)
    try:
        f.canvas.draw()
        radii = exp_lipschitz.LIPSCHITZ_SIZES["tiny"]["radii"]
        for ax in f.axes:
            assert ax.get_legend() is None
            lines = {
                ln.get_label(): ln.get_zorder() for ln in ax.get_lines() if not ln.get_label().startswith("_")
            }
            bounds = [z for lab, z in lines.items() if "bound" in lab.split("(")[0]]
            ests = [z for lab, z in lines.items() if "estimate" in lab.split("(")[0]]
            assert bounds and ests and min(ests) > max(bounds)
            labels = [t.get_text() for t in ax.get_xticklabels()]
            assert [float(t) for t in labels] == radii
        assert f.legends
    finally:
        _close(f)


def test_toys_figures_mark_targets_ends_and_coinciding_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Oracle: the toys' own data (final tokens, p_mm) and the drawn artists. The prompt panels draw a
    star at p_mm(final token)/||p_mm|| for every final token, start/end markers per line, and a
    '(k runs coincide)' label wherever k runs share one line; the global-toy panel plots a positive
    gap (1 − corr is 0 as a difference) under the finding's threshold."""
    monkeypatch.setitem(
        exp_toys.TOY_SIZES,
        "tiny",
        {"prompt_steps": 30, "global_steps": 30, "joint_steps": 30, "lp_steps": 30},
    )
    res = E.run_experiment(E.EXPERIMENT_REGISTRY["toys"], "tiny", 0)
    prompt, conv = res.figures
    from attnsvm.peers._prompt import solve_prompt_svm
    from attnsvm.peers._toys import prompt_toy

    for panel, key in zip(prompt.panels, ("c=0.9", "c=0.0"), strict=True):
        finals = {r["final_token"] for r in res.tables["prompt"] if r["toy"] == key}
        stars = {(s.x[0], s.y[0]) for s in panel.series if s.style == "k*"}
        inst, W = prompt_toy(float(key.split("=")[1]))
        for tok in finals:
            p = np.asarray(solve_prompt_svm(inst, W, [tok]).p, dtype=float)
            u = p / np.linalg.norm(p)
            assert any(abs(x - u[0]) < 1e-12 and abs(y - u[1]) < 1e-12 for x, y in stars), (key, tok)
        runs = [s for s in panel.series if s.mark_ends]
        counts = [
            int(m.group(1)) if (m := re.search(r"\((\d+) runs coincide\)", s.label)) else 1 for s in runs
        ]
        assert sum(counts) == sum(1 for r in res.tables["prompt"] if r["toy"] == key)
    f = _drawn(prompt)
    try:
        for ax in f.axes:
            # each run line adds a start (hollow) and an end marker on top of it
            n_runs = sum(
                1 for ln in ax.get_lines() if ln.get_marker() == "None" and ln.get_linestyle() == "-"
            )
            hollow = [
                ln for ln in ax.get_lines() if ln.get_marker() == "o" and ln.get_markerfacecolor() == "white"
            ]
            assert len(hollow) == n_runs
    finally:
        _close(f)
    glob = conv.panels[0]
    (gd,) = glob.series
    assert all(v > 0 for v in gd.y) and max(gd.y) < 1 - exp_toys.TOY_CORR
    assert (1 - exp_toys.TOY_CORR) in [y for y, _ in glob.hlines]


def test_coinciding_groups_runs_within_tolerance() -> None:
    """Oracle: hand-made trajectories 0.5·TOY_COINCIDE apart (one line) and 2·TOY_COINCIDE apart (two)."""
    base = np.array([[0.0, 1.0], [0.5, 0.5]])
    near = base + 0.5 * exp_toys.TOY_COINCIDE
    far = base + 2 * exp_toys.TOY_COINCIDE
    groups = exp_toys._coinciding(
        [
            exp_toys.PromptRun(y0=y, final_token=0, corr=1.0, direction=a)
            for y, a in ((1.0, base), (2.0, near), (3.0, far))
        ]
    )
    assert [[r.y0 for r in g] for g in groups] == [[1.0, 2.0], [3.0]]
