"""Stock-vLLM runs for the reduced-evidence verdicts the scenario catalogue does not reach.

Each run drives :class:`~kvscope.sim.cpu_engine.CPUEngine` with vLLM's stock
``OffloadingConnector`` (no kvscope anywhere) and records engine facts (outputs, tokens
restored, what was done to the disk tier) read from the engine and the disk, never from
metrics. ``capture.py`` serves vLLM's /metrics after a run and writes one scrape.

* ``tier-failures``: the disk tier's files are truncated (corruption: every promotion of them
  fails on a short read), then its directory is replaced by a plain file (a vanished mount:
  every cascade fails). The engine recomputes; outputs stay the same.
* ``tier-stall``: the disk tier (on ramfs: no O_DIRECT, so vLLM reads it buffered) stops
  answering reads: its block files become FIFOs nobody writes, so a promotion's read blocks.
  The client gives up on the request that waits for it (abort); the engine idles with the
  promotion in flight. Capturing it mounts a ramfs, so it needs root.
* ``queue-wait``: more requests than the GPU KV cache holds at once, none of whose prefixes
  any tier holds: after a few steps the engine is stopped mid-run (a stalled scheduler, as a
  scrape sees it between two steps) with requests waiting for capacity and none for a KV load.
* ``restart-without-seed``: an engine stores four prompts on the disk tier and restarts with
  another PYTHONHASHSEED; the new engine re-asks the four prompts and restores nothing,
  although the disk holds them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from vllm.v1.request import RequestStatus

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt

PROMPT_TOKENS = 96  # 6 chunks of 16 tokens per KV group
FLOODS = 3
BASE = EngineConfig(rows=12, kv_groups=2, world_size=2, num_gpu_blocks=40,
                    max_num_batched_tokens=16, connector="OffloadingConnector",
                    vllm_metrics=True)


def block_files(root: str) -> list[str]:
    """The disk tier's block files (its run config.json aside)."""
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f != "config.json"]


def _flood(e: CPUEngine, seeds: range) -> None:
    for seed in seeds:  # evict earlier prompts from the GPU and the CPU tier
        e.generate(prompt(seed, PROMPT_TOKENS), 2)
        e.drain()


Cleanups = list[Callable[[], None]]


def tier_failures(engines: list[CPUEngine], facts: dict[str, Any], cleanups: Cleanups) -> None:
    e = CPUEngine(BASE)
    engines.append(e)
    target = prompt(1, PROMPT_TOKENS)
    first = e.generate(target, 4)
    e.drain()
    _flood(e, range(2, 2 + FLOODS))
    on_disk = block_files(e.fs_root)
    for path in on_disk:  # corrupt every block file: a short read on promotion
        os.truncate(path, 0)
    again = e.generate(target, 4, max_steps=200)
    e.drain()
    # the disk tier's directory vanishes (a lost mount): every cascade write now fails
    shutil.rmtree(e.fs_root)
    with open(e.fs_root, "w") as f:
        f.write("not a directory\n")
    _flood(e, range(10, 10 + FLOODS))
    facts.update(files_truncated=len(on_disk), fs_root_replaced_by_file=True,
                 first_output=first.output, again_output=again.output,
                 same_output=first.output == again.output,
                 restored_tokens=again.num_external_tokens)


def tier_stall(engines: list[CPUEngine], facts: dict[str, Any], cleanups: Cleanups) -> None:
    mnt = tempfile.mkdtemp(prefix="kvscope-native-ramfs-")
    subprocess.run(["mount", "-t", "ramfs", "ramfs", mnt], check=True)
    cleanups.append(lambda: (subprocess.run(["umount", "-l", mnt], check=False),
                             shutil.rmtree(mnt, ignore_errors=True)))
    # settle_tiers off: the engine must not wait for the tier's I/O (it never ends)
    e = CPUEngine(replace(BASE, fs_root=os.path.join(mnt, "fs"), settle_tiers=False))
    engines.append(e)
    target = prompt(1, PROMPT_TOKENS)
    e.generate(target, 4)
    e.drain()
    _flood(e, range(2, 2 + FLOODS))
    e.connector.connector_scheduler.manager.secondary_tiers[0]._pool.wait_idle()
    on_disk = block_files(e.fs_root)
    for path in on_disk:  # the storage stops answering: reads block forever
        os.remove(path)
        os.mkfifo(path)

    def unblock() -> None:  # a writer that closes at once: the blocked reads fail and end
        for path in on_disk:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass  # nobody reading this one
    cleanups.insert(0, unblock)
    rid = e.add_request(target, 4)
    for _ in range(20):
        e.step()
    waiting = rid not in e.finished
    e.scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)  # the client gave up
    for _ in range(5):
        e.step()
    facts.update(block_files_made_fifos=len(on_disk), request_waited_20_steps=waiting,
                 request_aborted=True, scheduler_has_requests=e.scheduler.has_requests())


def restart_without_seed(engines: list[CPUEngine], facts: dict[str, Any],
                         cleanups: Cleanups) -> None:
    shared = tempfile.mkdtemp(prefix="kvscope-native-restart-")
    facts["shared_dir"] = shared
    cfg = replace(BASE, fs_root=os.path.join(shared, "fs"),
                  model_dir=os.path.join(shared, "model"))
    targets = [prompt(seed, PROMPT_TOKENS) for seed in range(1, 5)]
    before = CPUEngine(replace(cfg, hash_seed="1"))
    engines.append(before)
    first = [before.generate(t, 2) for t in targets]
    before.drain()
    held_files = len(block_files(before.fs_root))
    before.close()
    after = CPUEngine(replace(cfg, hash_seed="2"))  # the restart, PYTHONHASHSEED not pinned
    engines.append(after)
    again = []
    for t in targets:
        again.append(after.generate(t, 2))
        after.drain()
    facts.update(disk_files_before_restart=held_files, prompts_reasked=len(targets),
                 restored_tokens=[a.num_external_tokens for a in again],
                 same_output=all(a.output == f.output for a, f in zip(again, first)))


def queue_wait(engines: list[CPUEngine], facts: dict[str, Any], cleanups: Cleanups) -> None:
    e = CPUEngine(BASE)  # 40 GPU blocks: 3 prompts of 6 chunks x 2 groups at once
    engines.append(e)
    rids = [e.add_request(prompt(seed, PROMPT_TOKENS), 64) for seed in range(1, 9)]
    for _ in range(4):  # vLLM's stats describe the queues as the last step left them
        e.step()
    requests = [e.scheduler.requests[r] for r in rids if r in e.scheduler.requests]
    facts.update(
        requests_added=len(rids),
        waiting=sum(r.status == RequestStatus.WAITING for r in requests),
        waiting_for_kv=sum(r.status == RequestStatus.WAITING_FOR_REMOTE_KVS for r in requests),
        running=sum(r.status == RequestStatus.RUNNING for r in requests))


RUNS: dict[str, Callable[[list[CPUEngine], dict[str, Any], Cleanups], None]] = {
    "tier-failures": tier_failures,
    "tier-stall": tier_stall,
    "restart-without-seed": restart_without_seed,
    "queue-wait": queue_wait,
}
