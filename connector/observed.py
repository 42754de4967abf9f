"""ObservedOffloadingConnector: vLLM's OffloadingConnector with kvscope's eyes on it.

Load it with::

    --kv-transfer-config '{"kv_connector": "ObservedOffloadingConnector",
      "kv_connector_module_path": "kvscope.connector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"cpu_bytes_to_use": ..., "kvscope": {...}}}'

The subclass only wraps: after ``super().__init__`` it replaces the manager the
connector scheduler calls with a forwarding proxy, taps the tier instances, and
after ``register_kv_caches`` wraps the worker instance. Options live under
``kv_connector_extra_config["kvscope"]`` (``settings.py``); what reaches vLLM's
stats pipeline and its /metrics: ``vllm_stats.py``.
"""

from __future__ import annotations

import logging

from kvscope.connector import compat
from kvscope.connector.compat import load_failures
from kvscope.connector.compat.vllm_api import (
    KVConnectorRole,
    OffloadingConnector,
    bound_load_jobs,
)
from kvscope.connector.export.vllm_stats import KvscopePromMetrics, stats_from_delta
from kvscope.connector.integrity.checksums import Digester
from kvscope.connector.scheduler import hooks
from kvscope.connector.scheduler.observer import SchedulerObserver
from kvscope.connector.settings import Settings, effective_policy
from kvscope.connector.worker.proxy import WorkerProxy
from kvscope.exporters.otel import get_tracer
from kvscope.exporters.prometheus import Exporter, start_exporter
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import ErrorSite

logger = logging.getLogger("kvscope")

_WARNED_POLICY = False  # the refuse -> observe fallback is logged once per process


