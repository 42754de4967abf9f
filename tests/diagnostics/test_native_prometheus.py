"""kv-diagnose --prometheus on a stock vLLM 0.33: the same verdicts as a direct scrape.

Each real /metrics capture of ``native/`` (stock OffloadingConnector on vLLM 0.33, CPU) is
served over loopback as the engine served it; one real Prometheus scrapes them all. Then
``kv-diagnose --prometheus --selector instance=...`` must reach, for each engine, the verdict
a direct ``--scrape`` of the same engine reaches (its counters born inside the window count
from zero, as on the kvscope path).
"""

from __future__ import annotations

import contextlib
import json

import pytest

from kvscope.diagnostics.cli import main
from tests.diagnostics.test_native import NATIVE
from tests.support.static_metrics import serving

pytestmark = pytest.mark.prometheus

# capture -> the verdicts its direct scrape gives (test_native.py checks those against the
# engine facts)
EXPECTED = {
    "capacity-ceiling": ["capacity_ceiling_suspected"],
    "healthy": ["healthy"],
    "pending-at-idle": ["inconclusive"],
    "restart-without-seed": ["stores_without_restores_suspected"],
    "store-never-fits": ["store_never_fits_suspected"],
    "tier-failures": ["tier_job_failures"],
    "tier-stall": ["pending_at_idle_suspected"],
}


def _verdicts(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_prometheus_window_gives_the_scrape_verdicts(prometheus, capsys):
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(serving(NATIVE / f"vllm-0.33.0-{name}.prom"))
                for name in EXPECTED}
        prom = prometheus(list(urls.values()), scrape_interval="500ms")
        instances = {name: url.split("//")[1].split("/")[0] for name, url in urls.items()}
        # two scrapes of every engine: a window with a first and a last sample
        prom.wait_for('count(count_over_time(vllm:num_requests_running[1m]) >= 2)',
                      lambda r: bool(r) and float(r[0]["value"][1]) >= len(urls), timeout=60)
        for name, want in EXPECTED.items():
            sel = f'{{instance="{instances[name]}"}}'
            code, window = _verdicts(capsys, ["--prometheus", prom.url, "--since", "5m",
                                              "--selector", sel])
            assert window["reduced_evidence"] is True, name
            assert [v["id"] for v in window["verdicts"]] == want, (name, window["verdicts"])
            scrape_code, scraped = _verdicts(capsys, ["--scrape", urls[name],
                                                      "--interval", "0.05"])
            assert code == scrape_code, name
            assert window["verdicts"][0]["evidence"] == scraped["verdicts"][0]["evidence"], name
