"""The restore benchmarks' two schedules (kvscope.sim.reask_schedule) on vLLM's real
scheduler: whichever evicts the timed prompt (the next prompt's prefill, or the other
prompts' restores), every timed re-ask must be a whole restore from disk, or the benchmark
times something else. Judged by what vLLM loaded and promoted, and the outputs."""

from __future__ import annotations

import pytest

from kvscope.sim import restore_convoy

pytestmark = pytest.mark.vllm

TOKENS = 4096  # 256 keys; the engine keeps 32 rows and 64 GPU blocks to spare


@pytest.mark.parametrize("between", ["prefill", "restore"])
def test_every_timed_reask_restores_its_whole_prompt_from_disk(between):
    res = restore_convoy.run(TOKENS, pairs=2, warmup=1, between=between)
    keys = TOKENS // 16
    assert len(res["iters"]) == 4
    assert [i["prompt"] for i in res["iters"]] == (
        [1, 2, 3, 4] if between == "prefill" else [1, 2, 0, 1])
    for it in res["iters"]:
        assert it["loaded"] == TOKENS, it  # none of it left in the GPU blocks or rows
        assert it["promotions"]["keys"] == keys and it["promotions"]["jobs"] == 1, it
        assert it["promotions"]["failed_keys"] == 0
        assert it["same_output"]
    assert not res["telemetry_errors"]
