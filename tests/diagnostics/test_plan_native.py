"""``kv-diagnose plan`` on a stock vLLM (no kvscope): the primary tier's geometry read from
vLLM's own ``kv_offload_config_info`` (``cpu_num_chunks``, ``cpu_kv_cache_size_tokens``),
the restores from the command line.

Judged by the engines of the committed captures: the healthy engine restored its 96-token
prompt whole through 12 rows, the capacity-ceiling engine restored nothing through 6.
"""

from __future__ import annotations

import json

import pytest

from kvscope.diagnostics.cli import main
from tests.diagnostics.test_native import RELEASES, _facts, capture
from tests.support.static_metrics import serving


def _plan(path, capsys, *extra: str) -> tuple[int, dict]:
    with serving(path) as url:
        code = main(["plan", "--scrape", url, "--interval", "0.05", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("release", RELEASES)
def test_rows_of_a_stock_engine_from_its_config_info(release, capsys):
    healthy, ceiling = capture(release, "healthy"), capture(release, "capacity-ceiling")
    assert _facts(healthy)["restored_tokens"] == 96  # whole, through the tier's 12 rows
    assert _facts(ceiling)["restored_tokens"] == 0  # nothing, through 6
    for path, rows_now in ((healthy, 12), (ceiling, 6)):
        code, plan = _plan(path, capsys, "--held-tokens", "96", "--concurrency", "1")
        assert code == 0
        assert plan["inputs"]["rows_now"]["value"] == rows_now
        assert "cpu_num_chunks" in plan["inputs"]["rows_now"]["source"]
        assert "cpu_kv_cache_size_tokens" in plan["inputs"]["chunk_tokens"]["source"]
        assert plan["rows_per_restore"] == 12  # what the healthy engine restored through
        assert plan["rows"] == 12


@pytest.mark.parametrize("release", RELEASES)
def test_a_stock_engine_needs_the_restores_on_the_command_line(release, capsys):
    with serving(capture(release, "healthy")) as url:
        code = main(["plan", "--scrape", url, "--interval", "0.05", "--held-tokens", "96"])
    assert code == 2
    assert "--concurrency" in capsys.readouterr().err
