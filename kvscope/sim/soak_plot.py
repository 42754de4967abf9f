"""The soak's plot: RSS (warm-up shaded, the growth bound drawn), the journal, the series
kvscope exports and its telemetry errors, over the run's minutes."""

from __future__ import annotations

from typing import Any


def plot(samples: list[dict[str, Any]], rss: dict[str, Any], args, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t_s"] / 60 for s in samples]
    fig, ax = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    ax[0].plot(t, [s["rss_kib"] / 1024 for s in samples], "o-", ms=3, label="RSS")
    ax[0].plot(t, [(s["rss_anon_kib"] or 0) / 1024 for s in samples], "-", lw=1,
               label="of it anonymous")
    if rss.get("baseline_kib"):
        ax[0].axvspan(0, rss["warmup_end_s"] / 60, color="0.9", label="warm-up")
        bound = rss["baseline_kib"] * (1 + args.max_rss_growth) / 1024
        ax[0].axhline(bound, color="r", ls="--", lw=1,
                      label=f"baseline + {args.max_rss_growth:.0%}")
    ax[0].set_ylabel("MiB")
    ax[0].legend(loc="lower right", fontsize=8)
    growth = rss.get("growth")
    ax[0].set_title("kvscope soak on vLLM's scheduler (CPU): RSS growth after warm-up "
                    + (f"{growth:+.2%}" if growth is not None else "n/a"), fontsize=10)
    ax[1].plot(t, [s["journal_len_max"] for s in samples], "o-", ms=3,
               label="largest since last sample")
    ax[1].plot(t, [s["journal_len"] for s in samples], "x", ms=3, label="at the sample")
    ax[1].set_ylabel("journal items")
    ax[1].legend(loc="upper right", fontsize=8)
    ax[2].plot(t, [s["series"] for s in samples], "o-", ms=3, label="series exported")
    ax[2].plot(t, [s["kvscope_state_items"] for s in samples], "s-", ms=3,
               label="items in kvscope's containers")
    ax[2].legend(loc="lower right", fontsize=8)
    ax[3].plot(t, [s["telemetry_errors"] for s in samples], "o-", ms=3,
               label="kvscope_telemetry_errors_total")
    ax[3].plot(t, [len(s["pending_nonzero"]) for s in samples], "x", ms=3,
               label="pending gauges not 0 (at samples)")
    ax[3].legend(loc="upper left", fontsize=8)
    ax[3].set_xlabel("minutes")
    for a in ax:
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
