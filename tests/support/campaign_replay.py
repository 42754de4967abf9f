"""Replay a GPU fault campaign's recordings in a real Prometheus, here, without a GPU.

1. ``promtool tsdb create-blocks-from openmetrics`` backfills each recording
   (``tests/fixtures/campaign*/*.om.gz``, written by the benchmarks ``gpu_campaign.py`` and
   ``cpu_campaign.py``) into a fresh TSDB; a real ``prometheus`` serves it.
2. The recording rules are backfilled the same way Prometheus evaluates them
   (``promtool tsdb create-blocks-from rules`` against that Prometheus), and it is
   restarted over both.
3. Alerts: each alert rule's expression is evaluated with ``query_range`` at the
   rule interval over the recorded span, and an alert fires once its expression
   held for the rule's whole ``for:`` (Prometheus' pending -> firing).

The campaign's runs last minutes, not the production windows (``for: 10m``), so
the rules are generated with :data:`CAMPAIGN_CONFIG`: the same expressions, with
windows scaled to the run.

    python -m tests.support.campaign_replay [DIR ...]   # prints the alerts per phase
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from kvscope import durations
from kvscope.dashboards import rules as r
from kvscope.dashboards.config import DEFAULT, Config

ROOT = Path(__file__).resolve().parents[2]
# Two H200s through `vllm serve` (gpu_campaign.py); one H200, TP=1, through `vllm serve`
# (gpu_campaign.py --tp 1); vLLM's scheduler on CPU (cpu_campaign.py)
FIXTURES = ROOT / "tests" / "fixtures"
CAMPAIGN_DIRS = (FIXTURES / "campaign", FIXTURES / "campaign-h200", FIXTURES / "campaign-cpu")

CAMPAIGN_CONFIG: Config = replace(
    DEFAULT, rate_window="20s", rule_interval="5s", pending_at_idle_for="15s",
    capacity_ceiling_for="20s", checksum_mismatch_window="20s",
    stores_without_restores_window="60s", stores_without_restores_for="30s",
    stale_stats_seconds=30, stale_stats_for="20s", tier_write_failures_window="20s",
    tier_write_failures_for="10s", tier_data_lost_window="20s",
    transfer_stuck_after_s=10, transfer_stuck_for="5s")

@dataclass(frozen=True)
class Firing:
    alert: str
    labels: dict
    since: float  # when it fired (expression true for the whole for:), or the window start
    active_from: float  # when its expression became true (before the window: carried over)


def recordings(dirs: Sequence[Path] = CAMPAIGN_DIRS) -> list[Path]:
    return sorted(p for d in dirs for p in d.glob("*.om.gz"))


def phases(dirs: Sequence[Path] = CAMPAIGN_DIRS) -> list[dict]:
    """Every phase of every run, with ``run`` set to the run's name."""
    out = []
    for path in sorted(p for d in dirs for p in d.glob("*.json")):
        run = json.loads(path.read_text())
        for phase in run.get("phases", []):
            if "start" in phase:
                out.append({**phase, "run": path.stem})
    return out


def span(dirs: Sequence[Path] = CAMPAIGN_DIRS) -> tuple[float, float]:
    ps = phases(dirs)
    return min(p["start"] for p in ps), max(p["end"] for p in ps)


def backfill_openmetrics(recording: Path, data_dir: Path) -> None:
    with tempfile.NamedTemporaryFile("wb", suffix=".om", delete=False) as tmp:
        with gzip.open(recording, "rb") as src:
            shutil.copyfileobj(src, tmp)
    try:
        _promtool("tsdb", "create-blocks-from", "openmetrics", tmp.name, str(data_dir))
    finally:
        os.unlink(tmp.name)


def _promtool(*args: str) -> None:
    p = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"promtool {' '.join(args[:3])} failed: {(p.stdout + p.stderr)[-2000:]}")


def recording_rules_file(cfg: Config, path: Path) -> Path:
    doc = {"groups": [{"name": r.RECORDING_GROUP, "interval": cfg.rule_interval,
                       "rules": r.recording_rules(cfg)}]}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@contextlib.contextmanager
def replayed(dirs: Sequence[Path] = CAMPAIGN_DIRS, cfg: Config = CAMPAIGN_CONFIG,
             workdir: Path | None = None) -> Iterator[object]:
    """A real Prometheus over the backfilled recordings and recording rules."""
    from tests.support.prometheus import running_prometheus

    owned = workdir is None
    root = Path(tempfile.mkdtemp(prefix="kvscope-replay-") if owned else workdir)
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    try:
        for rec in recordings(dirs):
            backfill_openmetrics(rec, data)
        start, end = span(dirs)
        with running_prometheus(workdir=root) as prom:
            rules = recording_rules_file(cfg, root / "recording.yaml")
            _promtool("tsdb", "create-blocks-from", "rules", f"--start={int(start) - 60}",
                      f"--end={int(end) + 60}", f"--url={prom.url}",
                      f"--output-dir={root / 'rules-blocks'}",
                      f"--eval-interval={cfg.rule_interval}", str(rules))
        for block in (root / "rules-blocks").iterdir():
            if block.is_dir():
                shutil.move(str(block), data / block.name)
        with running_prometheus(workdir=root) as prom:
            yield prom
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)


def firing(prom, start: float, end: float, cfg: Config = CAMPAIGN_CONFIG) -> list[Firing]:
    """Alerts that fire in [start, end]: expression true at every evaluation for ``for:``."""
    step = durations.seconds(cfg.rule_interval)
    out: list[Firing] = []
    for rule in r.alert_rules(cfg):
        hold = durations.seconds(rule.get("for", "0s"))
        lookback = start - hold - step
        for series in prom.query_range(rule["expr"], lookback, end, step):
            run_start = None
            prev = None
            for t, _ in series["values"]:
                t = float(t)
                if prev is None or t - prev > step * 1.5:
                    run_start = t  # a gap: the alert went back to inactive
                prev = t
                if t >= start and t - run_start >= hold:
                    out.append(Firing(rule["alert"], series["metric"], t, run_start))
                    break
    return sorted(out, key=lambda f: f.since)


def main() -> int:
    dirs = [Path(a) for a in sys.argv[1:]] or list(CAMPAIGN_DIRS)
    with replayed(dirs) as prom:
        for phase in phases(dirs):
            if "error" in phase:
                print(f"{phase['run']:>22} {phase['name']:<16} (server dead: {phase['error']})")
                continue
            started, carried = [], []
            for f in firing(prom, phase["start"], phase["end"]):
                names = started if f.active_from >= phase["start"] else carried
                if f.alert not in names:
                    names.append(f.alert)
            print(f"{phase['run']:>22} {phase['name']:<16} fired {started}"
                  + (f", still firing from before: {carried}" if carried else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
