"""Mutation testing of one attnsvm module at a time (mutmut 3), with a uniform random sample.

Usage (from the repository root, serially: mutmut cannot run under pytest-xdist)::

    python tools/mutation.py grad                  # every mutant of attnsvm/model/_grad.py
    python tools/mutation.py gd --sample 500       # a uniform random sample of 500 mutants
    python tools/mutation.py --list                # the modules and their test selections
    tox -e mutation -- gd --sample 500             # the same, in tox's mutation environment

What it does:

1. copies the working tree (tracked and untracked-but-not-ignored files) into
   ``build/mutation/<module>/`` so that a run never touches the checkout;
2. writes a ``[tool.mutmut]`` section into the copy's ``pyproject.toml`` that mutates only
   the module's files (:data:`PATHS`: one file, or the files a module was split into) and runs only that module's test selection (:data:`TESTS`; unit tests,
   property suites in the ``mutation`` profile: ci with a quarter of the examples);
3. generates the mutants, draws the sample (``random.Random(seed).sample`` over the sorted mutant
   names, so a sample is reproducible from its seed), runs mutmut on exactly those;
4. reads each mutant's outcome, subtracts the mutants judged *equivalent* in
   ``docs/mutation/equivalent.csv`` (committed, one reason per mutant), and writes
   ``docs/mutation/<module>.json``: counts, the score ``killed / (tried − equivalent)`` and its
   exact (Clopper–Pearson) 95 % interval, the seed, the survivors' names.

Survivors are shown with ``mutmut show NAME`` inside ``build/mutation/<module>/``. After adding
tests for them, ``--survivors`` runs only the last run's live survivors again (valid while the
module's source is unchanged; the JSON records its hash).

After a change to some of a module's functions, ``--update`` re-runs only what the change can have
changed, as mutmut's own cache does: mutmut numbers a function's mutants from that function's code, so
the mutants of every function whose code is unchanged keep their names and outcomes, and only the
changed or new functions' mutants are drawn and run. The sample of those is a seeded Bernoulli draw at
the previous run's rate ``tried / mutants`` (every mutant after a full run), decided per mutant name, so
the union stays a uniform sample in expectation. It refuses when the module's code outside its functions
(constants, imports, class attributes: :func:`context_hash`) changed. What it cannot see: a mutant of an
unchanged function whose outcome depends on a changed one; run the whole sample again before stating a
final score (``--rerun`` runs the recorded sample again, whole).

A key's code is read as one, whichever of its files holds each definition (:func:`_key_statements`), and a
previous result's mutants are matched by their local name (:func:`canonical_mutant`, which drops the module
path mutmut prefixes and applies the recorded renames of :data:`RENAMES`): moving code between a key's
files, or renaming a class with a recorded entry, keeps its results. When the hashing rule itself changes,
``tools/mutation_restamp.py`` recomputes the stored hashes on the version each result was run on.
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "mutation"
EQUIVALENT = RESULTS / "equivalent.csv"

#: Test selection per module: the tests that state the module's claims. Globs are relative to the
#: repository root; missing files are skipped.
TESTS: dict[str, list[str]] = {
    "scaling": ["tests/test_scaling.py", "tests/test_strategies_scale.py"],
    "instance": [
        "tests/test_instance.py",
        "tests/test_scale_core.py",
        "tests/test_masks.py",
        "properties/test_bad_input.py",
        "properties/test_masks.py",
    ],
    "attention": [
        "tests/test_attention.py",
        "tests/test_scale_core.py",
        "tests/test_masks.py",
        "properties/test_attention.py",
        "properties/test_scale_core.py",
        "properties/test_masks.py",
    ],
    "losses": ["tests/test_losses.py", "properties/test_attention.py"],
    "grad": [
        "tests/test_grad.py",
        "tests/test_grad_edges.py",
        "tests/test_grad_log_edges.py",
        "tests/test_scale_core.py",
        "tests/test_masks.py",
        "properties/test_grad.py",
        "properties/test_scale_core.py",
        "properties/test_bad_input.py",
        "properties/test_masks.py",
    ],
    "tensor": [
        "tests/test_tensor.py",
        "tests/test_scale_core.py",
        "tests/test_masks.py",
        "properties/test_tensor.py",
        "properties/test_bad_input.py",
        "properties/test_masks.py",
    ],
    "svm": [
        "tests/test_svm.py",
        "tests/test_svm_edges.py",
        "tests/test_scale_svm.py",
        "tests/test_masks.py",
        "properties/test_svm.py",
        "properties/test_scale_svm.py",
        "properties/test_masks.py",
    ],
    "svm_working_set": [
        "tests/test_svm_working_set.py",
        "tests/test_svm_working_set_edges.py",
        "tests/test_svm_working_set_core_edges.py",
        "tests/test_masks.py",
        "properties/test_masks.py",
    ],
    # properties/test_gd.py (8000-step convergence runs, minutes) is left out: the unit tests and the
    # scale and batch properties exercise every line of gd.py in seconds.
    "gd": [
        "tests/test_gd.py",
        "tests/test_gd_edges.py",
        "tests/test_gd_batch_edges.py",
        "tests/test_gd_more_edges.py",
        "tests/test_gd_batch_refusals.py",
        "tests/test_batch_engine.py",
        "tests/test_engine_spread.py",
        "tests/test_fused_kernel.py",
        "tests/test_value_exponents.py",
        "tests/test_masked_rescale.py",
        "tests/test_grad_overflowing_loss.py",
        "tests/test_engine_eager_paths.py",
        "tests/test_gd_scale_and_build_edges.py",
        "tests/test_masks_batch.py",
        "tests/test_scale_gd.py",
        "tests/test_masks.py",
        "properties/test_gd_batch.py",
        "properties/test_scale_gd.py",
        "properties/test_masks.py",
    ],
    "lipschitz": [
        "tests/test_lipschitz.py",
        "tests/test_lipschitz_edges.py",
        "tests/test_scale_lipschitz.py",
        "tests/test_lipschitz_estimate_edges.py",
        "tests/test_lipschitz_bound_edges.py",
        "tests/test_masks_lipschitz.py",
        "properties/test_lipschitz.py",
        "properties/test_scale_lipschitz.py",
    ],
    "prompt": [
        "tests/test_prompt.py",
        "tests/test_prompt_edges.py",
        "tests/test_scale_peers.py",
        "properties/test_scale_peers.py",
    ],
    "joint": [
        "tests/test_joint.py",
        "tests/test_joint_edges.py",
        "tests/test_scale_peers.py",
        "properties/test_scale_peers.py",
    ],
    "mirror": [
        "tests/test_mirror.py",
        "tests/test_mirror_edges.py",
        "tests/test_mirror_svm_edges.py",
        "tests/test_scale_peers.py",
        "properties/test_scale_peers.py",
    ],
    "multitoken": [
        "tests/test_multitoken.py",
        "tests/test_multitoken_edges.py",
        "tests/test_scale_peers.py",
        "properties/test_scale_peers.py",
    ],
    "strategies": [
        "tests/test_strategies.py",
        "tests/test_strategies_scale.py",
        "tests/test_strategies_masks.py",
    ],
    "validation": ["tests/test_validation.py", "tests/test_instance.py", "properties/test_bad_input.py"],
}

#: The files of each module key (the keys of :data:`TESTS` name the results, ``docs/mutation/KEY.json``).
#: A key may span several files (a module split into a package's files): mutmut mutates them together, the
#: hashes below read their code as one (:func:`_key_statements`), and mutant names are compared by their
#: local name (:func:`canonical_mutant`), so moving code between a key's files keeps its results.
PATHS: dict[str, tuple[str, ...]] = {
    "scaling": ("attnsvm/scaling.py",),
    "instance": ("attnsvm/model/_instance.py",),
    "attention": ("attnsvm/model/_attention.py",),
    "losses": ("attnsvm/model/_losses.py",),
    "grad": ("attnsvm/model/_grad.py",),
    "tensor": ("attnsvm/model/_tensor.py",),
    # attnsvm/svm/_solve.py until its split (pure moves)
    "svm": (
        "attnsvm/svm/_constants.py",
        "attnsvm/svm/_results.py",
        "attnsvm/svm/_dual.py",
        "attnsvm/svm/_problem.py",
        "attnsvm/svm/_conic.py",
        "attnsvm/svm/_solve.py",
        "attnsvm/svm/_optimality.py",
    ),
    "svm_working_set": ("attnsvm/svm/_working_set.py",),
    # attnsvm/gd/_engine.py until its split (pure moves)
    "gd": (
        "attnsvm/gd/_metrics.py",
        "attnsvm/gd/_scaled.py",
        "attnsvm/gd/_single.py",
        "attnsvm/gd/_torch_engine.py",
        "attnsvm/gd/_fused.py",
        "attnsvm/gd/_stack.py",
        "attnsvm/gd/_batch.py",
        "attnsvm/gd/_paths.py",
        "attnsvm/gd/_kq.py",
    ),
    # attnsvm/lipschitz.py until its split into a package (pure moves and extracted phases)
    "lipschitz": (
        "attnsvm/lipschitz/_checks.py",
        "attnsvm/lipschitz/_pairs.py",
        "attnsvm/lipschitz/_logit.py",
        "attnsvm/lipschitz/_results.py",
        "attnsvm/lipschitz/_bound.py",
        "attnsvm/lipschitz/_heads.py",
        "attnsvm/lipschitz/_jacobian.py",
        "attnsvm/lipschitz/_estimate.py",
        "attnsvm/lipschitz/_compare.py",
    ),
    "prompt": ("attnsvm/peers/_prompt.py",),
    "joint": ("attnsvm/peers/_joint.py",),
    "mirror": ("attnsvm/peers/_mirror.py",),
    "multitoken": ("attnsvm/peers/_multitoken.py",),
    "strategies": ("attnsvm/strategies.py",),
    "validation": ("attnsvm/_validation.py",),
}

#: Recorded renames of a key's top-level classes and functions, ``{key: {old name: new name}}``; never
#: guessed. The hashes read every identifier through it (a renamed class, its methods, and the calls and
#: annotations that name it hash as before), and a previous result's mutant and function names are read
#: through it (``xǁ_TorchBatchǁlogits__mutmut_3`` is ``xǁBatchEngineǁlogits__mutmut_3``): mutmut numbers
#: a function's mutants from its code, which a rename does not touch. An entry stays while any result or
#: ``equivalent.csv`` row predates its rename (it is a no-op on code that has only the new name).
RENAMES: dict[str, dict[str, str]] = {
    "gd": {"_TorchBatch": "BatchEngine"},  # attnsvm.gd.BatchEngine made public (issue 14)
}

#: mutmut's exit-code meanings (mutmut.stats.status_by_exit_code, 3.8.1), the ones that occur.
KILLED = {1, 3}
SURVIVED = {0}
TIMEOUT = {36, -24, 24, 152}
#: No result: the mutant was not run (33, 5: no test covers it). Any other code — 255 is mutmut's
#: worker raising an exception (``os._exit(-1)``), e.g. when ``pytest.main`` returns a usage error
#: inside mutmut although the same tests run normally outside it — is *errored*: neither killed nor
#: survived, left out of the score and reported, and the run fails.
UNTESTED = {33, 5}


def _copy_tree(dest: Path) -> None:
    """Copy tracked and untracked-not-ignored files (the working tree as a user would commit it)."""
    if dest.exists():
        shutil.rmtree(dest)
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in files:
        if not raw:
            continue
        rel = Path(raw.decode())
        src = ROOT / rel
        if not src.is_file():
            continue  # deleted in the working tree
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


def _checkout_state() -> dict[str, Any]:
    """``{"commit": HEAD's sha, "dirty": [tracked files that differ from it, and untracked ones]}`` of the
    checkout, read when a run copies it: the JSON then says which code the outcomes belong to."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout

    dirty = [line[3:] for line in git("status", "--porcelain").splitlines() if line[3:]]
    return {"commit": git("rev-parse", "HEAD").strip(), "dirty": sorted(dirty)}


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(x) for x in items) + "]"


