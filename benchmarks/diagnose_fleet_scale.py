"""kv-diagnose at fleet scale: ``--since 7d`` over a 512-rank engine through Prometheus.

Builds a real Prometheus TSDB holding seven days of one engine's kvscope series
(world size 512; shape and incidents in ``tests/support/fleet_history.py``) with
``promtool tsdb create-blocks-from openmetrics`` (one UTC day per input, one block each),
starts Prometheus on it (127.0.0.1), then times the real command an operator runs,

    kv-diagnose --prometheus URL --since 7d --json

end to end (process start to exit), ``--repeat`` times, and checks every run finds what
the history was built to show (the capacity ceiling of the last hours and the
eight-minute stuck transfer days earlier). Not a test.

    python benchmarks/diagnose_fleet_scale.py [--ranks 512] [--engines 1] [--days 7]
        [--interval 60] [--repeat 7] [--workdir DIR (kept; a TSDB already there is reused)]
        [--out benchmarks/results/diagnose_fleet_scale.json]

``--engines N`` (N > 1): N such engines of ``--ranks`` ranks each, every one with both
incidents, one instance each; the timed command adds ``--each-engine`` and every engine's
report must find both (64 engines x TP=8: ``--engines 64 --ranks 8``).

The history runs to ``--ahead`` seconds past the build's start, so the runs (minutes
later) see an engine that is alive up to their own ``now``; samples after ``now`` are
never read by a query at ``now``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvscope.exporters import signals as S  # noqa: E402
from tests.support.backfill import backfill  # noqa: E402
from tests.support.fleet_history import EXPECTED, History, Shape, chunks, write_chunk  # noqa: E402
from tests.support.prometheus import running_prometheus  # noqa: E402


def build(work: Path, shape: Shape, engines: int = 1) -> dict:
    """Backfill ``engines`` engines of ``shape`` (one instance each) into ``work/data``;
    returns what it is and what it cost."""
    histories = [History(dataclasses.replace(shape, instance=f"fleet-engine-{i}:8000"))
                 for i in range(engines)]

    def write(lo: float, hi: float, om) -> int:
        return sum(write_chunk(h, lo, hi, om, eof=i == len(histories) - 1, append=i > 0)
                   for i, h in enumerate(histories))

    t0 = time.perf_counter()
    samples = backfill(chunks(shape), write, work / "data", work,
                       lambda line: print(line, flush=True))
    meta = {"series": engines * sum(1 for _ in histories[0].series()), "samples": samples,
            "engines": engines,
            "start": shape.start, "end": shape.end, "interval_s": shape.interval,
            "world_size": shape.world_size, "stuck_from": shape.stuck_from,
            "ceiling_from": shape.ceiling_from, "build_s": round(time.perf_counter() - t0, 1)}
    (work / "history.json").write_text(json.dumps(meta, indent=1))
    return meta


def reusable(work: Path, args, now: float) -> dict | None:
    try:
        meta = json.loads((work / "history.json").read_text())
    except (OSError, ValueError):
        return None
    same = (meta["world_size"] == args.ranks and meta["interval_s"] == args.interval
            and meta.get("engines", 1) == args.engines
            and meta["start"] <= now - args.days * 86400 - 600 and meta["end"] >= now + 300)
    return meta if same else None


def own_metric(url: str, name: str) -> float:
    """One unlabelled series of Prometheus' own /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return math.nan


def prometheus_cpu(url: str) -> float:
    return own_metric(url, "process_cpu_seconds_total")


def wait_compacted(url: str, timeout: float = 1200.0) -> float:
    """Wait until Prometheus has compacted the backfilled blocks (into 54 h ones: its
    max block duration is 10% of the retention), as a long-running Prometheus has: its
    compaction loop runs once a minute, so done = one whole run that compacted nothing.
    Returns the seconds waited."""
    t0 = time.monotonic()
    ticks: list[tuple[float, float]] = []  # (triggered, compactions) at each new trigger
    while time.monotonic() - t0 < timeout:
        trig = own_metric(url, "prometheus_tsdb_compactions_triggered_total")
        done = own_metric(url, "prometheus_tsdb_compactions_total")
        if not ticks or trig > ticks[-1][0]:
            ticks.append((trig, done))
            # the loop runs one compaction at a time: a trigger after one that changed
            # nothing means that whole run found nothing to compact
            if len(ticks) >= 3 and ticks[-1][1] == ticks[-2][1]:
                return time.monotonic() - t0
        time.sleep(1.0)
    raise SystemExit(f"Prometheus still compacting after {timeout:.0f} s")


def findings(out: str) -> list[list[str]]:
    """The verdict ids of each engine's report (``--each-engine``) or of the one report."""
    try:
        doc = json.loads(out)
    except ValueError:
        return []
    if doc.get("each_engine"):
        return [[v["id"] for v in e.get("report", {}).get("verdicts", [])]
                for e in doc.get("engines", [])]
    return [[v["id"] for v in doc.get("verdicts", [])]]


