"""The incident classes, reproduced on real vLLM scheduler objects on CPU.

Each scenario drives :class:`~kvscope.sim.cpu_engine.CPUEngine` (vLLM's
real scheduler, offloading connector and tiering manager; CPU copies where a
GPU would DMA) into one of the situations kvscope exists to tell apart, and
records the facts a test or the demo checks (same output? tokens restored?).

What each one reproduces, the verdict it must get and the engine facts that show it
happened are its entry in :mod:`kvscope.sim.catalog`. ``run_scenario``
(:mod:`kvscope.sim.scenario_run`, importable from here too) runs one and serves what it
produced.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from dataclasses import replace

from kvscope.connector.compat import hash_lookahead
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt
from kvscope.sim.scenario_run import (
    ScenarioRun,
    run_scenario,  # noqa: F401  (callers import it from here)
    wait_until,
)

PROMPT_TOKENS = 96  # 6 chunks of 16 tokens per KV group
FLOODS = 3


def _ask_then_flood(e: CPUEngine, target: list[int], tokens: int):
    """Ask ``target``, then flood the engine with FLOODS other prompts of ``tokens`` tokens,
    which evict it from the GPU prefix cache (and from a small CPU tier); the first ask."""
    first = e.generate(target, 4)
    e.drain()
    for seed in range(2, 2 + FLOODS):
        e.generate(prompt(seed, tokens), 2)
        e.drain()
    return first


def _ask_flood_ask(e: CPUEngine, run: ScenarioRun, target: list[int] | None = None) -> None:
    """Ask ``target`` (default: PROMPT_TOKENS tokens), flood with prompts as long, ask again."""
    target = target or prompt(1, PROMPT_TOKENS)
    first = _ask_then_flood(e, target, len(target))
    again = e.generate(target, 4, max_steps=200)
    e.drain()
    run.facts.update(first_output=first.output, again_output=again.output,
                     same_output=first.output == again.output,
                     restored_tokens=again.num_external_tokens)


def healthy(run: ScenarioRun, cfg: EngineConfig) -> None:
    e = CPUEngine(replace(cfg, rows=12))
    run.engines.append(e)
    _ask_flood_ask(e, run)
    run.facts["gpu_blocks_held"] = gpu_blocks_held(e)


def capacity_ceiling(run: ScenarioRun, cfg: EngineConfig) -> None:
    # 6 rows: enough for one step's store job while the previous one cascades to
    # disk (so the whole prompt reaches disk), too few for its 12 keys at once.
    e = CPUEngine(replace(cfg, rows=6))
    run.engines.append(e)
    _ask_flood_ask(e, run)


def livelock(run: ScenarioRun, cfg: EngineConfig) -> None:
    e = CPUEngine(replace(cfg, rows=8))
    run.engines.append(e)
    target = prompt(1, PROMPT_TOKENS)
    _ask_then_flood(e, target, PROMPT_TOKENS)
    rid = e.add_request(target, 4)
    for _ in range(40):
        e.step()
    e.refresh()
    run.facts.update(stuck_request_done=rid in e.finished, steps=40)
    run.background = e.step


def stale_rows(run: ScenarioRun, cfg: EngineConfig, policy: str = "refuse") -> None:
    # One KV group: block-level load errors, recovered by every supported vLLM
    # (several groups: stale_rows_hybrid, compat.load_failures).
    e = CPUEngine(replace(cfg, rows=12, kv_groups=1, num_gpu_blocks=16, own_region_ranks=(1,),
                          checksum_policy=policy))
    run.engines.append(e)
    _ask_flood_ask(e, run)


def stale_rows_observe(run: ScenarioRun, cfg: EngineConfig) -> None:
    stale_rows(run, cfg, policy="observe")


def stale_rows_hybrid(run: ScenarioRun, cfg: EngineConfig) -> None:
    e = CPUEngine(replace(cfg, rows=24, kv_groups=2, own_region_ranks=(1,),
                          checksum_policy="refuse"))
    run.engines.append(e)
    _ask_flood_ask(e, run)


def pending_at_idle(run: ScenarioRun, cfg: EngineConfig) -> None:
    e = CPUEngine(replace(cfg, rows=64, stuck=lambda rank, kind, job: rank == 1
                          and kind == "store"))
    run.engines.append(e)
    out = e.generate(prompt(1, PROMPT_TOKENS // 2), 2)
    for _ in range(5):
        e.step()
    e.refresh()
    run.facts.update(request_done=out.request_id in e.finished,
                     has_pending_work=e.scheduler.has_requests())
    run.background = e.step


def not_settled_at_idle(run: ScenarioRun, cfg: EngineConfig) -> None:
    """Every finished request leaves its GPU blocks referenced in vLLM's block pool (test
    fault ``leak_blocks``, kvscope/sim/faults.py): the engine idles holding them."""
    e = CPUEngine(replace(cfg, rows=64, fault="leak_blocks"))
    run.engines.append(e)
    done = [e.generate(prompt(seed, PROMPT_TOKENS // 2), 2) for seed in (1, 2)]
    e.drain()
    run.facts.update(requests_done=all(d.request_id in e.finished for d in done),
                     has_requests=e.scheduler.has_requests(),
                     gpu_blocks_held=gpu_blocks_held(e))


def gpu_blocks_held(e: CPUEngine) -> int:
    """Engine truth: blocks of vLLM's GPU block pool some reference holds now (its null
    block aside), counted on the blocks themselves, never from kvscope's gauges."""
    pool = e.scheduler.kv_cache_manager.block_pool
    return sum(1 for b in pool.blocks if b.ref_cnt > 0 and not b.is_null)