def _configure(dest: Path, module: str, tests: list[str]) -> None:
    """Replace the copy's ``[tool.mutmut]`` section with one for this module."""
    text = (dest / "pyproject.toml").read_text()
    start = text.find("[tool.mutmut]")
    if start >= 0:
        nxt = text.find("\n[", start + 1)
        text = text[:start] + (text[nxt + 1 :] if nxt >= 0 else "")
    text += (
        "\n[tool.mutmut]\n"
        'source_paths = ["attnsvm"]\n'
        f"only_mutate = {_toml_list(list(PATHS[module]))}\n"
        f'also_copy = ["conftest.py", "properties/", "tests/", "symbolic/"]\n'
        'pytest_add_cli_args = ["-p", "no:xdist", "-p", "no:cacheprovider", "-p", "no:randomly", "-q", "--tb=line"]\n'
        f"pytest_add_cli_args_test_selection = {_toml_list(tests)}\n"
        # torch is not fork-safe after use: fork each mutant's worker from a clean server process.
        'process_isolation = "forkserver"\n'
    )
    (dest / "pyproject.toml").write_text(text)


def _generate(dest: Path) -> list[str]:
    """Generate the mutants (no tests run) and return their names, sorted."""
    code = (
        "from mutmut.__main__ import copy_src_dir, copy_also_copy_files, setup_source_paths, create_mutants\n"
        "from mutmut.__main__ import set_mutant_under_test\n"
        "import os\n"
        "os.makedirs('mutants', exist_ok=True)\n"
        "set_mutant_under_test('mutant_generation')\n"
        "copy_src_dir(); copy_also_copy_files(); setup_source_paths(); create_mutants(2)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=dest, check=True)
    return sorted(_exit_codes(dest))


def _exit_codes(dest: Path) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for meta in (dest / "mutants").rglob("*.meta"):
        out.update(json.loads(meta.read_text())["exit_code_by_key"])
    return out


def _equivalent(module: str, names: list[str]) -> dict[str, str]:
    """``{mutant: reason}`` of the key's rows of ``equivalent.csv``, each row matched to the current mutant of
    the same local name (:func:`canonical_mutant`: a row written before a move or a recorded rename names
    the same mutant); rows whose mutant no longer exists are left out."""
    if not EQUIVALENT.exists():
        return {}
    current = {canonical_mutant(n, module): n for n in names}
    with EQUIVALENT.open(newline="") as fh:
        rows = [row for row in csv.DictReader(fh) if row["module"] == module]
    out: dict[str, str] = {}
    for row in rows:
        name = current.get(canonical_mutant(row["mutant"], module))
        if name is not None:
            out[name] = row["reason"]
    return out


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial confidence interval for ``k`` successes in ``n`` trials."""
    from scipy.stats import beta

    if n == 0:
        return (0.0, 1.0)
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def _source_hash(module: str, root: Path | None = None, *, paths: tuple[str, ...] | None = None) -> str:
    """Hash of the key's code as mutmut sees it (:func:`_key_statements`, functions included): a
    documentation edit, a dependency guard, a moved internal import, a constant moved unchanged into a
    shared module, or a definition moved between the key's files keeps a run's mutant names (and
    ``--survivors``) valid, while any other code change does not. ``paths`` (default :data:`PATHS`) names
    the key's files in ``root``, e.g. in an older version of the tree."""
    return _digest(_key_statements(module, root, paths=paths, functions=True))


def _digest(statements: list[str]) -> str:
    return hashlib.sha256("\n".join(statements).encode()).hexdigest()


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


def _is_dependency_guard(stmt: ast.stmt) -> bool:
    """``require("torch", feature=...)`` as a statement, or the import of ``attnsvm._deps``: the guard
    changes behaviour only where the package is missing, and carries ``# pragma: no mutate``, so mutmut
    makes no mutant of it and the function's other mutants keep their numbers."""
    if isinstance(stmt, ast.ImportFrom) and (stmt.module or "").endswith("_deps"):
        return True
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Name)
        and stmt.value.func.id == "require"
    )


