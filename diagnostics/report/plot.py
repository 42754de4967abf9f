"""``--plot``: each finding's decisive comparison, with its evidence marked.

One panel per comparison a verdict rests on (pending keys vs primary rows for
the capacity ceiling, mismatches by rank for stale rows, the oldest pending
age vs the threshold for pending at idle, ...), from :mod:`.panels`. Panels with
nothing to show (every line zero) are left out. Legends sit outside the axes so
they never cover a mark.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from kvscope.exporters import signals as S

from ..atomic import write_atomically
from ..model import DiagnoseError
from .diagnosis import Report, _iso, safe
from .panels import Panel, panels_for

FORMATS = (".png", ".svg", ".pdf")


def check_plot_path(path: str) -> None:
    """Refuse a --plot path before any work: unknown format, no such folder, not a file."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise DiagnoseError(f"--plot {path}: name a {', '.join(FORMATS)} file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise DiagnoseError(f"--plot {path}: folder {folder} does not exist")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise DiagnoseError(f"--plot {path}: exists and is not a regular file")
    if not os.access(folder, os.W_OK):
        raise DiagnoseError(f"--plot {path}: folder {folder} is not writable")


SHORT_WINDOW_S = 600.0  # shorter windows (a scrape's two samples) get a seconds axis


class _Axis:
    """x values: wall-clock times for a long window, seconds from its start for a short one."""

    def __init__(self, start: float, end: float):
        self.start = start
        self.relative = end - start < SHORT_WINDOW_S

    def x(self, t: float):
        return t - self.start if self.relative else datetime.fromtimestamp(t, UTC)


def _draw(ax, panel: Panel, report: Report, axis: _Axis) -> None:
    drawn = 0
    for line in panel.lines:
        if not line.samples:
            continue
        xs = [axis.x(t) for t, _ in line.samples]
        ys = [v for _, v in line.samples]
        # Equal lines overlap: each next one is drawn thinner, on top, so all stay visible.
        width = max(1.2, 4.0 - 1.1 * drawn) if line.style == "-" else 2.0
        ax.step(xs, ys, where="post", label=safe(line.label), linestyle=line.style,
                color=line.color, linewidth=width, zorder=2 + drawn,
                marker="o" if len(xs) < 5 else None, markersize=4)
        drawn += 1
    for ref in panel.refs:
        ax.axhline(ref.value, color=ref.color, linestyle=":", linewidth=1.5,
                   label=safe(f"{ref.label} = {ref.value:g}"))
    ax.set_title(safe(panel.title), fontsize=9, loc="left")
    if panel.ylabel:
        ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    for f in report.verdicts:
        for m in f.marks:
            if m.series in panel.mark_keys:
                ax.axvline(axis.x(m.t), color="red", linestyle="--", linewidth=1)
                ax.annotate(safe(f"{m.text}"), (axis.x(m.t), 0.97),
                            xycoords=("data", "axes fraction"), fontsize=7, color="red",
                            va="top", ha="right", rotation=90)
    if panel.note:
        ax.text(0.01, 0.04, safe(panel.note), transform=ax.transAxes, fontsize=8, va="bottom",
                bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85, "edgecolor": "grey"})
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def write_plot(report: Report, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.dates as mdates
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover
        raise DiagnoseError(f"--plot needs matplotlib: {e}") from None
    check_plot_path(path)
    panels = panels_for(report)
    src = report.source
    axis = _Axis(src.start, src.end)
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 2.3 * len(panels) + 1.3), sharex=True,
                             squeeze=False)
    try:
        for ax, panel in zip(axes[:, 0], panels, strict=True):
            _draw(ax, panel, report, axis)
        if axis.relative:
            axes[-1, 0].set_xlabel(f"seconds after {_iso(src.start)}", fontsize=8)
        else:
            axes[-1, 0].xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))
        top = report.top
        more = len(report.incidents) - 1
        fig.suptitle(safe(f"kv-diagnose: {report.status.upper()} - {top.title}"
                          + (f" ({top.confidence_label})" if top.kind == "incident" else "")
                          + (f" + {more} more" if more > 0 else "")), fontsize=11)
        fig.text(0.01, 0.005, safe(f"{src.kind} {src.location}"[:150]
                                   + f"  |  counters: {'process lifetime' if src.lifetime else 'window'}"
                                   + f"  |  metrics: {S.PREFIX}*"), fontsize=7, color="grey")
        fig.tight_layout(rect=(0, 0.02, 1, 0.96))
        _save(fig, path)
    finally:
        plt.close(fig)


def _save(fig, path: str) -> None:
    ext = os.path.splitext(path)[1].lower()
    write_atomically(path, "plot", lambda f: fig.savefig(f, dpi=110, format=ext[1:]), suffix=ext)
