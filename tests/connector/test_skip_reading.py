"""A request that reads no cached KV (``prompt_logprobs``, or ``skip_reading_prefix_cache``)
is not a lookup: vLLM's GPU prefix cache and the offloading connector serve it nothing
without looking, so kvscope opens no round for it and counts none of its stored prefix as
held and not offered. Before: every such request read as lost coverage (reason ``other``),
and kv-diagnose named an unclassified anomaly on the H200 campaign's clean control
(docs/measured-facts.md). Judged by the engine: what it restored, and what a plain
re-ask of the same prompt restores (the tiers held it)."""

from __future__ import annotations

import pytest

from kvscope.exporters import signals as S
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig
from kvscope.sim.cpu_model import prompt

pytestmark = pytest.mark.vllm


def _coverage(e: CPUEngine) -> tuple[float, float, float]:
    e.refresh()
    snap = e.connector.kvscope_recorder.snapshot()
    held = sum(v for (m, _), v in snap.counters.items() if m is S.RESTORE_HELD_TOKENS)
    short = sum(v for (m, _), v in snap.counters.items() if m is S.RESTORE_SHORT_TOKENS)
    hit = sum(v for (m, _), v in snap.counters.items() if m is S.HIT_TOKENS)
    return held, short, hit


def test_a_request_that_reads_no_cache_is_not_counted_as_lost_coverage():
    target = prompt(3, 96)
    with CPUEngine(EngineConfig(rows=32, num_gpu_blocks=16)) as e:
        e.generate(target, 2)
        for seed in (4, 5, 6):  # out of the GPU prefix cache, into the tiers
            e.generate(prompt(seed, 96), 2)
        e.drain()
        before = _coverage(e)
        skipped = e.generate(target, 2, prompt_logprobs=5)
        e.drain()
        after_skip = _coverage(e)
        for seed in (7, 8, 9):  # it was computed again: out of the GPU prefix cache again
            e.generate(prompt(seed, 96), 2)
        e.drain()
        before_plain = _coverage(e)
        plain = e.generate(target, 2)
        e.drain()
        after_plain = _coverage(e)
    assert plain.num_external_tokens == 96, plain  # the premise: the tiers held it all
    assert skipped.num_external_tokens == 0 and skipped.num_cached_tokens == 0, skipped
    assert skipped.output == plain.output
    assert after_skip == before  # nothing held, short or hit for the request that did not read
    held, short, hit = (a - b for a, b in zip(after_plain, before_plain, strict=True))
    assert (held, short, hit) == (96, 0, 96)  # the plain re-ask: held and offered in full
