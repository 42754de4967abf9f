"""Capture vLLM's own /metrics from a stock OffloadingConnector run on CPU.

    .venv033/bin/python -m tests.diagnostics.native.capture capacity-ceiling \
        tests/diagnostics/native/vllm-0.33.0-capacity-ceiling.prom

Runs a catalogued scenario, or one of ``runs.RUNS``, with vLLM's stock
``OffloadingConnector`` (no kvscope anywhere) on the CPU harness, feeding vLLM's ``PrometheusStatLogger`` as
``vllm serve`` does, and writes one scrape of vLLM's /metrics endpoint, with the
scenario's engine facts (the oracle) as comment lines at the top.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import urllib.request
from collections.abc import Iterator

from prometheus_client import REGISTRY, start_http_server

from kvscope.sim.scenarios import run_scenario

from .runs import RUNS, block_files


@contextlib.contextmanager
def _native_run(name: str) -> Iterator[tuple[str, dict]]:
    engines: list = []
    facts: dict = {}
    cleanups: list = []
    server = None
    try:
        RUNS[name](engines, facts, cleanups)
        server, _ = start_http_server(0, addr="127.0.0.1", registry=REGISTRY)
        yield f"http://127.0.0.1:{server.server_port}/metrics", facts
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        for undo in cleanups[:1]:  # unblock the tier before shutting the engine down
            undo()
        for e in engines:
            e.close()
        for undo in cleanups[1:]:
            undo()
        if "shared_dir" in facts:
            shutil.rmtree(facts.pop("shared_dir"), ignore_errors=True)


@contextlib.contextmanager
def _served(name: str) -> Iterator[tuple[str, dict]]:
    if name in RUNS:
        with _native_run(name) as got:
            yield got
        return
    with run_scenario(name, exporter_port=None, vllm_metrics_port=0,
                      connector="OffloadingConnector") as sc:
        # what reached the disk tier, counted on the disk
        sc.facts["disk_block_files"] = len(block_files(sc.engine.fs_root))
        yield sc.vllm_metrics_url, sc.facts


def capture(scenario: str) -> str:
    with _served(scenario) as (url, run_facts):
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read().decode()
        import vllm

        facts = {k: v for k, v in run_facts.items()
                 if isinstance(v, (bool, int, str, list)) and k != "shared_dir"}
    header = [f"# kvscope capture: vLLM {vllm.__version__}, stock OffloadingConnector, "
              f"CPU harness, scenario {scenario}",
              f"# engine facts: {json.dumps(facts, sort_keys=True)}"]
    return "\n".join(header) + "\n" + body


if __name__ == "__main__":
    text = capture(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        f.write(text)
