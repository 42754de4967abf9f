"""Seeded CPU geometries for the engine-truth oracle matrix.

One geometry is one CPU engine (:mod:`kvscope.sim.cpu_engine`) and one
workload on it: ask ``concurrency`` prompts one by one, flood the GPU cache
(and the primary tier) with other prompts of the same length, then ask the
same prompts again, all at once. What varies: the primary tier's rows; 1-3 KV
groups, the last one a sliding-window group in some; chunks per prompt and a
partial tail chunk (prompt lengths); tokens per step
(``max_num_batched_tokens``); 1-8 concurrent requests, with or without a shared
prefix; the CPU spec alone or tiering with the fs tier, its I/O settled every
step or racing the steps.

``generate(seed, count)`` is a pure function of its arguments: the same seed
gives the same geometries on every machine.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

from kvscope.sim.cpu_engine import EngineConfig, prompt

CHUNK = 16  # tokens per block = per offloaded chunk in every geometry
MAX_MODEL_LEN = 4096
STEP_CHOICES = (16, 32, 48, 64, 128, 256)
ASK_TOKENS = 4  # tokens each ask generates (the output compared between the two asks)
FLOOD_TOKENS = 2


@dataclass(frozen=True)
class Geometry:
    index: int
    seed: int
    tiering: bool  # TieringOffloadingSpec + fs tier, else CPUOffloadingSpec alone
    rows: int  # primary-tier rows
    kv_groups: int
    window_chunks: int | None  # sliding window of the last group, in chunks; None: all full
    chunks: int  # full chunks per prompt
    tail: int  # tokens past the last full chunk
    step_tokens: int  # max_num_batched_tokens
    concurrency: int  # prompts asked, then re-asked together
    shared_chunks: int  # leading chunks every prompt shares (0: none)
    num_gpu_blocks: int
    floods: int  # prompts asked between the two asks
    # The fs tier's I/O threads race the steps, as beside a real engine (else the
    # harness lets each step's tier I/O finish first: repeatable runs).
    race_tiers: bool = False
    # Tokens every ask and flood generates (None: 4 an ask, 2 a flood). A store job
    # refused while its request runs is retried every step, decode steps too: the
    # refusal counts of a GPU run (16 tokens out) need its output length.
    output_tokens: int | None = None
    # The fs tier's promotions stay in flight this many steps (a disk slower than a
    # forward: kvscope.sim.promotion_delay), with settled tiers
    promotion_delay: int = 0

    @property
    def ask_tokens(self) -> int:
        return self.output_tokens or ASK_TOKENS

    @property
    def flood_tokens(self) -> int:
        return self.output_tokens or FLOOD_TOKENS

    @property
    def prompt_tokens(self) -> int:
        return self.chunks * CHUNK + self.tail

    @property
    def name(self) -> str:
        spec = "fs" if self.tiering else "cpu"
        swa = f"+swa{self.window_chunks}" if self.window_chunks else ""
        share = f"/shared{self.shared_chunks}" if self.shared_chunks else ""
        spec += "~" if self.race_tiers else ""
        out = f"/o{self.output_tokens}" if self.output_tokens else ""
        out += f"/d{self.promotion_delay}" if self.promotion_delay else ""
        return (f"g{self.index:03d}-{spec}-r{self.rows}-k{self.kv_groups}{swa}-c{self.chunks}"
                f"t{self.tail}-s{self.step_tokens}-x{self.concurrency}{share}{out}")

    def engine_config(self, **over) -> EngineConfig:
        cfg = EngineConfig(
            rows=self.rows, tiering=self.tiering, world_size=1, kv_groups=self.kv_groups,
            sliding_window=self.window_chunks * CHUNK if self.window_chunks else None,
            block_size=CHUNK, num_gpu_blocks=self.num_gpu_blocks,
            max_num_batched_tokens=self.step_tokens, max_num_seqs=8,
            max_model_len=MAX_MODEL_LEN, settle_tiers=not self.race_tiers,
            promotion_delay_steps=self.promotion_delay)
        for k, v in over.items():
            setattr(cfg, k, v)
        return cfg

    def prompts(self) -> list[list[int]]:
        """The prompts asked twice; with a shared prefix they agree on its chunks."""
        n = self.prompt_tokens
        shared = prompt(self.seed * 1000 + 999, self.shared_chunks * CHUNK)
        out = []
        for i in range(self.concurrency):
            own = prompt(self.seed * 1000 + i, n)
            out.append((shared + own[len(shared):])[:n])
        return out

    def flood_prompts(self) -> list[list[int]]:
        return [prompt(self.seed * 1000 + 500 + i, self.prompt_tokens) for i in range(self.floods)]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["name"] = self.name
        d["prompt_tokens"] = self.prompt_tokens
        return d


def keys_per_request(chunks: int, kv_groups: int, window_chunks: int | None) -> int:
    """Rows one whole-prompt restore needs at once: every chunk of each full-attention
    group, the window's chunks of a sliding-window group."""
    full = kv_groups - (1 if window_chunks else 0)
    return full * chunks + (min(window_chunks, chunks) if window_chunks else 0)


