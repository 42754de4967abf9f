"""Worker ranks the engine has, against the ranks the worker-side series name.

Each worker rank exports its own series (``rank="0"`` .. ``world_size - 1``; vLLM's
/metrics merges them, a standalone exporter serves one per rank). A rank whose
endpoint was not scraped, or whose series a relabel rule dropped, is missing from
EVERY worker-side series: nothing in the rest of the input looks partial, and a
check that reads per-rank series (checksums, refused loads) would judge the ranks it
sees and pass. ``kvscope_info{world_size}`` (the scheduler side's view) says how many
ranks there are; a check that needs worker-side series reports each rank it cannot
see as "could not check", never as a pass.

A kvscope older than the label exports no world size: the ranks seen cannot be
checked against anything, and the report says so (:func:`unknown_note`).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvscope.exporters import signals as S

from .checks import Need
from .evidence import Evidence

# every series name a worker-side metric yields (all carry the rank label)
WORKER_SERIES = frozenset(n for m in S.WORKER_METRICS for n in S.exposed_series(m))


def world_size(ev: Evidence) -> int | None:
    """The largest world size a target exports (None: no target exports one).

    The largest, so that a rank an engine of that size has is never explained away
    by a smaller engine of the same window."""
    sizes = [w for t in ev.targets if (w := t.int_label("world_size")) is not None and w > 0]
    return max(sizes) if sizes else None


def missing(ev: Evidence) -> tuple[str, ...]:
    """Worker ranks below the world size that no worker-side series names."""
    ws = world_size(ev)
    if ws is None:
        return ()
    seen = set(ev.worker_ranks)
    return tuple(str(r) for r in range(ws) if str(r) not in seen)


def reads_ranks(needs: Iterable[Need]) -> bool:
    """Whether a check needs worker-side (per-rank) series."""
    return any(nd.series in WORKER_SERIES for nd in needs)


def reasons(ev: Evidence, needs: Iterable[Need]) -> tuple[str, ...]:
    """One "could not check" reason per rank the check cannot see ([] = every rank seen)."""
    if not reads_ranks(needs):
        return ()
    gone = missing(ev)
    if not gone:
        return ()
    seen = ", ".join(sorted(ev.worker_ranks, key=_natural)) or "none"
    return tuple(
        f"rank {r} missing from every worker-side series ({S.INFO.name} {S.L_WORLD_SIZE}="
        f"{world_size(ev)}; ranks seen: {seen}): its endpoint not scraped, or its series "
        "dropped by a relabel rule"
        for r in gone)


def unknown_note(ev: Evidence) -> str | None:
    """The report's note when worker ranks are judged without a world size to hold them to."""
    if not ev.targets or world_size(ev) is not None or not ev.worker_ranks:
        return None
    n = len(ev.worker_ranks)
    return (f"world size unknown ({S.INFO.name} has no {S.L_WORLD_SIZE} label: a kvscope older "
            f"than it): {n} worker rank{'s' if n != 1 else ''} seen, and a rank missing from "
            "every series cannot be told from a smaller world")


def _natural(key: str):
    return (0, int(key), "") if key.isdigit() else (1, 0, key)
