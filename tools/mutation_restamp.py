"""Restamp mutation results (``docs/mutation/KEY.json``) under the current hashing rule of tools/mutation.py.

Usage (from the repository root; reads git, writes only the named results)::

    python tools/mutation_restamp.py --legacy-tool REV gd svm        # restamp
    python tools/mutation_restamp.py --legacy-tool REV gd --check    # report only

When the rule that hashes a key's code changes (a key split over several files, a recorded rename, a new
normalization), a result's hashes must be recomputed on the code the result was *run on*, not on today's
code: otherwise a function changed since the run would look unchanged, and ``--update`` would keep
outcomes it must re-run. For each key this

1. loads the tool as it was at ``REV`` (the rule the result was stamped with) and its file list for the key;
2. walks the commits that touched those files (newest first, and ``REV`` itself), exports each commit's
   ``attnsvm/`` tree, and finds the one whose legacy source hash equals the result's ``source_sha256``;
   its legacy context hash and function hashes must equal the result's too (else nothing is written);
3. recomputes ``source_sha256``, ``context_sha256`` and ``function_sha256`` there with the current tool
   (the key's old files in that tree; the current :data:`RENAMES`), and checks that the legacy and current
   rules agree on which functions differ between that version and ``REV`` (a rule change that hides or
   invents a change is refused).

Counts, outcomes and mutant names are left as they are: the tool reads names by their local name and
recorded renames (``canonical_mutant``), so a move between files needs no rename of stored names.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _export(rev: str, dest: Path) -> Path:
    """``attnsvm/`` of ``rev`` under ``dest`` (what the hashes read: the key's files and their imports)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "attnsvm"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def _files(legacy: ModuleType, key: str) -> tuple[str, ...]:
    paths = legacy.PATHS[key]
    return (paths,) if isinstance(paths, str) else tuple(paths)


def _legacy_hashes(legacy: ModuleType, key: str, root: Path) -> tuple[str, str, dict[str, str]]:
    return legacy._source_hash(key, root), legacy.context_hash(key, root), legacy.function_hashes(key, root)


def restamp(key: str, legacy: ModuleType, current: ModuleType, rev: str, tmp: Path, *, write: bool) -> None:
    path = current.RESULTS / f"{key}.json"
    doc: dict[str, Any] = json.loads(path.read_text())
    files = _files(legacy, key)
    commits = [rev] + _git("log", "--format=%H", rev, "--", *files).split()
    found: str | None = None
    for commit in dict.fromkeys(commits):
        try:
            root = _export(commit, tmp / key / commit)
        except subprocess.CalledProcessError:
            continue
        if not all((root / f).is_file() for f in files):
            continue
        src, ctx, fun = _legacy_hashes(legacy, key, root)
        if src == doc["source_sha256"]:
            if ctx != doc.get("context_sha256", ctx) or fun != doc.get("function_sha256", fun):
                raise SystemExit(
                    f"{key}: {commit[:10]} matches the source hash but not the stored context/functions"
                )
            found = commit
            break
    if found is None:
        raise SystemExit(f"{key}: no version of {' '.join(files)} since {rev} matches the stored source hash")
    run_root, rev_root = tmp / key / found, tmp / key / rev
    new_src = current._source_hash(key, run_root, paths=files)
    new_ctx = current.context_hash(key, run_root, paths=files)
    new_fun = current.function_hashes(key, run_root, paths=files)
    # Both rules must see the same changes between the run's version and REV (renames read through).
    old_run, old_rev = legacy.function_hashes(key, run_root), legacy.function_hashes(key, rev_root)
    now_rev = current.function_hashes(key, rev_root, paths=files)
    canon = current.canonical_function
    legacy_changed = sorted(
        canon(f, key) for f in set(old_run) | set(old_rev) if old_run.get(f) != old_rev.get(f)
    )
    current_changed = sorted(f for f in set(new_fun) | set(now_rev) if new_fun.get(f) != now_rev.get(f))
    if legacy_changed != current_changed:
        raise SystemExit(f"{key}: the rules disagree on the changes: {legacy_changed} vs {current_changed}")
    legacy_ctx_same = legacy.context_hash(key, run_root) == legacy.context_hash(key, rev_root)
    if legacy_ctx_same != (new_ctx == current.context_hash(key, rev_root, paths=files)):
        raise SystemExit(f"{key}: the rules disagree on whether the context changed")
    print(
        f"{key}: run on {found[:10]}; functions changed since, up to {rev[:10]}: {', '.join(current_changed) or 'none'}"
        f"; context {'unchanged' if legacy_ctx_same else 'changed'}"
    )
    if not write:
        return
    doc["source_sha256"], doc["context_sha256"] = new_src, new_ctx
    if doc.get("function_sha256") is not None:
        doc["function_sha256"] = new_fun
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{key}: restamped")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("keys", nargs="+", help="result keys to restamp (docs/mutation/KEY.json)")
    p.add_argument(
        "--legacy-tool", required=True, help="git revision whose tools/mutation.py stamped the results"
    )
    p.add_argument("--check", action="store_true", help="find and check the versions; write nothing")
    args = p.parse_args(argv)
    rev = _git("rev-parse", args.legacy_tool).strip()
    current = _load(ROOT / "tools" / "mutation.py", "attnsvm_mutation_current")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "tool").mkdir()
        (tmp / "tool" / "mutation.py").write_text(_git("show", f"{rev}:tools/mutation.py"))
        legacy = _load(tmp / "tool" / "mutation.py", "attnsvm_mutation_legacy")
        for key in args.keys:
            restamp(key, legacy, current, rev, tmp, write=not args.check)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
