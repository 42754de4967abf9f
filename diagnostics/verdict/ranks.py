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

from ..classifiers.needs import Need
from ..evidence.build import Evidence
from ..evidence.targets import TargetInfo

# every series name a worker-side metric yields (all carry the rank label)
WORKER_SERIES = frozenset(n for m in S.WORKER_METRICS for n in S.exposed_series(m))


def world_size(ev: Evidence) -> int | None:
    """The largest world size a target exports (None: no target exports one)."""
    sizes = [w for t in ev.targets if (w := _size(t)) is not None]
    return max(sizes) if sizes else None


def _size(t: TargetInfo) -> int | None:
    w = t.int_label("world_size")
    return w if w is not None and w > 0 else None


def missing(ev: Evidence) -> tuple[tuple[str, int, str, str], ...]:
    """(rank, world size, ranks seen, where) for each worker rank below a world size that no
    worker-side series names.

    An engine that vLLM's /metrics labels (``engine``) is held to the ranks its own
    worker-side series name (another engine's rank 1 does not stand in for its own),
    plus those of series without the label (a standalone exporter's, which no engine can
    be told from). Otherwise (standalone exporters) every rank seen counts, against the
    largest world size."""
    scopes = ev.rank_scopes
    loose = scopes.get(("", "", ""), frozenset())
    out: list[tuple[str, int, str, str]] = []
    unscoped = 0
    for t in ev.targets:
        w = _size(t)
        if w is None:
            continue
        if not t.engine:
            unscoped = max(unscoped, w)
            continue
        seen = scopes.get((t.target, t.model_name, t.engine), frozenset()) | loose
        where = f"; engine {t.engine} at {t.target}"
        out += [(str(r), w, _list(seen), where) for r in range(w) if str(r) not in seen]
    if unscoped:
        seen = frozenset(ev.worker_ranks)
        out += [(str(r), unscoped, _list(seen), "") for r in range(unscoped)
                if str(r) not in seen]
    return tuple(dict.fromkeys(out))


def reads_ranks(needs: Iterable[Need]) -> bool:
    """Whether a check needs worker-side (per-rank) series."""
    return any(nd.series in WORKER_SERIES for nd in needs)


def reasons(ev: Evidence, needs: Iterable[Need]) -> tuple[str, ...]:
    """One "could not check" reason per rank the check cannot see ([] = every rank seen)."""
    if not reads_ranks(needs):
        return ()
    return tuple(
        f"rank {r} missing from every worker-side series ({S.INFO.name} {S.L_WORLD_SIZE}={w}; "
        f"ranks seen: {seen}{where}): its endpoint not scraped, or its series dropped by a "
        "relabel rule"
        for r, w, seen, where in missing(ev))


def unknown_note(ev: Evidence) -> str | None:
    """The report's note when worker ranks are judged without a world size to hold them to."""
    if not ev.targets or world_size(ev) is not None or not ev.worker_ranks:
        return None
    n = len(ev.worker_ranks)
    return (f"world size unknown ({S.INFO.name} has no {S.L_WORLD_SIZE} label: a kvscope older "
            f"than it): {n} worker rank{'s' if n != 1 else ''} seen, and a rank missing from "
            "every series cannot be told from a smaller world")


def _list(ranks) -> str:
    return ", ".join(sorted(ranks, key=_natural)) or "none"


def _natural(key: str):
    return (0, int(key), "") if key.isdigit() else (1, 0, key)
