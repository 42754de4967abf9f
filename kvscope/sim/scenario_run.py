"""Running one scenario of the catalog and serving what it produced until the caller is done.

``run_scenario`` builds the scenario's engine(s) from the base config every scenario starts
from, runs its function (:mod:`kvscope.sim.scenarios`, named by its entry in
:mod:`kvscope.sim.catalog`) and serves:

* ``metrics_url``: kvscope's standalone exporter over the scheduler and every
  rank of the scenario's engine(s) (``exporter_port``; 0 = a free port);
* ``vllm_metrics_url``: vLLM's own /metrics (the default prometheus-client
  registry its PrometheusStatLogger fills; kvscope series carry ``model_name``
  and ``engine`` there), when ``vllm_metrics_port`` is given.

Scenarios whose incident is ongoing (livelock, queue wait, pending at idle)
keep the engine stepping in the background while served, as vLLM does while it
has work; the others leave an idle engine. Apart from the scenarios themselves: this is
the serving and the teardown they share, not any one incident.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import REGISTRY, start_http_server

from kvscope.exporters.prometheus import DEFAULT_ADDR, Exporter, start_exporter
from kvscope.exporters.recorder import Recorder
from kvscope.sim.catalog import CATALOG
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig


@dataclass
class ScenarioRun:
    name: str
    description: str
    engines: list[CPUEngine]
    facts: dict[str, Any] = field(default_factory=dict)
    exporter: Exporter | None = None
    vllm_metrics_url: str | None = None
    background: Callable[[], None] | None = None  # one step of ongoing work

    @property
    def engine(self) -> CPUEngine:
        return self.engines[-1]

    @property
    def metrics_url(self) -> str | None:
        return self.exporter.url if self.exporter else None

    @property
    def recorders(self) -> list[Recorder]:
        out = []
        for e in self.engines:
            out.append(e.connector.kvscope_recorder)
            out.extend(r.connector.kvscope_recorder for r in e.ranks)
        return out


def _base(**kw) -> EngineConfig:
    """The engine every scenario starts from; each overrides what its incident needs."""
    cfg = EngineConfig(rows=12, kv_groups=2, world_size=2, num_gpu_blocks=40,
                       max_num_batched_tokens=16)
    return replace(cfg, **kw)


@contextlib.contextmanager
def run_scenario(name: str, *, exporter_port: int | None = 0,
                 vllm_metrics_port: int | None = None, background_interval_s: float = 0.05,
                 addr: str = DEFAULT_ADDR, **engine_overrides: Any) -> Iterator[ScenarioRun]:
    """Run scenario ``name`` and serve its signals until the with-block exits."""
    scenario = CATALOG.get(name)
    if scenario is None:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(CATALOG)}")
    fn = scenario.runner()
    cfg = _base(vllm_metrics=vllm_metrics_port is not None, **engine_overrides)
    run = ScenarioRun(name, scenario.doc, [])
    stop = threading.Event()
    thread = None
    server = None
    try:
        fn(run, cfg)
        if exporter_port is not None:
            run.exporter = start_exporter(run.recorders, exporter_port, addr)
        if vllm_metrics_port is not None:
            server, _ = start_http_server(vllm_metrics_port, addr=addr, registry=REGISTRY)
            run.vllm_metrics_url = f"http://{addr}:{server.server_port}/metrics"
        if run.background is not None:
            lock = threading.Lock()
            run.facts["step_lock"] = lock

            def loop() -> None:
                while not stop.wait(background_interval_s):
                    with lock:
                        run.background()

            thread = threading.Thread(target=loop, name=f"kvscope-{name}", daemon=True)
            thread.start()
        yield run
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=10)
        if run.exporter is not None:
            run.exporter.close()
        if server is not None:
            server.shutdown()
            server.server_close()
        for e in run.engines:
            e.close()
        if "shared_dir" in run.facts:
            shutil.rmtree(run.facts["shared_dir"], ignore_errors=True)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0,
               interval: float = 0.02) -> bool:
    """Poll ``predicate`` until true or ``timeout``; returns the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
