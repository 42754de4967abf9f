"""Capture vLLM's own /metrics from a stock OffloadingConnector run on CPU.

    .venv033/bin/python -m tests.diagnostics.native.capture capacity-ceiling \
        tests/diagnostics/native/vllm-0.33.0-capacity-ceiling.prom

Runs a catalogued scenario with vLLM's stock ``OffloadingConnector`` (no kvscope
anywhere) on the CPU harness, feeding vLLM's ``PrometheusStatLogger`` as
``vllm serve`` does, and writes one scrape of vLLM's /metrics endpoint, with the
scenario's engine facts (the oracle) as comment lines at the top.
"""

from __future__ import annotations

import json
import sys
import urllib.request

from kvscope.connector.scenarios import run_scenario


def capture(scenario: str) -> str:
    with run_scenario(scenario, exporter_port=None, vllm_metrics_port=0,
                      connector="OffloadingConnector") as sc:
        with urllib.request.urlopen(sc.vllm_metrics_url, timeout=10) as resp:
            body = resp.read().decode()
        import vllm

        facts = {k: v for k, v in sc.facts.items() if isinstance(v, (bool, int, str, list))}
    header = [f"# kvscope capture: vLLM {vllm.__version__}, stock OffloadingConnector, "
              f"CPU harness, scenario {scenario}",
              f"# engine facts: {json.dumps(facts, sort_keys=True)}"]
    return "\n".join(header) + "\n" + body


if __name__ == "__main__":
    text = capture(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        f.write(text)
