"""vLLM 0.26's abort of a request waiting for its restore, on vLLM's real scheduler on CPU:
the engine dies in the step after the abort, with or without kvscope; a release that bounds
a store by the request's blocks runs through and ends with nothing pending.

The drive (``kvscope.sim.abort_while_waiting``) is deterministic: a re-ask deferred while
its promotions from the fs tier are in flight, never scheduled, then aborted. Judged by
engine truth: where vLLM raised, what the request held when aborted, what vLLM holds after.
"""

from __future__ import annotations

import traceback

import pytest

from kvscope.connector import compat
from kvscope.diagnostics.known_bugs import ABORT_WHILE_WAITING as BUG
from kvscope.sim import abort_while_waiting as aww
from kvscope.sim.cpu_engine import CPUEngine, prompt

pytestmark = pytest.mark.vllm

HAS_BUG = BUG.affects(compat.VLLM_VERSION)
CONNECTORS = pytest.mark.parametrize("connector", ["OffloadingConnector",
                                                   "ObservedOffloadingConnector"],
                                     ids=["stock", "kvscope"])


def _raised_in_build_store_jobs(exc: BaseException) -> bool:
    last = traceback.extract_tb(exc.__traceback__)[-1]
    return (last.filename.endswith("kv_connector/v1/offloading/scheduler.py")
            and last.name == "_build_store_jobs")


@pytest.mark.skipif(not HAS_BUG, reason=f"vLLM {compat.VLLM_VERSION} has no such bug "
                    f"(fixed in {BUG.fixed_in})")
@CONNECTORS
def test_the_step_after_the_abort_ends_the_engine(connector):
    with CPUEngine(aww.engine_config(connector)) as e:
        with pytest.raises(AssertionError) as raised:
            aww.drive(e)
        assert _raised_in_build_store_jobs(raised.value)
        rid = f"req-{e._req_counter}"  # the re-ask, the last request added
        status = e.connector.connector_scheduler._req_status[rid]
        # it had waited, never scheduled: every chunk's key, no GPU block, nothing computed
        assert len(status.group_states[0].offload_keys) == aww.CHUNKS
        assert not status.group_states[0].block_ids
        assert status.req.num_computed_tokens == 0


@pytest.mark.skipif(HAS_BUG, reason=f"vLLM {compat.VLLM_VERSION} has the bug")
@CONNECTORS
def test_a_fixed_release_runs_through_with_nothing_pending(connector):
    with CPUEngine(aww.engine_config(connector)) as e:
        d = aww.drive(e)
        assert (d.computed_tokens, d.held_chunks) == (0, aww.CHUNKS)  # it waited, keys all
        assert d.waited_steps == aww.DELAY_STEPS - 1
        e.drain()
        assert not e.scheduler.has_requests()
        assert d.rid not in e.scheduler.requests
        # the engine serves on: the same prompt restores from the tiers
        again = e.generate(prompt(1, aww.CHUNKS * aww.BLOCK), 2, aww.MAX_STEPS)
        assert again.num_external_tokens > 0