def queue_wait(run: ScenarioRun, cfg: EngineConfig) -> None:
    e = CPUEngine(replace(cfg, rows=64, max_num_seqs=1, max_num_batched_tokens=64))
    run.engines.append(e)
    long = e.add_request(prompt(1, 32), 100_000)
    queued = [e.add_request(prompt(seed, PROMPT_TOKENS), 4) for seed in range(2, 5)]
    for _ in range(30):
        e.step()
    e.refresh()
    run.facts.update(long_running=long not in e.finished,
                     queued_done=sum(r in e.finished for r in queued))
    run.background = e.step


def store_never_fits(run: ScenarioRun, cfg: EngineConfig) -> None:
    e = CPUEngine(replace(cfg, rows=4, max_num_batched_tokens=256))
    run.engines.append(e)
    _ask_flood_ask(e, run)


def stored_in_part(run: ScenarioRun, cfg: EngineConfig) -> None:
    # 12 rows; a step stores 4 chunks x 2 groups = 8 rows. The first job fits; the next
    # finds the first one's rows still pinned (written, then cascading) and is refused,
    # retried grown, never fits: 4 of the 12 chunks reach the tiers.
    chunks = 12
    e = CPUEngine(replace(cfg, rows=12, max_num_batched_tokens=64,
                          num_gpu_blocks=2 * chunks + 16))
    run.engines.append(e)
    target = prompt(1, chunks * 16)
    first = _ask_then_flood(e, target, chunks * 16)
    run.facts["prompt_tokens"] = len(target)
    _reask(e, run, [target], [first])


def stores_without_restores(run: ScenarioRun, cfg: EngineConfig) -> None:
    shared = tempfile.mkdtemp(prefix="kvscope-restart-")
    run.facts["shared_dir"] = shared
    base = replace(cfg, rows=64, fs_root=os.path.join(shared, "fs"),
                   model_dir=os.path.join(shared, "model"))
    target = prompt(1, PROMPT_TOKENS)
    before = CPUEngine(replace(base, hash_seed="1"))
    run.engines.append(before)
    before.generate(target, 2)
    before.drain()
    after = CPUEngine(replace(base, hash_seed="2"))
    run.engines.append(after)
    out = after.generate(target, 2)
    after.drain()
    run.facts.update(restored_tokens=out.num_external_tokens)


