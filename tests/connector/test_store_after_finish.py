"""vLLM 0.26's store after finish on vLLM's real scheduler on CPU: the stock connector dies,
kvscope skips that one store and the engine goes on with every other request whole.

The drive (``kvscope.sim.store_after_finish``) is deterministic: a request's store refused
while another's holds every row, the refused request finishing as the rows come free, its
last store prepared the step after. Judged by engine truth: what vLLM served and what its
tiers hold, against the same requests on an engine where nothing goes wrong.
"""

from __future__ import annotations

import logging
import traceback

import pytest

from kvscope.connector import compat
from kvscope.connector.compat import store_after_finish as bug
from kvscope.exporters import signals as S
from kvscope.sim import store_after_finish as saf
from kvscope.sim.cpu_engine import CPUEngine

pytestmark = pytest.mark.vllm

needs_bug = pytest.mark.skipif(not bug.has_bug(), reason=f"vLLM {compat.VLLM_VERSION} has "
                               f"no store-after-finish bug (fixed in {bug.FIXED_IN})")
fixed = pytest.mark.skipif(bug.has_bug(), reason=f"vLLM {compat.VLLM_VERSION} has the bug")
LABELS = (S.VllmFault.STORE_AFTER_FINISH.value,)


def _raised_by_vllm_prepare_store(exc: BaseException) -> bool:
    last = traceback.extract_tb(exc.__traceback__)[-1]
    return last.filename.endswith("kv_offload/tiering/manager.py") and last.name == "prepare_store"


def _contained(e: CPUEngine) -> float:
    return e.connector.kvscope_recorder.value(S.VLLM_FAULTS_CONTAINED, LABELS)


@needs_bug
@pytest.mark.parametrize("connector,contain", [("OffloadingConnector", None),
                                               ("ObservedOffloadingConnector", False)],
                         ids=["stock", "kvscope-containment-off"])
def test_vllm_raises_out_of_its_scheduler_step(connector, contain):
    with CPUEngine(saf.engine_config(connector, contain)) as e:
        with pytest.raises(KeyError) as raised:
            saf.drive(e)
        assert raised.value.args == ("req-2",)  # the request vLLM had already forgotten
        assert _raised_by_vllm_prepare_store(raised.value)
        if contain is False:
            assert not e.connector._kvscope_observer.contained
            assert _contained(e) == 0


@needs_bug
def test_kvscope_skips_that_store_and_every_other_request_is_whole(caplog):
    reference = saf.clean_run()
    with caplog.at_level(logging.WARNING, logger="kvscope"), \
            CPUEngine(saf.engine_config()) as e:
        d = saf.drive(e)  # no KeyError: the step that died above went through
        manager = e.connector.connector_scheduler.manager
        short_keys = list(e.scheduler.connector.connector_scheduler._req_status.get(
            d.short).group_states[0].offload_keys) if d.short in \
            e.connector.connector_scheduler._req_status else None
        # no row taken for the skipped store: the primary tier holds A's keys, all of them
        assert all(compat.primary_holds(manager, k) for k in d.holder_keys)
        assert compat.row_states(compat.primary_tier(manager))[1] == saf.ROWS
        assert short_keys is None  # vLLM let the finished request go, as after a store
        served = {"holder": e.finished[d.holder], "short": e.finished[d.short],
                  **saf.serve_after(e)}
        # the flood's last store also comes after its state is gone, but 28 chunks never fit
        # 4 rows: vLLM refuses it without raising, and kvscope leaves that call to vLLM
        assert _contained(e) == 1
    for name, ref in reference.items():
        assert served[name].output == ref.output, name
    # A's stores and restores whole: restored from the tiers as on the clean engine
    assert served["holder_again"].num_external_tokens == \
        reference["holder_again"].num_external_tokens > 0
    # what the skip costs, and nothing more: R's chunks were never offloaded (every store
    # of it refused, the last one skipped), so its re-ask recomputes them
    assert served["short_again"].num_external_tokens == 0
    logged = [r for r in caplog.records if "store-after-finish" in r.getMessage()]
    assert len(logged) == 1 and f"fixed in vLLM {bug.FIXED_IN}" in logged[0].getMessage()


@needs_bug
def test_the_last_token_filling_a_chunk_kills_the_stock_engine_and_not_kvscopes():
    """offload_prompt_only false: one request is enough, no store refused before."""
    with CPUEngine(saf.last_token_config("OffloadingConnector")) as e, \
            pytest.raises(KeyError) as raised:
        saf.drive_last_token(e)
    assert _raised_by_vllm_prepare_store(raised.value)
    with CPUEngine(saf.last_token_config()) as e:
        rid = saf.drive_last_token(e)
        first = e.finished[rid]
        assert _contained(e) == 1
        e.generate(saf.prompt(3, saf.FLOOD_TOKENS), 2, max_steps=saf.MAX_STEPS)
        e.drain()
        again = e.generate(saf.prompt(1, saf.LAST_PROMPT_TOKENS), saf.LAST_MAX_TOKENS,
                           max_steps=saf.MAX_STEPS)
        assert again.output == first.output
        # the prompt's chunks were stored before the skipped one: the whole prompt served
        # from the caches again, what the flood pushed out of the GPU from the tiers
        assert again.num_cached_tokens == saf.LAST_PROMPT_TOKENS
        assert again.num_external_tokens > 0
        assert _contained(e) == 1


@fixed
def test_a_fixed_release_runs_the_drive_through_with_the_stock_connector():
    with CPUEngine(saf.engine_config("OffloadingConnector")) as e:
        d = saf.drive(e)
        assert d.short in e.finished
    with CPUEngine(saf.last_token_config("OffloadingConnector")) as e:
        assert saf.drive_last_token(e) in e.finished


@fixed
def test_nothing_is_wrapped_on_a_release_without_the_bug():
    """Built only (the newest release's steps may need the harness of that release)."""
    with CPUEngine(saf.engine_config()) as e:
        proxy = e.connector.connector_scheduler.manager
        assert e.connector._kvscope_observer.contained is False
        assert proxy.prepare_store.__qualname__ == "_store_tap.<locals>.prepare_store"
        assert _contained(e) == 0  # declared, never counted


def test_nothing_is_wrapped_without_the_tiering_manager():
    """vLLM's CPU manager alone keeps no per-request state: nothing to contain, any release."""
    with CPUEngine(saf.engine_config(tiering=False, stuck=None)) as e:
        proxy = e.connector.connector_scheduler.manager
        assert e.connector._kvscope_observer.contained is False
        assert proxy.prepare_store.__qualname__ == "_store_tap.<locals>.prepare_store"


def test_the_gate_is_the_release():
    assert bug.has_bug("0.26.0") and bug.has_bug("0.26.1")
    assert not bug.has_bug("0.27.0") and not bug.has_bug("0.33.0")
    assert not bug.has_bug("0.34.0") and not bug.has_bug("1.0.0")
