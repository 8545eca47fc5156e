"""The mutation tool's bookkeeping (tools/mutation.py): what keeps a run's results valid, and the
incremental ``--update`` sample. No mutmut run: these pin the rules the scores rest on.

Oracles: hand-written source pairs whose behaviour is (or is not) the same; closed forms of the
Clopper–Pearson interval at its edges; the binomial law of a Bernoulli sample.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("attnsvm_mutation_tool", ROOT / "tools" / "mutation.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _module(tool, tmp_path: Path, source: str, key: str = "fake") -> Path:
    path = tmp_path / "attnsvm" / "fake.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    tool.PATHS[key] = "attnsvm/fake.py"
    return tmp_path


BASE = '''"""Doc."""
from ._deps import require
require("torch", feature="x")  # pragma: no mutate
from .model._grad import g
from .scaling import h
import numpy as np

LIMIT = 3


def f(x):
    """Doc of f."""
    return g(x) + LIMIT


class K:
    scale = 2

    def m(self, y):
        return h(y) * self.scale
'''


def test_moves_docstrings_and_guards_keep_the_hash(tool, tmp_path: Path) -> None:
    """A moved internal import, a reordered import list, an edited docstring and a dropped dependency
    guard change nothing mutmut's mutants depend on: same source hash, context and function hashes."""
    moved = (
        BASE.replace('"""Doc."""', '"""Another doc."""')
        .replace('from ._deps import require\nrequire("torch", feature="x")  # pragma: no mutate\n', "")
        .replace(
            "from .model._grad import g\nfrom .scaling import h\n",
            "from .scaling import h\nfrom .grad import g\n",
        )
        .replace('"""Doc of f."""', '"""Other."""')
    )
    a = _module(tool, tmp_path / "a", BASE)
    b = _module(tool, tmp_path / "b", moved)
    assert tool._source_hash("fake", a) == tool._source_hash("fake", b)
    assert tool.context_hash("fake", a) == tool.context_hash("fake", b)
    assert tool.function_hashes("fake", a) == tool.function_hashes("fake", b)


def test_a_function_change_leaves_the_context_and_other_functions(tool, tmp_path: Path) -> None:
    """Changing one function's body changes that function's hash only; a constant change changes the
    context (every mutant may read it), so ``--update`` must refuse it."""
    a = _module(tool, tmp_path / "a", BASE)
    body = _module(tool, tmp_path / "b", BASE.replace("return g(x) + LIMIT", "return g(x) - LIMIT"))
    const = _module(tool, tmp_path / "c", BASE.replace("LIMIT = 3", "LIMIT = 4"))
    attr = _module(tool, tmp_path / "d", BASE.replace("scale = 2", "scale = 5"))
    ha, hb = tool.function_hashes("fake", a), tool.function_hashes("fake", body)
    assert ha["f"] != hb["f"] and ha["K.m"] == hb["K.m"]
    assert tool.context_hash("fake", a) == tool.context_hash("fake", body)
    assert tool.context_hash("fake", a) != tool.context_hash("fake", const)
    assert tool.context_hash("fake", a) != tool.context_hash("fake", attr)
    assert tool.function_hashes("fake", a) == tool.function_hashes("fake", const)


def _with_shared(tool, root: Path, source: str, shared: str) -> Path:
    """The fake module plus ``attnsvm/_shared.py`` holding ``shared``."""
    _module(tool, root, source)
    (root / "attnsvm" / "_shared.py").write_text(shared)
    return root


def test_a_constant_moved_unchanged_into_a_shared_module_keeps_the_context(tool, tmp_path: Path) -> None:
    """``LIMIT = 3`` here, or ``from ._shared import LIMIT`` where ``_shared`` binds ``LIMIT = 3`` (also
    under another name, ``as``), binds the same value: same context and source hash. A different value in the
    shared module, or a name bound to something else, changes the context. ``__all__`` and a new internal
    import of a function (read only by changed functions) are not context."""
    a = _module(tool, tmp_path / "a", BASE)
    moved = BASE.replace("LIMIT = 3\n", "").replace(
        "import numpy as np\n", "import numpy as np\nfrom ._shared import LIMIT\n"
    )
    b = _with_shared(tool, tmp_path / "b", moved, "LIMIT = 3\n")
    aliased = moved.replace("from ._shared import LIMIT", "from ._shared import CAP as LIMIT")
    c = _with_shared(tool, tmp_path / "c", aliased, "CAP = 3\n")
    other = _with_shared(tool, tmp_path / "d", moved, "LIMIT = 4\n")
    func = _with_shared(tool, tmp_path / "e", moved, "def LIMIT():\n    return 3\n")
    exported = _module(tool, tmp_path / "f", BASE.replace("LIMIT = 3", '__all__ = ["f", "K"]\nLIMIT = 3'))
    new_import = _module(
        tool, tmp_path / "g", BASE.replace("from .scaling import h", "from .scaling import h, k")
    )
    ctx = tool.context_hash("fake", a)
    assert tool.context_hash("fake", b) == ctx and tool.context_hash("fake", c) == ctx
    assert tool._source_hash("fake", b) == tool._source_hash("fake", a)
    assert tool.context_hash("fake", other) != ctx
    assert tool.context_hash("fake", func) != ctx
    assert tool.context_hash("fake", exported) == ctx
    assert tool.context_hash("fake", new_import) == ctx


