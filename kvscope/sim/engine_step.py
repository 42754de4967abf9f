"""One CPU engine step, taken as vLLM's engine core and its model runners take it.

``schedule()``, then on every simulated rank the worker-side connector calls around the
model's forward, the ranks' outputs merged by vLLM's ``KVOutputAggregator``, then
``update_from_output``. Between the forward and the outputs the secondary tiers' I/O may
be settled (repeatable scenarios). Kept apart from building the engine: this is the part
whose order matters, each call made where vLLM's own loop makes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvscope.sim import harness_compat

if TYPE_CHECKING:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
    from vllm.v1.core.sched.scheduler import Scheduler

    from kvscope.sim.cpu_model import PatternModel
    from kvscope.sim.engine_config import EngineConfig
    from kvscope.sim.engine_results import RequestResults
    from kvscope.sim.promotion_delay import CompletionsAtStepEnd, DelayedPromotions


@dataclass
class Rank:
    """One simulated rank: its worker-side connector and its KV cache (CPU tensors)."""

    rank: int
    connector: Any
    kv: dict[str, torch.Tensor]


class EngineStepping:
    """The stepping half of :class:`~kvscope.sim.cpu_engine.CPUEngine`, which builds
    the attributes below."""

    cfg: EngineConfig
    scheduler: Scheduler
    connector: Any  # the scheduler-side connector
    ranks: list[Rank]
    model: PatternModel
    stat_logger: Any
    steps: int
    scheduler_seconds: float
    _aggregator: KVOutputAggregator
    _delayed: list[DelayedPromotions]
    _at_step_end: list[CompletionsAtStepEnd]
    _results: RequestResults

    def step(self) -> None:
        t0 = time.thread_time()  # CPU time of this thread: immune to other processes
        so = self.scheduler.schedule()
        self.scheduler_seconds += time.thread_time() - t0
        meta = so.kv_connector_metadata
        for rank in self.ranks:
            c = rank.connector
            if meta is not None:
                c.handle_preemptions(meta)
                c.bind_connector_metadata(meta)
                c.start_load_kv(None)
            self.model.forward(self.scheduler, so, rank.rank, rank.kv)
        # after every rank's forward, as one TP step
        sampled = self.model.sample_all(self.scheduler, so, [rank.kv for rank in self.ranks])
        if self.cfg.settle_tiers:
            for delayed in self._delayed:
                delayed.tick()
            self._settle_tiers()
        outputs = []
        for rank in self.ranks:
            c = rank.connector
            fs, fr, failed = harness_compat.finish_step(c, so.finished_req_ids)
            out = harness_compat.connector_output(
                failed, finished_sending=fs or None, finished_recving=fr or None,
                invalid_block_ids=c.get_block_ids_with_load_errors(),
                kv_connector_stats=c.get_kv_connector_stats(),
                kv_connector_worker_meta=c.build_connector_worker_meta())
            if meta is not None:
                c.clear_connector_metadata()
            outputs.append(harness_compat.model_runner_output(
                list(so.num_scheduled_tokens), sampled_token_ids=sampled,
                kv_connector_output=out))
        merged = self._aggregator.aggregate(outputs)
        t0 = time.thread_time()
        engine_outputs = self.scheduler.update_from_output(so, merged)
        self.scheduler_seconds += time.thread_time() - t0
        self._results.collect(engine_outputs)
        if self.stat_logger is not None:
            for eco in engine_outputs.values():
                if eco.scheduler_stats is not None:
                    self.stat_logger.record(eco.scheduler_stats, None, engine_idx=0)
        self.steps += 1
        time.sleep(self.cfg.step_time_s)

    def _tier_pools(self) -> list[Any]:
        """The secondary tiers' I/O thread pools (the fs tier's)."""
        manager = getattr(self.connector.connector_scheduler, "manager", None)
        return [t._pool for t in getattr(manager, "secondary_tiers", ()) or ()
                if getattr(t, "_pool", None) is not None]

    def _settle_tiers(self) -> None:
        """Let the secondary tiers' I/O of this step finish before the next step.

        Models disk I/O faster than one forward and makes scenarios repeatable:
        the fs tier's jobs (promotions, cascades) and its async existence checks,
        both started by this step's ``on_schedule_end``, are done when the next
        step looks up. vLLM collects the jobs finished by now at its next poll, and only
        those (:class:`~kvscope.sim.promotion_delay.CompletionsAtStepEnd`).
        """
        manager = getattr(self.connector.connector_scheduler, "manager", None)
        for tier in getattr(manager, "secondary_tiers", ()) or ():
            pool = getattr(tier, "_pool", None)
            if pool is not None:
                pool.wait_idle()
            lookups = getattr(tier, "_lookup_manager", None)
            if lookups is None:
                continue
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                lookups.drain_results()  # what vLLM's own next lookup() does first
                unflushed = {key for key, _ in lookups._lookup_batch}
                if all(st.result is not None or key in unflushed
                       for key, st in list(lookups._lookup_state.items())):
                    break
                time.sleep(0.0002)
        for completions in self._at_step_end:
            completions.step_ended()
