"""An fp32 reference, on CPU, for the GPU campaign's served tokens (no vLLM, no GPU).

The campaign's tiny Llama is built from a fixed seed (``gpu_e2e.make_model``), so
transformers can rebuild it here and compute, in fp32, what the bf16 engine served:

* ``divergence``: for the recorded stall_reads phase (prompt ids kept in its JSON), the fp32
  logprobs at each generated position of the first ask and of the re-ask: where they differ,
  how far apart the two words are in fp32 (a near-tie, or not);
* ``bf16_noise``: over fresh campaign-sized prompts, how far bf16 moves the model's logprobs
  from fp32 (the basis of ``teacher_forced.NEAR_TIE_NATS``), how often it flips the argmax,
  and how far below the fp32 top-1 a flipped argmax sits.

    python benchmarks/fp32_reference.py --out benchmarks/results/fp32_reference_h200_tp1.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_e2e import make_model, text  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "results", "campaign-h200", "faults-h200-tp1.json")
PROMPT_WORDS = 1504  # gpu_campaign.PROMPT_WORDS


def logprobs(model, ids: list[int]):
    import torch

    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)


def continuation(model, prompt_ids: list[int], served: list[int]) -> list[dict]:
    lp = logprobs(model, prompt_ids + served)
    rows = []
    for i, tok in enumerate(served):
        row = lp[len(prompt_ids) - 1 + i]
        top = row.topk(2)
        rows.append({"pos": i, "served": tok, "fp32_top1": int(top.indices[0]),
                     "gap_nats": round(float(top.values[0] - row[tok]), 5),
                     "top1_top2_nats": round(float(top.values[0] - top.values[1]), 5)})
    return rows


def main() -> int:
    import torch
    from transformers import LlamaForCausalLM

    p = argparse.ArgumentParser()
    p.add_argument("--run", default=RUN)
    p.add_argument("--phase", default="stall_reads")
    p.add_argument("--noise-seeds", type=int, nargs="+", default=[1001, 1006, 1011, 1016, 1021, 1036])
    p.add_argument("--out")
    args = p.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    d = tempfile.mkdtemp(prefix="kvscope-fp32-")
    make_model(d)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    m32 = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    m16 = LlamaForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
    out: dict = {"model": "gpu_e2e.make_model (seed 0), transformers on CPU",
                 "torch": torch.__version__}

    phase = next(ph for ph in json.load(open(args.run))["phases"] if ph["name"] == args.phase)
    prompt_ids = phase["first"]["prompt_token_ids"]
    div = {side: continuation(m32, prompt_ids, phase[side]["token_ids"])
           for side in ("first", "again")}
    div["served_equals_fp32_argmax"] = {
        side: sum(r["gap_nats"] == 0 for r in div[side]) for side in ("first", "again")}
    out["divergence"] = {"run": os.path.basename(args.run), "phase": args.phase, **div}

    flips, worst, gaps = 0, 0.0, []
    n = 0
    for seed in args.noise_seeds:
        ids = tok(text(seed, PROMPT_WORDS))["input_ids"]
        a, b = logprobs(m32, ids), logprobs(m16, ids)
        worst = max(worst, float((a - b).abs().max()))
        arg16 = b.argmax(-1)
        g = a.max(-1).values - a.gather(1, arg16[:, None])[:, 0]
        flips += int((g > 0).sum())
        gaps.append(g)
        n += len(ids)
    g = torch.cat(gaps)
    out["bf16_noise"] = {
        "positions": n, "max_abs_logprob_diff_nats": round(worst, 5),
        "argmax_flips": flips,
        "fp32_gap_of_bf16_argmax_nats": {q: round(float(torch.quantile(g, float(q))), 5)
                                         for q in ("0.99", "0.999", "1.0")}}
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
