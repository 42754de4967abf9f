"""Teacher-forced recompute: was a served token the engine's own best guess?

Comparing a re-ask's tokens with the first ask's cannot tell a wrong restore from a
near-tie that bf16 numerics broke differently on two compute paths (the first ask's last
prompt token inside a prefill chunk, the re-ask's alone over restored KV). So each served
continuation is asked again as a prompt (prompt ids + served ids) with vLLM's
``prompt_logprobs``: one fresh prefill whose logprobs at each generated position say where
the served token stands against the recompute's top-1.

Nothing cached may serve that recompute (vLLM 0.26 source):
* ``SamplingParams.prompt_logprobs`` set -> ``skip_reading_prefix_cache`` defaults to True
  (``sampling_params.py``): ``KVCacheManager.get_computed_blocks`` returns no hit
  (``v1/core/kv_cache_manager.py``) and ``OffloadingConnectorScheduler
  .get_num_new_matched_tokens`` reports 0 hit tokens (``.../offloading/scheduler.py``);
* a fresh ``cache_salt`` enters the first block's extra hash keys
  (``v1/core/kv_cache_utils.generate_block_hash_extra_keys``), and every later block hash
  chains on its parent, so no block of the recompute shares a hash with the served
  request's: what it stores cannot overwrite or refresh the served request's tier entries.
The recompute's ``usage.prompt_tokens_details.cached_tokens`` is recorded: 0 is the premise.

Judging (``judge``): at each generated position the served token is ``top1`` (the
recompute's argmax), ``near_tie`` (within ``NEAR_TIE_NATS`` of it) or ``wrong``; a token whose logprob
equals the top-1's (an exact bf16 tie) is ``top1``.
``NEAR_TIE_NATS``: the tiny random Llama's logits are flat (top-1 sits ~1 nat above the
median token, top-1/top-2 gaps of 0.001-0.2 nats), and bf16 moves its logprobs by at most
0.011 nats against fp32 (measured on CPU with transformers over 9,024 positions of the
campaign's prompts; docs/measured-facts.md). Two bf16 paths may then differ by ~0.022:
0.03 nats is a near-tie; a token from corrupt KV lands ~1 nat below top-1.
"""

from __future__ import annotations

import uuid

NEAR_TIE_NATS = 0.03
TOP_LOGPROBS = 5


def recompute_body(model: str, prompt_ids: list[int], served_ids: list[int],
                   salt: str | None = None) -> dict:
    """The completions request of a teacher-forced recompute of ``served_ids``."""
    return {"model": model, "prompt": list(prompt_ids) + list(served_ids), "max_tokens": 1,
            "temperature": 0.0, "prompt_logprobs": TOP_LOGPROBS,
            "cache_salt": salt or f"teacher-forced-{uuid.uuid4().hex}",
            "return_token_ids": True}


def served_positions(choice: dict, n_prompt: int, n_served: int) -> list[dict | None]:
    """The recompute's ``prompt_logprobs`` entries at the served positions.

    vLLM's entry ``j`` is the distribution of token ``j`` given tokens ``< j`` (entry 0 is
    None): ``{token_id (str in JSON): {"logprob", "rank", "decoded_token"}}`` holding the
    top ``prompt_logprobs`` tokens and the prompt's own token."""
    plp = choice.get("prompt_logprobs") or []
    return [plp[j] if j < len(plp) else None for j in range(n_prompt, n_prompt + n_served)]


def judge(served_ids: list[int], positions: list[dict | None],
          margin: float = NEAR_TIE_NATS) -> dict:
    """Per generated position: the served token against the recompute's top-1."""
    rows, worst = [], "top1"
    order = {"top1": 0, "near_tie": 1, "wrong": 2, "missing": 3}
    for i, (tok, dist) in enumerate(zip(served_ids, positions, strict=True)):
        if not dist:
            rows.append({"pos": i, "served": tok, "verdict": "missing"})
            worst = "missing"
            continue
        entries = {int(k): v for k, v in dist.items()}
        top1 = max(entries, key=lambda k: entries[k]["logprob"])
        served = entries.get(tok)
        if served is not None and served["logprob"] >= entries[top1]["logprob"]:
            top1 = tok  # an exact tie with the argmax is a top-1 (the sampler may pick either)
        if served is None:  # vLLM always returns the prompt's own token; absent: malformed
            rows.append({"pos": i, "served": tok, "top1": top1, "verdict": "missing"})
            worst = "missing"
            continue
        gap = entries[top1]["logprob"] - served["logprob"]
        verdict = "top1" if tok == top1 else ("near_tie" if gap <= margin else "wrong")
        runner_up = sorted((v["logprob"] for k, v in entries.items() if k != top1),
                           reverse=True)
        rows.append({"pos": i, "served": tok, "top1": top1, "rank": served.get("rank"),
                     "gap_nats": round(gap, 5),
                     "top1_top2_nats": (round(entries[top1]["logprob"] - runner_up[0], 5)
                                        if runner_up else None),
                     "verdict": verdict})
        if order[verdict] > order[worst]:
            worst = verdict
    return {"verdict": worst, "margin_nats": margin,
            "wrong": sum(r["verdict"] == "wrong" for r in rows),
            "near_tie": sum(r["verdict"] == "near_tie" for r in rows),
            "max_gap_nats": max((r["gap_nats"] for r in rows if "gap_nats" in r), default=None),
            "positions": rows}


def first_divergence(first: dict, again: dict, first_tf: dict | None,
                     again_tf: dict | None) -> dict | None:
    """Where two served continuations (``Server.complete`` results) first differ; there,
    how far each served token sat from its own recompute's top-1 (both recomputes share
    the context up to that position) and what each serve's own top logprobs were."""
    def at(seq, i):
        return seq[i] if seq and i < len(seq) else None

    for i, (a, b) in enumerate(zip(first.get("token_ids") or [], again.get("token_ids") or [])):
        if a != b:
            return {"pos": i, "first": a, "again": b,
                    "first_tf": at((first_tf or {}).get("positions"), i),
                    "again_tf": at((again_tf or {}).get("positions"), i),
                    "first_served_top": at(first.get("top_logprobs"), i),
                    "again_served_top": at(again.get("top_logprobs"), i)}
    return None
