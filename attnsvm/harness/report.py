"""The verification report: figures, ``report.md``, ``report.html``, ``results.json`` and CSV tables.

:func:`write_report` takes the :class:`~attnsvm.harness.results.ExperimentResult` list of a run and
writes, under one directory:

* ``<experiment>-<figure>.png`` — one PNG per figure (matplotlib, Agg backend);
* ``report.md`` — the claims, tables and figures in Markdown;
* ``report.html`` — the same, self-contained (PNGs embedded as base64);
* ``results.json`` — every number of the report (non-finite values as ``null``, their
  spelling kept in ``"nonfinite"``), the run's settings and the environment, one entry per experiment
  under ``"experiments"``; its layout version is ``"format"`` (:data:`RESULTS_FORMAT`);
* ``<experiment>-<table>.csv`` — every table.

Nothing here computes a result: the report only lays out what the experiments measured.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import os
import platform
import re
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .results import ExperimentClaim, ExperimentResult, Figure

__all__ = [
    "write_report",
    "to_jsonable",
    "summary_rows",
    "failed_claims",
    "render_figure",
    "draw_figure",
    "RESULTS_FORMAT",
]

#: Layout version of ``results.json``: 2 has ``"format"``, the key ``"experiments"`` and the summary
#: column ``"experiment"``; the unversioned layout before it (1) said ``"families"`` / ``"family"``.
RESULTS_FORMAT = 2

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


def failed_claims(results: Sequence[ExperimentResult]) -> list[tuple[str, ExperimentClaim]]:
    """``(experiment, claim)`` for every failed ``check`` claim."""
    return [(r.name, c) for r in results for c in r.failed]


def _status(r: ExperimentResult) -> str:
    if not r.available:
        return "not available"
    return "FAIL" if r.failed else "pass"


def summary_rows(results: Sequence[ExperimentResult]) -> list[dict[str, Any]]:
    """One row per experiment: status, checks passed, findings confirmed/refuted, time."""
    rows = []
    any_missing = any(not r.available for r in results)
    for r in results:
        checks = [c for c in r.claims if c.severity == "check"]
        finds = [c for c in r.claims if c.severity == "finding"]
        rows.append(
            {
                "experiment": r.name,
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
#: Band (10–90 % over seeds) fill opacity: light enough that two overlapping bands stay readable;
#: each band's edges are also drawn as thin lines in its series' line style.
BAND_ALPHA = 0.1
#: Reference lines (``Panel.hlines``), in turn: line style and grey level.
HLINE_STYLES = (("--", "0.3"), (":", "0.45"), ("-.", "0.6"))
#: Two lines of a panel coincide on the page when their x agree and their y agree to this relative
#: tolerance (well under a pixel on the report's 4-inch axes): the later one's legend entry says so.
COINCIDE_RTOL = 1e-3
#: Default marker size (points).
MARKER_SIZE = 4.0


def _tick_label(v: float) -> str:
    """A tick label: plain ("6", "20", "0.25") inside [1e-3, 1e4), a power of ten outside."""
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    if 1e-3 <= abs(v) < 1e4:
        return f"{v:.4g}"
    e = math.floor(math.log10(abs(v)) + 1e-9)
    m = v / 10.0**e
    if abs(m - round(m)) < 1e-6 and round(m) == 1:
        return f"$10^{{{e}}}$"
    return f"${m:.3g}\\times10^{{{e}}}$"


def _format_log_axis(axis: Any, lo: float, hi: float) -> None:
    """Plain tick labels on a log axis; label the 2 and 5 minor ticks too when it spans < 2 decades.

    (matplotlib's default labels a short log axis with minor ticks "6×10⁰", "2×10⁰".)
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fmt = FuncFormatter(lambda v, _pos: _tick_label(v))
    axis.set_major_formatter(fmt)
    if lo > 0 and hi > lo and math.log10(hi / lo) < 2:
        axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        axis.set_minor_formatter(fmt)
    else:
        axis.set_minor_formatter(NullFormatter())


def _values(v: Sequence[float | None]) -> Any:
    return np.asarray([np.nan if a is None else a for a in v], dtype=float)


def _coincides(x: Any, y: Any, drawn: list[tuple[str, Any, Any]]) -> str | None:
    """The label of an already drawn line that ``(x, y)`` lies on (within :data:`COINCIDE_RTOL`)."""
    for label, x0, y0 in drawn:
        if x0.shape == x.shape and np.array_equal(x0, x) and np.allclose(y, y0, rtol=COINCIDE_RTOL, atol=0):
            return label
    return None


def _draw_series(ax: Any, s: Any, panel: Any, drawn: list[tuple[str, Any, Any]], index: int) -> None:
    x = np.asarray(s.x, dtype=float)
    y = _values(s.y)
    mask = np.isfinite(x) & np.isfinite(y)
    if panel.xlog:
        mask &= x > 0
    if panel.ylog:
        mask &= y > 0
    if not np.any(mask):
        return
    label = s.label
    if not label.startswith("_"):  # a line hidden under another one says so in the legend
        under = _coincides(x[mask], y[mask], drawn)
        if under is not None:
            label = f"{label} (lies on {under})"
        drawn.append((s.label, x[mask], y[mask]))
    kw: dict[str, Any] = {"color": s.color} if s.color else {}
    if s.zorder is not None:
        kw["zorder"] = s.zorder
    ms = MARKER_SIZE if s.ms is None else s.ms
    if s.hollow:
        kw["mfc"] = "none"
    (line,) = ax.plot(x[mask], y[mask], s.style, label=label, ms=ms, lw=1.5, **kw)
    color = line.get_color()
    z = line.get_zorder()
    if s.lo is not None and s.hi is not None:
        lo, hi = _values(s.lo), _values(s.hi)
        bm = mask & np.isfinite(lo) & np.isfinite(hi)
        if panel.ylog:
            bm &= (lo > 0) & (hi > 0)
        if np.any(bm):
            ax.fill_between(x[bm], lo[bm], hi[bm], color=color, alpha=BAND_ALPHA, lw=0, zorder=z - 0.5)
            for edge in (lo, hi):  # band edges: overlapping bands stay distinguishable
                ax.plot(
                    x[bm], edge[bm], color=color, ls=line.get_linestyle(), lw=0.6, alpha=0.5, zorder=z - 0.4
                )
    xs, ys = x[mask], y[mask]
    if s.mark_ends:
        ax.plot(xs[:1], ys[:1], "o", color=color, mfc="white", mec=color, ms=ms + 4, mew=1.5, zorder=z + 0.1)
        ax.plot(xs[-1:], ys[-1:], "s", color=color, ms=ms + 3, zorder=z + 0.1)
    if s.point_labels is not None:
        labels = [lab for lab, m in zip(s.point_labels, mask, strict=True) if m]
        for xv, yv, lab in zip(xs, ys, labels, strict=True):
            if lab:
                # Alternate above / below the point, so two series' labels at one point do not overlap.
                offset = (4, 5) if index % 2 == 0 else (4, -11)
                ax.annotate(lab, (xv, yv), textcoords="offset points", xytext=offset, fontsize=7, color=color)


def render_figure(fig: Figure, path: Path) -> None:
    """Draw ``fig`` with matplotlib (Agg) and save it as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    f = draw_figure(fig)
    f.savefig(path, dpi=110)
    plt.close(f)


def _draw_panel(ax: Any, panel: Any) -> None:
    """One panel's series (:func:`_draw_series`), grey reference lines ``Panel.hlines``, axis scales,
    limits and ticks (plain labels on log axes), title, axis labels and grid."""
    drawn: list[tuple[str, Any, Any]] = []
    for i, s in enumerate(panel.series):
        _draw_series(ax, s, panel, drawn, i)
    for j, (yv, lab) in enumerate(panel.hlines):
        if math.isfinite(yv) and (yv > 0 or not panel.ylog):
            ls, grey = HLINE_STYLES[j % len(HLINE_STYLES)]
            ax.axhline(yv, color=grey, ls=ls, lw=1.1, label=lab or None, zorder=1)
    if panel.xlog:
        ax.set_xscale("log")
    if panel.ylog:
        ax.set_yscale("log")
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    if panel.xticks is not None:
        ax.set_xticks(list(panel.xticks))
        ax.set_xticklabels([_tick_label(float(v)) for v in panel.xticks])
        if panel.xlog:
            from matplotlib.ticker import NullFormatter, NullLocator

            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_minor_formatter(NullFormatter())
    elif panel.xlog:
        _format_log_axis(ax.xaxis, *ax.get_xlim())
    if panel.ylog:
        _format_log_axis(ax.yaxis, *ax.get_ylim())
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, which="major", alpha=0.3)


def _draw_note(ax: Any, panel: Any) -> None:
    """``Panel.note`` (if any) as a text box at ``Panel.note_loc``: ``"below"`` the x label,
    ``"outside"`` right of the axes (under the legend), or a corner ``"lower left"`` … ``"upper right"``."""
    if panel.note and panel.note_loc == "below":  # under the x label, whatever the tick labels' height
        ax.annotate(
            panel.note,
            xy=(0.5, 0.0),
            xycoords=ax.xaxis.label,
            xytext=(0, -6),
            textcoords="offset points",
            fontsize=7.5,
            va="top",
            ha="center",
            bbox={"boxstyle": "round", "fc": "white", "ec": "0.7"},
        )
    elif panel.note and panel.note_loc == "outside":  # under the legend, right of the axes
        ax.text(
            1.03,
            0.0,
            panel.note,
            transform=ax.transAxes,
            fontsize=7.5,
            va="bottom",
            ha="left",
            bbox={"boxstyle": "round", "fc": "white", "ec": "0.7"},
        )
    elif panel.note:
        vert, horiz = panel.note_loc.split()
        ax.text(
            0.02 if horiz == "left" else 0.98,
            0.02 if vert == "lower" else 0.98,
            panel.note,
            transform=ax.transAxes,
            fontsize=7.5,
            va="bottom" if vert == "lower" else "top",
            ha=horiz,
            bbox={"boxstyle": "round", "fc": "white", "ec": "0.7", "alpha": 0.9},
            zorder=10,
        )


def _place_legend(ax: Any, panel: Any, fig: Figure, merged: dict[str, Any]) -> None:
    """The panel's legend: its entries collected into ``merged`` (first handle per label) when the
    figure has one legend ``"below"``; else right of the axes (``"outside"``), at ``Panel.legend``, or
    none (``"none"``, or nothing labelled)."""
    handles, labels = ax.get_legend_handles_labels()
    if fig.legend == "below":
        for hd, lab in zip(handles, labels, strict=True):
            merged.setdefault(lab, hd)
    elif handles and panel.legend == "outside":
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    elif handles and panel.legend != "none":
        ax.legend(fontsize=8, loc=panel.legend)


def draw_figure(fig: Figure) -> Any:
    """Draw ``fig`` with matplotlib (Agg) and return the ``matplotlib.figure.Figure`` (unsaved, open).

    Bands are light with thin edges (so overlapping ones stay readable); log axes get plain tick
    labels ("6", "20", not "6×10⁰"); a line hidden under an earlier one of its panel says so in the
    legend; ``Panel.hlines`` are grey reference lines, ``Panel.note`` a text box, and
    ``Figure.legend == "below"`` one legend for the figure under its panels.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    k = len(fig.panels)
    ncols = min(k, fig.columns) if fig.columns else k
    nrows = math.ceil(k / ncols)
    # A panel with its legend outside (to the right) gets the legend's room as extra width.
    width = max(
        sum(8.4 if p.legend == "outside" else 5.2 for p in fig.panels[r * ncols : (r + 1) * ncols])
        for r in range(nrows)
    )
    f, axes = plt.subplots(nrows, ncols, figsize=(width, 4.0 * nrows), squeeze=False)
    for ax in axes.ravel()[k:]:
        ax.set_visible(False)
    merged: dict[str, Any] = {}
    for ax, panel in zip(axes.ravel()[:k], fig.panels, strict=True):
        _draw_panel(ax, panel)
        _draw_note(ax, panel)
        _place_legend(ax, panel, fig, merged)
    # ~10 characters of the 11-point title per inch of figure width: wrap instead of cropping.
    f.suptitle(textwrap.fill(fig.title, width=max(40, int(10 * width))), fontsize=11)
    if merged:
        f.legend(
            list(merged.values()),
            list(merged.keys()),
            loc="lower center",
            ncol=min(len(merged), 3),
            fontsize=8,
            bbox_to_anchor=(0.5, 0.0),
        )
        f.tight_layout(rect=(0, 0.06 * math.ceil(len(merged) / 3), 1, 1))
    else:
        f.tight_layout()
    return f


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


def _inline(text: str) -> str:
    """HTML-escape ``text`` and render its Markdown code spans (`` `x` ``) as ``<code>x</code>``."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


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
            f"<tr{cls}>" + "".join(f"<td>{_inline(_cell(r.get(c, '')))}</td>" for c in cols) + "</tr>"
        )
    more = f"<p><em>{len(rows) - limit} more rows in the CSV file.</em></p>" if len(rows) > limit else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


def _claim_rows(r: ExperimentResult) -> list[dict[str, Any]]:
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
    from .. import __version__

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


def _write_figures_and_tables(
    results: Sequence[ExperimentResult], out: Path
) -> tuple[list[str], dict[tuple[str, str], Path]]:
    """Each experiment's figures as ``<experiment>-<figure>.png`` and non-empty tables as
    ``<experiment>-<table>.csv`` in ``out``; returns the file names written, in order, and each figure's
    PNG path keyed by ``(experiment, figure)``."""
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
    return files, pngs


def _results_doc(
    results: Sequence[ExperimentResult],
    meta: dict[str, Any],
    summary: list[dict[str, Any]],
    failed: list[tuple[str, ExperimentClaim]],
) -> dict[str, Any]:
    """The ``results.json`` document without its ``"files"``: format, meta, verdict, summary and every
    experiment's fields, made JSON-ready (:func:`to_jsonable`), with ``"nonfinite"`` naming the JSON paths
    of the non-finite floats (written as ``null``)."""
    raw = {
        "format": RESULTS_FORMAT,
        "meta": meta,
        "passed": not failed,
        "failed_claims": [f"{name}/{c.name}" for name, c in failed],
        "summary": summary,
        "experiments": {
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
    return doc


def _md_experiment(r: ExperimentResult, pngs: dict[tuple[str, str], Path]) -> list[str]:
    """The Markdown lines of one experiment's section: title, description, then (when available) time,
    claims, numbers, figures (linked PNGs with captions) and tables."""
    md = [f"## {r.title} (`{r.name}`)", "", r.description, ""]
    if not r.available:
        md += [f"_Not available: {r.reason}._", ""]
        return md
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
    return md


def _markdown_report(
    results: Sequence[ExperimentResult],
    meta: dict[str, Any],
    settings_line: str,
    verdict: str,
    summary: list[dict[str, Any]],
    pngs: dict[tuple[str, str], Path],
) -> str:
    """``report.md``: the header (version, date, settings, verdict), the summary table and one
    :func:`_md_experiment` section per result."""
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
        md += _md_experiment(r, pngs)
    return "\n".join(md)


def _status_span(s: str) -> str:
    """``s`` (a status) as an HTML span of class pass, fail or na."""
    cls = {"pass": "pass", "FAIL": "fail"}.get(s, "na")
    return f'<span class="{cls}">{html.escape(s)}</span>'


def _html_experiment(r: ExperimentResult, pngs: dict[tuple[str, str], Path]) -> list[str]:
    """The HTML of one experiment's section, as :func:`_md_experiment`, with the figures embedded as
    base64 PNG data and each table folded in a ``<details>``."""
    h = [f"<h2 id='{html.escape(r.name)}'>{html.escape(r.title)} (<code>{html.escape(r.name)}</code>)</h2>"]
    h += [f"<p>{_inline(r.description)}</p>"]
    if not r.available:
        h += [f"<p class='na'>Not available: {_inline(r.reason)}.</p>"]
        return h
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
            f"<figcaption>{html.escape(fig.title)}. {_inline(fig.caption)}</figcaption></figure>",
        ]
    for tname, rows in r.tables.items():
        h += [
            f"<details><summary>Table <code>{html.escape(tname)}</code> ({len(rows)} rows; "
            f"<code>{html.escape(r.name)}-{html.escape(tname)}.csv</code>)</summary>",
            _html_table(rows),
            "</details>",
        ]
    return h


def _html_report(
    results: Sequence[ExperimentResult],
    meta: dict[str, Any],
    settings_line: str,
    verdict: str,
    passed: bool,
    summary: list[dict[str, Any]],
    pngs: dict[tuple[str, str], Path],
) -> str:
    """``report.html`` (self-contained): the header and summary as :func:`_markdown_report`, the verdict
    marked pass or FAIL, and one :func:`_html_experiment` section per result."""
    h = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>attnsvm verification report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>attnsvm verification report</h1>",
        f"<p>attnsvm {html.escape(str(meta['attnsvm']))}, {html.escape(str(meta['created']))}; "
        f"{html.escape(settings_line)}.</p>",
        f"<p><strong>Verdict: {_status_span('pass' if passed else 'FAIL')} — {html.escape(verdict)}.</strong> "
        "A <em>check</em> is a guarantee of the package (a failure makes <code>attnsvm reproduce</code> "
        "exit non-zero); a <em>finding</em> is a statement of the literature or a conjecture that the "
        "harness tests and reports either way.</p>",
        "<h2>Summary</h2>",
        _html_table(summary),
    ]
    for r in results:
        h += _html_experiment(r, pngs)
    h += ["</body></html>"]
    return "\n".join(h)


def write_report(
    results: Sequence[ExperimentResult], out_dir: str | Path, settings: dict[str, Any]
) -> dict[str, Any]:
    """Write the report files for ``results`` under ``out_dir`` (created if needed).

    The figures (PNG) and tables (CSV) first, then ``results.json``, ``report.md`` and ``report.html``.

    Args:
      results: the experiments' results, in report order.
      out_dir: the output directory.
      settings: the run's settings (size, seed, jobs, device, ...), recorded in the report.

    Returns:
      The ``results.json`` content (a dict), with ``"files"`` listing what was written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files, pngs = _write_figures_and_tables(results, out)

    meta = _meta(settings)
    summary = summary_rows(results)
    failed = failed_claims(results)
    doc = _results_doc(results, meta, summary, failed)
    files += ["report.md", "report.html", "results.json"]
    doc["files"] = files
    (out / "results.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False), encoding="utf-8")

    settings_line = ", ".join(f"{k}={v}" for k, v in settings.items())
    verdict = (
        "all checks pass"
        if not failed
        else f"{len(failed)} check(s) FAILED: " + ", ".join(f"{name}/{c.name}" for name, c in failed)
    )
    md = _markdown_report(results, meta, settings_line, verdict, summary, pngs)
    (out / "report.md").write_text(md, encoding="utf-8")
    h = _html_report(results, meta, settings_line, verdict, not failed, summary, pngs)
    (out / "report.html").write_text(h, encoding="utf-8")
    return doc
