"""The worker-side connector on CPU ranks.

Ranks are worker-role ObservedOffloadingConnectors whose OffloadingWorker copies
bytes on CPU (``kvscope.sim.cpu_worker.CPUCopyWorker``) between the rank's KV tensor and its
slot of vLLM's SharedOffloadRegion. A rank given its own region file stands in
for a rank on another node: the seeds' multi-node TP corruption, by construction.
"""

from __future__ import annotations

import pytest

from kvscope.connector import ObservedOffloadingConnector, Settings
from kvscope.exporters import signals as S
from kvscope.exporters.recorder import Recorder
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt
from kvscope.sim.scenarios import run_scenario, wait_until
from tests.connector.support import Exposition
from tests.support.prometheus import free_port

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("scope", ["unshared", "all"])
def test_stale_rows_refused_on_the_remote_rank_only(scope):
    """Rank 1 maps a region file of its own (another node's /dev/shm); rank 0 maps the
    scheduler's. By default (scope unshared) only rank 1's slots are digested: rank 0
    reads the promotion's bytes themselves. Scope all digests rank 0 too."""
    with run_scenario("stale-rows", kvscope_options={"checksum_scope": scope}) as sc:
        ex = Exposition.scrape(sc.metrics_url)
        facts = sc.facts
    assert ex.value(S.PROMOTIONS.name, result="completed") > 0
    if scope == "unshared":
        assert ex.value(S.CHECKSUM_RANKS.name, check="shared_region") == 1
        assert ex.value(S.CHECKSUM_RANKS.name, check="digested") == 1
        assert ex.value(S.ROW_CHECKSUMS.name, rank="0", outcome="match") == 0
    else:
        assert ex.value(S.CHECKSUM_RANKS.name, check="shared_region") == 0
        assert ex.value(S.CHECKSUM_RANKS.name, check="digested") == 2
        assert ex.value(S.ROW_CHECKSUMS.name, rank="0", outcome="match") > 0
    assert ex.value(S.ROW_CHECKSUMS.name, rank="0", outcome="mismatch") == 0
    assert ex.value(S.ROW_CHECKSUMS.name, rank="1", outcome="mismatch") > 0
    assert ex.value(S.ROW_CHECKSUMS.name, rank="1", outcome="match") == 0
    assert ex.value(S.LOADS_REFUSED.name, rank="1", reason="checksum_mismatch") >= 1
    assert ex.value(S.LOADS_REFUSED.name, rank="0") == 0
    # refused -> vLLM recomputed -> the answer is the first answer, not garbage
    assert facts["same_output"], facts
    assert facts["restored_tokens"] == 0
    # and the refused keys are withheld so the recompute does not loop on them
    assert ex.value(S.QUARANTINED_KEYS.name) > 0


def test_stale_rows_observe_serves_the_corruption():
    with run_scenario("stale-rows-observe") as sc:
        ex = Exposition.scrape(sc.metrics_url)
        facts = sc.facts
    assert ex.value(S.ROW_CHECKSUMS.name, rank="1", outcome="mismatch") > 0
    assert ex.value(S.LOADS_REFUSED.name) == 0
    assert facts["restored_tokens"] == 96
    assert not facts["same_output"], "the stale bytes must really change the output"
    (info,) = ex.series(S.INFO.name)
    assert info[0]["checksum_policy"] == "observe"


def _vllm_at_least(version: str) -> bool:
    """From the installed distribution's metadata, not from kvscope's compat layer."""
    import importlib.metadata

    def release(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("+")[0].split(".")[:3])

    return release(importlib.metadata.version("vllm")) >= release(version)


def test_stale_rows_refused_on_a_two_group_model():
    """Two KV groups: vLLM 0.33 raises on block-level load errors, so the refusal goes per
    request (failed_recving) and the request is recomputed; 0.26 has no safe path, so
    refuse degrades to observe (the stale load is served and counted)."""
    with run_scenario("stale-rows-hybrid") as sc:
        ex = Exposition.scrape(sc.metrics_url)
        facts = sc.facts
    assert len(sc.engine.kv_cache_config.kv_cache_groups) == 2
    assert ex.value(S.ROW_CHECKSUMS.name, rank="1", outcome="mismatch") > 0
    assert ex.value(S.ROW_CHECKSUMS.name, rank="0", outcome="mismatch") == 0
    (info,) = ex.series(S.INFO.name)
    if _vllm_at_least("0.33.0"):
        assert info[0]["checksum_policy"] == "refuse"
        assert ex.value(S.LOADS_REFUSED.name, rank="1", reason="checksum_mismatch") >= 1
        assert facts["same_output"], facts  # recomputed, not garbage
        assert facts["restored_tokens"] == 0
        assert ex.value(S.QUARANTINED_KEYS.name) > 0
    else:
        assert info[0]["checksum_policy"] == "observe"
        assert ex.value(S.LOADS_REFUSED.name) == 0
        assert facts["restored_tokens"] == 96
        assert not facts["same_output"], "the stale bytes must really change the output"


def test_block_level_refusal_would_crash_a_two_group_engine(monkeypatch):
    """The control for the test above: forced onto the block-level path, vLLM 0.33's
    scheduler raises inside the engine step on a two-group model."""
    if not _vllm_at_least("0.33.0"):
        pytest.skip("vLLM 0.26 is never offered block-level errors with several groups")
    from kvscope.connector.compat import load_failures

    if load_failures.job_level_supported():
        pytest.skip("vLLM 0.34 refuses by failed job: its workers see no GPU block ids to "
                    "report (compat.device_pointers)")
    monkeypatch.setattr(load_failures, "refusal_path", lambda *a, **k: load_failures.BLOCKS)
    with pytest.raises(RuntimeError, match="multiple KV cache groups"):
        with run_scenario("stale-rows-hybrid"):
            pass


