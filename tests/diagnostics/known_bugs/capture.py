"""Capture kvscope's /metrics from a CPU run that reached a known vLLM bug.

    .venv/bin/python -m tests.diagnostics.known_bugs.capture \
        tests/diagnostics/known_bugs/vllm-0.26.0-store-after-finish.prom

vLLM 0.26's store after finish (``kvscope.sim.store_after_finish``) with kvscope containing
it, the engine then serving on; one scrape of kvscope's exporter, with the engine facts
(the oracle: what vLLM served, what its tiers hold) as comment lines at the top.
"""

from __future__ import annotations

import json
import sys
import urllib.request

from kvscope.connector import compat
from kvscope.sim import store_after_finish as saf
from kvscope.sim.cpu_engine import CPUEngine


def capture() -> tuple[str, dict]:
    with CPUEngine(saf.engine_config(exporter_port=0)) as e:
        d = saf.drive(e)
        served = saf.serve_after(e)
        manager = e.connector.connector_scheduler.manager
        facts = {
            "vllm_version": compat.VLLM_VERSION,
            "short_finished": d.short in e.finished,
            "holder_keys_held": all(compat.primary_holds(manager, k)
                                    or any(compat.secondary_holds(t, k)
                                           for t in compat.secondary_tiers(manager))
                                    for k in d.holder_keys),
            "holder_restored_tokens": served["holder_again"].num_external_tokens,
            "same_holder_output": served["holder_again"].output == e.finished[d.holder].output,
        }
        text = urllib.request.urlopen(e.connector.kvscope_exporter.url, timeout=10).read()
    return text.decode(), facts


def main(path: str) -> None:
    text, facts = capture()
    head = (f"# kvscope capture: vLLM {facts['vllm_version']}, ObservedOffloadingConnector, CPU "
            f"harness, kvscope.sim.store_after_finish\n"
            f"# engine facts: {json.dumps(facts, sort_keys=True)}\n")
    with open(path, "w") as f:
        f.write(head + text)


if __name__ == "__main__":
    main(sys.argv[1])
