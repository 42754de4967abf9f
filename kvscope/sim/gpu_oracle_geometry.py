"""Seeded geometries of the GPU oracle (``benchmarks/gpu_oracle.py``), grouped into phases.

A *phase* is one vLLM engine (``vllm.LLM``): what only an engine fixes (KV groups, the
tiers, primary rows, tokens per step, GPU blocks). Its *geometries* run one after the
other on it, each with prompts of its own: prompt length, concurrent re-asks, floods.
An engine takes 30-50 s to start, so the oracle runs ~32 geometries on 8 engines (and
several engines at once: one H200 holds many tiny ones) to fit one 9-minute device call.

Geometry per the CPU oracle's workload (``kvscope.sim.oracle``): ask each prompt, flood
the GPU prefix cache (and the primary tier) with prompts of the same length, re-ask the
prompts together. Pure functions of the seed: the same geometries on every machine.
Judging windows (:func:`window`) cut one geometry's samples out of the engine's
lifetime counters, as a Prometheus range does, so a geometry is judged on its own.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field

BLOCK = 16  # tokens per GPU block = per offloaded chunk
PHASES = 8
PER_PHASE = 4
MIN_PROMPT, MAX_PROMPT = 1_000, 32_000
WINDOW_TOKENS = 512  # the Gemma2-style model's sliding window (prompts are longer)
OUTPUT_TOKENS = 16
# Rows of the primary tier per phase, as multiples of chunks per group of its longest
# prompt: below it (ceilings), around it, above it (head-room).
ROW_FACTORS = (0.3, 0.5, 0.8, 1.0, 1.3, 2.0, 3.0)
STEP_CHOICES = (256, 384, 512, 1024, 2048)


@dataclass(frozen=True)
class Geometry:
    phase: int
    index: int  # over all phases
    seed: int
    prompt_tokens: int
    concurrency: int  # prompts asked one by one, then re-asked together
    floods: int  # prompts asked between the two asks (evict the GPU prefix cache)
    output_tokens: int = OUTPUT_TOKENS

    @property
    def chunks(self) -> int:
        return self.prompt_tokens // BLOCK

    def prompts(self, vocab: int) -> list[list[int]]:
        """Token ids of the prompts asked twice (ids 3.. leave the special tokens out)."""
        return [_ids(f"{self.seed}:ask:{i}", self.prompt_tokens, vocab)
                for i in range(self.concurrency)]

    def flood_prompts(self, vocab: int) -> list[list[int]]:
        return [_ids(f"{self.seed}:flood:{i}", self.prompt_tokens, vocab)
                for i in range(self.floods)]


@dataclass(frozen=True)
class Phase:
    index: int
    seed: int
    tiering: bool  # TieringOffloadingSpec + fs tier, else CPUOffloadingSpec alone
    kv_groups: int  # 1: a Llama; 2: a Gemma2-style model (sliding window + full attention)
    rows: int  # primary-tier rows asked for (cpu_bytes_to_use = rows x row bytes)
    step_tokens: int  # max_num_batched_tokens
    num_gpu_blocks: int
    max_model_len: int
    geometries: tuple[Geometry, ...] = field(default=())

    @property
    def window_tokens(self) -> int | None:
        return WINDOW_TOKENS if self.kv_groups == 2 else None

    @property
    def name(self) -> str:
        spec = "fs" if self.tiering else "cpu"
        swa = f"+swa{WINDOW_TOKENS}" if self.kv_groups == 2 else ""
        return f"p{self.index}-{spec}-r{self.rows}-k{self.kv_groups}{swa}-s{self.step_tokens}"

    def geometry_name(self, g: Geometry) -> str:
        return f"{self.name}/g{g.index:02d}-n{g.prompt_tokens}-x{g.concurrency}"

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("geometries")
        d["name"] = self.name
        return d


def _ids(key: str, n: int, vocab: int) -> list[int]:
    rnd = random.Random(key)
    return [3 + rnd.randrange(vocab) for _ in range(n)]


def _phase(index: int, seed: int, first: int) -> Phase:
    rnd = random.Random(f"gpu:{seed}:{index}")
    kv_groups = 2 if index % 4 == 1 else 1  # 2 of 8 engines hybrid
    tiering = index % 4 != 3  # 6 of 8 tiering, 2 the CPU tier alone
    # The phase's longest prompt; its geometries go down to 2/3 of it
    longest = int(math.exp(rnd.uniform(math.log(1_500), math.log(MAX_PROMPT))))
    longest = max(MIN_PROMPT, min(MAX_PROMPT, longest // BLOCK * BLOCK))
    chunks = longest // BLOCK
    step = rnd.choice(STEP_CHOICES)
    rows = max(16, round(chunks * kv_groups * rnd.choice(ROW_FACTORS)))
    if not tiering and rnd.random() < 0.5:
        rows = chunks * kv_groups * 12  # big enough to keep prompts through the floods
    concurrency = [rnd.choice((1, 1, 2, 3, 4)) for _ in range(PER_PHASE)]
    # GPU blocks: every prompt of the widest re-ask at once, and room to spare; floods
    # then evict the prompts from the GPU prefix cache
    num_gpu_blocks = kv_groups * (max(concurrency) * (chunks + 2) + 16)
    geoms = []
    for k in range(PER_PHASE):
        n = rnd.randint(max(MIN_PROMPT, longest * 2 // 3), longest)
        n = max(MIN_PROMPT, n // BLOCK * BLOCK + rnd.choice((0, 0, rnd.randint(1, BLOCK - 1))))
        floods = math.ceil(num_gpu_blocks / (kv_groups * (n // BLOCK))) + 1
        geoms.append(Geometry(phase=index, index=first + k, seed=seed * 1000 + first + k,
                              prompt_tokens=n, concurrency=concurrency[k], floods=floods))
    max_len = -(-(longest + OUTPUT_TOKENS + BLOCK) // BLOCK) * BLOCK
    return Phase(index=index, seed=seed, tiering=tiering, kv_groups=kv_groups, rows=rows,
                 step_tokens=step, num_gpu_blocks=num_gpu_blocks, max_model_len=max_len,
                 geometries=tuple(geoms))


def _reported(index: int, seed: int, first: int, *, rows: int, step: int, kv_groups: int,
              asks: tuple[tuple[int, int], ...]) -> Phase:
    """A phase of the H200 runs the CPU harness reproduced (kvscope.sim.oracle_geometry
    REPORTED): five floods, 16 tokens out; ``asks``: (prompt tokens, concurrency)."""
    longest = max(n for n, _ in asks)
    chunks = longest // BLOCK
    num_gpu_blocks = kv_groups * (max(c for _, c in asks) * (chunks + 2) + 16)
    geoms = tuple(Geometry(phase=index, index=first + k, seed=seed * 1000 + first + k,
                           prompt_tokens=n, concurrency=c,
                           floods=max(5, math.ceil(num_gpu_blocks / (kv_groups * (n // BLOCK)))
                                      + 1))
                  for k, (n, c) in enumerate(asks))
    max_len = -(-(longest + OUTPUT_TOKENS + BLOCK) // BLOCK) * BLOCK
    return Phase(index=index, seed=seed, tiering=True, kv_groups=kv_groups, rows=rows,
                 step_tokens=step, num_gpu_blocks=num_gpu_blocks, max_model_len=max_len,
                 geometries=geoms)


def generate(seed: int, phases: int = PHASES) -> list[Phase]:
    """Two phases of the reported H200 runs (48 rows and 384-token steps, a 2,000-token
    prompt; the hybrid model's 80 rows and 256-token steps, 1,776 tokens), then seeded ones."""
    out = [
        _reported(0, seed, 0, rows=48, step=384, kv_groups=1,
                  asks=((2000, 1), (2000, 1), (1504, 2), (2000, 3))),
        _reported(1, seed, PER_PHASE, rows=80, step=256, kv_groups=2,
                  asks=((1776, 1), (1776, 1), (1200, 2), (1776, 3))),
    ]
    return out + [_phase(i, seed, i * PER_PHASE) for i in range(len(out), phases)]


def window(before: list[tuple[str, tuple, float]], t0: float,
           after: list[tuple[list[tuple[str, tuple, float]], float]], location: str):
    """A RawWindow of one geometry: the exporter's samples at ``t0`` (before it began)
    and at each ``after`` time, judged as a Prometheus range is (counters: growth
    within the window, not the engine's lifetime totals). Each sample list is
    ``diagnostics.scrape.parse_exposition``'s."""
    from kvscope.diagnostics.model import RawWindow, Series, SourceInfo

    samples: dict[tuple[str, tuple], list[tuple[float, float]]] = {}
    for got, t in [(before, t0), *after]:
        for name, labels, value in got:
            samples.setdefault((name, labels), []).append((t, value))
    t_prev, t_end = after[-2][1] if len(after) > 1 else t0, after[-1][1]
    # "recent" (still happening) is the change since the last sample before the recent
    # span: 1 ms short of the gap, that sample is the one at t_prev, as a scrape's pair is
    src = SourceInfo(kind="prometheus", location=location, start=t0, end=t_end, now=t_end,
                     lifetime=False, recent_span=max(t_end - t_prev - 1e-3, 1e-3))
    return RawWindow(src, tuple(Series(name, labels, location, tuple(smp))
                                for (name, labels), smp in sorted(samples.items())))
