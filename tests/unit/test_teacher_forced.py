"""The GPU campaign's teacher-forced engine-truth check (``kvscope.sim.teacher_forced``).

* the recompute request is what vLLM 0.26's own OpenAI protocol turns into sampling params
  that read no prefix cache, with a salt;
* on vLLM's real scheduler and offloading connector (CPU harness), such a request is served
  by neither the GPU prefix cache nor the offload tiers, while a plain re-ask of the same
  prompt is (the premise can fail);
* the judging, on payloads in the shape vLLM returns them, and on every recorded GPU
  campaign phase that carries them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.sim import teacher_forced as tf

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def entry(logprobs: dict[int, float]) -> dict[str, dict]:
    """One prompt_logprobs position as vLLM's JSON carries it (token ids as strings)."""
    ranked = sorted(logprobs, key=lambda k: -logprobs[k])
    return {str(k): {"logprob": v, "rank": ranked.index(k) + 1, "decoded_token": f"w{k}"}
            for k, v in logprobs.items()}


def test_recompute_body_reads_no_cache_in_vllms_own_protocol():
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    body = tf.recompute_body("tiny", [1, 5, 6], [7, 8])
    req = CompletionRequest(**body)
    sp = req.to_sampling_params(max_tokens=1, default_sampling_params={})
    assert req.prompt == [1, 5, 6, 7, 8] and req.cache_salt.startswith("teacher-forced-")
    assert sp.prompt_logprobs == tf.TOP_LOGPROBS and sp.skip_reading_prefix_cache is True
    assert tf.recompute_body("tiny", [1], [2])["cache_salt"] != body["cache_salt"]


def test_salted_prompt_logprobs_request_is_served_by_no_cache():
    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig
    from kvscope.sim.cpu_model import prompt

    target = prompt(7, 96)
    with CPUEngine(EngineConfig(rows=32, num_gpu_blocks=64)) as e:
        e.generate(target, 2)
        e.drain()
        recompute = e.generate(target, 2, prompt_logprobs=5, cache_salt="teacher-forced-1")
        e.drain()
        salted_only = e.generate(target, 2, cache_salt="teacher-forced-2")
        e.drain()
        plain = e.generate(target, 2)
    assert plain.num_cached_tokens >= 80, plain  # the premise: the prompt was reusable
    assert (recompute.num_cached_tokens, recompute.num_external_tokens) == (0, 0), recompute
    assert (salted_only.num_cached_tokens, salted_only.num_external_tokens) == (0, 0)
    assert recompute.output == plain.output


def test_judge_names_top1_near_tie_wrong_and_missing():
    positions = [entry({10: -1.0, 11: -1.5}),             # served 10: top-1
                 entry({12: -2.0, 13: -2.01, 14: -3.0}),  # served 13: 0.01 below top-1
                 entry({15: -1.0, 16: -2.2}),             # served 16: 1.2 nats below
                 None]
    out = tf.judge([10, 13, 16, 17], positions)
    assert [r["verdict"] for r in out["positions"]] == ["top1", "near_tie", "wrong", "missing"]
    assert out["verdict"] == "missing" and out["wrong"] == 1 and out["near_tie"] == 1
    assert out["positions"][1]["gap_nats"] == pytest.approx(0.01)
    assert out["positions"][2]["rank"] == 2 and out["max_gap_nats"] == pytest.approx(1.2)
    assert tf.judge([10, 13], positions[:2])["verdict"] == "near_tie"
    tie = [entry({20: -6.0224, 21: -6.0224, 22: -6.1})]  # an exact bf16 tie: either is top-1
    assert [tf.judge([t], tie)["positions"][0]["top1"] for t in (20, 21)] == [20, 21]
    assert tf.judge([21], tie)["verdict"] == "top1"
    assert tf.judge([10, 13], positions[:2], margin=0.005)["verdict"] == "wrong"


def test_served_positions_maps_generated_tokens_to_prompt_logprob_entries():
    choice = {"prompt_logprobs": [None, entry({5: -1.0}), entry({6: -1.0}),
                                  entry({7: -0.5, 9: -0.7}), entry({8: -0.1})]}
    pos = tf.served_positions(choice, n_prompt=3, n_served=2)  # prompt [a b c], served [7 8]
    assert [list(p) for p in pos] == [["7", "9"], ["8"]]
    assert tf.judge([7, 8], pos)["verdict"] == "top1"
    assert tf.served_positions(choice, 4, 2)[1] is None  # past the end: missing


def test_first_divergence_reports_both_sides():
    first = {"token_ids": [1, 2, 3], "top_logprobs": [{"w1": -1}, {"w2": -1}, {"w3": -1}]}
    again = {"token_ids": [1, 2, 4], "top_logprobs": [{"w1": -1}, {"w2": -1}, {"w4": -1}]}
    tf_first = tf.judge([1, 2, 3], [entry({1: 0}), entry({2: 0}), entry({3: -1, 4: -1.0005})])
    tf_again = tf.judge([1, 2, 4], [entry({1: 0}), entry({2: 0}), entry({3: -1, 4: -1.0005})])
    d = tf.first_divergence(first, again, tf_first, tf_again)
    assert (d["pos"], d["first"], d["again"]) == (2, 3, 4)
    assert d["first_tf"]["verdict"] == "top1" and d["again_tf"]["verdict"] == "near_tie"
    assert d["again_served_top"] == {"w4": -1}
    assert tf.first_divergence(first, first, tf_first, tf_first) is None


def recorded_judgements():
    for path in sorted(FIXTURES.glob("campaign*/*.json")):
        for phase in json.loads(path.read_text()).get("phases", []):
            for side, judged in (phase.get("teacher_forced") or {}).items():
                if judged and "raw" in judged:
                    yield f"{path.stem}:{phase['name']}:{side}", phase[side], judged


RECORDED = list(recorded_judgements())


@pytest.mark.skipif(not RECORDED, reason="no recorded campaign carries teacher-forced payloads")
@pytest.mark.parametrize("name,served,judged", RECORDED, ids=[r[0] for r in RECORDED])
def test_recorded_payloads_judge_as_recorded_with_no_wrong_token(name, served, judged):
    again = tf.judge(served["token_ids"], judged["raw"], judged["margin_nats"])
    assert again["positions"] == judged["positions"]
    assert judged["recompute_cached_tokens"] == 0  # nothing cached served the recompute
    assert again["verdict"] in ("top1", "near_tie"), again
