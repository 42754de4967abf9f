"""Checked against reality: the dashboards and rules against a real vLLM on CPU.

Every scenario of ``kvscope.sim.scenarios`` runs in this process (real vLLM scheduler,
connector and tiers) and stays alive while one Prometheus scrapes them all, each on its own
port: kvscope's standalone exporter for each scenario, and vLLM's own /metrics (kvscope series
with ``model_name``/``engine``, vLLM's request gauges beside them) for ``VLLM_SCENARIO``. Then
every panel query and rule expression goes through the HTTP API, narrowed to one scenario's
target (``querycheck.scope``): each must parse, name only contract series, and return data
whenever every series it selects exists; and exactly the scenario's alert expressions select
something (the ``for:`` clause aside).

One Prometheus for all scenarios (and the stand-in exporter of test_queries_live.py): its
service discovery alone takes ~5 s to start scraping (``live.pool``).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvscope.connector.compat import versions
from kvscope.dashboards import rules as r
from kvscope.exporters import signals as s
from kvscope.sim.catalog import SCENARIOS
from tests.dashboards import live
from tests.support import querycheck as qc

pytest.importorskip("vllm")
scenarios = pytest.importorskip("kvscope.sim.scenarios")

pytestmark = [pytest.mark.prometheus, pytest.mark.vllm]

# Scenario -> the alerts whose expression selects the scenario's engine once it has been scraped
# a few times; every other alert's expression must select nothing there. Alerts with long
# windows (stale stats: 120 s without a step; stores without restores: stores *seen* by
# Prometheus within 30 min) cannot come from a short run whose counters were already final at
# the first scrape.
EXPECTED_ALERT_EXPRS: dict[str, set[str]] = {
    "healthy": set(),
    # one vetoed round at the ceiling, before the first scrape (rate() cannot see it)
    "capacity-ceiling": {r.ALERT_CAPACITY_CEILING},
    # deferred round after round at the ceiling while Prometheus watches (on a busy machine
    # the promotions sometimes land after all: then only rounds before the first scrape)
    "livelock": {r.ALERT_CAPACITY_CEILING},
    "stale-rows": {r.ALERT_CHECKSUM_MISMATCH},
    "stale-rows-observe": {r.ALERT_CHECKSUM_MISMATCH},
    "pending-at-idle": {r.ALERT_PENDING_AT_IDLE},
    # every request finished, vLLM's pool still holds their blocks (the leak_blocks fault)
    "not-settled-at-idle": {r.ALERT_GPU_BLOCKS_HELD_AT_IDLE},
    "queue-wait": set(),
    # the re-ask stopped at a key whose store job was refused: a store_refused round before
    # the first scrape (the alert's "born within the window" arm selects it)
    "store-never-fits": {r.ALERT_STORES_REFUSED},
    "stored-in-part": {r.ALERT_STORES_REFUSED},
    "stores-without-restores": set(),
    # deferred rounds at the ceiling before the cut (before the first scrape); the coverage
    # alert needs held tokens rising while Prometheus watches, which a finished run lacks
    "truncated": {r.ALERT_CAPACITY_CEILING},
    "concurrency": set(),  # no round reached the ceiling: each request fits alone
    # keys lost before the first scrape: the born-in-window clause selects the engine
    "tier-data-lost": {r.ALERT_TIER_DATA_LOST},
    # only the sub-block group stored, before the first scrape: the stored-tokens series are
    # born within the window (their born-in-window arm), the large-block groups' at 0
    "tier-flooded": {r.ALERT_TIER_FLOODED},
}
# The scenario served through vLLM's own /metrics (one per process: vLLM's global registry).
# Pending at idle, so the pending-at-idle rule's join with vLLM's running/waiting gauges on the
# same target is exercised.
VLLM_SCENARIO = "pending-at-idle"
VLLM_ID = f"{VLLM_SCENARIO} (vLLM /metrics)"
# Scenarios that keep stepping in the background start last, so no engine steps while another
# scenario is being set up (vLLM's NONE_HASH, seeded by each engine at start, is global).
ONGOING = {"livelock", "queue-wait", "pending-at-idle"}


def _start(stack: contextlib.ExitStack, name: str, **kwargs):
    # vLLM 0.26's TieringOffloadingManager.prepare_store sometimes raises KeyError (its request
    # state is already gone) when the process is busy; the stock OffloadingConnector does too.
    # The scenario is this test's fixture, not its subject: run it again.
    for attempt in range(3):
        try:
            return stack.enter_context(scenarios.run_scenario(name, **kwargs))
        except (KeyError, TimeoutError):
            if attempt == 2:
                raise


@pytest.fixture(scope="module")
def reality(live_pool):
    """(prom, {scenario id: (matchers selecting its target, ScenarioRun)}), all scraped."""
    assert set(EXPECTED_ALERT_EXPRS) == set(SCENARIOS), "a scenario without expectations"
    order = sorted(SCENARIOS, key=lambda n: (n in ONGOING, n))
    targets = {n: live_pool.claim(n) for n in [*order, VLLM_ID]}
    stacks = {n: contextlib.ExitStack() for n in targets}
    try:
        runs = {}
        for name in order:
            runs[name] = _start(stacks[name], name, exporter_port=targets[name].port)
            assert runs[name].metrics_url == targets[name].url
            assert (runs[name].background is not None) == (name in ONGOING), name
        runs[VLLM_ID] = _start(stacks[VLLM_ID], VLLM_SCENARIO, exporter_port=None,
                               vllm_metrics_port=targets[VLLM_ID].port)
        assert runs[VLLM_ID].vllm_metrics_url == targets[VLLM_ID].url
        live.wait_for_data(live_pool.prom, list(targets.values()))
        yield live_pool.prom, {n: (targets[n].within, runs[n]) for n in targets}
    finally:
        # each close waits up to 0.5 s for its HTTP server's poll loop: close them side by side
        with ThreadPoolExecutor(len(stacks)) as pool:
            for future in [pool.submit(st.close) for st in stacks.values()]:
                future.result()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_queries_against_real_scenario(reality, scenario):
    prom, targets = reality
    within, _run = targets[scenario]
    assert live.exported_unknown_names(prom, within) == set()
    queries = live.committed_queries()
    problems = qc.check_live(prom, queries, within=within)
    assert not problems, "\n".join(problems)
    assert qc.alerts_with_data(prom, queries, within) == EXPECTED_ALERT_EXPRS[scenario]


def test_queries_through_vllm_metrics(reality):
    """vLLM's /metrics path: template variables select the engine, panels show it."""
    prom, targets = reality
    within, _run = targets[VLLM_ID]
    assert live.exported_unknown_names(prom, within) == set()
    # vLLM's labels are on the kvscope series, and vLLM's own request gauges are there
    steps = prom.query(f"{s.SCHEDULER_STEPS.name}{{{within}}}")
    assert len(steps) == 1, steps
    model = steps[0]["metric"].get(s.VLLM_LABEL_MODEL)
    engine = steps[0]["metric"].get(s.VLLM_LABEL_ENGINE)
    assert model and engine, steps[0]["metric"]
    for name in (s.VLLM_REQUESTS_RUNNING, s.VLLM_REQUESTS_WAITING,
                 s.VLLM_REQUESTS_WAITING_BY_REASON):
        assert prom.query(f"{name}{{{within}}}"), name

    queries = live.committed_queries()
    # the variables, run unscoped as Grafana runs them, offer this engine's values ...
    for q in queries:
        if q.kind == "variable" and q.name in ("$model", "$engine"):
            label = s.VLLM_LABEL_MODEL if q.name == "$model" else s.VLLM_LABEL_ENGINE
            metric = q.expr[len("label_values("):].split(",")[0]
            values = {x["metric"].get(label) for x in prom.query(f"count by ({label}) ({metric})")}
            assert (model if label == s.VLLM_LABEL_MODEL else engine) in values, (q.name, values)
    # ... and with them selected, every panel shows this engine (and only it)
    picked = {"model": model, "engine": engine}
    panels = [q for q in queries if q.kind == "panel"]
    problems = qc.check_live(prom, panels, **picked)
    assert not problems, "\n".join(problems)
    for q in panels:
        for row in prom.query(qc.substitute(q.expr, **picked)):
            inst = row["metric"].get("instance")
            assert inst in (None, within.split('"')[1]), (q.name, row["metric"])
    # rules over the whole target: the pending-at-idle join sees vLLM idle on the same target
    rules = [q for q in queries if q.kind in ("record", "alert")]
    problems = qc.check_live(prom, rules, within=within)
    assert not problems, "\n".join(problems)
    assert qc.alerts_with_data(prom, queries, within) == EXPECTED_ALERT_EXPRS[VLLM_SCENARIO]