def test_pending_at_idle_rank_that_never_reports():
    with run_scenario("pending-at-idle") as sc:
        assert sc.facts["request_done"] and sc.facts["has_pending_work"]
        rec = sc.engine.connector.kvscope_recorder
        store = (S.PendingKind.STORE.value,)
        assert wait_until(lambda: rec.value(S.OLDEST_PENDING_TRANSFER, store) > 0.5, timeout=20)
        ex = Exposition.scrape(sc.metrics_url)
    assert ex.value(S.PENDING_TRANSFERS.name, kind="store") > 0
    assert ex.value(S.OLDEST_PENDING_TRANSFER.name, kind="store") > 0.5
    assert ex.value(S.REQUESTS_IN_FLIGHT.name) == 0
    assert ex.value(S.REQUESTS.name) == 0
    assert ex.value(S.TRANSFERS_IN_FLIGHT.name, rank="1", direction="gpu_to_cpu") > 0
    assert ex.value(S.TRANSFERS_IN_FLIGHT.name, rank="0") == 0
    # the engine keeps stepping while work is pending, so the stats stay fresh
    assert ex.value(S.SCHEDULER_STEPS.name) > 5


def test_connector_serves_its_own_endpoint_per_process():
    """Export path 2: ``kvscope.exporter_port`` in the connector's extra config."""
    port = free_port()
    with CPUEngine(EngineConfig(rows=16, world_size=2, exporter_port=port)) as e:
        e.generate(prompt(1, 64), 2)
        e.drain()
        sched = Exposition.scrape(f"http://127.0.0.1:{port}/metrics")
        rank1 = Exposition.scrape(f"http://127.0.0.1:{port + 2}/metrics")
    assert sched.value(S.LOOKUP_ROUNDS.name) > 0
    assert not sched.has(S.ROW_CHECKSUMS.name + "_total") or \
        not sched.series(S.ROW_CHECKSUMS.name, rank="1")
    assert rank1.value(S.TRANSFER_BYTES.name, rank="1", direction="gpu_to_cpu") > 0
    assert rank1.value(S.LOOKUP_ROUNDS.name) == 0


class _BrokenRecorder(Recorder):
    """A recorder whose histogram path raises: the instrumentation must swallow it."""

    def observe(self, metric, labels, value):
        raise RuntimeError("telemetry bug")


def test_telemetry_errors_never_reach_vllm():
    ObservedOffloadingConnector.recorder_factory = _BrokenRecorder
    try:
        with run_scenario("healthy") as sc:
            ex = Exposition.scrape(sc.metrics_url)
            facts = sc.facts
    finally:
        ObservedOffloadingConnector.recorder_factory = Recorder
    assert facts["same_output"] and facts["restored_tokens"] == 96
    assert ex.value(S.TELEMETRY_ERRORS.name) > 0
    assert ex.value(S.LOOKUP_ROUNDS.name, verdict="hit") == 1


def test_settings_are_validated():
    assert Settings.from_extra_config({}).checksum_policy == "refuse"
    with pytest.raises(ValueError, match="unknown kvscope settings"):
        Settings.from_extra_config({"kvscope": {"exporter_prot": 1}})
    with pytest.raises(ValueError, match="checksum_policy"):
        Settings.from_extra_config({"kvscope": {"checksum_policy": "maybe"}})
    assert Settings.from_extra_config({"kvscope": {"checksum_threads": 4}}).checksum_threads == 4
    for bad in (0, -1, 2.5, "8"):
        with pytest.raises(ValueError, match="checksum_threads"):
            Settings.from_extra_config({"kvscope": {"checksum_threads": bad}})


def test_group_suffix_matches_vllm_key_encoding():
    from vllm.v1.kv_offload.base import get_offload_group_idx, make_offload_key

    from kvscope.connector import compat

    for group in (0, 1, 7, 300):
        key = make_offload_key(b"\x01" * 32, group)
        suffix = key[-compat.GROUP_SUFFIX_BYTES:]
        assert int.from_bytes(suffix, "big") == get_offload_group_idx(key) == group


def test_wrapping_is_idempotent():
    """A second observer on the same connector neither re-wraps the manager nor re-taps tiers."""
    from kvscope.connector.lookup.manager_proxy import ManagerProxy
    from kvscope.connector.scheduler.observer import SchedulerObserver

    with CPUEngine(EngineConfig(rows=16)) as e:
        cs = e.connector.connector_scheduler
        proxy = cs.manager
        tier = proxy.secondary_tiers[0]
        taps = (tier.submit_load, tier.submit_store, tier.get_finished_jobs)
        first = e.connector._kvscope_observer
        SchedulerObserver(recorder=Recorder(), tracer=first.tracer, connector_scheduler=cs,
                          spec=first.spec, vllm_config=first.vllm_config,
                          kv_cache_config=first.kv_cache_config)
        assert cs.manager is proxy and isinstance(proxy, ManagerProxy)
        assert (tier.submit_load, tier.submit_store, tier.get_finished_jobs) == taps
        # the proxy forwards what it does not define, reads and writes alike
        assert proxy.primary_tier is proxy._inner.primary_tier
        out = e.generate(prompt(1, 64), 2)
        assert out.output and first.rec.value(S.LOOKUP_ROUNDS, ("miss",)) >= 1
