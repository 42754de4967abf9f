"""``--plot``: a timeline of the key series with the verdicts' evidence marked."""

from __future__ import annotations

from datetime import UTC, datetime

from kvscope.exporters import signals as S

from .model import DiagnoseError, Quantity
from .report import Report

# panel key -> title; Mark.series names one of these
PANELS = ("rounds", "promotions", "stores", "pending", "requests", "checksums")
TITLES = {
    "rounds": "lookup rounds by verdict",
    "promotions": "promotions / cascades",
    "stores": "store jobs",
    "pending": "pending transfers",
    "requests": "requests by state",
    "checksums": "row checksums by outcome (all ranks)",
}


def _lines(report: Report) -> dict[str, list[tuple[str, Quantity]]]:
    ev = report.evidence
    if ev is None:
        return {}
    ck: dict[str, list] = {}
    for rt in ev.ranks.values():
        for o, q in rt.checksums.items():
            ck.setdefault(o, []).append(q)
    return {
        "rounds": [(f"{v}", q) for v, q in ev.rounds.verdicts.items()]
        + [(f"at ceiling ({v})", q) for v, q in ev.rounds.at_ceiling.items()],
        "promotions": [(f"promotion {k}", q) for k, q in ev.tiers.promotions.items()]
        + [(f"cascade {k}", q) for k, q in ev.tiers.cascades.items()],
        "stores": [(k, q) for k, q in ev.tiers.store_jobs.items()],
        "pending": [(k, q) for k, q in ev.pending.transfers.items()],
        "requests": [(k, q) for k, q in ev.requests.states.items()]
        + ([("vLLM waiting", ev.requests.vllm_waiting)] if ev.requests.vllm_waiting.present else []),
        "checksums": [(o, _sum_timelines(qs)) for o, qs in ck.items()],
    }


def _sum_timelines(qs: list[Quantity]) -> Quantity:
    acc: dict[float, float] = {}
    for q in qs:
        for t, v in q.samples:
            acc[t] = acc.get(t, 0.0) + v
    return Quantity(samples=tuple(sorted(acc.items())), present=True)


def write_plot(report: Report, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.dates as mdates
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover
        raise DiagnoseError(f"--plot needs matplotlib: {e}") from None
    lines = _lines(report)
    panels = [p for p in PANELS if any(q.samples for _, q in lines.get(p, []))] or ["rounds"]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.2 * len(panels) + 1.2), sharex=True,
                             squeeze=False)
    to_dt = lambda t: datetime.fromtimestamp(t, UTC)  # noqa: E731
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        for label, q in lines.get(panel, []):
            if q.samples:
                ax.step([to_dt(t) for t, _ in q.samples], [v for _, v in q.samples], where="post",
                        label=label, marker="o" if len(q.samples) < 5 else None, markersize=3)
        ax.set_title(TITLES[panel], fontsize=9, loc="left")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left", ncol=4)
        ax.grid(alpha=0.3)
        for f in report.verdicts:
            for m in f.marks:
                if m.series == panel:
                    ax.axvline(to_dt(m.t), color="red", linestyle="--", linewidth=1)
                    ax.annotate(f"{f.id}: {m.text}", (to_dt(m.t), 0.95), xycoords=("data", "axes fraction"),
                                fontsize=7, color="red", va="top", ha="left", rotation=0)
    axes[-1, 0].xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))
    top = report.verdicts[0]
    fig.suptitle(
        f"kv-diagnose: {top.title} ({top.confidence_label})" + (
            f" + {len(report.verdicts) - 1} more" if len(report.verdicts) > 1 else ""),
        fontsize=11,
    )
    src = report.source
    fig.text(0.01, 0.005, f"{src.kind} {src.location}"[:150] + f"  |  counters: {'process lifetime' if src.lifetime else 'window'}"
             f"  |  metrics: {S.PREFIX}*", fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.02, 1, 0.96))
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise DiagnoseError(f"cannot write plot {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