def tier_data_lost(run: ScenarioRun, cfg: EngineConfig) -> None:
    """The fs tier's directory removed mid-run: every later write succeeds, the prompt that
    was on disk is recomputed. kvscope's tier probe runs every 50 ms here (5 s by default)."""
    e = CPUEngine(replace(cfg, rows=12, kvscope_options={**cfg.kvscope_options,
                                                         "tier_probe_interval_s": 0.05}))
    run.engines.append(e)
    target = prompt(1, PROMPT_TOKENS)
    first = _ask_then_flood(e, target, PROMPT_TOKENS)
    files = [os.path.join(d, f) for d, _, fs in os.walk(e.fs_root) for f in fs
             if f.endswith(".bin")]
    probe = e.connector._kvscope_observer.probe
    # the probe has seen every completed write before the removal (as it would over time)
    if not wait_until(lambda: sum(map(len, probe.samples.values())) >= len(files)):
        raise TimeoutError("the tier probe did not take the written keys in")
    shutil.rmtree(e.fs_root)
    again = e.generate(target, 4, max_steps=200)
    e.drain()
    probes = probe.probes
    if not wait_until(lambda: probe.probes >= probes + 2):
        raise TimeoutError("the tier probe did not run")
    e.refresh()
    run.facts.update(first_output=first.output, again_output=again.output,
                     same_output=first.output == again.output,
                     restored_tokens=again.num_external_tokens, block_files_before=len(files))


def tiers_hold_tokens(e: CPUEngine, rid: str) -> int:
    """Engine truth: tokens of ``rid``'s prefix some tier holds now (files on the fs tier's
    disk, rows of the primary tier), the shortest over KV groups: what a full restore of it
    would load. Read from the tiers themselves, never from kvscope's counters."""
    from vllm.v1.kv_offload.base import make_offload_key

    manager = e.connector.connector_scheduler.manager
    primary = getattr(manager, "primary_tier", manager)
    tiers = list(getattr(manager, "secondary_tiers", ()) or ())
    hashes = e.scheduler.requests[rid].block_hashes
    held = []
    for g in range(e.cfg.kv_groups):
        n = 0
        for h in hashes:
            key = make_offload_key(h, g)
            if primary._policy.get(key) is None and not any(
                    os.path.exists(t.file_mapper.get_file_name(key)) for t in tiers):
                break
            n += 1
        held.append(n)
    return min(held) * e.cfg.block_size


def _reask(e: CPUEngine, run: ScenarioRun, targets: list[list[int]], first: list,
           max_steps: int = 200) -> None:
    """Ask ``targets`` again at once; record engine truth per request."""
    rids = [e.add_request(t, 4) for t in targets]
    held = [tiers_hold_tokens(e, r) for r in rids]  # before anything is restored
    for _ in range(max_steps):
        if all(r in e.finished for r in rids):
            break
        e.step()
    e.drain()
    done = [e.finished.get(r) for r in rids]
    run.facts.update(
        finished=all(d is not None for d in done),
        held_tokens=held,
        restored_tokens=[d.num_external_tokens if d else None for d in done],
        same_output=all(d is not None and d.output == f.output for d, f in zip(done, first)))


def truncated(run: ScenarioRun, cfg: EngineConfig) -> None:
    # Chunked prefill (one chunk a step) stores every chunk, so the whole prompt
    # reaches disk. Promotions land two steps after they start (a disk slower than a
    # forward), so a re-ask round finds every row pinned by promotions in flight and
    # its offer is cut at chunk 1, on every run: with promotions landing within the
    # step the re-ask livelocks (vLLM 0.26 and 0.33); racing the steps, it did either.
    e = CPUEngine(replace(cfg, rows=8, kv_groups=1, num_gpu_blocks=24,
                          promotion_delay_steps=2))
    run.engines.append(e)
    target = prompt(1, 12 * 16)
    first = _ask_then_flood(e, target, 12 * 16)
    _reask(e, run, [target], [first])


def concurrency(run: ScenarioRun, cfg: EngineConfig) -> None:
    e = CPUEngine(replace(cfg, rows=12, kv_groups=1, num_gpu_blocks=40))
    run.engines.append(e)
    targets = [prompt(100 + i, PROMPT_TOKENS + 32) for i in range(3)]
    first = []
    for t in targets:
        first.append(e.generate(t, 4))
        e.drain()
    for seed in range(2, 2 + 2 * FLOODS):
        e.generate(prompt(seed, PROMPT_TOKENS + 32), 2)
        e.drain()
    _reask(e, run, targets, first)