def _is_type_checking_import(stmt: ast.stmt) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) holding only imports, no ``else``: never runs,
    so it is an import statement like the others (a split often adds one to import a type across files)."""
    test = stmt.test if isinstance(stmt, ast.If) else None
    named = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )
    return (
        isinstance(stmt, ast.If)
        and named
        and not stmt.orelse
        and all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in stmt.body)
    )


def _is_internal_import(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.ImportFrom) and (
        stmt.level > 0 or (stmt.module or "").split(".")[0] == "attnsvm"
    )


def _module_file(importer: Path, stmt: ast.ImportFrom, root: Path) -> Path | None:
    """The file an internal ``from … import`` reads (``from .._types import X`` in
    ``attnsvm/model/_grad.py`` → ``attnsvm/_types.py``), or ``None`` when it is not a file of the tree."""
    if stmt.level > 0:
        base = importer.parent
        for _ in range(stmt.level - 1):
            base = base.parent
    else:
        base = root
    parts = (stmt.module or "").split(".") if stmt.module else []
    target = base.joinpath(*parts) if parts else base
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _simple_binding(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    """``NAME = expr`` or ``NAME: T = expr`` at module level, as ``(NAME, expr)``."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return stmt.target.id, stmt.value
    return None


@cache
def _parsed(path: Path) -> ast.Module:
    """A source file's syntax tree, parsed once per run (every imported name of a module looks into it)."""
    return ast.parse(path.read_text())


