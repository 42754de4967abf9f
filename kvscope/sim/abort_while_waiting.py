"""vLLM 0.26's abort of a request waiting for its restore, reproduced on vLLM's scheduler on
CPU, every run.

A prompt is stored through the primary tier to the fs tier, then flooded out of the GPU
blocks and the primary rows. Asked again, its lookup finds the prefix on disk and starts
promotions that stay in flight for a few steps (a slow disk), so vLLM defers the request:
it waits, never scheduled, with its offload keys and no GPU block. A client giving up
then (an abort) finishes it, and vLLM 0.26's next step builds a store job for it from its
token count: as many keys as chunks, no block id, and ``assert len(offload_keys) ==
len(offload_block_ids)`` in ``_build_store_jobs`` stops the engine (vLLM #49118). vLLM 0.27+
bounds the chunks to store by the allocated blocks (0.33 and 0.34 also store an aborted
request's computed tokens only): the same drive runs through. kvscope does not contain it: the
traceback is the evidence (``diagnostics/known_bugs.py``, ``abort_while_waiting``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt

BLOCK = 16
CHUNKS = 8  # the re-asked prompt's chunks
ROWS = 16  # primary rows: two prompts' worth
GPU_BLOCKS = 32  # four prompts' worth
FLOODS = 6  # prompts that push it out of both
DELAY_STEPS = 4  # steps a promotion stays in flight
MAX_STEPS = 200


def engine_config(connector: str = "ObservedOffloadingConnector", **overrides: Any
                  ) -> EngineConfig:
    cfg: dict[str, Any] = dict(rows=ROWS, block_size=BLOCK, world_size=1,
                               num_gpu_blocks=GPU_BLOCKS, kv_groups=1, tiering=True,
                               promotion_delay_steps=DELAY_STEPS, connector=connector)
    cfg.update(overrides)
    return EngineConfig(**cfg)


@dataclass
class Drive:
    rid: str  # the re-ask, aborted while it waited
    held_chunks: int  # its offload keys when aborted
    computed_tokens: int  # tokens vLLM had computed for it then (0: never scheduled)
    waited_steps: int  # steps it waited, deferred, before the abort


def drive(e: CPUEngine) -> Drive:
    """The sequence above on a built engine; on vLLM 0.26 the step after the abort raises
    vLLM's AssertionError. The engine is left as the sequence ends."""
    from vllm.v1.request import RequestStatus

    asked = prompt(1, CHUNKS * BLOCK)
    e.generate(asked, 2, MAX_STEPS)
    e.drain()
    for i in range(FLOODS):
        e.generate(prompt(100 + i, CHUNKS * BLOCK), 1, MAX_STEPS)
        e.drain()
    rid = e.add_request(asked, 2)
    req = e.scheduler.requests[rid]
    waited = 0
    while waited < DELAY_STEPS - 1:  # deferred while its promotions are in flight
        e.step()
        waited += 1
        if req.num_computed_tokens or req.status == RequestStatus.RUNNING:
            raise AssertionError(f"{rid} was scheduled after {waited} steps: it never waited")
    status = e.connector.connector_scheduler._req_status.get(rid)
    held = len(status.group_states[0].offload_keys) if status is not None else 0
    d = Drive(rid, held, req.num_computed_tokens, waited)
    e.scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
    e.step()  # vLLM 0.26: AssertionError in _build_store_jobs
    return d