def test_an_alias_renamed_in_annotations_keeps_the_function_hashes(tool, tmp_path: Path) -> None:
    """Annotations are never evaluated (``from __future__ import annotations``): a function annotated with
    ``IntArray`` or with ``Int64Array``, both bound to ``NDArray[np.int64]``, has one hash; an alias bound to
    another type, or a changed default value, gives another. The alias itself, read only in annotations, is
    not context."""
    head = "from __future__ import annotations\nimport numpy as np\nfrom numpy.typing import NDArray\n"
    body = "\n\ndef f(x: {A}, k: int = 1) -> {A}:\n    return x + k\n"
    a = _module(tool, tmp_path / "a", head + "IntArray = NDArray[np.int64]" + body.format(A="IntArray"))
    b = _with_shared(
        tool,
        tmp_path / "b",
        head + "from ._shared import Int64Array" + body.format(A="Int64Array"),
        "import numpy as np\nfrom numpy.typing import NDArray\nInt64Array = NDArray[np.int64]\n",
    )
    c = _module(tool, tmp_path / "c", head + "IntArray = NDArray[np.intp]" + body.format(A="IntArray"))
    d = _module(
        tool,
        tmp_path / "d",
        head + "IntArray = NDArray[np.int64]" + body.format(A="IntArray").replace("= 1", "= 2"),
    )
    fa = tool.function_hashes("fake", a)
    assert tool.function_hashes("fake", b) == fa
    assert tool.function_hashes("fake", c) != fa and tool.function_hashes("fake", d) != fa
    assert tool.context_hash("fake", a) == tool.context_hash("fake", b) == tool.context_hash("fake", c)


def test_mutant_function_names(tool) -> None:
    """mutmut's mangled names map back to the function (the module path before the last dot is ignored)."""
    assert tool.mutant_function("attnsvm.gd._engine.x_run_gd__mutmut_3") == "run_gd"
    assert tool.mutant_function("attnsvm.gd.x_run_gd__mutmut_12") == "run_gd"
    assert tool.mutant_function("attnsvm.gd._engine.xǁ_TorchBatchǁrisk__mutmut_2") == "_TorchBatch.risk"
    assert tool.mutant_function("attnsvm.lipschitz.x__split__mutmut_1") == "_split"


def test_bernoulli_sample_rate_and_move_invariance(tool) -> None:
    """The per-name draw is a Bernoulli(rate) sample: over 20 000 names the count lies within 4.5
    binomial standard deviations of ``rate·N`` (a false alarm has probability < 1e-5); the decision
    depends on the local name only, so a module move keeps it."""
    N, rate = 20_000, 0.2
    names = [f"attnsvm.mod.x_f{i // 50}__mutmut_{i % 50}" for i in range(N)]
    k = sum(tool.in_bernoulli_sample(n, 7, rate) for n in names)
    assert abs(k - rate * N) <= 4.5 * math.sqrt(N * rate * (1 - rate))
    moved = [n.replace("attnsvm.mod.", "attnsvm.sub._mod.") for n in names]
    assert [tool.in_bernoulli_sample(n, 7, rate) for n in names[:500]] == [
        tool.in_bernoulli_sample(n, 7, rate) for n in moved[:500]
    ]
    assert not any(tool.in_bernoulli_sample(n, 7, 0.0) for n in names[:500])


def test_update_sample_keeps_unchanged_functions_and_draws_changed_ones(tool) -> None:
    """An update keeps the previous sample's mutants of unchanged functions (their outcomes stay), drops
    those of changed or removed functions, and draws the changed functions' new mutants."""
    names_old = [f"attnsvm.m.x_{f}__mutmut_{i}" for f in ("a", "b", "c") for i in range(1, 41)]
    prev = {
        "function_sha256": {"a": "1", "b": "2", "c": "3"},
        "sample_names": names_old[::3],
        "tried": len(names_old[::3]),
        "mutants_total": len(names_old),
        "sample_seed": 5,
    }
    # b changed (now 30 mutants), c removed, d new.
    names_new = (
        [f"attnsvm.m.x_a__mutmut_{i}" for i in range(1, 41)]
        + [f"attnsvm.m.x_b__mutmut_{i}" for i in range(1, 31)]
        + [f"attnsvm.m.x_d__mutmut_{i}" for i in range(1, 11)]
    )
    hashes = {"a": "1", "b": "9", "d": "4"}
    chosen, to_run, changed = tool._update_sample(prev, names_new, hashes, 5)
    assert changed == ["b", "d"]
    kept = [n for n in prev["sample_names"] if "x_a_" in n]
    assert set(kept) <= set(chosen) and not (set(kept) & set(to_run))
    assert all(tool.mutant_function(n) in {"b", "d"} for n in to_run)
    assert not any("x_c_" in n for n in chosen)
    rate = prev["tried"] / prev["mutants_total"]
    assert to_run == [
        n for n in names_new if tool.mutant_function(n) in {"b", "d"} and tool.in_bernoulli_sample(n, 5, rate)
    ]
    # After a full run every mutant of a changed function runs.
    full = dict(prev, sample_names=None, sample_seed=None, tried=len(names_old))
    chosen_f, to_run_f, _ = tool._update_sample(full, names_new, hashes, 5)
    assert chosen_f == sorted(names_new)
    assert sorted(to_run_f) == sorted(n for n in names_new if tool.mutant_function(n) in {"b", "d"})


@pytest.mark.parametrize("n", [1, 10, 500])
def test_clopper_pearson_edges(tool, n: int) -> None:
    """At ``k = n`` the exact interval's lower end is ``(α/2)^(1/n)`` and at ``k = 0`` its upper end is
    ``1 − (α/2)^(1/n)`` (closed forms of the beta quantile at its edge), with α = 0.05."""
    lo, hi = tool.clopper_pearson(n, n)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / n), rel=1e-12)
    lo0, hi0 = tool.clopper_pearson(0, n)
    assert lo0 == 0.0 and hi0 == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-12)
