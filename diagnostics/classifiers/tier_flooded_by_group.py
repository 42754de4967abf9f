"""Tier flooded by one KV group: its keys fill the tiers, another group's never reach them.

A model with several KV groups stores one key per chunk of each group, and a group's chunk is
its block size times ``blocks_per_chunk`` tokens: a sub-block group (a drafter's or MTP
group, or one left at the hash block size beside attention groups whose blocks grew to a
state's page size) stores many times the keys of the others per token. That alone is
healthy: groups storing in proportion to their block sizes store about the same tokens
(``kvscope_store_tokens_total{kv_group}``), and the sub-block group holds most of the CPU
primary tier (8x the keys: 80 % beside two such groups).

The incident: one group holds most of the primary tier while a full-attention group stored
far fewer of the tokens (its chunks never complete under its larger chunk, its store jobs are
refused): the tier, and through its cascades the disk ("every file on disk was _g6"), hold
keys no restore can use, since vLLM's cross-group AND needs every group's chunks.

The series are optional: a kvscope that predates them exports none of them, and then nothing
here can hold; with any of them there, a missing one is "could not check".
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence import partial
from ..evidence.build import Evidence
from ..evidence.model import GroupLookups
from ..model import Facts, Finding, Mark
from ..thresholds import Thresholds
from ._common import n, nbytes
from .needs import need, tiered
from .shared_facts import window_phrase

ID = "tier_flooded_by_group"
TITLE = "The offload tiers are flooded by one KV group's keys"
SEVERITY = 72
CHECK = ("one KV group's keys filling the CPU primary tier while a full-attention group stores "
         "far fewer tokens than its block size predicts (where the engine exports stores per "
         "KV group)")
# Rounds miss or are vetoed, and coverage drops, for want of the victim group's chunks.
EXPLAINS = frozenset({"rounds", "coverage"})
_FULL = "full_attention"
_SERIES = (S.STORE_KEYS, S.STORE_TOKENS, S.STORE_BYTES, S.EVICTED_KEYS, S.PRIMARY_KEYS)


def needs(ev: Evidence) -> tuple:
    """Several KV groups only; a kvscope exporting any of the per-group store series exports
    them all from its first step (and kvscope_kv_group_info with them)."""
    if ev.kv_group_count < 2 or not any(ev.has(m) for m in _SERIES):
        return ()
    return (S.STORE_KEYS, S.STORE_TOKENS, S.PRIMARY_KEYS, S.PRIMARY_ROWS,
            need(S.KV_GROUP_INFO, S.L_KV_GROUP, S.L_KIND, S.L_TOKENS_PER_BLOCK))


@dataclass(frozen=True)
class GroupStored:
    """What one KV group stored over the window."""

    group: str
    kind: str  # attention kind; "" unknown
    tokens_per_block: int | None
    stored_tokens: float
    stored_keys: float
    stored_bytes: float | None  # None: not exported (or none)

    @property
    def name(self) -> str:
        tpb = self.tokens_per_block
        return (f"KV group {self.group} ({self.kind or 'kind unknown'}"
                + (f", {tpb} tokens per block)" if tpb else ")"))


@dataclass(frozen=True)
class FloodFacts(Facts):
    lifetime: bool
    flood_group: str  # the group whose keys fill the primary tier
    flood_keys: float  # its keys in the primary tier now
    primary_keys: float  # every group's keys in the primary tier now
    primary_rows: float
    groups: tuple[GroupStored, ...]  # every KV group, in group order
    victims: tuple[str, ...]  # full-attention groups storing far fewer tokens
    victim_fraction: float  # the threshold: under this share of the flood group's tokens
    victim_tokens_least: float  # the fewest tokens a victim stored
    victim_keys_refused: float  # victims' keys in store jobs refused (no_space)
    victim_keys_evicted: float  # victims' keys evicted from the primary tier by stores
    tiered: bool
    rounds: float
    hit_rounds: float
    hit_tokens: float
    victim_chunk_tokens: int | None  # tokens per chunk of the victims' largest block

    @property
    def share(self) -> float:
        return self.flood_keys / self.primary_keys

    @property
    def victims_named(self) -> str:
        return f"KV group{'s' if len(self.victims) > 1 else ''} {', '.join(self.victims)}"

    def lines(self) -> list[str]:
        w, they, flood = window_phrase(self.lifetime), self.victims_named, self.flood_group
        name = next(g.name for g in self.groups if g.group == flood)
        lines = [f"{name} holds {n(self.flood_keys)} of the {n(self.primary_keys)} keys in the "
                 f"CPU primary tier ({self.share:.0%}; {n(self.primary_rows)} rows)"]
        lines += [f"{g.name} stored {n(g.stored_tokens)} prompt tokens ({n(g.stored_keys)} keys"
                  + (f", {nbytes(g.stored_bytes)}" if g.stored_bytes is not None else "")
                  + f") {w}" for g in self.groups]
        lines.append("groups that store in proportion to their block sizes store about the same "
                     f"tokens; {they} stored "
                     + ("none" if self.victim_tokens_least == 0 else
                        f"under {self.victim_fraction:.0%} of KV group {flood}'s")
                     + ": what the tiers hold of those prompts is useless to a restore (vLLM's "
                     "cross-group AND needs every group's chunks)")
        if self.victim_keys_refused > 0:
            lines.append(f"{n(self.victim_keys_refused)} keys of {they} were in store jobs refused "
                         f"for lack of space (no_space) {w}")
        if self.victim_keys_evicted > 0:
            lines.append(f"{n(self.victim_keys_evicted)} keys of {they} evicted from the primary "
                         f"tier by stores {w}")
        if self.tiered:
            lines.append("every key stored is cascaded to the disk tier: its files are KV group "
                         f"{flood}'s in the same proportion")
        lines.append(f"{n(self.rounds)} lookup rounds {w}, {n(self.hit_rounds)} hit; "
                     f"{n(self.hit_tokens)} tokens offered to load")
        return lines

    def next_step(self) -> str:
        they, flood, chunk = self.victims_named, self.flood_group, self.victim_chunk_tokens
        if self.victim_keys_refused > 0:
            cause = (f"The store jobs of {they} were refused for lack of space while KV group "
                     f"{flood}'s fit: grow the CPU primary tier (cpu_bytes_to_use) counting KV "
                     f"group {flood}'s keys ({self.share:.0%} of the tier), or lower "
                     "max_num_batched_tokens so that one step's store job is smaller.")
        else:
            size = (f"a chunk of {they} is {chunk} tokens (tokens per block × blocks_per_chunk)"
                    if chunk else "their chunks are larger")
            cause = (f"The chunks of {they} never complete: {size}, and the prompts stored are "
                     "shorter (or only their unaligned tails are new). Make the large-block "
                     "groups' chunks fit the prompts served (a lower blocks_per_chunk in "
                     "kv_connector_extra_config), or keep the prefixes meant to be restored at "
                     "least one such chunk long.")
        return (f"A prefix restores only if every KV group stored its chunks; {they} stored "
                f"{'none' if self.victim_tokens_least == 0 else 'too few'}. {cause} Until then "
                f"the tiers fill with KV group {flood}'s keys, which no restore can use.")


def _stored(ev: Evidence, lk: GroupLookups) -> GroupStored:
    b = lk.store_bytes
    return GroupStored(lk.group, ev.group_kind(lk.group) or "",
                       ev.group_tokens_per_block(lk.group) or None,
                       lk.store_tokens.increase, lk.store(S.StoreKeyResult.STORED).increase,
                       b.increase if b.present and b.increase > 0 else None)


def _dropped(ev: Evidence) -> bool:
    """A KV group without the per-group series the others have (kvscope exports them for
    every group from the first step): dropped from the input, noted as a partial export."""
    gone = False
    for metric, field in ((S.PRIMARY_KEYS, "primary_keys"), (S.STORE_TOKENS, "store_tokens")):
        if not ev.has(metric):
            continue  # absent altogether: needs() says so
        for g, lk in ev.lookups.items():
            if not getattr(lk, field).present:
                partial.note_missing(metric.name, S.L_KV_GROUP, g)
                gone = True
    return gone


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    if _dropped(ev):
        return None
    groups = {g: lk for g, lk in ev.lookups.items() if lk.primary_keys.present}
    if len(groups) < 2:
        return None
    held = {g: lk.primary_keys.last for g, lk in groups.items()}
    total = sum(held.values())
    if total <= 0:
        return None
    flood = max(held, key=lambda g: (held[g], g))
    share = held[flood] / total
    top = groups[flood].store_tokens.increase
    if share < th.flood_share or top <= 0:
        return None
    victims = [lk for g, lk in ev.lookups.items()
               if g != flood and ev.group_kind(g) == _FULL
               and lk.store_tokens.increase < th.flood_victim_fraction * top]
    if not victims:
        return None
    worst = min(v.store_tokens.increase for v in victims)
    facts = FloodFacts(
        lifetime=ev.source.lifetime,
        flood_group=flood,
        flood_keys=held[flood],
        primary_keys=total,
        primary_rows=ev.primary_rows,
        groups=tuple(_stored(ev, ev.lookups[g]) for g in sorted(ev.lookups, key=_natural)),
        victims=tuple(v.group for v in victims),
        victim_fraction=th.flood_victim_fraction,
        victim_tokens_least=worst,
        victim_keys_refused=sum(v.store(S.StoreKeyResult.NO_SPACE).increase for v in victims),
        victim_keys_evicted=sum(v.evicted.increase for v in victims if v.evicted.present),
        tiered=tiered(ev),
        rounds=ev.rounds.total,
        hit_rounds=ev.rounds.get(S.Verdict.HIT).increase,
        hit_tokens=ev.rounds.hit_tokens.increase,
        victim_chunk_tokens=_victim_chunk(ev, victims),
    )
    rows = ev.primary_rows
    full = rows > 0 and total >= 0.9 * rows
    conf = 0.85 if worst == 0 and full else 0.7 if worst == 0 or full else 0.5
    q = groups[flood].store_tokens
    marks = [Mark("stores", q.samples[-1][0], f"KV group {flood} floods")] if q.samples else []
    return Finding(
        id=ID,
        title=TITLE,
        confidence=conf,
        facts=facts,
        next_step=facts.next_step(),
        severity=SEVERITY,
        marks=marks,
    )


def _victim_chunk(ev: Evidence, victims: list[GroupLookups]) -> int | None:
    """Tokens per chunk of the victims' largest block: their tokens per block times the
    engine's blocks per chunk (kvscope_info chunk_tokens over KV group 0's block size)."""
    chunk0, tpb0 = ev.info_int(S.L_CHUNK_TOKENS), ev.group_tokens_per_block("0")
    tpbs = [t for v in victims if (t := ev.group_tokens_per_block(v.group))]
    if not (chunk0 and tpb0 and tpbs) or chunk0 % tpb0:
        return None
    return max(tpbs) * (chunk0 // tpb0)


def _natural(key: str):
    return (0, int(key), "") if key.isdigit() else (1, 0, key)
