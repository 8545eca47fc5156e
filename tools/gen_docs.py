"""Generated parts of the documentation site: an MkDocs hook, and a command-line tool to preview them.

The site (``mkdocs.yml``, sources in ``docs/``) is hand-written Markdown except for four things that
must never be copied by hand, because copies go stale:

* the **API reference**: one page per public module of ``attnsvm`` (every ``*.py`` and subpackage
  whose name does not start with ``_``, found on disk, so a new or renamed module gets its page
  without editing anything), each holding ``::: attnsvm.<module>`` for mkdocstrings, plus an index
  page listing each module with the first line of its docstring (read with ``ast``: nothing is
  imported);
* the **command line**: ``docs/cli.md`` holds the marker ``<!-- gen:cli-help -->``, replaced by the
  ``--help`` text of ``attnsvm`` and of each subcommand, taken from ``attnsvm.harness.cli.build_parser()``;
* the **benchmarks**: ``docs/benchmarks.md`` holds ``<!-- gen:bench docs/benchmarks/NAME.json -->``,
  replaced by tables rendered from that file, the JSON written by ``attnsvm bench --json``;
* the **changelog**: ``changelog.md`` is ``CHANGELOG.md`` from the repository root.

As a hook (``hooks: [tools/gen_docs.py]`` in ``mkdocs.yml``) it fills the ``API reference`` entry of
the navigation (``on_config``), adds the generated pages (``on_files``) and replaces the markers
(``on_page_markdown``); nothing is written into ``docs/``. As a script it prints one generated
piece, for review::

    python tools/gen_docs.py cli
    python tools/gen_docs.py bench docs/benchmarks/bench-quick.json
    python tools/gen_docs.py modules
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "attnsvm"
#: Width of the generated ``--help`` text (argparse reads ``COLUMNS``): fixed so the page does not
#: depend on the terminal that built it.
HELP_COLUMNS = 80
#: The navigation entry the hook expands into one page per module.
API_NAV_TITLE = "API reference"
CLI_MARKER = "<!-- gen:cli-help -->"
CHANGELOG_DOCS_LINK = re.compile(r"\]\(docs/")
#: Sphinx cross-reference roles in the docstrings (``:func:`name```), which Markdown renders as a literal
#: ``:func:`` before the code: the role is dropped, and ``~a.b.name`` shows ``name``, as in Sphinx.
SPHINX_ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|exc|obj|const):<code>(?:~(?:[\w.]+\.)?)?")
BENCH_MARKER = re.compile(r"<!-- gen:bench (?P<path>[^ ]+\.json) -->")
#: Docstring warnings known to be about style only, each silenced by file and message until that
#: docstring is fixed; every other warning still fails the strict build. svm.solve_svm: a
#: continuation line of ``Raises:`` is not indented under its item.
KNOWN_STYLE_WARNINGS: tuple[tuple[str, str], ...] = ()


# ----------------------------------------------------------------------------- modules
def public_modules(root: Path = ROOT) -> list[str]:
    """Dotted names of the package and its public modules and subpackages, found on disk."""
    pkg = root / PACKAGE
    names: list[str] = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts) or "__pycache__" in path.parts:
            continue
        if len(parts) > 1:
            names.append(".".join(parts))
    return names


def module_summary(name: str, root: Path = ROOT) -> str:
    """First line of the module's docstring, read without importing it."""
    base = root.joinpath(*name.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def api_page_path(name: str) -> str:
    """Site path of a module's API page: ``attnsvm.svm`` → ``api/svm.md``."""
    return "api/" + name.split(".", 1)[1].replace(".", "/") + ".md"


def api_page(name: str) -> str:
    """Markdown of one API page: the module's docstring and members, rendered by mkdocstrings."""
    return f"# `{name}`\n\n::: {name}\n"


def api_index(root: Path = ROOT) -> str:
    """Markdown of the API index: every public module with its one-line summary."""
    lines = [
        "# API reference",
        "",
        "Rendered from the docstrings by mkdocstrings (static analysis: nothing is imported). The top-level",
        f"`{PACKAGE}` namespace re-exports the everyday functions; each module below documents its own.",
        "",
        "| module | what it holds |",
        "|---|---|",
    ]
    for name in public_modules(root):
        summary = module_summary(name, root).replace("|", "\\|")
        lines.append(f"| [`{name}`]({api_page_path(name)[4:]}) | {summary} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- CLI
def cli_markdown() -> str:
    """``attnsvm --help`` and each subcommand's ``--help``, as Markdown code blocks."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    try:
        from attnsvm.harness.cli import build_parser

        parser = build_parser()
        blocks = [("attnsvm --help", parser.format_help())]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    blocks.append((f"attnsvm {name} --help", sub.format_help()))
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    out = []
    for title, text in blocks:
        out += [f"### `{title}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- benchmarks
def _num(x: Any) -> str:
    """A number as the tables show it: 3 significant digits, integers as integers."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if x == 0:
            return "0"
        if 1e-3 <= abs(x) < 1e5:
            return f"{x:.3g}"
        return f"{x:.2e}"
    return str(x)


def _range(r: Any) -> str:
    """A ``[low, high]`` range, or a dash when there is none (a single run)."""
    return "–" if not r or r[0] == r[1] else f"{_num(r[0])} … {_num(r[1])}"


def bench_markdown(path: Path) -> str:
    """Tables of an ``attnsvm bench --json`` file: environment, Att-SVM solvers, batched GD engine."""
    data = json.loads(path.read_text(encoding="utf-8"))
    env = dict(data.get("environment", {}))
    size = "quick" if data.get("quick") else ("tiny" if data.get("tiny") else "full")
    env_items = [f"{k} {_num(v) if v is not None else 'unset'}" for k, v in env.items()]
    if "load_avg_end" in data:
        env_items.append(f"load_avg_1min at the end {_num(data['load_avg_end'])}")
    command = (
        "python benchmarks/bench_svm.py --scale full --json"  # the script's format: {"rows": [...]}
        if "rows" in data
        else f"attnsvm bench{' --quick' if size == 'quick' else ''} --json"
    )
    out = [
        f"Source: `{path.relative_to(ROOT).as_posix() if path.is_absolute() else path}` "
        f"(`{command}`, sizes: **{size}**, "
        f"{_num(data.get('elapsed_s'))} s). Environment: " + ", ".join(env_items) + ".",
    ]
    svm = data.get("svm") or []
    if svm:
        shapes = sorted({(r.get("n"), r.get("T")) for r in svm}, key=str)
        out += [
            "",
            "#### Att-SVM solvers ("
            + "; ".join(f"n = {_num(n)}, T = {_num(t)}" for n, t in shapes)
            + "; errors relative to the certified dual solution)",
            "",
            "| method | d | time [s] (range) | runs | × dual | raw error | final error | certified |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in svm:
            cells = [
                str(r.get("method")),
                _num(r.get("d")),
                _num(r.get("time_s"))
                + ("" if _range(r.get("time_range_s")) == "–" else f" ({_range(r.get('time_range_s'))})"),
                _num(r.get("runs")),
                _num(r.get("time_over_dual")),
                _num(r.get("raw_rel_error")),
                _num(r.get("rel_error")),
                _num(r.get("certified")),
            ]
            out.append("| " + " | ".join(cells) + " |")
    scale = data.get("svm_scale") or [r for r in data.get("rows", []) if r.get("bench") == "svm_scale"]
    if scale:
        out += [
            "",
            "#### Att-SVM at scale (gaussian instances; one fresh process per solve; errors against the "
            "certified working-set W)",
            "",
            "| method | n, T, d | m | wall [s] | CPU [s] | peak [MiB] | certified | error bound | KKT max "
            "| error | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in scale:
            note = str(r.get("note", "")).replace("|", "\\|")
            cells = [
                str(r.get("method")),
                f"{_num(r.get('n'))}, {_num(r.get('T'))}, {_num(r.get('d'))}",
                _num(r.get("m")),
                _num(r.get("time_s")),
                _num(r.get("cpu_s")),
                _num(r.get("peak_mib")),
                _num(r.get("certified")),
                _num(r.get("error_bound")),
                _num(r.get("kkt_max")),
                _num(r.get("rel_error")),
                note,
            ]
            out.append("| " + " | ".join(cells) + " |")
    gd = data.get("gd") or []
    if gd:
        out += [
            "",
            "#### Batched GD engine against per-instance autograd loops",
            "",
            "| quantity | value | range | unit | note |",
            "|---|---|---|---|---|",
        ]
        for r in gd:
            note = str(r.get("note", "")).replace("|", "\\|")
            out.append(
                f"| `{r.get('name')}` | {_num(r.get('value'))} | {_range(r.get('range'))} | "
                f"{r.get('unit', '')} | {note} |"
            )
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- MkDocs hook
class _KnownStyleWarnings(logging.Filter):
    """Drops the docstring warnings listed in :data:`KNOWN_STYLE_WARNINGS`."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(path in msg and text in msg for path, text in KNOWN_STYLE_WARNINGS)


def on_config(config: Any) -> Any:
    """Expand the ``API reference`` navigation entry into the index and one page per module."""
    griffe_logger = logging.getLogger("mkdocs.plugins.griffe")
    if not any(isinstance(f, _KnownStyleWarnings) for f in griffe_logger.filters):
        griffe_logger.addFilter(_KnownStyleWarnings())
    nav = config.get("nav") or []
    for i, item in enumerate(nav):
        if isinstance(item, dict) and API_NAV_TITLE in item:
            entries: list[Any] = [{"Overview": "api/index.md"}]
            entries += [{name: api_page_path(name)} for name in public_modules()]
            nav[i] = {API_NAV_TITLE: entries}
    return config


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages: the API index and pages, and the changelog."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, "api/index.md", content=api_index()))
    for name in public_modules():
        files.append(File.generated(config, api_page_path(name), content=api_page(name)))
    # CHANGELOG.md links to pages as ``docs/x.md`` (from the repository root); on the site they are ``x.md``.
    changelog = CHANGELOG_DOCS_LINK.sub("](", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))
    files.append(File.generated(config, "changelog.md", content=changelog))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the CLI and benchmark markers by their generated Markdown."""
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_markdown())

    def bench(match: re.Match[str]) -> str:
        return bench_markdown(ROOT / match.group("path"))

    return BENCH_MARKER.sub(bench, markdown)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """API pages: show the docstrings' Sphinx roles as plain code (:data:`SPHINX_ROLE`)."""
    if not page.file.src_uri.startswith("api/"):
        return html
    return SPHINX_ROLE.sub("<code>", html)


# ----------------------------------------------------------------------------- script
def main(argv: list[str] | None = None) -> int:
    """Print one generated piece (``cli``, ``bench FILE`` or ``modules``) to stdout."""
    p = argparse.ArgumentParser(description="Print a generated part of the documentation site.")
    p.add_argument("what", choices=("cli", "bench", "modules"))
    p.add_argument("file", nargs="?", help="for bench: the JSON written by `attnsvm bench --json`")
    args = p.parse_args(argv)
    if args.what == "cli":
        print(cli_markdown())
    elif args.what == "bench":
        if not args.file:
            p.error("bench needs the JSON file")
        print(bench_markdown(Path(args.file).resolve()))
    else:
        print(api_index())
    return 0


if __name__ == "__main__":
    sys.exit(main())
