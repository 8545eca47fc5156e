"""The verification report: figures, ``report.md``, ``report.html``, ``results.json`` and CSV tables.

:func:`write_report` takes the :class:`~attnsvm.experiments.FamilyResult` list of a run and
writes, under one directory:

* ``<family>-<figure>.png`` — one PNG per figure (matplotlib, Agg backend);
* ``report.md`` — the claims, tables and figures in Markdown;
* ``report.html`` — the same, self-contained (PNGs embedded as base64);
* ``results.json`` — every number of the report (non-finite values as ``null``, their
  spelling kept in ``"nonfinite"``), the run's settings and the environment;
* ``<family>-<table>.csv`` — every table.

Nothing here computes a result: the report only lays out what the families measured.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .experiments import Claim, FamilyResult, Figure

__all__ = ["write_report", "to_jsonable", "summary_rows", "failed_claims", "render_figure"]

#: Rows of a table shown in report.md / report.html (the CSV and results.json keep all).
MAX_TABLE_ROWS = 40


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types: arrays → lists, numpy scalars → Python, non-finite floats → ``None``."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if obj is None or isinstance(obj, str):
        return obj
    return str(obj)


def failed_claims(results: Sequence[FamilyResult]) -> list[tuple[str, Claim]]:
    """``(family, claim)`` for every failed ``check`` claim."""
    return [(r.name, c) for r in results for c in r.failed]


def _status(r: FamilyResult) -> str:
    if not r.available:
        return "not available"
    return "FAIL" if r.failed else "pass"


def summary_rows(results: Sequence[FamilyResult]) -> list[dict[str, Any]]:
    """One row per family: status, checks passed, findings confirmed/refuted, time."""
    rows = []
    any_missing = any(not r.available for r in results)
    for r in results:
        checks = [c for c in r.claims if c.severity == "check"]
        finds = [c for c in r.claims if c.severity == "finding"]
        rows.append(
            {
                "family": r.name,
                "title": r.title,
                "status": _status(r),
                "checks": f"{sum(c.passed for c in checks)}/{len(checks)}",
                "findings": f"{sum(c.passed for c in finds)} hold, {sum(not c.passed for c in finds)} refuted",
                "time_s": round(r.elapsed_s, 2),
            }
        )
        if any_missing:
            rows[-1]["reason"] = r.reason
    return rows


# --------------------------------------------------------------------------- figures
def render_figure(fig: Figure, path: Path) -> None:
    """Draw ``fig`` with matplotlib (Agg) and save it as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    k = len(fig.panels)
    f, axes = plt.subplots(1, k, figsize=(5.2 * k, 4.0), squeeze=False)
    for ax, panel in zip(axes[0], fig.panels, strict=True):
        for s in panel.series:
            x = np.asarray(s.x, dtype=float)
            y = np.asarray([np.nan if v is None else v for v in s.y], dtype=float)
            mask = np.isfinite(x) & np.isfinite(y)
            if panel.xlog:
                mask &= x > 0
            if panel.ylog:
                mask &= y > 0
            if not np.any(mask):
                continue
            kw: dict[str, Any] = {"color": s.color} if s.color else {}
            (line,) = ax.plot(x[mask], y[mask], s.style, label=s.label, ms=4, lw=1.5, **kw)
            if s.lo is not None and s.hi is not None:
                lo = np.asarray([np.nan if v is None else v for v in s.lo], dtype=float)
                hi = np.asarray([np.nan if v is None else v for v in s.hi], dtype=float)
                bm = mask & np.isfinite(lo) & np.isfinite(hi)
                if panel.ylog:
                    bm &= (lo > 0) & (hi > 0)
                if np.any(bm):
                    ax.fill_between(x[bm], lo[bm], hi[bm], color=line.get_color(), alpha=0.18, lw=0)
        if panel.xlog:
            ax.set_xscale("log")
        if panel.ylog:
            ax.set_yscale("log")
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    f.suptitle(fig.title, fontsize=11)
    f.tight_layout()
    f.savefig(path, dpi=110)
    plt.close(f)


# ---------------------------------------------------------------------------- tables
def _cell(v: Any) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if not math.isfinite(f):
            return str(f)
        if f == 0 or 1e-3 <= abs(f) < 1e5:
            return f"{f:.4g}"
        return f"{f:.3e}"
    if isinstance(v, (list, tuple)):
        return " ".join(_cell(x) for x in v)
    return str(v)


def _columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    return cols


