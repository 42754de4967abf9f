"""Stores without restores: the tiers fill up, lookups never find anything.

Sub-cases and their tells:

* the ``hash_seed`` fingerprint of ``kvscope_info`` differs between processes
  or across a restart: keys are computed differently, nothing stored matches;
* one KV group never finds a key while others do: it vetoes every round.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Mark
from ..thresholds import Thresholds
from ._common import n, nbytes
from .needs import need, tiered
from .shared_facts import window_phrase

ID = "stores_without_restores"
TITLE = "Stores without restores"
SEVERITY = 60
CHECK = "stores that are never restored (hash-seed drift, a group that always misses)"
# kvscope_info's hash_seed is the fingerprint that tells a seed drift apart.
NEEDS = (need(S.INFO, S.L_HASH_SEED), S.LOOKUPS, S.LOOKUP_ROUNDS, S.STORE_JOBS)
EXPLAINS = frozenset({"rounds", "coverage"})


SEED_DIFFERS, GROUP_MISSES, NOTHING_FOUND = (
    "hash seed differs", "one group always misses", "nothing found")


@dataclass(frozen=True)
class TargetSeeds:
    target: str
    seeds: tuple[str, ...]  # hash_seed values in order of first appearance
    ordered: bool  # appeared at different times (a before/after), not side by side


@dataclass(frozen=True)
class GroupFound:
    group: str
    found: float


@dataclass(frozen=True)
class StoresFacts(Facts):
    lifetime: bool
    case: str  # "hash seed differs" | "one group always misses" | "nothing found"
    store_jobs_prepared: float
    stored_bytes: float  # GPU -> CPU
    cascaded_keys: float
    hit_rounds: float
    # hash seed differs: the seeds per target; the lookups none of which found a key
    target_seeds: tuple[TargetSeeds, ...] = ()
    key_lookups_none_found: float | None = None
    # one group always misses: the silent groups, their lookups, the groups that find
    silent_groups: tuple[str, ...] = ()
    silent_group_lookups: float = 0.0
    finding_groups: tuple[GroupFound, ...] = ()
    vetoed_rounds: float = 0.0
    # nothing found: lookups resolved as MISS, keys the tiers hold
    resolved_misses: float = 0.0
    keys_held: float = 0.0

    def lines(self) -> list[str]:
        w = window_phrase(self.lifetime)
        lines = []
        if self.case == SEED_DIFFERS:
            lines.append("hash_seed fingerprint differs: " + "; ".join(
                f"{t.target}: {(' -> ' if t.ordered else ', ').join(t.seeds)}"
                + ("" if t.ordered or len(t.seeds) < 2 else " (served side by side)")
                for t in self.target_seeds))
            if self.key_lookups_none_found is not None:
                lines.append(f"{n(self.key_lookups_none_found)} key lookups {w}, none found in "
                             "any tier (no hit, no promotion), although the tiers hold stored keys")
        elif self.case == GROUP_MISSES:
            lines.append(
                f"kv_group {', '.join(self.silent_groups)} found 0 of "
                f"{n(self.silent_group_lookups)} keys {w} while "
                + ", ".join(f"kv_group {g.group} found {n(g.found)}" for g in self.finding_groups)
                + f"; {n(self.vetoed_rounds)} rounds vetoed")
        else:
            lines.append(f"0 of {n(self.resolved_misses)} resolved lookups found anything {w} (no "
                         f"hit, no promotion) while the tiers hold {n(self.keys_held)} keys")
        if self.store_jobs_prepared > 0:
            lines.append(f"{n(self.store_jobs_prepared)} store jobs prepared {w}")
        if self.stored_bytes > 0:
            lines.append(f"{nbytes(self.stored_bytes)} stored GPU -> CPU {w}")
        if self.cascaded_keys > 0:
            lines.append(f"{n(self.cascaded_keys)} keys cascaded to the disk tier {w}")
        lines.append(f"{n(self.hit_rounds)} hit rounds {w}")
        return lines


def _stored(ev: Evidence) -> tuple[float, float, float]:
    """(store jobs prepared, bytes stored GPU -> CPU, keys cascaded to disk) over the window."""
    jobs = ev.tiers.store(S.StoreJobResult.PREPARED).increase
    b = sum(
        rt.bytes.get(S.Direction.GPU_TO_CPU.value).increase
        for rt in ev.ranks.values() if S.Direction.GPU_TO_CPU.value in rt.bytes
    )
    if b == 0 and ev.vllm.offload_store_bytes.present:
        b = ev.vllm.offload_store_bytes.increase
    return jobs, b, ev.tiers.cascade(S.CascadeResult.COMPLETED).increase


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
    jobs, stored_bytes, cascaded = _stored(ev)
    stored = sum(x for x in (jobs, stored_bytes, cascaded) if x > 0)
    if stored <= 0:
        return None
    found = ev.found_anywhere
    # Keys the tiers hold: what reached the disk tier, else the primary tier's rows.
    held = max(ev.tiers.cascade(S.CascadeResult.COMPLETED).increase,
               ev.tiers.row(S.RowState.OCCUPIED).last)
    missed = ev.lookups_total(S.LookupResult.MISS)
    restored = ev.rounds.get(S.Verdict.HIT).increase
    base = dict(lifetime=ev.source.lifetime, store_jobs_prepared=jobs, stored_bytes=stored_bytes,
                cascaded_keys=cascaded, hit_rounds=restored)
    if len(ev.hash_seeds) > 1:
        conf = 0.9 if restored == 0 else 0.6
        looked = sum(g.total for g in ev.lookups.values())
        facts = StoresFacts(
            case=SEED_DIFFERS, **base,
            target_seeds=tuple(TargetSeeds(t.target, tuple(t.hash_seeds), t.seeds_ordered)
                               for t in ev.targets if t.hash_seeds),
            key_lookups_none_found=looked if found == 0 and looked > 0 else None)
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
            facts = StoresFacts(
                case=GROUP_MISSES, **base,
                silent_groups=tuple(g.group for g in silent),
                silent_group_lookups=sum(g.total for g in silent),
                finding_groups=tuple(GroupFound(g.group, g.found) for g in finders),
                vetoed_rounds=vetoed)
            step = (
                f"kv_group {', '.join(facts.silent_groups)} never resolves and vetoes the others: "
                "check that this group is stored at all (sliding-window/other attention kinds, "
                "per-group block size) and that its keys are computed like the stored ones."
            )
        elif found == 0 and missed >= max(held, 1) and not ceiling_any and not _turned_over(ev):
            # Without a seed change this is only a hint: a workload that never
            # repeats a prefix looks the same. So it needs volume: at least as
            # many lookups resolved as MISS as the tiers hold keys (a cold
            # cache's first misses, before anything was stored, do not count
            # for much); retries are unresolved lookups, not misses.
            conf = 0.4
            facts = StoresFacts(case=NOTHING_FOUND, **base, resolved_misses=missed, keys_held=held)
            step = (
                "If this workload repeats prefixes, keys stored are not the keys looked up: compare "
                "hash_seed and the model/config between the processes that store and that look up."
            )
        else:
            return None
    marks = []
    hit_q = ev.rounds.get(S.Verdict.HIT)
    t_end = ev.source.end
    marks.append(Mark("rounds", t_end if not hit_q.samples else hit_q.samples[-1][0], facts.case))
    return Finding(
        id=ID,
        title=f"{TITLE} ({facts.case})",
        confidence=conf,
        facts=facts,
        next_step=step,
        severity=SEVERITY,
        marks=marks,
    )
