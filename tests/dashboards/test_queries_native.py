"""The native-metrics panels (vLLM >= 0.33) against a live Prometheus scraping real vLLM 0.33
and 0.34.

vLLM 0.26 exports none of the series these panels read, so a 0.26 engine cannot feed them;
the real vLLM 0.33 and 0.34 /metrics captures of ``tests/diagnostics/native/`` (stock
OffloadingConnector, CPU runs: healthy, capacity ceiling, a stalled and a failing disk tier, a
restart, requests waiting for the scheduler) are served as their engines served them, on
every test environment. Each panel
query must parse, name only known series and return data wherever its series exist; and every
native panel must show something on at least one of these engines (no panel is decoration).
test_queries_reality.py checks which vLLM version produces the series on a live engine.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from kvscope.dashboards import native
from kvscope.dashboards.config import DEFAULT
from tests.dashboards import live
from tests.support import querycheck as qc
from tests.support.static_metrics import serving

pytestmark = pytest.mark.prometheus

CAPTURES = Path(__file__).parents[1] / "diagnostics" / "native"
NAMES = ("healthy", "capacity-ceiling", "tier-stall", "tier-failures", "restart-without-seed",
         "queue-wait")
RELEASES = ("0.33.0", "0.34.0")




def _native_queries():
    titles = {p.build().title for p in native.panels(DEFAULT)}
    queries = [q for q in live.committed_queries()
               if q.kind == "panel" and q.name.rsplit(" [", 1)[0] in titles]
    assert {q.name.rsplit(" [", 1)[0] for q in queries} == titles, "a native panel not rendered"
    return queries


@pytest.fixture(scope="module")
def captured(live_pool):
    targets = {(v, n): live_pool.claim(f"native-capture-{v}-{n}") for v in RELEASES for n in NAMES}
    with contextlib.ExitStack() as stack:
        for (release, name), target in targets.items():
            stack.enter_context(serving(CAPTURES / f"vllm-{release}-{name}.prom", live.HOST,
                                        target.port))
        instances = "|".join(qc.regex_escape(t.instance) for t in targets.values())
        live_pool.prom.wait_for(
            f'count(count_over_time(vllm:kv_offload_config_info{{instance=~"{instances}",'
            f'tier="0:primary"}}[1m]) >= 3)',
            lambda r: bool(r) and float(r[0]["value"][1]) >= len(targets), timeout=60)
        yield live_pool.prom, targets


def test_native_panels_against_real_vllm(captured):
    prom, targets = captured
    queries = _native_queries()
    shown: set[str] = set()
    for name, target in targets.items():
        problems = qc.check_live(prom, queries, within=target.within)
        assert not problems, f"{name}:\n" + "\n".join(problems)
        shown |= {q.name for q in queries
                  if prom.query(qc.scope(qc.substitute(q.expr), target.within))}
    assert shown == {q.name for q in queries}, sorted({q.name for q in queries} - shown)


@pytest.mark.parametrize("release", RELEASES)
def test_native_panels_show_each_engine_its_incident(captured, release):
    """What an operator should see: failures on the failing tier, a job in flight on the
    stalled one, promotions refused a row at the capacity ceiling, disk hits when healthy,
    requests waiting with no KV load when the scheduler is what holds them."""
    prom, targets = captured

    def value(expr: str, name: str) -> float:
        rows = prom.query(qc.scope(expr, targets[release, name].within))
        return sum(float(r["value"][1]) for r in rows)

    s = qc.s
    assert value(s.VLLM_TIERING_ACTIVE_PROMOTIONS, "tier-stall") == 1
    assert value(s.VLLM_TIERING_PRIMARY_WRITE_USAGE, "tier-stall") > 0
    assert value(s.VLLM_TIERING_CASCADE_JOB_FAILURES, "tier-failures") > 0
    assert value(s.VLLM_TIERING_PROMOTION_JOB_FAILURES, "tier-failures") > 0
    assert value(s.VLLM_TIERING_PROMOTION_ALLOC_FAILURES, "capacity-ceiling") > 0
    assert value(f'{s.VLLM_TIERING_CHUNK_HITS}{{tier!="0:primary"}}', "healthy") > 0
    assert value(f'{s.VLLM_PROMPT_TOKENS_CACHED_BY_SOURCE}{{source=~"host|disk"}}',
                 "healthy") > 0
    assert value(f'{s.VLLM_PROMPT_TOKENS_CACHED_BY_SOURCE}{{source=~"host|disk"}}',
                 "restart-without-seed") == 0
    no_kv_load = f"sum({s.VLLM_REQUESTS_WAITING}) - sum({s.VLLM_KV_FETCH_BY_STAGE})"
    assert value(no_kv_load, "queue-wait") > 0
    assert value(s.VLLM_KV_FETCH_BY_STAGE, "queue-wait") == 0
