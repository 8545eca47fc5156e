"""The mutation tool's bookkeeping (tools/mutation.py): what keeps a run's results valid, and the
incremental ``--update`` sample. No mutmut run: these pin the rules the scores rest on.

Oracles: hand-written source pairs whose behaviour is (or is not) the same; closed forms of the
Clopper–Pearson interval at its edges; the binomial law of a Bernoulli sample.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
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
    tool.PATHS[key] = ("attnsvm/fake.py",)
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


def _key(tool, root: Path, files: dict[str, str], key: str = "split") -> Path:
    """A module key made of ``files`` (``{name: source}`` under ``attnsvm/pkg/``)."""
    for name, source in files.items():
        path = root / "attnsvm" / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    tool.PATHS[key] = tuple(f"attnsvm/pkg/{name}" for name in files)
    return root


def _hashes(tool, root: Path, key: str = "split") -> tuple[str, str, dict[str, str]]:
    return tool._source_hash(key, root), tool.context_hash(key, root), tool.function_hashes(key, root)


#: One module before a split: constants read by several functions, a class with an attribute, a method
#: calling a function, ``__all__`` and a dependency guard.
SINGLE = '''"""The module before its split."""
from __future__ import annotations
import math
import numpy as np
from .._deps import require
require("numpy", feature="x")  # pragma: no mutate
__all__ = ["f", "K", "g"]
LIMIT = 3
_LN2 = math.log(2.0)


def f(x):
    """Doc of f."""
    return x * LIMIT + _LN2


class K:
    scale = 2

    def m(self, y):
        return f(y) * self.scale


def g(z):
    return np.abs(K().m(z)) - LIMIT
'''

#: The same code split over two files, as a pure move does it: new module docstrings, no ``__all__``,
#: imports recomputed per file (the constant ``LIMIT`` imported where it is read, an import for type
#: checking only), the guard dropped.
SPLIT_A = '''"""New docstring: the function f."""
from __future__ import annotations
import math
LIMIT = 3
_LN2 = math.log(2.0)


def f(x):
    """Doc of f (moved)."""
    return x * LIMIT + _LN2
'''
SPLIT_B = '''"""New docstring: K and g."""
from __future__ import annotations
from typing import TYPE_CHECKING
import numpy as np
from ._a import LIMIT, f
if TYPE_CHECKING:
    from ._a import _LN2


class K:
    scale = 2

    def m(self, y):
        return f(y) * self.scale


def g(z):
    return np.abs(K().m(z)) - LIMIT
'''


def test_a_key_split_over_two_files_keeps_its_hashes(tool, tmp_path: Path) -> None:
    """A pure move of one module's definitions into two files of the key (new module docstrings,
    ``__all__`` and the guard gone, imports recomputed, a constant imported where it is read) keeps the
    source, context and function hashes; the same split with one function's body changed changes that
    function's hash (and the source hash) only."""
    one = _hashes(tool, _key(tool, tmp_path / "one", {"single.py": SINGLE}))
    two = _hashes(tool, _key(tool, tmp_path / "two", {"_a.py": SPLIT_A, "_b.py": SPLIT_B}))
    assert two == one
    assert set(one[2]) == {"f", "K.m", "g"}
    body = SPLIT_B.replace("- LIMIT", "+ LIMIT")
    changed = _hashes(tool, _key(tool, tmp_path / "chg", {"_a.py": SPLIT_A, "_b.py": body}))
    assert changed[1] == one[1] and changed[0] != one[0]
    assert {k for k in one[2] if changed[2][k] != one[2][k]} == {"g"}
    # the file list of the key matters: a file left out loses its definitions
    tool.PATHS["split"] = ("attnsvm/pkg/_a.py",)
    assert set(tool.function_hashes("split", tmp_path / "two")) == {"f"}


CONSTS = '''"""Constants of the key."""
from __future__ import annotations
import math
LIMIT = 3
_LN2 = math.log(2.0)
'''


def test_moving_a_constant_between_a_keys_files_keeps_the_context(tool, tmp_path: Path) -> None:
    """``LIMIT`` and ``_LN2`` moved from ``_a`` into a third file of the key (read there by nothing,
    imported by ``_a`` and ``_b``) bind the same values: same context, source and function hashes as the
    single file. A real change of the constant's value, in the file that now holds it, changes the context
    (every mutant may read it) and leaves the function hashes; a constant that no file reads is not
    context, as in a single file."""
    one = _hashes(tool, _key(tool, tmp_path / "one", {"single.py": SINGLE}))
    moved_a = SPLIT_A.replace(
        "import math\nLIMIT = 3\n_LN2 = math.log(2.0)\n", "from ._consts import LIMIT, _LN2\n"
    )
    moved_b = SPLIT_B.replace("from ._a import LIMIT, f", "from ._a import f\nfrom ._consts import LIMIT")
    assert moved_a != SPLIT_A and moved_b != SPLIT_B
    files = {"_consts.py": CONSTS, "_a.py": moved_a, "_b.py": moved_b}
    assert _hashes(tool, _key(tool, tmp_path / "moved", files)) == one
    four = dict(files, **{"_consts.py": CONSTS.replace("LIMIT = 3", "LIMIT = 4")})
    real = _hashes(tool, _key(tool, tmp_path / "real", four))
    assert real[1] != one[1] and real[0] != one[0]
    assert real[2] == one[2]
    unread = dict(files, **{"_consts.py": CONSTS + "UNUSED = 9\n"})
    assert _hashes(tool, _key(tool, tmp_path / "unread", unread)) == one


