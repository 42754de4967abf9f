"""What kvscope's aggregator spends on one long restore's journal, on vLLM's scheduler on CPU.

While a long restore waits for its promotion, vLLM looks the request up again every step:
a 131k-token restore is ~80 deferred rounds on the H200, a 400k one ~120, and each round is
one journal event that kvscope's aggregator judges (round_verdicts.judge_plain). With the
hold-back during a restore's reads (aggregator.py) those judgements are applied together
once the reads end: in the restore's tail, where the GIL they take is taken from vLLM's
engine thread. This measures that work for a real restore's journal: prompts 0-2 asked
(tiering, one prompt's rows, the fs tier's threads racing the steps: restore_convoy.py's
engine), then each re-asked in turn (each evicted by the other two: reask_schedule.py)
with the aggregator held back for the whole re-ask, so its journal is exactly the
restore's; then

* ``drain_ms``: the aggregator's refresh of that journal (apply every event, flush the
  sums into the recorder, the gauges), timed on this thread's CPU clock, as the aggregator
  thread would run it;
* ``deferred_us``: the judging of the restore's deferred rounds alone, per round (each
  deferred round's event applied again, ``--replays`` times, under the aggregator's lock;
  the per-round sums the flush hands over are dropped after).

Engine truth per re-ask: tokens vLLM loaded (the whole prompt), so every timed journal is
a whole restore's.

    python benchmarks/deferred_round_cost.py --tokens 131072 --reasks 6 --out benchmarks/results/deferred_round_cost.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from deferred_step_cost import emit, header  # noqa: E402
from kvscope_switch import KvscopeSwitch  # noqa: E402
from restore_convoy import OUT, engine_config, settle  # noqa: E402
from scale_workload import telemetry_errors  # noqa: E402


def deferred_events(items: list, judge: object) -> list[tuple]:
    """The journal's deferred-round events: ``judge``'s whose round answered None."""
    out, i = [], 0
    while i < len(items):
        k = items[i + 1]
        args = items[i + 2:i + 2 + k]
        if items[i] == judge and args[4] is None:  # judge_plain(rid, tokens, off, len, n...)
            out.append(tuple(args))
        i += 2 + k
    return out


def reask(e, switch: KvscopeSwitch, tokens: int, p: int) -> dict:
    """Prompt ``p`` asked again with the aggregator held back throughout; its journal timed."""
    from kvscope.connector.aggregator import journal_events
    from kvscope.sim.cpu_model import prompt

    obs = switch.observer
    agg = obs.agg
    settle(e, switch.manager)
    obs.refresh()  # the journal before the re-ask, applied: what is left is the restore's
    busy, max_s = agg.hold_back.busy, agg.hold_back.max_s
    agg.hold_back.busy, agg.hold_back.max_s = (lambda: True), 1e9
    try:
        rid = e.add_request(prompt(p, tokens), OUT)
        steps = 0
        while rid not in e.finished:
            e.step()
            steps += 1
        with agg.lock:
            items = agg.journal[:]
            rounds = deferred_events(items, obs._judge_plain)
            t0 = time.thread_time()
            obs.refresh()
            drain = time.thread_time() - t0
    finally:
        agg.hold_back.busy, agg.hold_back.max_s = busy, max_s
    return {"p": p, "steps": steps, "events": journal_events(items), "items": len(items),
            "deferred_rounds": len(rounds), "drain_ms": round(drain * 1e3, 3),
            "loaded": e.finished[rid].num_external_tokens, "rounds": rounds}


def replay(obs, rounds: list[tuple], replays: int) -> float:
    """Seconds of this thread's CPU per deferred round, its judgement applied again."""
    judge = obs._judge_plain
    with obs.agg.lock:
        t0 = time.thread_time()
        for _ in range(replays):
            for args in rounds:
                judge(*args)
        spent = time.thread_time() - t0
        obs.verdicts.flush()
        obs.lookups.counts.clear()
    return spent / (replays * len(rounds))


def run(tokens: int, reasks: int, replays: int) -> dict:
    from kvscope.sim.cpu_engine import CPUEngine
    from kvscope.sim.cpu_model import prompt

    with CPUEngine(engine_config(tokens)) as e:
        switch = KvscopeSwitch(e.scheduler, [r.connector for r in e.ranks])
        switch.set(True)
        for p in range(3):
            settle(e, switch.manager)
            e.generate(prompt(p, tokens), OUT, max_steps=10**6)
        out = []
        for k in range(reasks + 1):  # the first re-ask warms up
            r = reask(e, switch, tokens, k % 3)
            rounds = r.pop("rounds")
            r["deferred_us"] = round(replay(switch.observer, rounds, replays) * 1e6, 2) \
                if rounds else None
            if k:
                out.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
        errors = telemetry_errors(e)
    drains = [r["drain_ms"] for r in out]
    per = [r["deferred_us"] for r in out if r["deferred_us"] is not None]
    return {"tokens": tokens, "keys": tokens // 16, "reasks": out,
            "drain_ms_median": statistics.median(drains),
            "deferred_rounds_median": statistics.median(r["deferred_rounds"] for r in out),
            "deferred_us_median": statistics.median(per) if per else None,
            "loaded_all": all(r["loaded"] == tokens for r in out), "telemetry_errors": errors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--reasks", type=int, default=6)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args()
    emit(header(), run(a.tokens, a.reasks, a.replays), a.out)  # stamped before the run
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
