"""What each scraped process says about itself: ``kvscope_info`` and ``kvscope_kv_group_info``.

These are label-carrying info gauges, not quantities: their labels are the facts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..model import Series


def scope_key(target: str, model_name: str = "", engine: str = "") -> str:
    """One engine's name: its target, plus vLLM's model and engine labels where present
    (the key of ``Evidence.freshness.last_step`` and :attr:`TargetInfo.key`)."""
    labels = ((S.VLLM_LABEL_MODEL, model_name), (S.VLLM_LABEL_ENGINE, engine))
    return " ".join([target, *(f"{k}={v}" for k, v in labels if v)])


@dataclass(frozen=True)
class TargetInfo:
    """One scraped process (scheduler side), from ``kvscope_info``."""

    target: str
    model_name: str
    engine: str
    kvscope_version: str
    vllm_version: str
    spec: str
    tiers: str
    primary_rows: str
    hash_seeds: tuple[str, ...]  # distinct values, in order of first appearance
    checksum_policy: str = ""  # policy in effect (kvscope_info), "" when not exported
    chunk_tokens: str = ""  # tokens per offloaded chunk (one row per KV group)
    max_num_batched_tokens: str = ""
    # worker ranks of this engine (rank="0".. on worker-side series); "" from a kvscope
    # older than the label: a rank missing from every series cannot be seen then
    world_size: str = ""
    # True when the seeds were first seen at different times (a restart seen
    # happening); False when all were already there at the first sample.
    seeds_ordered: bool = False

    @property
    def key(self) -> str:
        return scope_key(self.target, self.model_name, self.engine)

    def int_label(self, name: str) -> int | None:
        v = getattr(self, name)
        try:
            return int(float(v)) if v != "" else None
        except ValueError:
            return None


def read_targets(info: list[Series]) -> tuple[TargetInfo, ...]:
    """One TargetInfo per (target, model, engine) from the ``kvscope_info`` series.

    A process that restarted with another hash seed exports a second info series:
    the seeds are kept in order of first appearance, the other labels from the
    latest series.
    """
    by_target: dict[tuple[str, str, str], list[Series]] = defaultdict(list)
    for s in info:
        by_target[(s.target, s.label(S.VLLM_LABEL_MODEL), s.label(S.VLLM_LABEL_ENGINE))].append(s)
    targets: list[TargetInfo] = []
    for (target, model, engine), ss in sorted(by_target.items()):
        ss = sorted(ss, key=lambda s: s.samples[0][0])
        seeds: list[str] = []
        seed_first: dict[str, float] = {}
        for s in ss:
            h = s.label(S.L_HASH_SEED)
            if h not in seeds:
                seeds.append(h)
                seed_first[h] = s.samples[0][0]
        last = max(ss, key=lambda s: s.samples[-1][0])
        targets.append(
            TargetInfo(
                target=target,
                model_name=model,
                engine=engine,
                kvscope_version=last.label(S.L_KVSCOPE_VERSION),
                vllm_version=last.label(S.L_VLLM_VERSION),
                spec=last.label(S.L_SPEC),
                tiers=last.label(S.L_TIERS),
                primary_rows=last.label(S.L_PRIMARY_ROWS),
                hash_seeds=tuple(seeds),
                checksum_policy=last.label(S.L_CHECKSUM_POLICY),
                chunk_tokens=last.label(S.L_CHUNK_TOKENS),
                max_num_batched_tokens=last.label(S.L_MAX_BATCHED_TOKENS),
                world_size=last.label(S.L_WORLD_SIZE),
                seeds_ordered=len(set(seed_first.values())) == len(seed_first) > 1,
            )
        )
    return tuple(targets)


def read_kv_groups(group_info: list[Series]) -> dict[str, tuple[str, str]]:
    """KV group -> (attention kind, tokens per block), from ``kvscope_kv_group_info``."""
    return {s.label(S.L_KV_GROUP): (s.label(S.L_KIND), s.label(S.L_TOKENS_PER_BLOCK))
            for s in group_info}


def read_kv_group_restore_chunks(group_info: list[Series]) -> dict[str, int]:
    """KV group -> the most chunks of it a restore promotes
    (``kvscope_kv_group_info{restore_chunks}``; 0: every chunk of the prefix)."""
    return {s.label(S.L_KV_GROUP): int(s.label(S.L_RESTORE_CHUNKS)) for s in group_info
            if s.label(S.L_RESTORE_CHUNKS).isdigit()}


def read_kv_group_drafters(group_info: list[Series]) -> dict[str, str]:
    """KV group -> how vLLM keys it for a drafter (``kvscope_kv_group_info{drafter}``)."""
    return {s.label(S.L_KV_GROUP): s.label(S.L_DRAFTER) for s in group_info
            if s.label(S.L_DRAFTER)}
