"""Verdict latency of kv-diagnose on a 24 h window, 64 ranks x 4 KV groups.

Backfills a synthetic-but-contract-shaped history (a capacity ceiling starting at hour 20)
into a fresh TSDB with ``promtool tsdb create-blocks-from openmetrics``, starts a real
Prometheus on it (127.0.0.1), then times ``kv-diagnose --prometheus ... --since 24h`` and
``kv-diagnose --bundle`` (the same window recorded). Not a test.

    python benchmarks/diagnose_latency.py [--resolution 60] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvscope.diagnostics.cli import diagnose_bundle, diagnose_prometheus  # noqa: E402
from kvscope.diagnostics.sources.bundle import write_bundle  # noqa: E402
from kvscope.diagnostics.sources.prometheus import prometheus_window  # noqa: E402
from kvscope.exporters import signals as S  # noqa: E402
from tests.support.prometheus import running_prometheus  # noqa: E402

RANKS, GROUPS, ROWS = 64, 4, 4096


def write_openmetrics(path: Path, end: float, resolution: int) -> int:
    start = end - 86400
    ts = list(range(int(start), int(end) + 1, resolution))
    lines: list[str] = []
    n = 0

    def fam(name, kind, series):  # series: list[(labels str, fn(i, t) -> value)]
        nonlocal n
        base = name[: -len("_total")] if kind == "counter" else name
        lines.append(f"# TYPE {base} {kind}")
        for labels, fn in series:
            n += 1
            for i, t in enumerate(ts):
                sel = f"{{{labels}}}" if labels else ""
                lines.append(f"{name}{sel} {fn(i, t)} {t}")

    ceiling_from = len(ts) * 20 // 24
    fam(S.LOOKUP_ROUNDS.name, "counter", [
        ('verdict="hit"', lambda i, t: 10 * min(i, ceiling_from)),
        ('verdict="vetoed"', lambda i, t: 5 * max(0, i - ceiling_from)),
        ('verdict="miss"', lambda i, t: 2 * i),
    ])
    fam(S.ROUNDS_AT_ROW_CEILING.name, "counter",
        [('verdict="vetoed"', lambda i, t: 5 * max(0, i - ceiling_from))])
    fam(S.LOOKUPS.name, "counter", [
        (f'kv_group="{g}",result="{r}"', lambda i, t: 100 * i)
        for g in range(GROUPS) for r in ("hit", "miss", "retry")
    ])
    fam(S.PRIMARY_ROWS.name, "gauge", [('state="total"', lambda i, t: ROWS)])
    fam(S.LAST_ROUND_PENDING_KEYS.name, "gauge", [('verdict="vetoed"', lambda i, t: ROWS)])
    fam(S.CASCADES.name, "counter", [('result="completed"', lambda i, t: 50 * i)])
    fam(S.SCHEDULER_STEPS.name, "counter", [("", lambda i, t: 1000 * i)])
    fam(S.LAST_STEP_TIMESTAMP.name, "gauge", [("", lambda i, t: t)])
    fam(S.INFO.name, "gauge", [('hash_seed="0",primary_rows="4096",tiers="cpu+fs",kvscope_version="0.1.0"', lambda i, t: 1)])
    fam(S.TRANSFER_BYTES.name, "counter", [
        (f'rank="{r}",direction="{d.value}"', lambda i, t: 4096 * i)
        for r in range(RANKS) for d in S.Direction
    ])
    fam(S.TRANSFERS_IN_FLIGHT.name, "gauge", [
        (f'rank="{r}",direction="{d.value}"', lambda i, t: 0) for r in range(RANKS) for d in S.Direction
    ])
    fam(S.ROW_CHECKSUMS.name, "counter", [(f'rank="{r}",outcome="match"', lambda i, t: i) for r in range(RANKS)])
    fam(S.WORKER_LAST_STEP_TIMESTAMP.name, "gauge", [(f'rank="{r}"', lambda i, t: t) for r in range(RANKS)])
    lines.append("# EOF")
    path.write_text("\n".join(lines) + "\n")
    return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--resolution", type=int, default=60, help="seconds between backfilled samples")
    ap.add_argument("--workdir")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="kvdiag-bench-"))
    end = float(int(time.time()) - 120)
    om = work / "history.om"
    t0 = time.perf_counter()
    n = write_openmetrics(om, end, a.resolution)
    print(f"wrote {n} series x {86400 // a.resolution + 1} samples in {time.perf_counter() - t0:.1f} s")
    data = work / "data"
    t0 = time.perf_counter()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
                   check=True, stdout=subprocess.DEVNULL)
    print(f"promtool backfill {time.perf_counter() - t0:.1f} s")
    om.unlink()
    with running_prometheus([], workdir=work) as prom:
        # running_prometheus uses <workdir>/data as its TSDB: the backfilled blocks
        prom.wait_for(S.SCHEDULER_STEPS.name + "[1d]", timeout=60)  # blocks loaded
        lat = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            rep = diagnose_prometheus(prom.url, end - 86400, end, timeout=30)
            lat.append(time.perf_counter() - t0)
        print(f"prometheus 24h: top={rep.top.id} median {statistics.median(lat):.3f} s, max {max(lat):.3f} s")
        raw = prometheus_window(prom.url, end - 86400, end, timeout=30)
    bundle = work / "bench.kvb"
    write_bundle(raw, str(bundle))
    blat = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        brep = diagnose_bundle(str(bundle))
        blat.append(time.perf_counter() - t0)
    print(f"bundle ({bundle.stat().st_size / 1e6:.1f} MB, {len(raw.series)} series): top={brep.top.id} "
          f"median {statistics.median(blat):.3f} s, max {max(blat):.3f} s")
    if not a.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
