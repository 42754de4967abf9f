"""Shared steps of the live query checks (stand-in exporter and real vLLM scenarios)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvscope.dashboards import artifacts as g
from kvscope.dashboards.config import DEFAULT

from tests.support import querycheck as qc
from tests.support.prometheus import Prometheus

# The rules Prometheus evaluates in these tests: the committed expressions, evaluated every
# second instead of every minute so recorded series exist within seconds.
FAST = dataclasses.replace(DEFAULT, rule_interval="1s")


def write_fast_rules(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / g.RULES_FILE
    path.write_text(g.render_rules(FAST)[g.RULES_FILE])
    return path


def committed_queries() -> list[g.Query]:
    """Queries of the committed files (what users deploy), not of a fresh render."""
    return g.queries_from({n: (g.GENERATED_DIR / n).read_text() for n in g.render()})


def wait_for_data(prom: Prometheus, timeout: float = 60.0) -> None:
    """Until >= 3 scrapes of the scheduler's counters exist and every rule was evaluated."""
    steps = f"count_over_time({qc.s.SCHEDULER_STEPS.name}[1m])"
    prom.wait_for(steps, lambda r: bool(r) and float(r[0]["value"][1]) >= 3, timeout=timeout)

    def evaluated(_result) -> bool:
        groups = prom.rules()
        return bool(groups) and all(r.get("lastEvaluation", "").startswith("20")
                                    and r.get("health") == "ok"
                                    for grp in groups for r in grp["rules"])

    prom.wait_for("vector(1)", evaluated, timeout=timeout)
    # two evaluations after the third scrape, so rate()-based records have two points
    prom.wait_for(steps, lambda r: bool(r) and float(r[0]["value"][1]) >= 5, timeout=timeout)


def exported_unknown_names(prom: Prometheus) -> set[str]:
    """kvscope_* series names Prometheus scraped that the contract does not list."""
    got = {r["metric"]["__name__"] for r in prom.query('count by (__name__) ({__name__=~"kvscope_.+"})')}
    return {n for n in got if n not in qc.KNOWN_SERIES and not n.endswith("_created")}