def test_a_name_defined_twice_across_a_keys_files_is_refused(tool, tmp_path: Path) -> None:
    """mutmut names a mutant by its function's local name, and results are matched by it: two files of one
    key defining ``f`` (or the class ``K``) make the key ambiguous, and every hash refuses it, naming both
    files."""
    dup_b = SPLIT_B + "\n\ndef f(x):\n    return x\n"
    root = _key(tool, tmp_path / "dup", {"_a.py": SPLIT_A, "_b.py": dup_b})
    for fn in (tool.function_hashes, tool.context_hash, tool._source_hash):
        with pytest.raises(SystemExit, match=r"f is defined in both attnsvm/pkg/_a.py and attnsvm/pkg/_b.py"):
            fn("split", root)
    cls = _key(tool, tmp_path / "cls", {"_a.py": SPLIT_A + "\n\nclass K:\n    pass\n", "_b.py": SPLIT_B})
    with pytest.raises(SystemExit, match=r"K is defined in both"):
        tool.context_hash("split", cls)


OLD_CLASS = '''"""Doc."""
from __future__ import annotations


class _Engine:
    step = 2

    def run(self, x):
        return x * self.step

    def twice(self, x):
        return self.run(self.run(x))


def drive(x: _Engine) -> float:
    return _Engine().twice(x)
'''


def test_a_recorded_class_rename_keeps_its_methods_results(tool, tmp_path: Path, monkeypatch) -> None:
    """``_Engine`` renamed ``Engine`` (methods unchanged; the caller and its annotation follow the rename):
    with the rename recorded in ``RENAMES``, the context and every function hash are as before (keyed by
    the new name), a previous result's method mutants are today's, and an update runs nothing. Without the
    record the class hashes as another one: a rename is never guessed."""
    old_root = _key(tool, tmp_path / "old", {"e.py": OLD_CLASS}, key="ren")
    new_root = _key(tool, tmp_path / "new", {"e.py": OLD_CLASS.replace("_Engine", "Engine")}, key="ren")
    monkeypatch.setitem(tool.RENAMES, "ren", {})
    assert tool.context_hash("ren", old_root) != tool.context_hash("ren", new_root)
    assert set(tool.function_hashes("ren", old_root)) == {"_Engine.run", "_Engine.twice", "drive"}
    assert tool.function_hashes("ren", old_root)["drive"] != tool.function_hashes("ren", new_root)["drive"]
    monkeypatch.setitem(tool.RENAMES, "ren", {"_Engine": "Engine"})
    old, new = _hashes(tool, old_root, "ren"), _hashes(tool, new_root, "ren")
    assert old == new and set(new[2]) == {"Engine.run", "Engine.twice", "drive"}
    # the previous result as stored (its function keys and mutmut's names of the time) against today's
    old_names = [f"attnsvm.pkg.e.xǁ_Engineǁ{m}__mutmut_{i}" for m in ("run", "twice") for i in (1, 2)]
    drive = "attnsvm.pkg.e.x_drive__mutmut_1"
    new_names = [n.replace("xǁ_Engineǁ", "xǁEngineǁ") for n in old_names] + [drive]
    prev = {
        "function_sha256": {"_Engine.run": new[2]["Engine.run"], "_Engine.twice": new[2]["Engine.twice"]}
        | {"drive": new[2]["drive"]},
        "sample_names": [*old_names[:3], drive],
        "killed_names": old_names[:2],
        "live_survivors": [old_names[2]],
        "tried": 4,
        "mutants_total": 5,
        "sample_seed": 3,
    }
    chosen, to_run, changed = tool._update_sample(prev, new_names, new[2], 3, module="ren")
    assert changed == [] and to_run == []
    assert chosen == sorted([*new_names[:3], drive])
    moved = tool._translate_previous(prev, new_names, "ren")
    assert moved["killed_names"] == new_names[:2] and moved["live_survivors"] == [new_names[2]]
    assert set(moved["function_sha256"]) == {"Engine.run", "Engine.twice", "drive"}
    # without the record the methods are new functions, and their mutants run again
    monkeypatch.setitem(tool.RENAMES, "ren", {})
    _, to_run_bare, changed_bare = tool._update_sample(
        prev, new_names, tool.function_hashes("ren", new_root), 3, module="ren"
    )
    assert changed_bare == ["Engine.run", "Engine.twice"]
    assert to_run_bare and to_run_bare == [n for n in new_names[:4] if tool.in_bernoulli_sample(n, 3, 4 / 5)]


