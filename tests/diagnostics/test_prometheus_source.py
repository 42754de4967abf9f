"""The Prometheus source against a real Prometheus (Debian package), 127.0.0.1 only."""

from __future__ import annotations

import json
import time

import pytest

from kvscope.diagnostics import cli
from kvscope.diagnostics.sources.prometheus import (
    escaped_name,
    normalize_selector,
    query_for,
    step_for,
)
from kvscope.exporters import signals as S

from .support import contract_registry, info_values, serve

pytestmark = pytest.mark.prometheus


def test_query_building():
    assert normalize_selector('{model_name="x", engine="0"}') == 'model_name="x", engine="0"'
    assert normalize_selector('model_name="x"') == 'model_name="x"'
    assert query_for("vllm:num_requests_waiting", 'model_name="x"') == (
        '{__name__="vllm:num_requests_waiting",model_name="x"}'
    )
    assert step_for(0, 86400) == 360.0 and step_for(0, 60) == 1.0
    # prometheus-client 0.26 escapes ':' in OpenMetrics sample names for Prometheus 2.x
    assert escaped_name(S.VLLM_REQUESTS_WAITING) == "vllm_num_requests_waiting"
    assert escaped_name(S.REQUESTS.name) is None


def _stale_rows_engine():
    from prometheus_client.exposition import generate_latest

    reg, m = contract_registry()
    m[S.INFO.name].labels(*info_values()).set(1)
    m[S.PRIMARY_ROWS.name].labels("total").set(8)

    def body():
        m[S.SCHEDULER_STEPS.name].inc()
        m[S.LAST_STEP_TIMESTAMP.name].set(time.time())
        m[S.PROMOTIONS.name].labels("completed").inc(2)
        m[S.ROW_CHECKSUMS.name].labels("0", "match").inc(2)
        m[S.ROW_CHECKSUMS.name].labels("1", "mismatch").inc(2)
        m[S.LOADS_REFUSED.name].labels("1", "checksum_mismatch").inc(2)
        return generate_latest(reg)

    return body


def test_prometheus_window_reaches_the_verdict(prometheus, capsys, tmp_path):
    with serve(_stale_rows_engine()) as url:
        prom = prometheus([url])
        prom.wait_for(f'{S.ROW_CHECKSUMS.name}{{outcome="mismatch"}} > 2', timeout=30)
        code = cli.main(["--prometheus", prom.url, "--since", "2m", "--selector", '{job="kvscope"}',
                         "--json"])
        out, err = capsys.readouterr()
        assert code == 1, err
        doc = json.loads(out)
        assert doc["source"]["kind"] == "prometheus" and doc["source"]["selector"] == '{job="kvscope"}'
        top = doc["verdicts"][0]
        assert top["id"] == "stale_row_corruption"
        assert top["facts"]["mismatched_ranks"][0]["rank"] == "1"

        bundle = tmp_path / "p.kvb"
        assert cli.main(["record", "--prometheus", prom.url, "--since", "2m", "-o", str(bundle)]) == 0
        capsys.readouterr()
        assert cli.main(["--bundle", str(bundle), "--json"]) == 1
        assert json.loads(capsys.readouterr().out)["verdicts"][0]["id"] == "stale_row_corruption"

        code = cli.main(["--prometheus", prom.url, "--since", "2m", "--selector", '{job="nope"}'])
        err = capsys.readouterr().err
        assert code == 2 and "no kvscope or vLLM metrics" in err and "Traceback" not in err

        code = cli.main(["--prometheus", prom.url, "--since", "2m", "--selector", '{job=~"("}'])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("kv-diagnose: Prometheus") and len(err.splitlines()) == 1
