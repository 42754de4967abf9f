"""vLLM 0.33 renamed the primary tier's rows from blocks to chunks.

0.26: ``spec.num_blocks``, ``CPUOffloadingManager._num_blocks`` /
``_num_allocated_blocks`` / ``_num_write_pending_blocks`` /
``_num_evictable_cache_blocks``, tier jobs' ``block_ids``.
0.33: ``num_chunks``, ``_num_chunks`` / ``_num_allocated_chunks`` /
``_num_write_pending_chunks`` / ``_num_evictable_cache_chunks``, ``chunk_ids``. Read
whichever the object has.
"""

from __future__ import annotations

from typing import Any


def _first(obj: Any, *names: str, default: Any = 0) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return default


def spec_rows_total(spec: Any) -> int:
    """Rows of the primary tier an OffloadingSpec sized (0.33 num_chunks, 0.26 num_blocks)."""
    return int(_first(spec, "num_chunks", "num_blocks") or 0)


def primary_total(primary: Any) -> int:
    """Rows of a CPUOffloadingManager (primary_counters()[0] alone)."""
    return int(_first(primary, "_num_chunks", "_num_blocks"))


def primary_counters(primary: Any) -> tuple[int, int, int]:
    """(total, allocated, write-pending) counters of a CPUOffloadingManager."""
    total = _first(primary, "_num_chunks", "_num_blocks")
    allocated = _first(primary, "_num_allocated_chunks", "_num_allocated_blocks")
    pending = _first(primary, "_num_write_pending_chunks", "_num_write_pending_blocks")
    return int(total), int(allocated), int(pending)


def primary_evictable(primary: Any) -> int | None:
    """Rows of a CPUOffloadingManager that an allocation may evict now (ref count 0);
    None where the manager keeps no such counter."""
    value = _first(primary, "_num_evictable_cache_chunks", "_num_evictable_cache_blocks",
                   default=None)
    return None if value is None else int(value)


def row_count(obj: Any) -> int:
    """len(row_ids(obj)) without building the list."""
    rows = getattr(obj, "chunk_ids", None)
    if rows is None:
        rows = getattr(obj, "block_ids", ())
    return len(rows)


def row_ids(obj: Any) -> list[int]:
    """Row ids of a tier job or CPU spec (0.33 chunk_ids, 0.26 block_ids)."""
    rows = getattr(obj, "chunk_ids", None)
    if rows is None:
        rows = getattr(obj, "block_ids", ())
    return [int(r) for r in rows]


def policy_entries(policy: Any) -> Any:
    """The key -> row-status dict of the primary tier's LRU cache policy (0.33 ``chunks``,
    0.26 ``blocks``); None for another policy."""
    entries = getattr(policy, "chunks", None)
    if entries is None:
        entries = getattr(policy, "blocks", None)
    return entries if isinstance(entries, dict) else None