def _md_table(rows: Sequence[dict[str, Any]], limit: int = MAX_TABLE_ROWS) -> str:
    if not rows:
        return "_(empty)_\n"
    cols = _columns(rows)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows[:limit]:
        out.append("| " + " | ".join(_cell(r.get(c, "")).replace("|", "\\|") for c in cols) + " |")
    if len(rows) > limit:
        out.append(f"\n_{len(rows) - limit} more rows in the CSV file._")
    return "\n".join(out) + "\n"


def _html_table(rows: Sequence[dict[str, Any]], limit: int = MAX_TABLE_ROWS) -> str:
    if not rows:
        return "<p><em>(empty)</em></p>"
    cols = _columns(rows)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for r in rows[:limit]:
        cls = ""
        if r.get("status") == "FAIL" or r.get("result") == "FAIL":
            cls = ' class="fail"'
        body.append(
            f"<tr{cls}>" + "".join(f"<td>{html.escape(_cell(r.get(c, '')))}</td>" for c in cols) + "</tr>"
        )
    more = f"<p><em>{len(rows) - limit} more rows in the CSV file.</em></p>" if len(rows) > limit else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


def _claim_rows(r: FamilyResult) -> list[dict[str, Any]]:
    rows = []
    for c in r.claims:
        if c.severity == "check":
            result = "pass" if c.passed else "FAIL"
        else:
            result = "holds" if c.passed else "refuted"
        rows.append(
            {
                "claim": c.name,
                "kind": c.severity,
                "result": result,
                "statement": c.statement,
                "measured": c.message,
            }
        )
    return rows


def _write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    cols = _columns(rows)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: to_jsonable(r.get(c, "")) for c in cols})


# --------------------------------------------------------------------------- writing
def _meta(settings: dict[str, Any]) -> dict[str, Any]:
    from . import __version__

    libs = {}
    for name in ("numpy", "scipy", "torch", "cvxpy", "sympy", "matplotlib"):
        mod = sys.modules.get(name)
        if mod is not None:
            libs[name] = getattr(mod, "__version__", "?")
    return {
        "attnsvm": __version__,
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "libraries": libs,
        "blas_threads": {
            v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
        },
        **settings,
    }


