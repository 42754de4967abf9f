"""The fault campaigns replayed in VictoriaMetrics, next to Prometheus (``campaign_replay.py``).

1. Every sample of each recording (``tests/fixtures/campaign*/*.om.gz``, the samples
   ``promtool tsdb create-blocks-from openmetrics`` backfills into Prometheus) is imported
   through ``/api/v1/import/prometheus`` into a fresh ``victoria-metrics``.
2. The recording rules, then the alert rules (:data:`campaign_replay.CAMPAIGN_CONFIG`), are
   evaluated over the recorded span by ``vmalert -replay.*`` (vmalert's own backfill, the
   counterpart of ``promtool tsdb create-blocks-from rules``), which writes the recorded series
   and vmalert's ``ALERTS`` / ``ALERTS_FOR_STATE`` back into VictoriaMetrics.
3. :func:`vmalert_firing` reads which alerts vmalert fired in a window, in the shape of
   :func:`campaign_replay.firing` (the query_range emulation used against Prometheus).

    python -m tests.support.campaign_replay_vm [DIR ...]   # alerts per phase: Prometheus vs vmalert

An alert "from before" (still firing as a phase starts) depends on where the evaluation grid
falls (vmalert's starts at ``-replay.timeFrom``, the emulation's at each phase's start), so
only the alerts that started in a phase are compared.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

from kvscope import durations
from kvscope.dashboards import rules as r
from kvscope.dashboards.config import Config
from tests.support import campaign_replay as replay

# Labels vmalert adds to ALERTS beyond the expression's own (and the rule's static labels).
_VMALERT_LABELS = {"__name__", "alertname", "alertstate", "alertgroup"}


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def vmalert_replay(vm, rule_file: Path, start: float, end: float, cfg: Config) -> None:
    """Evaluate ``rule_file`` over [start, end] with ``vmalert -replay`` into ``vm``.

    ``-datasource.queryStep=0s``: vmalert otherwise sends step=5m with every range query of
    the replay, i.e. one evaluation per 5 minutes instead of one per group interval (seen on
    1.79.5: one sample per series). ``-replay.rulesDelay=0s``: no rule of a group reads
    another's output; the recording group is replayed (and flushed) before the alert group.
    """
    p = subprocess.run(
        ["vmalert", f"-rule={rule_file}", f"-datasource.url={vm.url}",
         f"-remoteWrite.url={vm.url}", f"-replay.timeFrom={_iso(start)}",
         f"-replay.timeTo={_iso(end)}", "-replay.disableProgressBar",
         "-replay.rulesDelay=0s", "-datasource.queryStep=0s",
         f"-evaluationInterval={cfg.rule_interval}", "-httpListenAddr=127.0.0.1:0",
         "-loggerLevel=WARN"],
        capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"vmalert replay of {rule_file.name} failed:"
                           f" {(p.stdout + p.stderr)[-2000:]}")
    vm.flush()


def _rules_file(path: Path, group: dict) -> Path:
    path.write_text(yaml.safe_dump({"groups": [group]}, sort_keys=False))
    return path


@contextlib.contextmanager
def replayed_vm(dirs: Sequence[Path] = replay.CAMPAIGN_DIRS,
                cfg: Config = replay.CAMPAIGN_CONFIG,
                workdir: Path | None = None) -> Iterator[object]:
    """A real VictoriaMetrics over the recordings, the recorded series and vmalert's alerts."""
    from tests.support.victoriametrics import running_victoriametrics

    owned = workdir is None
    root = Path(tempfile.mkdtemp(prefix="kvscope-replay-vm-") if owned else workdir)
    try:
        with running_victoriametrics(workdir=root) as vm:
            for rec in replay.recordings(dirs):
                vm.import_openmetrics(rec)
            vm.flush()
            # the same window promtool backfills the recording rules over
            start, end = replay.span(dirs)
            start, end = int(start) - 60, int(end) + 60
            groups = r.rules(cfg)["groups"]
            for i, group in enumerate(groups):
                vmalert_replay(vm, _rules_file(root / f"rules-{i}.yaml", group), start, end, cfg)
            yield vm
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)


def vmalert_firing(vm, start: float, end: float,
                   cfg: Config = replay.CAMPAIGN_CONFIG) -> list[replay.Firing]:
    """Alerts vmalert had firing in [start, end], read from its ALERTS series the way
    :func:`campaign_replay.firing` reads an expression: ``active_from`` is where the unbroken
    run of pending/firing samples that the first firing one belongs to began (looked for from
    ``start - for - interval``, as there; ALERTS_FOR_STATE exists only for rules with a
    ``for:``)."""
    step = durations.seconds(cfg.rule_interval)
    static = {k for rule in r.alert_rules(cfg) for k in rule.get("labels", {})}
    out: list[replay.Firing] = []
    for rule in r.alert_rules(cfg):
        lookback = start - durations.seconds(rule.get("for", "0s")) - step
        span = f"{(end - lookback) * 1000:.0f}ms"  # raw samples in (lookback, end]
        samples: dict[tuple, dict[float, str]] = {}
        for s in vm.query(f'ALERTS{{alertname="{rule["alert"]}"}}[{span}]', at=end):
            labels = tuple(sorted((k, v) for k, v in s["metric"].items()
                                  if k not in _VMALERT_LABELS | static))
            for t, _ in s["values"]:
                samples.setdefault(labels, {})[float(t)] = s["metric"]["alertstate"]
        for labels, states in samples.items():
            run_start = prev = None
            for t in sorted(states):
                if prev is None or t - prev > step * 1.5:
                    run_start = t  # a gap: the alert went back to inactive
                prev = t
                if t >= start and states[t] == "firing":
                    out.append(replay.Firing(rule["alert"], dict(labels), t, run_start))
                    break
    return sorted(out, key=lambda f: f.since)


def per_phase(firings: list[replay.Firing], phase: dict) -> tuple[list[str], list[str]]:
    """(alerts that started in the phase, alerts still firing from before), first seen first."""
    started, carried = [], []
    for f in firings:
        names = started if f.active_from >= phase["start"] else carried
        if f.alert not in names:
            names.append(f.alert)
    return started, carried


def main() -> int:
    dirs = [Path(a) for a in sys.argv[1:]] or list(replay.CAMPAIGN_DIRS)
    with replay.replayed(dirs) as prom, replayed_vm(dirs) as vm:
        for phase in replay.phases(dirs):
            if "error" in phase:
                continue
            a = per_phase(replay.firing(prom, phase["start"], phase["end"]), phase)
            b = per_phase(vmalert_firing(vm, phase["start"], phase["end"]), phase)
            print(f"{phase['run']:>22} {phase['name']:<16} prometheus {a[0]} (from before"
                  f" {a[1]}), vmalert {b[0]} (from before {b[1]})"
                  + ("" if a[0] == b[0] else "   STARTED DIFFERENTLY"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