def _one(index: int, seed: int) -> Geometry:
    rnd = random.Random(f"{seed}:{index}")
    tiering = rnd.random() < 0.75
    kv_groups = rnd.choice((1, 1, 2, 2, 3))
    window = rnd.choice((1, 2, 3)) if kv_groups >= 2 and rnd.random() < 0.4 else None
    chunks = rnd.randint(2, 14)
    tail = rnd.choice((0, 0, rnd.randint(1, CHUNK - 1)))
    concurrency = rnd.choice((1, 1, 1, 2, 2, 3, 4, 6, 8))
    shared = rnd.randint(1, chunks) if concurrency > 1 and rnd.random() < 0.5 else 0
    need = keys_per_request(chunks, kv_groups, window)
    # Rows around what one request needs (ceilings below it, head-room above),
    # and for concurrent asks between one request's need and all of theirs.
    if concurrency > 1 and rnd.random() < 0.5:
        rows = rnd.randint(need, max(need, need * concurrency))
    else:
        rows = max(2, round(need * rnd.uniform(0.3, 2.0)))
    # Small steps mostly (chunked prefill, stores that fit); some whole-prompt steps.
    step = rnd.choice(STEP_CHOICES)
    blocks_per_prompt = kv_groups * (chunks + 2)
    num_gpu_blocks = blocks_per_prompt * concurrency + 8
    floods = math.ceil(num_gpu_blocks / (kv_groups * max(chunks, 1))) + 1
    if not tiering and rnd.random() < 0.5:
        # The CPU tier alone: often big enough to keep the prompts through the
        # flood, so the re-ask restores from it (else the flood evicts them).
        rows = (concurrency + floods + 1) * kv_groups * chunks
    # Its own stream: adding this dimension left every other draw as it was.
    race = tiering and random.Random(f"{seed}:{index}:race").random() < 0.35
    return Geometry(index=index, seed=seed, tiering=tiering, rows=rows, kv_groups=kv_groups,
                    window_chunks=window, chunks=chunks, tail=tail, step_tokens=step,
                    concurrency=concurrency, shared_chunks=shared,
                    num_gpu_blocks=num_gpu_blocks, floods=floods, race_tiers=race)


def generate(seed: int, count: int) -> list[Geometry]:
    return [_one(i, seed) for i in range(count)]


def _reported(index: int, rows: int, chunks: int, step: int, *, kv_groups: int = 1,
              window: int | None = None, delay: int = 0) -> Geometry:
    """One re-ask after five floods, the H200 runs' workload (16 tokens out)."""
    return Geometry(index=index, seed=index, tiering=True, rows=rows, kv_groups=kv_groups,
                    window_chunks=window, chunks=chunks, tail=0, step_tokens=step,
                    concurrency=1, shared_chunks=0, num_gpu_blocks=kv_groups * (chunks + 2) + 8,
                    floods=5, output_tokens=16, promotion_delay=delay)


# Geometries reported from GPU runs, reproduced on the CPU harness (rows, prompt length,
# tokens per step, floods, KV groups as reported). Both H200 runs restored exactly rows'
# worth (rows x 16 tokens for one group) and kv-diagnose said store_never_fits at 0.5; an
# outside probe cannot tell a prompt stored in part from one cut at the row count. The
# per-key truth here: stored in part (48 of 125 keys; 32 of 111 chunks in each group),
# as the H200 runs' file counts agree (289 files = 6 prompts x 48 + 1; 385 = 6 x 64 + 1).
# The third is the contrast: the whole prompt on disk, the restore cut at the row count.
REPORTED: dict[str, Geometry] = {
    # 48 rows, 2,000-token prompt, 384 tokens a step: 2 jobs of 24 rows fit, then refused
    "h200-48rows-384step": _reported(900, 48, 125, 384),
    # Gemma2-style: a full-attention and a sliding-window group, 80 rows, 256 tokens a step
    "h200-hybrid-80rows-256step": _reported(901, 80, 111, 256, kv_groups=2, window=4),
    # 48 rows, 128 tokens a step: every job fits, the whole prompt reaches disk; promotions
    # landing two steps late cut the re-ask at the row count (the truncated form)
    "truncated-48rows-128step": _reported(902, 48, 125, 128, delay=2),
}