def _nonfinite_paths(obj: Any, prefix: str = "") -> dict[str, str]:
    """JSON paths of non-finite floats (written as ``null``) and their spelling."""
    out: dict[str, str] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_nonfinite_paths(v, f"{prefix}/{k}"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_nonfinite_paths(v, f"{prefix}/{i}"))
    elif isinstance(obj, (float, np.floating)) and not math.isfinite(float(obj)):
        out[prefix] = str(float(obj))
    return out


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{border-bottom:2px solid #444}h2{border-bottom:1px solid #bbb;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0;font-size:.86em}td,th{border:1px solid #ccc;padding:.25em .5em;
text-align:left;vertical-align:top}th{background:#f2f2f2}tr.fail td{background:#fde2e2}
.pass{color:#11772d;font-weight:bold}.fail{color:#b00020;font-weight:bold}.na{color:#777}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}figcaption{font-size:.85em;color:#555}
code{background:#f4f4f4;padding:0 .2em}
"""


def write_report(
    results: Sequence[FamilyResult], out_dir: str | Path, settings: dict[str, Any]
) -> dict[str, Any]:
    """Write the report files for ``results`` under ``out_dir`` (created if needed).

    Args:
      results: the families' results, in report order.
      out_dir: the output directory.
      settings: the run's settings (size, seed, jobs, device, ...), recorded in the report.

    Returns:
      The ``results.json`` content (a dict), with ``"files"`` listing what was written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    pngs: dict[tuple[str, str], Path] = {}
    for r in results:
        for fig in r.figures:
            p = out / f"{r.name}-{fig.name}.png"
            render_figure(fig, p)
            pngs[(r.name, fig.name)] = p
            files.append(p.name)
        for tname, rows in r.tables.items():
            if rows:
                p = out / f"{r.name}-{tname}.csv"
                _write_csv(rows, p)
                files.append(p.name)

    meta = _meta(settings)
    summary = summary_rows(results)
    failed = failed_claims(results)
    raw = {
        "meta": meta,
        "passed": not failed,
        "failed_claims": [f"{fam}/{c.name}" for fam, c in failed],
        "summary": summary,
        "families": {
            r.name: {
                "title": r.title,
                "description": r.description,
                "available": r.available,
                "reason": r.reason,
                "elapsed_s": r.elapsed_s,
                "config": r.config,
                "numbers": r.numbers,
                "claims": [asdict(c) for c in r.claims],
                "tables": r.tables,
                "figures": [asdict(f) for f in r.figures],
            }
            for r in results
        },
    }
    doc = to_jsonable(raw)
    doc["nonfinite"] = _nonfinite_paths(raw)
    files += ["report.md", "report.html", "results.json"]
    doc["files"] = files
    (out / "results.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False), encoding="utf-8")

    settings_line = ", ".join(f"{k}={v}" for k, v in settings.items())
    verdict = (
        "all checks pass"
        if not failed
        else f"{len(failed)} check(s) FAILED: " + ", ".join(f"{fam}/{c.name}" for fam, c in failed)
    )

    # ---- Markdown
    md = [
        "# attnsvm verification report",
        "",
        f"attnsvm {meta['attnsvm']}, {meta['created']}; {settings_line}.",
        "",
        f"**Verdict: {verdict}.** A *check* is a guarantee of the package (a failure makes "
        "`attnsvm reproduce` exit non-zero); a *finding* is a statement of the literature or a "
        "conjecture that the harness tests and reports either way.",
        "",
        "## Summary",
        "",
        _md_table(summary),
    ]
    for r in results:
        md += [f"## {r.title} (`{r.name}`)", "", r.description, ""]
        if not r.available:
            md += [f"_Not available: {r.reason}._", ""]
            continue
        md += [f"Time: {r.elapsed_s:.1f} s.", "", "### Claims", "", _md_table(_claim_rows(r))]
        if r.numbers:
            md += ["### Numbers", "", _md_table([{"quantity": k, "value": v} for k, v in r.numbers.items()])]
        for fig in r.figures:
            p = pngs[(r.name, fig.name)]
            md += [f"![{fig.title}]({p.name})", ""]
            if fig.caption:
                md += [f"_{fig.caption}_", ""]
        for tname, rows in r.tables.items():
            md += [f"### Table `{tname}` ({len(rows)} rows; `{r.name}-{tname}.csv`)", "", _md_table(rows)]
    (out / "report.md").write_text("\n".join(md), encoding="utf-8")

    # ---- HTML (self-contained)
    def status_span(s: str) -> str:
        cls = {"pass": "pass", "FAIL": "fail"}.get(s, "na")
        return f'<span class="{cls}">{html.escape(s)}</span>'

    h = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>attnsvm verification report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>attnsvm verification report</h1>",
        f"<p>attnsvm {html.escape(str(meta['attnsvm']))}, {html.escape(str(meta['created']))}; "
        f"{html.escape(settings_line)}.</p>",
        f"<p><strong>Verdict: {status_span('pass' if not failed else 'FAIL')} — {html.escape(verdict)}.</strong> "
        "A <em>check</em> is a guarantee of the package (a failure makes <code>attnsvm reproduce</code> "
        "exit non-zero); a <em>finding</em> is a statement of the literature or a conjecture that the "
        "harness tests and reports either way.</p>",
        "<h2>Summary</h2>",
        _html_table(summary),
    ]
    for r in results:
        h += [
            f"<h2 id='{html.escape(r.name)}'>{html.escape(r.title)} (<code>{html.escape(r.name)}</code>)</h2>"
        ]
        h += [f"<p>{html.escape(r.description)}</p>"]
        if not r.available:
            h += [f"<p class='na'>Not available: {html.escape(r.reason)}.</p>"]
            continue
        h += [f"<p>Time: {r.elapsed_s:.1f} s.</p>", "<h3>Claims</h3>", _html_table(_claim_rows(r))]
        if r.numbers:
            h += [
                "<h3>Numbers</h3>",
                _html_table([{"quantity": k, "value": v} for k, v in r.numbers.items()]),
            ]
        for fig in r.figures:
            data = base64.b64encode(pngs[(r.name, fig.name)].read_bytes()).decode("ascii")
            h += [
                "<figure>",
                f"<img alt='{html.escape(fig.title)}' src='data:image/png;base64,{data}'>",
                f"<figcaption>{html.escape(fig.title)}. {html.escape(fig.caption)}</figcaption></figure>",
            ]
        for tname, rows in r.tables.items():
            h += [
                f"<details><summary>Table <code>{html.escape(tname)}</code> ({len(rows)} rows; "
                f"<code>{html.escape(r.name)}-{html.escape(tname)}.csv</code>)</summary>",
                _html_table(rows),
                "</details>",
            ]
    h += ["</body></html>"]
    (out / "report.html").write_text("\n".join(h), encoding="utf-8")
    return doc
