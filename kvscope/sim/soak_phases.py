"""The soak's traffic: one cycle of phases on a CPU engine, and what the engine did in each.

A cycle (every prompt's content new, so kvscope sees new keys all along):

* ``shared``: a long prefix asked with ``suffixes`` different suffixes, one after the
  other (an agent session's turns): the first stores it, the others find it on the GPU;
* ``flood``: other prompts, together more tokens than the primary tier has rows and the
  GPU has blocks, asked at once: the prefix leaves both, for disk only;
* ``reask``: the session's first prompt again: restored from disk (promotions into the
  primary tier, then loads); engine truth: every token the tiers held restored, the
  same output;
* ``ceiling``: alternately a prompt needing more rows than the primary tier has, asked
  and at once asked again (``alone``), or ``concurrent`` long prefixes that each fit the
  tier, asked, flooded away and asked again together; engine truth: each re-ask finished
  with its first output, restoring no more than the tiers held (the ceiling cuts it).

Engine truth is read from vLLM (each request's ``num_external_cached_tokens`` and output)
and from the tiers themselves (``tiers_hold_tokens``: rows of the primary tier, files of
the fs tier), never from kvscope's counters.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt
from kvscope.sim.scenarios import tiers_hold_tokens

BLOCK = 16  # tokens per block and per primary-tier row (one KV group)


@dataclass(frozen=True)
class Plan:
    """Sizes of one cycle; the engine is built from them (:meth:`engine_config`)."""

    rows: int  # primary-tier rows
    prefix_tokens: int  # the shared prefix (a multiple of BLOCK)
    suffix_tokens: int
    suffixes: int  # asks sharing the prefix in the shared phase
    flood_tokens: int  # tokens of one flood prompt
    floods: int  # flood prompts asked at once
    ceiling_tokens: int  # the alone form's prompt: more rows than the tier has
    concurrent: int  # the concurrent form's prefixes
    concurrent_tokens: int  # tokens of each (fits the tier alone, not all together)
    out_tokens: int = 4
    max_num_batched_tokens: int = 8192

    def engine_config(self, fs_root: str) -> EngineConfig:
        longest = max(self.prefix_tokens + self.suffix_tokens, self.ceiling_tokens,
                      self.concurrent * self.concurrent_tokens)
        return EngineConfig(
            rows=self.rows, tiering=True, kv_groups=1, world_size=1, fs_root=fs_root,
            # the GPU holds the longest ask (or the concurrent ones together), no more:
            # a flood then evicts the prefix from it
            num_gpu_blocks=longest // BLOCK + 2 * self.max_num_batched_tokens // BLOCK,
            max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=32,
            max_model_len=max(self.prefix_tokens + self.suffix_tokens, self.ceiling_tokens)
            + 2 * self.out_tokens + BLOCK,
            # promotions land two steps after they start (a disk slower than a forward): a
            # re-ask past the row ceiling is then cut and finishes (kvscope.sim.scenarios:
            # truncated); landing within the step, it livelocks, and the soak would stop
            promotion_delay_steps=2, exporter_port=0)

    def check(self) -> None:
        gpu_tokens = self.engine_config("").num_gpu_blocks * BLOCK
        tier_tokens = self.rows * BLOCK
        assert self.prefix_tokens % BLOCK == 0 and self.suffix_tokens % BLOCK == 0
        assert self.prefix_tokens + self.suffix_tokens <= tier_tokens, "the session must fit"
        assert self.ceiling_tokens > tier_tokens, "the alone form needs more rows than the tier"
        # each fits alone; together half as many rows again as the tier has
        assert 2 * self.concurrent * self.concurrent_tokens >= 3 * tier_tokens
        assert self.concurrent_tokens <= tier_tokens
        assert self.floods * self.flood_tokens > max(gpu_tokens, tier_tokens), "floods evict"


# Operators' scale: 100k-token sessions (a 96k-token shared prefix), 8,192 primary rows.
FULL = Plan(rows=8192, prefix_tokens=96 * 1024, suffix_tokens=1024, suffixes=3,
            flood_tokens=16 * 1024, floods=14, ceiling_tokens=136 * 1024, concurrent=3,
            concurrent_tokens=64 * 1024)
# CI's: the same phases, small enough for a couple of minutes on two shared cores.
SHORT = Plan(rows=512, prefix_tokens=6 * 1024, suffix_tokens=256, suffixes=3,
             flood_tokens=2 * 1024, floods=10, ceiling_tokens=10 * 1024, concurrent=3,
             concurrent_tokens=4 * 1024, max_num_batched_tokens=2048)
PLANS = {"full": FULL, "short": SHORT}


class Traffic:
    """Drives one engine through the cycles, phase after phase."""

    def __init__(self, engine: CPUEngine, plan: Plan,
                 on_step: Callable[[CPUEngine], None] | None = None) -> None:
        self.e = engine
        self.plan = plan
        self.on_step = on_step  # called after every step of a phase (the sampler)
        self._seeds = itertools.count(1_000)  # every prompt's content new
        self.cycle = 0
        self.new_tokens = 0  # prompt tokens never asked before (what reached the tiers)

    def _prompt(self, n: int) -> list[int]:
        self.new_tokens += n
        return prompt(next(self._seeds), n)

    def _run(self, prompts: list[list[int]]) -> list[Any]:
        """Ask ``prompts`` at once, step until all finished and the tiers are idle."""
        rids = [self.e.add_request(p, self.plan.out_tokens) for p in prompts]
        self.e.run_until_done(rids, max_steps=100_000, on_step=self.on_step)
        self.e.drain()
        return self._take(rids)

    def _take(self, rids: list[str]) -> list[Any]:
        """The finished requests, forgotten by the harness: what it keeps per request is
        the benchmark's to drop (it would grow the RSS this soak measures)."""
        done = [self.e.finished.pop(r) for r in rids]
        for r in rids:
            self.e._results._outputs.pop(r, None)
            self.e.model._prefix_digest.pop(r, None)
        return done

    def _reask(self, prompts: list[list[int]], first: list[Any]) -> dict[str, Any]:
        """Ask ``prompts`` again at once: engine truth per request."""
        rids = [self.e.add_request(p, self.plan.out_tokens) for p in prompts]
        held = [tiers_hold_tokens(self.e, r) for r in rids]  # before anything is restored
        self.e.run_until_done(rids, max_steps=100_000, on_step=self.on_step)
        self.e.drain()
        done = self._take(rids)
        return {"prompt_tokens": [len(p) for p in prompts], "held_tokens": held,
                "restored_tokens": [d.num_external_tokens for d in done],
                "same_output": [d.output == f.output for d, f in zip(done, first, strict=True)]}

    # ---- phases -----------------------------------------------------------------------
    def shared(self) -> dict[str, Any]:
        p = self.plan
        self._prefix = self._prompt(p.prefix_tokens)
        self._session = [self._prefix + self._prompt(p.suffix_tokens)
                         for _ in range(p.suffixes)]
        done = [self._run([s])[0] for s in self._session]
        self._first = done[0]
        return {"cached_tokens": [d.num_cached_tokens for d in done],
                "restored_tokens": [d.num_external_tokens for d in done]}

    def flood(self) -> dict[str, Any]:
        done = self._run([self._prompt(self.plan.flood_tokens) for _ in range(self.plan.floods)])
        return {"prompts": len(done), "restored_tokens": sum(d.num_external_tokens for d in done)}

    def reask(self) -> dict[str, Any]:
        fact = self._reask([self._session[0]], [self._first])
        # the whole prompt reached a tier, and all of it came back, unchanged
        fact["ok"] = (fact["held_tokens"] == fact["prompt_tokens"]
                      and fact["restored_tokens"] == fact["held_tokens"]
                      and all(fact["same_output"]))
        return fact

    def ceiling(self) -> dict[str, Any]:
        p = self.plan
        if self.cycle % 2 == 0:
            form = "alone"
            prompts = [self._prompt(p.ceiling_tokens)]
            first = [self._run(prompts)[0]]
        else:
            form = "concurrent"
            prompts = [self._prompt(p.concurrent_tokens) for _ in range(p.concurrent)]
            first = [self._run([q])[0] for q in prompts]
            self.flood()
        fact = {"form": form, **self._reask(prompts, first)}
        fact["cut"] = any(r < h for r, h in zip(fact["restored_tokens"], fact["held_tokens"]))
        # finished, unchanged, never more than the tiers held
        fact["ok"] = (all(fact["same_output"]) and all(
            r <= h for r, h in zip(fact["restored_tokens"], fact["held_tokens"])))
        return fact

    PHASES = ("shared", "flood", "reask", "ceiling")

    def phases(self):
        """Yield each phase's engine truth, phase after phase, cycle after cycle, for ever."""
        while True:
            for name in self.PHASES:
                yield {"cycle": self.cycle, "phase": name, **getattr(self, name)()}
            self.cycle += 1