class ObservedOffloadingConnector(OffloadingConnector):
    """OffloadingConnector + kvscope signals. Behaviour is the stock connector's,
    except that a promoted row whose bytes differ on some rank is not loaded
    (checksum policy ``refuse``)."""

    # Tests and embedders may pass these before construction (class-level
    # injection keeps vLLM's constructor signature); the observer's and the worker
    # proxy's builders are where the CPU harness's subclass adds its test fault hooks
    # (kvscope.sim.fault_connector).
    recorder_factory = Recorder
    tracer_provider = None
    observer_factory = SchedulerObserver
    worker_factory = WorkerProxy
    # This rank's WorkerProxy once wrapped (worker role), read by the per-step calls below
    # without a property, a getattr and an isinstance each time
    _kvscope_w: WorkerProxy | None = None

    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None)
        self.kvscope_settings = Settings.from_extra_config(extra)
        self.kvscope_recorder: Recorder = type(self).recorder_factory()
        self.kvscope_exporter: Exporter | None = None
        self._kvscope_tracer = get_tracer(type(self).tracer_provider,
                                          install_otlp=self.kvscope_settings.otlp_traces)
        self._kvscope_observer: SchedulerObserver | None = None
        rec = self.kvscope_recorder
        with rec.guard(ErrorSite.MANAGER):
            if role == KVConnectorRole.SCHEDULER and self.connector_scheduler is not None:
                self._kvscope_observer = type(self).observer_factory(
                    recorder=rec, tracer=self._kvscope_tracer,
                    connector_scheduler=self.connector_scheduler,
                    spec=compat.scheduler_spec(self.connector_scheduler.manager,
                                               vllm_config, kv_cache_config),
                    vllm_config=vllm_config,
                    kv_cache_config=kv_cache_config,
                    checksum_policy=effective_policy(self.kvscope_settings.checksum_policy,
                                                     kv_cache_config, extra),
                    tier_probe_interval_s=self.kvscope_settings.tier_probe_interval_s,
                    digester=Digester(self.kvscope_settings.checksum_algorithm,
                                      self.kvscope_settings.checksum_threads),
                    stats_builder=stats_from_delta,
                    flush_interval_s=self.kvscope_settings.flush_interval_s,
                    per_key_lookups=self.kvscope_settings.per_key_lookups,
                    contain_vllm_faults=self.kvscope_settings.contain_vllm_faults,
                    checksum_scope=self.kvscope_settings.checksum_scope)
                hooks.install(self, self._kvscope_observer, ObservedOffloadingConnector)
                self._maybe_start_exporter(0)
        rec.flush()

    # ---- helpers ------------------------------------------------------------------------
    def _maybe_start_exporter(self, offset: int) -> None:
        port = self.kvscope_settings.exporter_port
        if port is None or self.kvscope_exporter is not None:
            return
        with self.kvscope_recorder.guard(ErrorSite.EXPORTER):
            self.kvscope_exporter = start_exporter(
                self.kvscope_recorder, port + offset if port else 0,
                self.kvscope_settings.exporter_addr)
            logger.info("kvscope: serving %s", self.kvscope_exporter.url)

    @property
    def kvscope_worker(self) -> WorkerProxy | None:
        cw = self.connector_worker
        w = getattr(cw, "worker", None) if cw is not None else None
        return w if isinstance(w, WorkerProxy) else None

    def _wrap_worker(self) -> None:
        cw = self.connector_worker
        if cw is None or cw.worker is None or isinstance(cw.worker, WorkerProxy):
            self._kvscope_w = self.kvscope_worker
            return
        extra = getattr(cw.spec, "extra_config", None)
        policy = effective_policy(self.kvscope_settings.checksum_policy, cw.kv_cache_config,
                                  extra)
        global _WARNED_POLICY
        if policy != self.kvscope_settings.checksum_policy and not _WARNED_POLICY:
            _WARNED_POLICY = True
            logger.warning(
                "kvscope: checksum_policy=refuse needs vLLM to recompute refused loads; "
                "vLLM %s cannot do that safely for this model (several KV-cache groups%s), "
                "so mismatches are counted (policy observe) and not refused.",
                compat.VLLM_VERSION, " and a sync_load_budget_bytes"
                if load_failures.request_level_supported() else "")
        with self.kvscope_recorder.guard(ErrorSite.WORKER):
            cw.worker = type(self).worker_factory(
                cw.worker, recorder=self.kvscope_recorder, tracer=self._kvscope_tracer,
                spec=cw.spec, checksum_policy=policy,
                algorithm=self.kvscope_settings.checksum_algorithm,
                digest_threads=self.kvscope_settings.checksum_threads,
                refusal_path=load_failures.refusal_path(cw.kv_cache_config, extra),
                flush_interval_s=self.kvscope_settings.flush_interval_s)
            self._kvscope_w = cw.worker
            self._maybe_start_exporter(1 + cw.worker.rank)

    # ---- worker role ----------------------------------------------------------------------
    # Called per step on vLLM's engine thread (TP=1): vLLM's methods are called on the class
    # (OffloadingConnector.f(self, ...)), not through super(), which builds an object per call.
    def register_kv_caches(self, kv_caches):
        super().register_kv_caches(kv_caches)
        self._wrap_worker()

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        super().register_cross_layers_kv_cache(kv_cache, attn_backend)
        self._wrap_worker()

    def start_load_kv(self, forward_context, **kwargs):
        w = self._kvscope_w
        if w is not None and w.wants_load_jobs:  # which request each load job serves
            w.note_load_jobs(bound_load_jobs(self))
        return OffloadingConnector.start_load_kv(self, forward_context, **kwargs)

    def get_finished(self, finished_req_ids):
        result = OffloadingConnector.get_finished(self, finished_req_ids)
        w = self._kvscope_w
        if w is not None:
            w.step()
        return result

    if load_failures.request_level_supported():  # vLLM 0.33 (0.26's runner calls get_finished)
        def get_transfer_results(self, finished_req_ids):
            """Finished transfers plus refused loads as failed receives."""
            results = OffloadingConnector.get_transfer_results(self, finished_req_ids)
            w = self._kvscope_w
            if w is None:
                return results
            return load_failures.with_failed_requests(results, w.take_failed_requests())

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors = OffloadingConnector.get_block_ids_with_load_errors(self)
        w = self._kvscope_w
        if w is None or not w.load_errors:  # the common case: vLLM's own, untouched
            return errors
        return set(errors) | w.take_load_errors()

    # ---- scheduler role ---------------------------------------------------------------------
    # on_new_request, get_num_new_matched_tokens, update_state_after_alloc,
    # build_connector_meta, update_connector_output, request_finished(_all_groups) and
    # the scheduler side's get_kv_connector_stats: closures set on the instance once the
    # observer exists (scheduler/hooks.py: one Python frame of kvscope per vLLM call).
    # bind_gpu_block_pool: a method (once, when the scheduler is built).

    def bind_gpu_block_pool(self, gpu_block_pool):
        """vLLM's scheduler binds its GPU block pool once it exists (0.33 through
        ``bind_kv_cache_manager``: ``compat.block_pool``): kvscope reads the blocks in use
        (``kvscope_gpu_blocks``, ``kvscope_idle_gpu_blocks_in_use``)."""
        super().bind_gpu_block_pool(gpu_block_pool)
        observer = self._kvscope_observer
        if observer is None:
            return
        with self.kvscope_recorder.guard(ErrorSite.MANAGER):
            observer.bind_block_pool(gpu_block_pool)

    # ---- export path 1: vLLM's stats pipeline -------------------------------------------------
    def get_kv_connector_stats(self):
        stats = OffloadingConnector.get_kv_connector_stats(self)
        observer = self._kvscope_observer
        try:
            if observer is not None:  # scheduler side (its hook, scheduler/hooks.py, first)
                ours = observer.take_stats()
            else:  # worker side: flushed at most every flush_interval_s while busy (WorkerProxy.step)
                rec = self.kvscope_recorder
                if not rec.delta_ready:
                    return stats
                ours = stats_from_delta(rec.take_delta())
            if ours is None:
                return stats
            return ours if stats is None or stats.is_empty() else ours.aggregate(stats)
        except Exception as exc:
            self.kvscope_recorder.error(ErrorSite.STATS, exc)
            return stats

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KvscopePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self):
        try:
            if self._kvscope_observer is not None:
                self._kvscope_observer.close()
            super().shutdown()
        finally:
            if self.kvscope_exporter is not None:
                self.kvscope_exporter.close()
                self.kvscope_exporter = None
