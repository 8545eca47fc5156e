"""The results of the experiments behind ``attnsvm reproduce``: claims, figures and the result record.

An experiment (:mod:`attnsvm.harness.experiments`, run by :mod:`attnsvm.harness.runner`) returns an
:class:`ExperimentResult`: its numbers, tables (lists of rows), :class:`Figure` data (panels of
:class:`Series`) and its :class:`ExperimentClaim` list.

A claim is an :class:`ExperimentClaim` (not to be confused with the proved identities of
:class:`attnsvm.identities.Claim`): a named statement with ``passed`` and a message giving the
measured numbers. ``severity="check"`` claims are what the package guarantees (a failure
makes ``attnsvm reproduce`` exit non-zero); ``severity="finding"`` claims are conjectures
or statements of the literature that the harness tests and reports either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

__all__ = [
    "ExperimentClaim",
    "Series",
    "Panel",
    "Figure",
    "ExperimentResult",
]


@dataclass(kw_only=True)
class ExperimentClaim:
    """One checked statement: ``passed`` with a message that gives the measured numbers."""

    name: str
    statement: str
    passed: bool
    message: str
    severity: str = "check"  # "check" (guaranteed; failure → exit 1) or "finding" (reported)


@dataclass
class Series:
    """One line of a panel: ``y`` against ``x``, with an optional band ``[lo, hi]``."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    _: KW_ONLY
    lo: Sequence[float] | None = None
    hi: Sequence[float] | None = None
    style: str = "-o"
    color: str | None = None  # a matplotlib colour; None cycles
    #: Drawing order: a higher value is drawn on top (e.g. estimates over the bounds they sit under).
    zorder: float | None = None
    #: Marker size (points); ``None``: the renderer's default.
    ms: float | None = None
    #: Text drawn next to each point (e.g. how many runs the point aggregates); ``None``: none.
    point_labels: list[str] | None = None
    #: Mark the first point (hollow circle, "start") and the last one (filled square, "end").
    mark_ends: bool = False
    #: Hollow markers (so a series drawn on top of this one shows through).
    hollow: bool = False

    def __post_init__(self) -> None:
        for name in ("lo", "hi"):
            val = getattr(self, name)
            if val is not None and (isinstance(val, str) or len(val) != len(self.x)):
                raise TypeError(
                    f"Series {self.label!r}: {name} must be None or as long as x (pass style= by keyword)"
                )
        if len(self.y) != len(self.x):
            raise TypeError(
                f"Series {self.label!r}: x and y differ in length ({len(self.x)} vs {len(self.y)})"
            )
        if self.point_labels is not None and len(self.point_labels) != len(self.x):
            raise TypeError(
                f"Series {self.label!r}: point_labels must be None or as long as x "
                f"({len(self.point_labels)} vs {len(self.x)})"
            )


@dataclass
class Panel:
    """One set of axes."""

    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    _: KW_ONLY
    xlog: bool = False
    ylog: bool = False
    #: Axis limits ``(low, high)``, either ``None`` for automatic (e.g. ``(0, 1.02)``: shares from 0).
    ylim: tuple[float | None, float | None] | None = None
    #: Ticks at exactly these x values, labelled plainly ("4", "16", "0.25"); ``None``: automatic.
    xticks: list[float] | None = None
    #: Horizontal reference lines ``(y, label)`` (dashed grey), e.g. a claim's threshold.
    hlines: list[tuple[float, str]] = field(default_factory=list)
    #: Text in a box inside the axes, e.g. the criterion a claim checks and its outcome.
    note: str = ""
    #: Where the note goes: ``"lower left"``, ``"lower right"``, ``"upper left"``, ``"upper right"``
    #: ``"outside"`` (right of the axes, under an outside legend) or ``"below"`` (under the x label).
    note_loc: str = "lower left"
    #: Legend position: a matplotlib ``loc`` (``"best"``, ``"upper left"``, ...), ``"outside"`` (right
    #: of the axes, clear of every curve) or ``"none"``.
    legend: str = "best"


@dataclass
class Figure:
    """A figure of one or more panels side by side, saved as ``<experiment>-<name>.png``."""

    name: str
    title: str
    panels: list[Panel]
    _: KW_ONLY
    caption: str = ""
    #: ``"panel"``: one legend in each panel (at its ``Panel.legend``); ``"below"``: one legend for
    #: the whole figure under the panels (the panels' entries merged by label).
    legend: str = "panel"
    #: Panels per row (``None``: all in one row); more panels wrap onto further rows.
    columns: int | None = None


@dataclass
class ExperimentResult:
    """What one experiment produced."""

    name: str
    title: str
    description: str
    _: KW_ONLY
    available: bool = True
    reason: str = ""  # why the experiment is not available
    numbers: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    claims: list[ExperimentClaim] = field(default_factory=list)
    elapsed_s: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)

    def claim(
        self, name: str, statement: str, passed: bool, message: str, *, severity: str = "check"
    ) -> None:
        """Append an :class:`ExperimentClaim` (for plug-in experiments; the built-in ones return theirs from a
        ``check_<experiment>`` function)."""
        self.claims.append(
            ExperimentClaim(
                name=name, statement=statement, passed=bool(passed), message=message, severity=severity
            )
        )

    @property
    def failed(self) -> list[ExperimentClaim]:
        """The ``check`` claims that failed."""
        return [c for c in self.claims if c.severity == "check" and not c.passed]
