"""Shared steps of the live query checks (stand-in exporter and real vLLM scenarios).

All live checks of this folder share one Prometheus (``conftest.live_pool``): its service
discovery alone takes ~5 s before the first scrape, so it is started once per session with
``SLOTS`` target ports reserved, and each module starts its exporters on ports it claims. Every
check is narrowed to its own targets (``querycheck.scope``), so targets do not see each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from kvscope.dashboards import artifacts as g
from kvscope.dashboards.config import DEFAULT
from tests.support import querycheck as qc
from tests.support.prometheus import (
    HOST,
    RESTORE_VLLM_COLONS,
    Prometheus,
    free_port,
    running_prometheus,
)

# How often Prometheus scrapes and evaluates in these tests: rate() needs two samples and the
# checks wait for five, so this decides how long a test waits for data.
INTERVAL = "500ms"
# The rules Prometheus evaluates in these tests: the committed expressions, evaluated every
# INTERVAL instead of every minute so recorded series exist within seconds.
FAST = dataclasses.replace(DEFAULT, rule_interval=INTERVAL)


def write_fast_rules(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / g.RULES_FILE
    path.write_text(g.render_rules(FAST)[g.RULES_FILE])
    return path


def committed_queries() -> list[g.Query]:
    """Queries of the committed files (what users deploy), not of a fresh render."""
    return g.queries_from({n: (g.GENERATED_DIR / n).read_text() for n in g.render()})


@dataclasses.dataclass(frozen=True)
class Target:
    """One scrape target of the pool: serve /metrics on ``port``; ``within`` selects it."""

    name: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/metrics"

    @property
    def instance(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def within(self) -> str:
        return f'instance="{self.instance}"'


SLOTS = 40


@dataclasses.dataclass
class Pool:
    prom: Prometheus
    free: list[int]
    claimed: dict[str, Target] = dataclasses.field(default_factory=dict)

    def claim(self, name: str) -> Target:
        if name not in self.claimed:
            if not self.free:
                raise RuntimeError(f"all {SLOTS} target slots claimed; raise live.SLOTS")
            self.claimed[name] = Target(name, self.free.pop(0))
        return self.claimed[name]


@contextmanager
def pool(workdir: Path) -> Iterator[Pool]:
    """Prometheus scraping ``SLOTS`` reserved ports (down until someone serves on them), with
    the committed rules evaluated every ``INTERVAL``."""
    ports: list[int] = []
    while len(ports) < SLOTS:
        port = free_port()
        if port not in ports:
            ports.append(port)
    rules = write_fast_rules(workdir / "rules")
    with running_prometheus(
        [f"http://{HOST}:{p}/metrics" for p in ports], [rules], workdir=workdir / "prom",
        wait_targets=False, scrape_interval=INTERVAL, evaluation_interval=INTERVAL,
        # Prometheus 2.x + prometheus_client 0.26 store vllm:* as vllm_* (see there)
        metric_relabel_configs=RESTORE_VLLM_COLONS,
    ) as prom:
        yield Pool(prom, ports)


def wait_for_data(prom: Prometheus, targets: Sequence[Target], timeout: float = 60.0) -> None:
    """Until each target is up with >= 3 scrapes of the scheduler's step counter, every rule
    was evaluated, and then >= 5 scrapes (so rate()-based records have two points)."""
    instances = "|".join(qc.regex_escape(t.instance) for t in targets)
    up = f'count(up{{instance=~"{instances}"}} == 1)'
    steps = (f"count(count_over_time({qc.s.SCHEDULER_STEPS.name}"
             f'{{instance=~"{instances}"}}[1m]) >= %d)')

    def all_targets(r) -> bool:
        return bool(r) and float(r[0]["value"][1]) >= len(targets)

    prom.wait_for(up, all_targets, timeout=timeout)
    prom.wait_for(steps % 3, all_targets, timeout=timeout)

    def evaluated(_result) -> bool:
        groups = prom.rules()
        return bool(groups) and all(r.get("lastEvaluation", "").startswith("20")
                                    and r.get("health") == "ok"
                                    for grp in groups for r in grp["rules"])

    prom.wait_for("vector(1)", evaluated, timeout=timeout)
    prom.wait_for(steps % 5, all_targets, timeout=timeout)


def exported_unknown_names(prom: Prometheus, within: str = "") -> set[str]:
    """kvscope_* series names Prometheus scraped that the contract does not list."""
    sel = "{" + ",".join(m for m in ('__name__=~"kvscope_.+"', within) if m) + "}"
    got = {r["metric"]["__name__"] for r in prom.query(f"count by (__name__) ({sel})")}
    return {n for n in got if n not in qc.KNOWN_SERIES and not n.endswith("_created")}