# Two large-block KV groups (a hybrid model's attention groups, their blocks grown to its
# state's page size) beside a sub-block group (a drafter's, or one left at the hash block
# size): per token the sub-block group has 8x the keys of each of the others. One chunk is
# one block of its group (blocks_per_chunk 1).
HYBRID_BLOCKS = (128, 128, 16)
# Under one chunk of the large-block groups: only the sub-block group's chunks are complete.
SHORT_PROMPT_TOKENS = 112
# Two chunks of the large-block groups: every group stores its chunks.
LONG_PROMPT_TOKENS = 256


def group_truth(e: CPUEngine) -> dict[str, list[int]]:
    """Engine truth, per KV group: the keys the primary tier's cache policy holds and the
    block files on the fs tier's disk (``..._g<group>/<hash>.bin``), read from the tiers
    themselves, never from kvscope's counters."""
    from vllm.v1.kv_offload.base import get_offload_group_idx

    manager = e.connector.connector_scheduler.manager
    policy = getattr(manager, "primary_tier", manager)._policy
    entries = getattr(policy, "chunks", None)  # vLLM 0.33
    if entries is None:
        entries = getattr(policy, "blocks", None)  # 0.26 (LRU)
    primary = Counter(get_offload_group_idx(k) for k in list(entries))
    files = Counter(int(d.rsplit("_g", 1)[1]) for d, _, fs in os.walk(e.fs_root)
                    for f in fs if f.endswith(".bin"))
    groups = range(e.cfg.kv_groups)
    return {"primary_keys": [primary[g] for g in groups],
            "disk_files": [files[g] for g in groups]}


def _hybrid(run: ScenarioRun, cfg: EngineConfig, tokens: int, rows: int) -> None:
    e = CPUEngine(replace(cfg, rows=rows, kv_groups=len(HYBRID_BLOCKS),
                          group_block_sizes=HYBRID_BLOCKS, num_gpu_blocks=64))
    run.engines.append(e)
    _ask_flood_ask(e, run, prompt(1, tokens))
    run.facts.update(group_truth(e), rows=rows)


def tier_flooded(run: ScenarioRun, cfg: EngineConfig) -> None:
    """Prompts shorter than the large-block groups' chunk: only the sub-block group's keys
    are ever stored. They fill the primary tier (24 rows, 28 keys stored) and every file on
    disk is that group's; a re-ask restores nothing (vLLM's cross-group AND needs every
    group, and the others stored nothing)."""
    _hybrid(run, cfg, SHORT_PROMPT_TOKENS, rows=24)


def healthy_hybrid(run: ScenarioRun, cfg: EngineConfig) -> None:
    """The same model with prompts of two large-block chunks: every group stores in
    proportion to its block size (the sub-block group still holds 80 % of the primary
    tier's keys), and the re-ask restores the prompt."""
    _hybrid(run, cfg, LONG_PROMPT_TOKENS, rows=40)


# A hybrid model speculating with an EAGLE drafter whose KV group has a sliding window: a
# full-attention group of 32-token blocks beside the drafter's group of 16-token blocks with
# a 16-token window (one chunk). vLLM stores, of each 32-token segment, only the window's
# trailing drafter chunk; the lookup of a drafter group whose trailing block is dropped
# needs the window plus one chunk in a row.
DRAFTER_BLOCKS = (32, 16)
DRAFTER_WINDOW = 16
DRAFTER_PROMPT_TOKENS = 256


def drafter_group(run: ScenarioRun, cfg: EngineConfig, drafter: bool = True) -> None:
    """Store, evict to disk, ask again, with an EAGLE drafter's sliding-window group: on vLLM
    0.26 the drafter group can never certify its window, and its miss vetoes the restore
    through the cross-group AND; later releases restore (0.34 keys blocks with lookahead
    tokens). ``drafter=False``: the same model without the drafter (the control)."""
    e = CPUEngine(replace(cfg, rows=64, kv_groups=2, group_block_sizes=DRAFTER_BLOCKS,
                          sliding_window=DRAFTER_WINDOW, drafter=drafter, num_gpu_blocks=64,
                          max_num_batched_tokens=512))
    run.engines.append(e)
    _ask_flood_ask(e, run, prompt(1, DRAFTER_PROMPT_TOKENS))
    run.facts.update(group_truth(e), lookahead_hashes=hash_lookahead.lookahead_tokens(e.vllm_config) > 0)