def timed(cmd: list[str], repeat: int, prom_url: str, engines: int = 1) -> list[dict]:
    """``cmd`` once to warm up (Prometheus' page cache, Python's bytecode), then ``repeat``
    timed runs, process start to exit; each with its exit code, findings and the CPU
    seconds kv-diagnose and Prometheus spent (on a shared machine, wall time is also
    other people's work; CPU time is this run's)."""
    runs = []
    for i in range(repeat + 1):
        ru0, pc0 = resource.getrusage(resource.RUSAGE_CHILDREN), prometheus_cpu(prom_url)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        ru1, pc1 = resource.getrusage(resource.RUSAGE_CHILDREN), prometheus_cpu(prom_url)
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        per_engine = findings(p.stdout)
        # every engine was built with both incidents: each must be found in each
        ok = (p.returncode == 1 and len(per_engine) == engines
              and all(e in found for found in per_engine for e in EXPECTED))
        found = sorted({f for fs in per_engine for f in fs})
        print(f"{cmd[0]}: {dt:.3f} s exit {p.returncode} {len(per_engine)} report(s) {found} "
              f"{p.stderr.strip()[-200:]}", flush=True)
        if i:
            runs.append({"seconds": round(dt, 3), "cpu_s": round(cpu, 3),
                         "prometheus_cpu_s": round(pc1 - pc0, 2), "exit": p.returncode,
                         "findings": found, "ok": ok,
                         **({"stderr": p.stderr.strip()[-300:]} if p.stderr else {})})
    return runs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--engines", type=int, default=1,
                    help="engines of --ranks ranks each (instances fleet-engine-0..N-1:8000); "
                         "more than one: the timed command adds --each-engine")
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--interval", type=int, default=60, help="seconds between samples")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--ahead", type=float, default=1800.0)
    ap.add_argument("--workdir")
    ap.add_argument("--nice", type=int, default=0,
                    help="niceness for Prometheus and kv-diagnose (children inherit it); below "
                         "0 (root) keeps a shared machine's other jobs off the timing")
    ap.add_argument("--baseline", metavar="KV_DIAGNOSE",
                    help="also time this kv-diagnose (e.g. another checkout's venv) the same way")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/diagnose_fleet_scale.json"))
    a = ap.parse_args()
    if a.nice:
        os.nice(a.nice)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="kvdiag-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    now = time.time()
    meta = reusable(work, a, now)
    if meta is None:
        shutil.rmtree(work / "data", ignore_errors=True)
        # 10 minutes of history before the window: the first point has its lookback
        shape = Shape(end=float(int(now + a.ahead)), span=a.days * 86400 + a.ahead + 600,
                      interval=a.interval, world_size=a.ranks)
        meta = build(work, shape, a.engines)
    print(f"history: {meta['series']:,} series, {meta['samples']:,} samples "
          f"(built in {meta.get('build_s', '?')} s)")
    exe = shutil.which("kv-diagnose", path=str(Path(sys.executable).parent)) or "kv-diagnose"
    with running_prometheus([], workdir=work, retention="30d", timeout=120) as prom:
        # the oldest block is open once a query reaches it
        prom.wait_for(f"{S.SCHEDULER_STEPS.name} offset {int(a.days)}d", timeout=120)
        print("waiting for Prometheus to compact the backfilled blocks ...", flush=True)
        meta["compaction_wait_s"] = round(wait_compacted(prom.url), 1)
        each = ["--each-engine"] if a.engines > 1 else []
        args = ["--prometheus", prom.url, "--since", f"{a.days:g}d", *each, "--json"]
        load_before = os.getloadavg()
        runs = timed([exe, *args], a.repeat, prom.url, a.engines)
        baseline = (timed([a.baseline, *args], a.repeat, prom.url, a.engines) if a.baseline
                    else None)
    lat = [r["seconds"] for r in runs]
    result = {
        "benchmark": "diagnose_fleet_scale",
        "command": "python " + shlex.join(["benchmarks/diagnose_fleet_scale.py", *sys.argv[1:]]),
        "timed_command": shlex.join(["kv-diagnose", "--prometheus", "URL", "--since",
                                     f"{a.days:g}d", *each, "--json"]),
        "history": meta,
        "expected_findings": list(EXPECTED),
        "median_s": round(statistics.median(lat), 3),
        "max_s": round(max(lat), 3),
        "median_cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 3),
        "median_prometheus_cpu_s": round(statistics.median(r["prometheus_cpu_s"] for r in runs), 2),
        "all_verdicts_ok": all(r["ok"] for r in runs),
        "runs": runs,
        **({"baseline": {"kv_diagnose": a.baseline, "runs": baseline}} if baseline else {}),
        "machine": {"nproc": os.cpu_count(), "nice": os.nice(0), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg(),
                    "python": platform.python_version(),
                    "prometheus": subprocess.run(["prometheus", "--version"], capture_output=True,
                                                 text=True).stdout.splitlines()[0]},
        "date": time.strftime("%F %T UTC", time.gmtime()),
    }
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"median {result['median_s']} s, max {result['max_s']} s (CPU: kv-diagnose "
          f"{result['median_cpu_s']} s, Prometheus {result['median_prometheus_cpu_s']} s), "
          f"verdicts ok: {result['all_verdicts_ok']} -> {a.out}")
    if not a.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if result["all_verdicts_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
