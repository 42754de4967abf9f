"""What one lookup round costs on vLLM's scheduler thread, warm: stock vs observed connector.

    python benchmarks/hook_call_cost.py [--calls 5000] [--repeats 21]

``get_num_new_matched_tokens`` (the call vLLM makes per waiting request and step; with
tiering twice per request) on the real connector of a CPU engine (``kvscope.sim``,
``CPUOffloadingSpec``, nothing stored: every round is a plain miss after one key), called
repeatedly for one waiting request, timed on the calling thread's CPU clock. kvscope's
aggregator thread is stopped first: the rounds are applied between repeats, outside the
timing, so neither its work nor its GIL hand-offs land in the figure. Batches of the two
connectors alternate (one process, both engines: a shared box drifts between runs); the
best of ``--repeats`` batches per connector, in µs per call; ``observed_minus_stock_us`` is kvscope's warm cost per round
(the hook, the per-key lookup tap, the round's hand-over). Between vLLM's calls in a real
step caches are colder, so a round costs several times this there
(``scheduler_overhead.py`` measures that); this isolates the code path.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt  # noqa: E402


def _asker(e):
    rid = e.add_request(prompt(0, 96), 8)
    request, ask = e.scheduler.requests[rid], e.connector.get_num_new_matched_tokens
    assert ask(request, 0)[0] == 0  # the premise: a miss, same answer every call
    observer = getattr(e.connector, "_kvscope_observer", None)
    if observer is not None:
        observer.agg.close()  # the journal applied by e.refresh() between batches instead
    return request, ask


def per_call_us(calls: int, repeats: int) -> tuple[float, float]:
    """(stock, observed) µs per call: batches of the two alternated, best batch of each."""
    with CPUEngine(_config("OffloadingConnector")) as stock, \
            CPUEngine(_config("ObservedOffloadingConnector")) as observed:
        pairs = [_asker(stock), _asker(observed)]
        best = [float("inf"), float("inf")]
        for r in range(repeats):
            for i in (0, 1) if r % 2 == 0 else (1, 0):
                request, ask = pairs[i]
                t0 = time.thread_time()
                for _ in range(calls):
                    ask(request, 0)
                best[i] = min(best[i], time.thread_time() - t0)
            observed.refresh()  # outside the timing
        return 1e6 * best[0] / calls, 1e6 * best[1] / calls


def _config(connector: str) -> EngineConfig:
    return EngineConfig(rows=512, tiering=False, connector=connector, step_time_s=0.0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--repeats", type=int, default=21)
    args = p.parse_args()
    stock, observed = per_call_us(args.calls, args.repeats)
    print(json.dumps({"call": "get_num_new_matched_tokens", "calls": args.calls,
                      "repeats": args.repeats, "load_average": os.getloadavg()[0],
                      "stock_us": round(stock, 3), "observed_us": round(observed, 3),
                      "observed_minus_stock_us": round(observed - stock, 3)}))


if __name__ == "__main__":
    main()
