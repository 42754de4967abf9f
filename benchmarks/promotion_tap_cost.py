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
per promoted key (the median of each repeat's difference in ``*_median_diff_ns``: on a shared
host a slow spell can take one arm's best). A third arm, ``bare``, is a promoting scan's bare rest
(connector/bare_rest.py): the rows' keys noted and vLLM's own ``prepare_write`` put back,
the batch's calls, then the promotions and evictions read from the rows (``sweep``):
``bare_minus_vllm_ns`` is kvscope's cost per promoted key there.

    python benchmarks/promotion_tap_cost.py [--keys 8192] [--repeats 31] [--out F]
"""

from __future__ import annotations

import argparse
import itertools
import json
import operator
import os
import statistics
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def per_call_ns(keys: int, repeats: int) -> dict:
    from vllm.v1.kv_offload.base import ReqContext

    from kvscope.connector import compat
    from kvscope.connector.bare_rest import BareRest
    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

    with CPUEngine(EngineConfig(rows=keys, tiering=True)) as e:
        taps = e.connector._kvscope_observer.taps
        primary, cursor = taps.primary, taps.cursor
        cs = e.connector.connector_scheduler
        reader = compat.tiered_scan_reader(cs, cs.manager._inner)
        errors: list = []
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
        times: dict[str, list[float]] = {"tap": [], "vllm": [], "bare": []}
        evicted = swept = 0
        arms = ("tap", "vllm", "bare")
        for r in range(repeats):
            for arm in arms[r % 3:] + arms[:r % 3]:
                call, batch = (tap if arm == "tap" else own), fresh()
                cursor.it = iter(batch)  # a tapped scan in progress (prefix_scan.py)
                t0 = time.thread_time()
                if arm == "bare":  # as the scan reaches BareRest, then returns
                    rest = BareRest(reader.rows, taps.bare, lambda site, exc:
                                    errors.append(exc))
                    next(rest, None)
                    call = primary.prepare_write  # vLLM's own now
                for k in batch:
                    call([k], ctx)
                if arm == "bare":
                    taps.bare(False)
                    rest.sweep(batch, keys, cursor, ctx, reader.promotes)
                dt = time.thread_time() - t0
                cursor.it = None
                if arm != "vllm":
                    assert len(cursor.promoted) == keys  # every call promoted its key
                    assert cursor.promoted == batch
                    evicted += len(cursor.evicted.keys)
                    swept += len(cursor.swept)
                assert primary.prepare_write is tap and not errors, errors
                cursor.promoted.clear()
                cursor.evicted.clear()
                cursor.swept.clear()
                done(batch, ctx)
                times[arm].append(dt)
        tap_ns, vllm_ns, bare_ns = (1e9 * min(times[a]) / keys for a in arms)
        diff = {a: 1e9 * statistics.median(map(operator.sub, times[a], times["vllm"])) / keys
                for a in ("tap", "bare")}
        return {"keys": keys, "repeats": repeats, "evictions_per_call":
                round(evicted / (keys * repeats), 3),
                "bare_evictions_per_call": round(swept / (keys * repeats), 3),
                "tap_ns": round(tap_ns, 1), "vllm_ns": round(vllm_ns, 1),
                "bare_ns": round(bare_ns, 1),
                "tap_minus_vllm_ns": round(tap_ns - vllm_ns, 1),
                "bare_minus_vllm_ns": round(bare_ns - vllm_ns, 1),
                "tap_median_diff_ns": round(diff["tap"], 1),
                "bare_median_diff_ns": round(diff["bare"], 1)}


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
