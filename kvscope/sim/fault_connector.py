"""kvscope's connector with the test fault hooks (:mod:`kvscope.sim.faults`) installed.

Test-only. The served connector (``ObservedOffloadingConnector``) has no fault hook; the
CPU harness (``EngineConfig.fault_hooks``, or a ``fault``) and the fault campaigns select
this subclass by name::

    "kv_connector": "FaultInjectingConnector",
    "kv_connector_module_path": "kvscope.sim.fault_connector"

Each hook is off unless ``KVSCOPE_FAULT_FILE`` names the switch file when the connector is
built, and then does nothing until a fault is switched on in it. The hooks go where the
fault needs them, around kvscope's own: the fs tier's stalls beneath kvscope's tier taps,
the round and finish faults before the connector's hooks read the observer's handlers,
the promoted rows' corruption above the taps (after kvscope digested them), the block leak
above the connector's hooks, the withheld stores beneath the worker proxy.
"""

from __future__ import annotations

from typing import Any

from kvscope.connector.observed import ObservedOffloadingConnector
from kvscope.connector.scheduler.observer import SchedulerObserver
from kvscope.connector.worker.proxy import WorkerProxy
from kvscope.exporters.signals import ErrorSite
from kvscope.sim import faults


def _observer_with_faults(*, connector_scheduler: Any, **kwargs: Any) -> SchedulerObserver:
    faults.install_tier_stalls(connector_scheduler.manager)  # before the observer's taps
    observer = SchedulerObserver(connector_scheduler=connector_scheduler, **kwargs)
    faults.install_round_faults(observer)  # before the connector's hooks read its handlers
    faults.install_promotion_faults(observer)  # above the tier taps it built
    return observer


def _worker_with_faults(inner: Any, **kwargs: Any) -> WorkerProxy:
    proxy = WorkerProxy(inner, **kwargs)
    faults.install_worker(proxy)  # beneath the proxy
    return proxy


class FaultInjectingConnector(ObservedOffloadingConnector):
    """ObservedOffloadingConnector whose scheduler side, worker side and GPU block pool
    carry the hooks of :mod:`kvscope.sim.faults`."""

    observer_factory = staticmethod(_observer_with_faults)
    worker_factory = staticmethod(_worker_with_faults)

    def bind_gpu_block_pool(self, gpu_block_pool):
        super().bind_gpu_block_pool(gpu_block_pool)
        if self._kvscope_observer is None:
            return
        with self.kvscope_recorder.guard(ErrorSite.MANAGER):
            faults.install_block_leak(self, gpu_block_pool)  # above the connector's hooks
