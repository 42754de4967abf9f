"""The livelock kv-diagnose must name when a deferred request that fits the primary tier
evicts its own rows: judged against what vLLM's real scheduler did on the CPU harness.

The workload is the CI plan check's (tests/connector/test_plan_verify.py) short of its plan:
24 prompts of 1,024 tokens re-asked at once through 1,396 primary rows (64 per restore; 21 fit whole at once).
On vLLM 0.33 the first re-ask stays deferred for good: each step it promotes two of its last
three chunks, and the allocation evicts the third, its own (the primary tier's lookup does
not refresh a hit's place in the LRU order; docs/measured-facts.md names the recorded cycle),
two promotions a step, far below the churn rate of the
classic livelock (a request larger than the tier). On vLLM 0.26 every re-ask ends.

A second geometry: two KV groups, where the re-ask cut by the cross-group AND leaves the
others deferred for good on 0.33 (the classic churn form).

The engine keeps stepping while kv-diagnose scrapes it, as a server would; the verdict must
follow the engine: the livelock named if and only if a re-ask is still unfinished.
"""

from __future__ import annotations

import threading

import pytest

vllm = pytest.importorskip("vllm")

from kvscope.diagnostics.classifiers.capacity_ceiling_livelock import (  # noqa: E402
    ChurnFacts,
    OwnRowsFacts,
)
from kvscope.diagnostics.sources.scrape import scrape_window  # noqa: E402
from kvscope.diagnostics.verdict.diagnose import diagnose_raw  # noqa: E402
from kvscope.exporters.prometheus import start_exporter  # noqa: E402
from kvscope.sim.cpu_engine import CPUEngine  # noqa: E402
from kvscope.sim.plan_workload import ASK_TOKENS, Workload, ask_each, flood  # noqa: E402

LIVELOCK = "capacity_ceiling_livelock"
CASES = {
    # the CI plan check's workload short of its plan: the first re-ask evicts its own rows (0.33)
    # (work, rows, the livelock's tell, most re-asks that may be left unfinished)
    "one-group-24": (Workload(concurrency=24, prompt_tokens=1024), 1396,
                     lambda x: isinstance(x, OwnRowsFacts) and x.primary_rows == 1396
                     and x.request_keys <= x.primary_rows, 11),  # fits: most re-asks end
    # two KV groups, rows for 3 of 4 whole and 40 more: the 4th is cut by the cross-group AND
    # (group 1 finds no row), and on 0.33 the other three are deferred for good while their
    # promotions churn (tests/connector/test_plan_verify.py checks the cut against the model)
    "two-groups-4": (Workload(concurrency=4, prompt_tokens=1024, kv_groups=2), 424,
                     lambda x: isinstance(x, ChurnFacts) and x.per_step is not None,
                     3),  # promotions churn; the cut re-ask ends
}


@pytest.mark.vllm
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_livelock_verdict_follows_the_engine(case):
    work, rows, tell, most_stuck = CASES[case]
    engine = CPUEngine(work.engine_config(rows))
    stop, stepper, exporter = threading.Event(), None, None
    try:
        ask_each(engine, work)
        flood(engine, work, 0)
        rids = [engine.add_request(p, ASK_TOKENS) for p in work.prompts()]
        try:
            engine.run_until_done(rids, max_steps=work.step_budget())
        except TimeoutError:
            for _ in range(20):  # a stuck re-ask: the engine steps on, as a server's does
                engine.step()
        stuck = [r for r in rids if r not in engine.finished]
        engine.refresh()

        def step_on() -> None:
            while not stop.wait(0.02):
                engine.step()

        stepper = threading.Thread(target=step_on, daemon=True)
        stepper.start()
        exporter = start_exporter([engine.connector.kvscope_recorder]
                                  + [r.connector.kvscope_recorder for r in engine.ranks], 0)
        report = diagnose_raw(scrape_window([exporter.url], 2.0))
    finally:
        stop.set()
        if stepper is not None:
            stepper.join(timeout=10)
        if exporter is not None:
            exporter.close()
        engine.close()

    found = {f.id: f for f in report.verdicts}
    assert len(stuck) <= most_stuck, stuck  # the wave ran
    assert (LIVELOCK in found) == bool(stuck), (stuck, list(found))
    if stuck:
        f = found[LIVELOCK]
        assert tell(f.facts), f.facts
        assert f.facts.deferred_now == len(stuck), f.facts
    if case == "two-groups-4":  # the cut: the concurrency form, group 1's miss named
        f = found["capacity_ceiling_concurrency"]
        groups = f.facts.ceiling_groups
        assert "1" in [g.group for g in groups.no_free_row + groups.group_veto], f.facts