def test_previous_results_are_matched_by_local_name(tool, tmp_path: Path, monkeypatch) -> None:
    """A function moved to another file of its key keeps its mutants' local names (mutmut prefixes the
    module path): an update keeps their outcomes, and ``equivalent.csv`` rows written with the old path
    name today's mutants. A different local name (another function, another mutant number, a function
    that is gone) is never matched, nor another key's row."""
    old = [f"attnsvm.gd._engine.x_{f}__mutmut_{i}" for f in ("a", "b") for i in range(1, 6)]
    new = [n.replace("._engine.", "._single.") for n in old[:5]] + [
        n.replace("._engine.", "._paths.") for n in old[5:]
    ]
    assert tool.canonical_mutant(old[0], "gd") == tool.canonical_mutant(new[0], "gd") == "x_a__mutmut_1"
    assert tool.canonical_mutant(old[0], "gd") != tool.canonical_mutant(old[1], "gd")
    assert (
        tool.canonical_mutant("attnsvm.gd._engine.xǁ_TorchBatchǁ_parts__mutmut_29", "gd")
        == tool.canonical_mutant("attnsvm.gd._torch_engine.xǁBatchEngineǁ_parts__mutmut_29", "gd")
        == "xǁBatchEngineǁ_parts__mutmut_29"
    )
    prev = {
        "function_sha256": {"a": "1", "b": "2"},
        "sample_names": old[::2],
        "killed_names": old[::4],
        "tried": 5,
        "mutants_total": 10,
        "sample_seed": 1,
    }
    chosen, to_run, changed = tool._update_sample(prev, new, {"a": "1", "b": "2"}, 1, module="mod")
    assert changed == [] and to_run == [] and chosen == sorted(new[::2])
    assert tool._translate_previous(prev, new, "mod")["killed_names"] == new[::4]
    csv_path = tmp_path / "equivalent.csv"
    csv_path.write_text(
        "module,mutant,reason\n"
        f"mod,{old[1]},moved with its function\n"
        "mod,attnsvm.gd._engine.x_c__mutmut_1,its function is gone\n"
        f"other,{old[2]},another key's row\n"
    )
    monkeypatch.setattr(tool, "EQUIVALENT", csv_path)
    assert tool._equivalent("mod", new) == {new[1]: "moved with its function"}