def _definition(path: Path, name: str, root: Path, depth: int = 0) -> str | None:
    """``ast.dump`` of the expression that ``name`` is bound to at module level in ``path`` (following
    internal re-exports), or ``None`` when it is not a simple binding (a function, a class, a guard...)."""
    if depth > 8:
        return None
    tree = _parsed(path)
    for stmt in tree.body:
        bound = _simple_binding(stmt)
        if bound is not None and bound[0] == name:
            return ast.dump(bound[1])
        if isinstance(stmt, ast.ImportFrom) and _is_internal_import(stmt):
            for a in stmt.names:
                if (a.asname or a.name) == name:
                    src = _module_file(path, stmt, root)
                    return None if src is None else _definition(src, a.name, root, depth + 1)
    return None


def _runtime_names(tree: ast.AST) -> set[str]:
    """The names the module reads when it runs: every loaded name outside annotations (with
    ``from __future__ import annotations``, which every module of the package has, annotations are never
    evaluated), so an alias used only in annotations is not among them."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        for field, value in ast.iter_fields(node):
            if field in ("annotation", "returns"):
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load):
                    names.add(child.id)
                if isinstance(child, ast.AST):
                    visit(child)

    visit(tree)
    return names


def _annotations_by_value(tree: ast.AST, path: Path, root: Path) -> None:
    """Replace, inside annotations, each name bound at module level to an expression (here or through an
    internal import) by that expression: ``IntArray`` and ``Int64Array`` bound to the same
    ``NDArray[np.int64]`` read the same, so renaming an alias keeps the functions' hashes."""
    values: dict[str, str] = {}
    for stmt in getattr(tree, "body", []):
        bound = _simple_binding(stmt)
        if bound is not None:
            values[bound[0]] = ast.dump(bound[1])
        elif isinstance(stmt, ast.ImportFrom) and _is_internal_import(stmt):
            src = _module_file(path, stmt, root)
            for a in stmt.names:
                expr = None if src is None else _definition(src, a.name, root)
                if expr is not None:
                    values[a.asname or a.name] = expr

    class _Sub(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return ast.Constant(values[node.id]) if node.id in values else node

    for node in ast.walk(tree):
        for field in ("annotation", "returns"):
            ann = getattr(node, field, None)
            if isinstance(ann, ast.AST):
                setattr(node, field, _Sub().visit(ann))


def _rename(tree: ast.AST, renames: dict[str, str]) -> None:
    """Read every identifier through a recorded rename (:data:`RENAMES`): names, attributes, definitions
    and imported names, in place."""
    if not renames:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            node.id = renames.get(node.id, node.id)
        elif isinstance(node, ast.Attribute):
            node.attr = renames.get(node.attr, node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node.name = renames.get(node.name, node.name)
        elif isinstance(node, ast.alias):
            node.name = renames.get(node.name, node.name)
            if node.asname is not None:
                node.asname = renames.get(node.asname, node.asname)


def _normalized_tree(
    source: str, path: Path | None = None, root: Path = ROOT, *, renames: dict[str, str] | None = None
) -> ast.AST:
    """The syntax tree without what mutmut's mutants do not depend on: docstrings, dependency guards
    (:func:`_is_dependency_guard`), ``__all__``, and where the package's own imports come from and in which
    order: in each body, the imports from ``attnsvm`` (relative or absolute) become one sorted list of the
    names they bind (``from .grad import x`` and ``from ..model._grad import x`` both bind ``x``), so
    that moving a module, or sorting its imports, keeps its results.

    At module level (when ``path``, the module's file, is given) a name that is bound to an expression,
    here (``EPS = float(np.finfo(np.float64).eps)``) or by an internal import of such a binding
    (``from ..scaling import EPS``), becomes the pair (name, expression), and these pairs are sorted: moving
    a constant or an array alias into a shared module, unchanged, keeps the context; changing its value
    does not; inside annotations such a name reads as its expression (:func:`_annotations_by_value`). A
    binding that nothing reads at run time (an array alias used only in annotations) is left
    out. The other names that module-level imports bind (functions, classes, modules; internal or
    not) are left out: a name that an unchanged function reads is bound as before (or that function fails),
    and a new one is read only by changed functions, whose mutants run again; what an imported function does
    is another module's code, which no mutant of this module's results covers (the assumption every
    per-module run makes). Rebinding an imported name to a different object of the same name
    (``import jax.numpy as np``) is the one change this does not see.

    ``renames`` (a key's :data:`RENAMES`) is applied to every identifier first.
    """
    tree = _strip_docstrings(ast.parse(source))
    _rename(tree, renames or {})
    read = _runtime_names(tree)
    if path is not None:
        _annotations_by_value(tree, path, root)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list) or not any(isinstance(s, ast.stmt) for s in body):
            continue
        module_level = node is tree and path is not None
        kept = [s for s in body if not _is_dependency_guard(s)]
        if module_level:
            kept = [s for s in kept if (_simple_binding(s) or ("", None))[0] != "__all__"]
        internal = [s for s in kept if _is_internal_import(s)]
        bindings: list[tuple[str, str]] = []
        names: set[tuple[str, str]] = set()
        for s in internal:
            for a in s.names:  # type: ignore[attr-defined]
                expr = None
                if module_level:
                    src = _module_file(path, s, root)  # type: ignore[arg-type]
                    expr = None if src is None else _definition(src, a.name, root)
                if expr is None:
                    if not module_level:
                        names.add((a.name, a.asname or ""))
                else:
                    bindings.append((a.asname or a.name, expr))
        rest = [s for s in kept if not _is_internal_import(s)]
        if module_level:
            rest = [
                s
                for s in rest
                if not isinstance(s, (ast.Import, ast.ImportFrom)) and not _is_type_checking_import(s)
            ]
            local = [(b[0], ast.dump(b[1])) for s in rest if (b := _simple_binding(s)) is not None]
            bindings += local
            rest = [s for s in rest if _simple_binding(s) is None]
        head: list[ast.stmt] = []
        if names:
            head.append(
                ast.ImportFrom(
                    module="<attnsvm>",
                    names=[ast.alias(name=n, asname=a or None) for n, a in sorted(names)],
                    level=0,
                )
            )
        head += [
            ast.Expr(ast.Constant(f"{n} = {e}")) for n, e in sorted(bindings) if not module_level or n in read
        ]
        node.body = (head + rest) or [ast.Pass()]  # type: ignore[attr-defined]
    return tree


def _key_trees(module: str, root: Path | None, paths: tuple[str, ...] | None) -> list[tuple[str, ast.Module]]:
    """``(file, normalized tree)`` of each of the key's files under ``root`` (default :data:`ROOT`)
    (:func:`_normalized_tree`, with the key's recorded renames)."""
    root = ROOT if root is None else root
    renames = RENAMES.get(module, {})
    out: list[tuple[str, ast.Module]] = []
    for rel in PATHS[module] if paths is None else paths:
        path = root / rel
        tree = _normalized_tree(path.read_text(), path, root, renames=renames)
        assert isinstance(tree, ast.Module)
        out.append((rel, tree))
    return out


def _definitions(module: str, trees: list[tuple[str, ast.Module]]) -> None:
    """Refuse a key whose files define one top-level function or class name twice: mutmut names a mutant
    by its function's local name, and the hashes are keyed by it."""
    seen: dict[str, str] = {}
    for rel, tree in trees:
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name in seen:
                    raise SystemExit(
                        f"{module}: {node.name} is defined in both {seen[node.name]} and {rel}; a key's files "
                        "must define each top-level name once"
                    )
                seen[node.name] = rel


def _key_statements(
    module: str, root: Path | None, *, paths: tuple[str, ...] | None = None, functions: bool
) -> list[str]:
    """The key's module-level code as one sorted set of normalized statements, whichever file holds each.

    Each file is normalized on its own (:func:`_normalized_tree`: docstrings, imports, ``__all__`` and
    dependency guards dropped; every constant or alias a file reads at run time, bound there or imported
    from the package, as the pair (name, expression)); then the ``ast.dump`` of every module-level statement
    of every file goes into one set, sorted. A set, not the files' sequence or a multiset: a constant that
    two files import is one binding, as in the single file it came from, and the order of module-level
    statements is not behaviour here (the package's modules bind constants and define functions and classes
    at module level; a name used at import time before it is bound fails the clean test run). So a key
    split over files, or a definition or constant moved between them, hashes as before; a changed value or
    definition does not. A top-level name defined twice is refused (:func:`_definitions`). Without
    ``functions`` (the context), functions and methods are left out, names included, and classes keep their
    other statements (attributes, decorators, bases)."""
    trees = _key_trees(module, root, paths)
    _definitions(module, trees)

    def strip(body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.ClassDef):
                node.body = strip(node.body) or [ast.Pass()]
            out.append(node)
        return out

    statements: set[str] = set()
    for _, tree in trees:
        body = tree.body if functions else strip(tree.body)
        # a file left without code (only imports, or constants read in other files) adds nothing
        statements.update(ast.dump(stmt) for stmt in body if not isinstance(stmt, ast.Pass))
    return sorted(statements)


def function_hashes(
    module: str, root: Path | None = None, *, paths: tuple[str, ...] | None = None
) -> dict[str, str]:
    """``{"f": sha, "Class.method": sha}`` of the top-level functions and methods of the key's files
    (normalized as in :func:`_normalized_tree`, recorded renames applied; a name defined twice is refused):
    mutmut numbers a function's mutants from its code, so an equivalent row stays meaningful exactly while
    its function's hash is unchanged, in whichever of the key's files the function is."""
    trees = _key_trees(module, root, paths)
    _definitions(module, trees)
    out: dict[str, str] = {}
    for _, tree in trees:
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[node.name] = hashlib.sha256(ast.dump(node).encode()).hexdigest()[:16]
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        key = f"{node.name}.{item.name}"
                        out[key] = hashlib.sha256(ast.dump(item).encode()).hexdigest()[:16]
    return out


def context_hash(module: str, root: Path | None = None, *, paths: tuple[str, ...] | None = None) -> str:
    """Hash of the key's code outside its functions and methods (:func:`_key_statements` without
    functions): what every mutant may depend on. Functions and methods are left out, names included: a new
    one is read only by changed functions (whose mutants run again), and a removed one that an unchanged
    function reads fails the clean test run."""
    return _digest(_key_statements(module, root, paths=paths, functions=False))


def in_bernoulli_sample(name: str, seed: int, rate: float) -> bool:
    """Whether a mutant belongs to the seeded Bernoulli sample of the given rate: decided from the seed and
    the mutant's local name only (not its module path), so the decision survives a module move."""
    local = name.rsplit(".", 1)[1]
    u = int.from_bytes(hashlib.sha256(f"{seed}:{local}".encode()).digest()[:8], "big") / 2.0**64
    return u < rate


def mutant_function(name: str) -> str:
    """The function a mutant belongs to: ``attnsvm.gd._engine.x_run_gd__mutmut_3`` → ``run_gd``,
    ``attnsvm.gd._engine.xǁ_TorchBatchǁrisk__mutmut_2`` → ``_TorchBatch.risk`` (the module path before the last
    dot does not matter: mutant-local names hold no dots)."""
    local = name.rsplit(".", 1)[1].rsplit("__mutmut_", 1)[0]
    if local.startswith("xǁ"):
        cls, meth = local[2:].split("ǁ", 1)
        return f"{cls}.{meth}"
    return local[2:]  # "x_" + function name


def canonical_function(name: str, module: str) -> str:
    """A function or ``Class.method`` name read through the key's recorded renames (:data:`RENAMES`)."""
    renames = RENAMES.get(module, {})
    head, dot, tail = name.partition(".")
    return renames.get(head, head) + dot + tail


def _function_of(name: str, module: str) -> str:
    """The canonical function (:func:`canonical_function`) a mutant belongs to."""
    return canonical_function(mutant_function(name), module)


def canonical_mutant(name: str, module: str) -> str:
    """How a mutant is compared with a previous result's: its local name (the module path that mutmut
    prefixes, which a move between files or modules changes, dropped), with the key's recorded renames
    applied: ``attnsvm.gd._engine.xǁ_TorchBatchǁlogits__mutmut_29`` and
    ``attnsvm.gd._torch_engine.xǁBatchEngineǁlogits__mutmut_29`` are both ``xǁBatchEngineǁlogits__mutmut_29``.
    Local names are unique within a key (:func:`_definitions`)."""
    local = name.rsplit(".", 1)[-1]
    base, number = local.rsplit("__mutmut_", 1)
    renames = RENAMES.get(module, {})
    if base.startswith("xǁ"):
        cls, meth = base[2:].split("ǁ", 1)
        base = f"xǁ{renames.get(cls, cls)}ǁ{meth}"
    else:
        base = "x_" + renames.get(base[2:], base[2:])
    return f"{base}__mutmut_{number}"


#: The mutant-name lists of a result, translated by :func:`_translate_previous`.
_NAME_LISTS = ("sample_names", "killed_names", "live_survivors", "untested", "errored")


def _translate_previous(doc: dict[str, Any], names: list[str], module: str) -> dict[str, Any]:
    """A previous result with its names read as today's: each recorded mutant becomes the current mutant of
    the same canonical local name (:func:`canonical_mutant`; one that no longer exists is dropped: its
    function changed or went), and the function hashes are keyed by canonical function names. The one place
    where names are compared with a previous result (``--update``, ``--survivors``, ``--rerun``)."""
    current = {canonical_mutant(n, module): n for n in names}
    out = dict(doc)
    for field in _NAME_LISTS:
        if out.get(field) is not None:
            found = (current.get(canonical_mutant(n, module)) for n in out[field])
            out[field] = [n for n in found if n is not None]
    if out.get("function_sha256") is not None:
        out["function_sha256"] = {canonical_function(f, module): h for f, h in out["function_sha256"].items()}
    return out


def _previous(module: str) -> dict[str, Any]:
    """The last run's result; ``--survivors`` needs it, for the same source of the module."""
    path = RESULTS / f"{module}.json"
    if not path.exists():
        raise SystemExit(f"{module}: no previous run ({path}); run without --survivors first")
    doc: dict[str, Any] = json.loads(path.read_text())
    if doc.get("source_sha256") != _source_hash(module):
        raise SystemExit(
            f"{module}: {' '.join(PATHS[module])} changed since the last run, so mutant names may mean other "
            "mutations; run the whole sample again (without --survivors)"
        )
    return doc


def _previous_for_update(module: str) -> dict[str, Any]:
    """The last run's result, for ``--update``: it must record its sample and the module's context."""
    path = RESULTS / f"{module}.json"
    if not path.exists():
        raise SystemExit(f"{module}: no previous run ({path}); run without --update first")
    doc: dict[str, Any] = json.loads(path.read_text())
    if "sample_names" not in doc or "context_sha256" not in doc:
        raise SystemExit(
            f"{module}: the last run does not record its sample and context (it predates --update); "
            "run the whole sample again"
        )
    if doc["context_sha256"] != context_hash(module):
        raise SystemExit(
            f"{module}: the module's code outside its functions changed since the last run (constants, "
            "imports or class attributes), which every mutant may depend on; run the whole sample again"
        )
    return doc


def _update_sample(
    prev: dict[str, Any], names: list[str], hashes: dict[str, str], seed: int, *, module: str = ""
) -> tuple[list[str], list[str], list[str]]:
    """``(chosen, to_run, changed functions)`` of an update: the previous sample's mutants of unchanged
    functions, plus a Bernoulli draw (:func:`in_bernoulli_sample`) of the changed functions' mutants.
    The previous result's names are read as today's (:func:`_translate_previous`: local names, the key's
    recorded renames); ``hashes`` are today's (:func:`function_hashes`, keyed by canonical names)."""
    prev = _translate_previous(prev, names, module)
    old = prev["function_sha256"]
    changed = sorted(f for f, h in hashes.items() if old.get(f) != h)
    present = set(names)
    # The previous sample: recorded, or every mutant after a full run (an unchanged function's mutants
    # are the same mutants now).
    prev_chosen = names if prev["sample_names"] is None else prev["sample_names"]
    kept = [n for n in prev_chosen if n in present and _function_of(n, module) not in changed]
    rate = 1.0 if prev["sample_names"] is None else prev["tried"] / prev["mutants_total"]
    fresh = [
        n
        for n in names
        if _function_of(n, module) in changed and (rate >= 1.0 or in_bernoulli_sample(n, seed, rate))
    ]
    return sorted(kept + fresh), fresh, changed


def run(
    module: str,
    *,
    sample: int | None,
    seed: int,
    children: int,
    survivors: bool,
    update: bool = False,
    rerun: bool = False,
) -> dict[str, Any]:
    """Mutate the module's file (:data:`PATHS`), run the sample (or, with ``survivors``, the last run's live
    survivors only, keeping its other outcomes; with ``update``, only the changed functions' mutants),
    and write ``docs/mutation/<module>.json``."""
    prev = _previous(module) if survivors else None
    upd = _previous_for_update(module) if update else None
    replay = _previous(module) if rerun else None
    tests = [t for t in TESTS[module] if (ROOT / t).exists()]
    dest = ROOT / "build" / "mutation" / module
    checkout = _checkout_state()
    _copy_tree(dest)
    _configure(dest, module, tests)
    names = _generate(dest)
    # the previous result's names as today's (a move between the key's files, a recorded rename)
    prev, upd, replay = (
        None if d is None else _translate_previous(d, names, module) for d in (prev, upd, replay)
    )
    changed: list[str] = []
    if prev is not None:
        sample, seed = prev["tried"], prev["sample_seed"] if prev["sample_seed"] is not None else seed
    if replay is not None:
        # every mutant of the recorded sample again, on the same code: removes --update's assumption
        chosen = names if replay.get("sample_names") is None else list(replay["sample_names"])
        to_run = chosen
        seed = replay["sample_seed"] if replay["sample_seed"] is not None else seed
    elif prev is not None and prev.get("sample_names") is not None:
        chosen, to_run = list(prev["sample_names"]), prev["live_survivors"]  # e.g. an updated sample
    elif upd is not None:
        seed = upd["sample_seed"] if upd["sample_seed"] is not None else seed
        chosen, to_run, changed = _update_sample(
            upd, names, function_hashes(module, dest), seed, module=module
        )
        print(f"{module}: update: changed or new functions: {', '.join(changed) or 'none'}", flush=True)
    else:
        chosen = (
            names
            if sample is None or sample >= len(names)
            else sorted(random.Random(seed).sample(names, sample))
        )
        to_run = chosen if prev is None else prev["live_survivors"]
    print(
        f"{module}: {len(names)} mutants, sample of {len(chosen)} (seed {seed}), running {len(to_run)}; "
        f"tests: {' '.join(tests)}",
        flush=True,
    )
    env = dict(os.environ, ATTNSVM_HYPOTHESIS_PROFILE="mutation", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["OPENBLAS_NUM_THREADS"] = "1"
    t0 = time.time()
    if to_run:
        # mutmut takes the names as arguments (a few thousand names fit in a Linux command line).
        subprocess.run(
            ["mutmut", "run", "--max-children", str(children), *to_run], cwd=dest, env=env, check=False
        )
    elapsed = time.time() - t0
    codes = _exit_codes(dest)
    unchecked = [n for n in to_run if codes.get(n) is None]
    if unchecked:
        # mutmut stops before testing any mutant when the clean run of the selection fails (for
        # example on a half-edited working tree): that is no result, not a survival.
        raise SystemExit(
            f"{module}: mutmut left {len(unchecked)} of {len(to_run)} mutants unchecked (did the clean "
            f"test run fail? see the output above, or run the selection in {dest}); no result written"
        )
    equivalent = _equivalent(module, names)
    hashes = function_hashes(module, dest)
    if prev is None and upd is None and (RESULTS / f"{module}.json").exists():
        # Equivalent rows were judged on the last run's code: a row whose function changed since then
        # may name a different mutation now (mutmut renumbers a changed function's mutants), so it
        # counts again until it is judged again.
        last = _translate_previous(json.loads((RESULTS / f"{module}.json").read_text()), names, module)
        old_hashes = last.get("function_sha256")
        if old_hashes is not None:
            stale = sorted(
                n
                for n in equivalent
                if old_hashes.get(_function_of(n, module)) != hashes.get(_function_of(n, module))
            )
            for n in stale:
                print("  equivalent row to judge again (its function changed since the last run):", n)
                del equivalent[n]
    known = KILLED | TIMEOUT | SURVIVED | UNTESTED
    errored = sorted(n for n in to_run if codes.get(n) not in known)
    if upd is not None:
        # Equivalent rows of changed functions may name other mutations now: they count again.
        for n in sorted(equivalent):
            if _function_of(n, module) in changed:
                print("  equivalent row to judge again (its function changed):", n)
                del equivalent[n]
        kept = set(chosen) - set(to_run)
        killed = sorted(
            (set(upd["killed_names"]) & kept) | {n for n in to_run if codes.get(n) in KILLED | TIMEOUT}
        )
        untested = sorted(
            (set(upd.get("untested", [])) & kept) | {n for n in to_run if codes.get(n) in UNTESTED}
        )
        errored = sorted((set(upd.get("errored", [])) & kept) | set(errored))
    elif prev is None:
        killed = sorted(n for n in chosen if codes.get(n) in KILLED | TIMEOUT)
        untested = sorted(n for n in chosen if codes.get(n) in UNTESTED)
    else:
        killed = sorted(set(prev["killed_names"]) | {n for n in to_run if codes.get(n) in KILLED | TIMEOUT})
        untested = sorted(n for n in to_run if codes.get(n) in UNTESTED)
    survived = sorted(set(chosen) - set(killed) - set(errored))
    judged = [n for n in survived if n in equivalent]
    live = [n for n in survived if n not in equivalent]
    denom = len(killed) + len(live)
    ratio = len(killed) / denom if denom else None
    lo, hi = clopper_pearson(len(killed), denom)
    full = len(chosen) == len(names)
    # which functions an --update re-ran; a whole rerun clears it; --survivors keeps the run's
    updated = (
        changed if upd is not None else None if replay is not None else (prev or {}).get("updated_functions")
    )
    doc: dict[str, Any] = {
        "module": list(PATHS[module]),
        # the commit the copy was taken from and the files that differed from it (uncommitted code ran)
        "commit": checkout["commit"],
        "dirty": checkout["dirty"],
        # of the copy that was mutated (the checkout may have changed during the run)
        "source_sha256": _source_hash(module, dest),
        "context_sha256": context_hash(module, dest),
        "mutants_total": len(names),
        "tried": len(chosen),
        "sample_seed": None if full else seed,
        "killed": len(killed),
        "survived": len(survived),
        "equivalent": len(judged),
        "score": ratio,
        "score_ci95": [lo, hi],
        "live_survivors": live,
        "untested": untested,
        "errored": errored,
        "tests": tests,
        "seconds": round(elapsed + (prev["seconds"] if prev else 0.0), 1),
        "updated_functions": updated,
        "mutmut": "3.8.1",
        "killed_names": killed,
        "function_sha256": hashes,
        # the mutants tried (None: every mutant of the module)
        "sample_names": None if full else chosen,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{module}.json").write_text(json.dumps(doc, indent=2) + "\n")
    score = f"{100 * ratio:.1f} %" if ratio is not None else "n/a"
    print(
        f"{module}: killed {len(killed)}, survived {len(survived)} ({len(judged)} judged equivalent), "
        f"score {score} [95 % CI {100 * lo:.1f}–{100 * hi:.1f} %], {elapsed:.0f} s"
    )
    for n in live:
        print("  live survivor:", n)
    if errored:
        print(f"  {len(errored)} mutants errored inside mutmut (no result; left out of the score)")
    return doc


def stamp(module: str) -> None:
    """Record the sample and the context hash in a result that predates them (for ``--update``), after
    checking that the module is unchanged and that the regenerated sample holds exactly the run's
    outcomes."""
    path = RESULTS / f"{module}.json"
    doc = json.loads(path.read_text())
    if doc["source_sha256"] != _source_hash(module):
        raise SystemExit(f"{module}: the module changed since its run; run it again instead")
    dest = ROOT / "build" / "mutation" / module
    _copy_tree(dest)
    _configure(dest, module, [t for t in TESTS[module] if (ROOT / t).exists()])
    names = _generate(dest)
    if len(names) != doc["mutants_total"]:
        raise SystemExit(f"{module}: {len(names)} mutants now, {doc['mutants_total']} in the run")
    full = doc["sample_seed"] is None
    chosen = names if full else sorted(random.Random(doc["sample_seed"]).sample(names, doc["tried"]))
    outcomes = set(doc["killed_names"]) | set(doc["live_survivors"]) | set(doc.get("errored", []))
    if (
        not {canonical_mutant(n, module) for n in outcomes} <= {canonical_mutant(n, module) for n in chosen}
        or len(chosen) != doc["tried"]
    ):
        raise SystemExit(f"{module}: the regenerated sample does not hold the run's outcomes")
    doc["context_sha256"] = context_hash(module)
    doc["sample_names"] = None if full else chosen
    doc.setdefault("updated_functions", None)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{module}: stamped ({len(chosen)} mutants in the sample)")


TABLE_START = "<!-- mutation-table: generated by `python tools/mutation.py --table` -->"
TABLE_END = "<!-- /mutation-table -->"


def status_table() -> str:
    """The per-module table of docs/mutation/README.md, from the committed ``MODULE.json`` files.

    A result whose module's code changed since its run (source hash) is marked *stale*; a module
    without a result is *not run*. Status: *met* when the score's point estimate is ≥ 95 %."""
    head = (
        "| module | mutants | tried | killed | equivalent | live | score (95 % CI) | status |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for module in TESTS:
        path = RESULTS / f"{module}.json"
        if not path.exists():
            rows.append(f"| {module} | | | | | | | not run |")
            continue
        d = json.loads(path.read_text())
        tried = "all" if d["sample_seed"] is None else f"sample {d['tried']} (seed {d['sample_seed']})"
        if d.get("updated_functions"):
            k = len(d["updated_functions"])
            tried += f", updated ({k} function{'s' if k != 1 else ''})"
        lo, hi = d["score_ci95"]
        score = "n/a" if d["score"] is None else f"{100 * d['score']:.1f} % ({100 * lo:.1f}–{100 * hi:.1f})"
        fresh = d["source_sha256"] == _source_hash(module)
        met = d["score"] is not None and d["score"] >= 0.95 and not d.get("errored")
        status = ("met" if met else "below 95 %") if fresh else "stale: the module changed since this run"
        rows.append(
            f"| {module} | {d['mutants_total']} | {tried} | {d['killed']} | {d['equivalent']} | "
            f"{len(d['live_survivors'])} | {score} | {status} |"
        )
    return "\n".join(rows)


def write_table(readme: Path = RESULTS / "README.md") -> None:
    """Replace the generated table between its markers in ``readme``."""
    text = readme.read_text()
    start, end = text.index(TABLE_START), text.index(TABLE_END)
    readme.write_text(text[: start + len(TABLE_START)] + "\n" + status_table() + "\n" + text[end:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", help=f"modules of attnsvm/ to mutate: {', '.join(TESTS)}")
    p.add_argument(
        "--sample", type=int, default=None, help="uniform random sample size (default: every mutant)"
    )
    p.add_argument("--seed", type=int, default=20261201, help="seed of the sample (default: 20261201)")
    p.add_argument("--children", type=int, default=2, help="parallel mutmut workers (default: 2)")
    p.add_argument("--list", action="store_true", help="print the modules and their test selections")
    p.add_argument(
        "--table", action="store_true", help="regenerate the status table in docs/mutation/README.md"
    )
    p.add_argument(
        "--survivors",
        action="store_true",
        help="run only the last run's live survivors again (after adding tests; the module's source "
        "must be unchanged), keeping its other outcomes",
    )
    p.add_argument(
        "--update",
        action="store_true",
        help="after a change to some functions: keep the outcomes of unchanged functions' mutants and run "
        "only the changed functions' (a Bernoulli draw at the last run's rate; see the module docstring)",
    )
    p.add_argument(
        "--stamp",
        action="store_true",
        help="record the sample and context hash in results that predate --update (module unchanged)",
    )
    p.add_argument(
        "--rerun",
        action="store_true",
        help="run every mutant of the last run's recorded sample again (e.g. after --update, to confirm it)",
    )
    args = p.parse_args(argv)
    if args.stamp:
        for m in args.modules or list(TESTS):
            stamp(m)
        return 0
    if args.survivors and args.update:
        p.error("--survivors and --update are exclusive (update first, then rerun its survivors)")
    if args.table:
        write_table()
        return 0
    if args.list or not args.modules:
        for m, t in TESTS.items():
            print(f"{m:12s} {' '.join(t)}")
        return 0
    unknown = [m for m in args.modules if m not in TESTS]
    if unknown:
        p.error(f"unknown module(s) {unknown}; choose from {', '.join(TESTS)}")
    live = 0
    for m in args.modules:
        doc = run(
            m,
            sample=args.sample,
            seed=args.seed,
            children=args.children,
            survivors=args.survivors,
            update=args.update,
            rerun=args.rerun,
        )
        live += len(doc["live_survivors"]) + len(doc["errored"])
    return 1 if live else 0


if __name__ == "__main__":
    raise SystemExit(main())
