"""Stores without restores: the tiers fill up, lookups never find anything.

Sub-cases and their tells:

* the ``hash_seed`` fingerprint of ``kvscope_info`` differs between processes
  or across a restart: keys are computed differently, nothing stored matches;
* one KV group never finds a key while others do: it vetoes every round.
"""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..checks import need, tiered
from ..evidence import Evidence
from ..model import Finding, Mark
from ..thresholds import Thresholds
from ._common import n, nbytes, window_word

ID = "stores_without_restores"
TITLE = "Stores without restores"
SEVERITY = 60
CHECK = "stores that are never restored (hash-seed drift, a group that always misses)"
# kvscope_info's hash_seed is the fingerprint that tells a seed drift apart.
NEEDS = (need(S.INFO, S.L_HASH_SEED), S.LOOKUPS, S.LOOKUP_ROUNDS, S.STORE_JOBS)
EXPLAINS = frozenset({"rounds", "coverage"})


def _stored(ev: Evidence) -> tuple[float, list[str]]:
    w = window_word(ev)
    lines, amount = [], 0.0
    jobs = ev.tiers.store(S.StoreJobResult.PREPARED).increase
    if jobs > 0:
        amount += jobs
        lines.append(f"{n(jobs)} store jobs prepared {w}")
    b = sum(
        rt.bytes.get(S.Direction.GPU_TO_CPU.value).increase
        for rt in ev.ranks.values() if S.Direction.GPU_TO_CPU.value in rt.bytes
    )
    if b == 0 and ev.vllm.offload_store_bytes.present:
        b = ev.vllm.offload_store_bytes.increase
    if b > 0:
        amount += b
        lines.append(f"{nbytes(b)} stored GPU -> CPU {w}")
    casc = ev.tiers.cascade(S.CascadeResult.COMPLETED).increase
    if casc > 0:
        amount += casc
        lines.append(f"{n(casc)} keys cascaded to the disk tier {w}")
    return amount, lines


def _turned_over(ev: Evidence) -> bool:
    """The CPU tier alone (nothing cascades to disk) stored more keys than it has rows:
    later stores evicted earlier ones (LRU), so a re-ask finding nothing is what a
    tier smaller than the working set does, not a sign of mismatched keys. Keys
    stored = GPU->CPU bytes of every rank / bytes of one row (all rank slots; rows
    are page-rounded, so this undercounts)."""
    if tiered(ev) or not ev.tiers.row_bytes.present or ev.tiers.row_bytes.last <= 0:
        return False
    b = sum(rt.bytes.get(S.Direction.GPU_TO_CPU.value).increase
            for rt in ev.ranks.values() if S.Direction.GPU_TO_CPU.value in rt.bytes)
    return b / ev.tiers.row_bytes.last > ev.primary_rows > 0


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    stored, lines = _stored(ev)
    if stored <= 0:
        return None
    w = window_word(ev)
    found = ev.found_anywhere
    # Keys the tiers hold: what reached the disk tier, else the primary tier's rows.
    held = max(ev.tiers.cascade(S.CascadeResult.COMPLETED).increase,
               ev.tiers.row(S.RowState.OCCUPIED).last)
    missed = ev.lookups_total(S.LookupResult.MISS)
    restored = ev.rounds.get(S.Verdict.HIT).increase
    seeds = ev.hash_seeds
    conf, sub, step = 0.0, "", ""
    if len(seeds) > 1:
        conf = 0.9 if restored == 0 else 0.6
        sub = "hash seed differs"
        per_target = [
            f"{t.target}: {(' -> ' if t.seeds_ordered else ', ').join(t.hash_seeds)}"
            + ("" if t.seeds_ordered or len(t.hash_seeds) < 2 else " (served side by side)")
            for t in ev.targets if t.hash_seeds
        ]
        lines.insert(0, "hash_seed fingerprint differs: " + "; ".join(per_target))
        looked = sum(g.total for g in ev.lookups.values())
        if found == 0 and looked > 0:
            lines.insert(1, f"{n(looked)} key lookups {w}, none found in any tier (no hit, no "
                            "promotion), although the tiers hold stored keys")
        step = (
            "Keys are hashed differently across processes/restarts: set the same PYTHONHASHSEED "
            "and prefix-caching hash algorithm on every process and keep it across restarts. "
            "Keys stored under the old seed never match: clear the fs tier's directory."
        )
    else:
        # A group that never hits while another does vetoes every round. Retries
        # are not finds (an async secondary-tier lookup answers retry, then miss).
        silent = [g for g in ev.lookups.values() if g.total > 0 and g.found == 0]
        finders = [g for g in ev.lookups.values() if g.found > 0]
        vetoed = ev.rounds.get(S.Verdict.VETOED).increase
        at_ceiling = ev.rounds.ceiling(S.Verdict.VETOED).increase > 0
        # A round at the row ceiling had a promotion find no row: its key was
        # found on disk, so "nothing found" cannot hold either.
        ceiling_any = at_ceiling or ev.rounds.ceiling(S.Verdict.DEFERRED).increase > 0
        # At the row ceiling a group misses because promotions took every row:
        # the capacity-ceiling verdict explains those vetoes, not a key mismatch.
        if silent and finders and vetoed > 0 and not at_ceiling:
            conf = 0.75
            sub = "one group always misses"
            names = ", ".join(g.group for g in silent)
            lines.insert(
                0,
                f"kv_group {names} found 0 of {n(sum(g.total for g in silent))} keys {w} while "
                + ", ".join(f"kv_group {g.group} found {n(g.found)}" for g in finders)
                + f"; {n(vetoed)} rounds vetoed",
            )
            step = (
                f"kv_group {names} never resolves and vetoes the others: check that this group is "
                "stored at all (sliding-window/other attention kinds, per-group block size) and "
                "that its keys are computed like the stored ones."
            )
        elif found == 0 and missed >= max(held, 1) and not ceiling_any and not _turned_over(ev):
            # Without a seed change this is only a hint: a workload that never
            # repeats a prefix looks the same. So it needs volume: at least as
            # many lookups resolved as MISS as the tiers hold keys (a cold
            # cache's first misses, before anything was stored, do not count
            # for much); retries are unresolved lookups, not misses.
            conf = 0.4
            sub = "nothing found"
            lines.insert(0, f"0 of {n(missed)} resolved lookups found anything {w} (no hit, no "
                            f"promotion) while the tiers hold {n(held)} keys")
            step = (
                "If this workload repeats prefixes, keys stored are not the keys looked up: compare "
                "hash_seed and the model/config between the processes that store and that look up."
            )
        else:
            return None
    lines.append(f"{n(restored)} hit rounds {w}")
    marks = []
    hit_q = ev.rounds.get(S.Verdict.HIT)
    t_end = ev.source.end
    marks.append(Mark("rounds", t_end if not hit_q.samples else hit_q.samples[-1][0], sub))
    return Finding(
        id=ID,
        title=f"{TITLE} ({sub})",
        confidence=conf,
        evidence=lines,
        next_step=step,
        severity=SEVERITY,
        marks=marks,
    )