def test_an_update_after_a_split_reruns_only_the_changed_function(tool, tmp_path: Path, monkeypatch) -> None:
    """Through ``run`` (mutmut stubbed: its mutant names and exit codes given): a full run of one file, then
    the module split over three files with one function changed (``a``) and the class renamed with a
    record. ``--update`` runs only ``a``'s mutants, keeps the renamed class's outcomes under today's names,
    and sends the equivalent row of the changed function back to judgement; ``--survivors`` then runs only
    the live survivors, found by today's names."""
    src = tmp_path / "src"
    pkg = src / "attnsvm" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "one.py").write_text(
        "LIMIT = 3\n\n\ndef a(x):\n    return x + LIMIT\n\n\nclass _E:\n    def r(self, y):\n        return y * 2\n"
    )
    state: dict = {"ran": []}
    monkeypatch.setattr(tool, "ROOT", src)
    monkeypatch.setattr(tool, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(tool, "EQUIVALENT", tmp_path / "results" / "equivalent.csv")
    monkeypatch.setitem(tool.TESTS, "k", [])
    monkeypatch.setitem(tool.PATHS, "k", ("attnsvm/pkg/one.py",))
    monkeypatch.setitem(tool.RENAMES, "k", {"_E": "E"})

    def copy_tree(dest: Path) -> None:  # the working tree's copy, as the tool makes it
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src / "attnsvm", dest / "attnsvm")

    monkeypatch.setattr(tool, "_copy_tree", copy_tree)
    monkeypatch.setattr(tool, "_checkout_state", lambda: {"commit": "0" * 40, "dirty": []})
    monkeypatch.setattr(tool, "_configure", lambda dest, module, tests: None)
    monkeypatch.setattr(tool, "_generate", lambda dest: sorted(state["codes"]))
    monkeypatch.setattr(tool, "_exit_codes", lambda dest: state["codes"])

    def fake_run(args, **kwargs):
        assert args[:2] == ["mutmut", "run"]
        state["ran"].append(sorted(args[4:]))

    monkeypatch.setattr(tool.subprocess, "run", fake_run)
    old_a = [f"attnsvm.pkg.one.x_a__mutmut_{i}" for i in (1, 2, 3)]
    old_r = [f"attnsvm.pkg.one.xǁ_Eǁr__mutmut_{i}" for i in (1, 2)]
    state["codes"] = {old_a[0]: 1, old_a[1]: 0, old_a[2]: 1, old_r[0]: 1, old_r[1]: 0}
    tool.RESULTS.mkdir()
    tool.EQUIVALENT.write_text(f"module,mutant,reason\nk,{old_a[1]},judged\n")
    full = tool.run("k", sample=None, seed=1, children=1, survivors=False)
    assert (full["killed"], full["equivalent"], full["live_survivors"]) == (3, 1, [old_r[1]])

    (pkg / "one.py").write_text("LIMIT = 3\n")
    (pkg / "two.py").write_text("from .one import LIMIT\n\n\ndef a(x):\n    return x - LIMIT\n")
    (pkg / "three.py").write_text("class E:\n    def r(self, y):\n        return y * 2\n")
    monkeypatch.setitem(tool.PATHS, "k", ("attnsvm/pkg/one.py", "attnsvm/pkg/two.py", "attnsvm/pkg/three.py"))
    new_a = [f"attnsvm.pkg.two.x_a__mutmut_{i}" for i in (1, 2, 3)]
    new_r = [f"attnsvm.pkg.three.xǁEǁr__mutmut_{i}" for i in (1, 2)]
    state["codes"] = {new_a[0]: 0, new_a[1]: 1, new_a[2]: 1, new_r[0]: None, new_r[1]: None}
    state["ran"] = []
    upd = tool.run("k", sample=None, seed=1, children=1, survivors=False, update=True)
    assert state["ran"] == [new_a] and upd["updated_functions"] == ["a"]
    assert upd["killed_names"] == sorted([new_r[0], new_a[1], new_a[2]])
    assert upd["live_survivors"] == sorted([new_r[1], new_a[0]]) and upd["equivalent"] == 0

    state["codes"][new_r[1]] = 1
    state["ran"] = []
    surv = tool.run("k", sample=None, seed=1, children=1, survivors=True)
    assert state["ran"] == [sorted([new_r[1], new_a[0]])]
    assert surv["killed"] == 4 and surv["live_survivors"] == [new_a[0]]


def test_the_keys_files_cover_the_split_packages(tool) -> None:
    """Every key's files exist and define each top-level name once; no file is in two keys; every file of
    the split packages ``attnsvm/gd``, ``attnsvm/svm`` and ``attnsvm/lipschitz`` (but ``__init__.py``, and
    ``svm``'s own key ``_working_set.py``) is in its key, so a file added by a later split is not silently left unmutated;
    every recorded rename belongs to a key."""
    keys = {k: v for k, v in tool.PATHS.items() if k in tool.TESTS}  # other tests add fake keys
    for key, files in keys.items():
        assert files and all((ROOT / f).is_file() for f in files), key
        tool.function_hashes(key)
    listed = [f for files in keys.values() for f in files]
    assert len(listed) == len(set(listed))
    for key, package in (("gd", "attnsvm/gd"), ("svm", "attnsvm/svm"), ("lipschitz", "attnsvm/lipschitz")):
        on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / package).glob("*.py")}
        assert set(keys[key]) == on_disk - {f"{package}/__init__.py", "attnsvm/svm/_working_set.py"}, key
    assert set(tool.RENAMES) <= set(keys)


@pytest.mark.parametrize("n", [1, 10, 500])
def test_clopper_pearson_edges(tool, n: int) -> None:
    """At ``k = n`` the exact interval's lower end is ``(α/2)^(1/n)`` and at ``k = 0`` its upper end is
    ``1 − (α/2)^(1/n)`` (closed forms of the beta quantile at its edge), with α = 0.05."""
    lo, hi = tool.clopper_pearson(n, n)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / n), rel=1e-12)
    lo0, hi0 = tool.clopper_pearson(0, n)
    assert lo0 == 0.0 and hi0 == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-12)


def test_a_run_records_the_commit_and_the_files_that_differed_from_it(
    tool, tmp_path: Path, monkeypatch
) -> None:
    """Oracle: git itself, in a throwaway repository: HEAD's sha, and the modified and untracked files."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
    (tmp_path / "a.py").write_text("x = 2\n")
    (tmp_path / "b.py").write_text("y = 1\n")
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    state = tool._checkout_state()
    assert state == {"commit": git("rev-parse", "HEAD").strip(), "dirty": ["a.py", "b.py"]}
