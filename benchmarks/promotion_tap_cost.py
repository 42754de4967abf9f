"""What kvscope's tap on the primary tier's ``prepare_write`` costs per promoted key, on
vLLM's real CPU tier (kvscope.sim, tiering).

A long restore's promoting scan calls ``prepare_write([key], req_context)`` once per key it
promotes, each call evicting a row of the full primary tier (8,187 at 131k tokens, 25,000
at 400k: on the H200 that scan is where kvscope's cost in a restore is resolved,
benchmarks/README.md runs J-N). Here the primary tier is filled with ready rows, then
batches of ``--keys`` such calls go through kvscope's tap (with a tapped scan open, as in
the promoting scan: the tap notes each answer on the scan's cursor) and through vLLM's own
method, alternated, each on fresh keys; after a batch its rows are completed with vLLM's
own method, untimed, so the next batch evicts again. Timed on the thread's CPU clock; the
best of ``--repeats`` batches per arm, ns per call; ``tap_minus_vllm_ns`` is kvscope's cost
per promoted key.

    python benchmarks/promotion_tap_cost.py [--keys 8192] [--repeats 31] [--out F]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def per_call_ns(keys: int, repeats: int) -> dict:
    from vllm.v1.kv_offload.base import ReqContext

    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

    with CPUEngine(EngineConfig(rows=keys, tiering=True)) as e:
        taps = e.connector._kvscope_observer.taps
        primary, cursor = taps.primary, taps.cursor
        tap = primary.prepare_write
        own = tap.__wrapped__  # vLLM's bound method, under kvscope's instance attribute
        done = getattr(primary.complete_write, "__wrapped__", primary.complete_write)
        ctx = ReqContext(req_id="promotion-tap-cost")
        serial = itertools.count(1)

        def fresh() -> list[bytes]:
            return [next(serial).to_bytes(16, "little") for _ in range(keys)]

        batch = fresh()
        for k in batch:  # the tier full of ready rows
            assert own([k], ctx) is not None
        done(batch, ctx)
        best = {"tap": float("inf"), "vllm": float("inf")}
        evicted = 0
        for r in range(repeats):
            for arm in ("tap", "vllm") if r % 2 == 0 else ("vllm", "tap"):
                call, batch = (tap if arm == "tap" else own), fresh()
                cursor.it = iter(batch)  # a tapped scan in progress (prefix_scan.py)
                t0 = time.thread_time()
                for k in batch:
                    call([k], ctx)
                dt = time.thread_time() - t0
                cursor.it = None
                if arm == "tap":
                    assert len(cursor.promoted) == keys  # every call promoted its key
                    evicted += len(cursor.evicted.keys)
                cursor.promoted.clear()
                cursor.evicted.clear()
                done(batch, ctx)
                best[arm] = min(best[arm], dt)
        tap_ns, vllm_ns = (1e9 * best[a] / keys for a in ("tap", "vllm"))
        return {"keys": keys, "repeats": repeats, "evictions_per_call":
                round(evicted / (keys * repeats), 3),
                "tap_ns": round(tap_ns, 1), "vllm_ns": round(vllm_ns, 1),
                "tap_minus_vllm_ns": round(tap_ns - vllm_ns, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=31)
    p.add_argument("--out")
    a = p.parse_args()
    res = {**per_call_ns(a.keys, a.repeats), "load_average": os.getloadavg()[0]}
    print(json.dumps(res))
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