def test_ongoing_scenarios_keep_stepping(reality):
    """The background scenarios advance their step counter while scraped (else rates lie)."""
    prom, targets = reality
    for name in sorted(ONGOING):
        within, run = targets[name]
        before = run.engine.steps
        assert scenarios.wait_until(lambda e=run.engine, n=before: e.steps > n, timeout=10), name
        rate = prom.query(f"rate({s.SCHEDULER_STEPS.name}{{{within}}}[1m])")
        assert rate and float(rate[0]["value"][1]) > 0, (name, rate)



# vLLM's native tiering series every tiered engine exports from its first lookup on (hit and
# failure counters appear only once something hits or fails: not on this engine).
NATIVE_ALWAYS = (s.VLLM_OFFLOAD_CONFIG_INFO, s.VLLM_TIERING_CHUNK_QUERIES,
                 s.VLLM_TIERING_ACTIVE_PROMOTIONS, s.VLLM_TIERING_ACTIVE_CASCADES,
                 s.VLLM_TIERING_PRIMARY_WRITE_USAGE, s.VLLM_PROMPT_TOKENS_CACHED_BY_SOURCE)


def test_native_series_follow_the_vllm_version(reality):
    """The overview's native row (dashboards/native.py) reads series only vLLM >= 0.33
    exports: there (kvscope installed) they are on vLLM's /metrics beside kvscope's,
    vllm:kv_offload_config_info included, and the row shows the engine; vLLM 0.26 exports
    none of them, the row stays empty. (test_queries_native.py runs every native panel
    against real 0.33 engines with hits and failures.)"""
    from kvscope.dashboards import native

    prom, targets = reality
    within, _run = targets[VLLM_ID]
    titles = {p.build().title for p in native.panels(live.DEFAULT)}
    panel_queries = [q for q in live.committed_queries()
                     if q.kind == "panel" and q.name.rsplit(" [", 1)[0] in titles]
    read = {n for q in panel_queries for n in qc.VLLM_NAME.findall(q.expr)}
    present = {n for n in read | set(NATIVE_ALWAYS) if prom.query(f"{n}{{{within}}}")}
    if not versions.at_least(s.VLLM_NATIVE_SINCE):
        assert present == set(), sorted(present)
        return
    assert set(NATIVE_ALWAYS) <= present, sorted(set(NATIVE_ALWAYS) - present)
    shown = {q.name.rsplit(" [", 1)[0] for q in panel_queries
             if prom.query(qc.scope(qc.substitute(q.expr), within))}
    blank_here = {native.tier_chunk_hit_ratio(live.DEFAULT).build().title,  # no hit yet
                  native.tier_job_failures(live.DEFAULT).build().title}  # nothing failed
    if not versions.at_least("0.34.0"):  # its series are 0.34's
        blank_here.add(native.deferred_releases(live.DEFAULT).build().title)
    assert shown == titles - blank_here, sorted(shown ^ (titles - blank_here))
