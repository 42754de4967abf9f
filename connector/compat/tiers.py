"""What each offload tier holds, read without changing it.

One concern: where a key lives. The CPU primary tier answers from its cache policy,
vLLM's fs tier from its files and its lookup state; coverage, the tier taps and probe,
the gauges and the oracle read them through here (re-exported as ``compat.<name>``). Private
attributes, always with a fallback; no I/O but ``os.stat``/``os.path.exists``.
"""

from __future__ import annotations

import os
from typing import Any

from kvscope.connector.compat.renames import policy_entries


def primary_tier(manager: Any) -> Any:
    """The CPU primary tier: a tiering manager's ``primary_tier``, else the manager."""
    return getattr(manager, "primary_tier", manager)


def secondary_tiers(manager: Any) -> list[Any]:
    return list(getattr(manager, "secondary_tiers", ()) or ())


# What vLLM's offloading manager binds once, in its __init__, and vLLM reads through the
# manager at every step: ``secondary_tiers`` (0.26, 0.33, 0.34: a list, never rebound) and,
# from 0.33, ``lock`` (a property over the lock made in __init__, entered for every schedule
# and lookup round: 624 reads in a 300-request run on 0.34). Kept on kvscope's manager proxy,
# each read is a dict hit, not a __getattr__ frame.
BOUND_ONCE = ("lock", "secondary_tiers")


def bound_once(manager: Any) -> dict[str, Any]:
    """Those of :data:`BOUND_ONCE` that ``manager`` has and answers with the same object
    twice (a property that builds its answer anew is left to be read each time)."""
    out = {}
    for name in BOUND_ONCE:
        try:
            first = getattr(manager, name)
            if getattr(manager, name) is first:
                out[name] = first
        except Exception:  # no such attribute, or a property that raises: read it as vLLM does
            continue
    return out


def primary_holds(manager: Any, key: bytes) -> bool:
    """Whether the CPU primary tier holds ``key`` in a row whose bytes are written
    (its cache policy's entry, ready). Read by the oracle, never on the hot path."""
    policy = getattr(primary_tier(manager), "_policy", None)
    block = policy.get(key) if policy is not None else None
    return block is not None and bool(getattr(block, "is_ready", True))


def primary_keys(manager: Any) -> list[bytes]:
    """The keys the CPU primary tier holds (its cache policy's entries: rows written or being
    written), copied in one C-level call; [] for a policy kvscope does not know. vLLM's LRU
    policy keeps them in one dict, its ARC policy in two (``t1``, ``t2``; the ghost lists
    ``b1``/``b2`` hold evicted keys, no row)."""
    policy = getattr(primary_tier(manager), "_policy", None)
    if policy is None:
        return []
    entries = policy_entries(policy)
    if entries is not None:
        return list(entries)
    t1, t2 = getattr(policy, "t1", None), getattr(policy, "t2", None)
    if isinstance(t1, dict) and isinstance(t2, dict):
        return [*t1, *t2]
    return []


def primary_key_count(manager: Any) -> int:
    """len(primary_keys(manager)) without copying the keys."""
    policy = getattr(primary_tier(manager), "_policy", None)
    if policy is None:
        return 0
    entries = policy_entries(policy)
    if entries is not None:
        return len(entries)
    t1, t2 = getattr(policy, "t1", None), getattr(policy, "t2", None)
    return len(t1) + len(t2) if isinstance(t1, dict) and isinstance(t2, dict) else 0


def secondary_holds(tier: Any, key: bytes) -> bool:
    """Whether a secondary tier holds ``key``: the fs tier's file for it exists
    (written to a temp file and renamed, so existing means complete)."""
    mapper = getattr(tier, "file_mapper", None)
    if mapper is None:
        return False
    return os.path.exists(mapper.get_file_name(key))


def secondary_file_identity(tier: Any, key: bytes) -> tuple[int, int, int] | None:
    """(device, inode, mtime ns) of the fs tier's file for ``key``; None when it does not
    exist. vLLM writes a block to a temp file and renames it, so a rewritten block is a new
    file: another identity under the same name."""
    mapper = getattr(tier, "file_mapper", None)
    if mapper is None:
        return None
    try:
        st = os.stat(mapper.get_file_name(key))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def tier_home(tier: Any) -> str | None:
    """The directory a file-backed tier created at start-up (its FileMapper's base path,
    ``<root_dir>/<model>_<digest>``, holding ``config.json``); None without a file mapper.
    vLLM 0.26 .. 0.33 write it once in the tier's constructor and never again: block files
    live beside it (``<base>_r<rank>/...``, recreated by each write)."""
    mapper = getattr(tier, "file_mapper", None)
    base = getattr(mapper, "base_path", None)
    return str(base) if base else None


def tier_type(tier: Any) -> str:
    return str(getattr(tier, "tier_type", type(tier).__name__))


def held_prefix(manager: Any, keys: list[bytes]) -> int:
    """How many of ``keys``, from the first, some tier holds: read only, no I/O.

    The primary tier answers from its cache policy (a row present, ready or being
    written); a secondary tier from the results of its asynchronous existence
    checks (the fs tier's lookup state; a key it has not checked yet ends the run,
    as does a tier without such state). Nothing is promoted, touched or counted.
    """
    primary = primary_tier(manager)
    policy = getattr(primary, "_policy", None)
    states = []
    for tier in secondary_tiers(manager):
        state = getattr(getattr(tier, "_lookup_manager", None), "_lookup_state", None)
        if state is not None:
            states.append(state)
    n = 0
    for key in keys:
        if policy is not None and policy.get(key) is not None:
            n += 1
            continue
        if not any(getattr(s.get(key), "result", None) is True for s in states):
            break
        n += 1
    return n
