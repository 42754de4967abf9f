"""Soak: continuous mixed traffic on vLLM's real scheduler on CPU; kvscope's memory stays flat.

    python -m kvscope.sim.soak [--preset full|short] [--duration-s 3720]
        [--sample-interval-s 60] [--warmup-fraction 0.1] [--max-rss-growth 0.05]
        [--fs-dir /var/tmp] [--out benchmarks/results/soak_cpu]

One engine (kvscope.sim.cpu_engine: vLLM's Scheduler, kvscope's connector, the tiering
manager with its fs tier in a directory on disk, CPU copies for the GPU's DMA) runs the
cycles of ``soak_phases`` (long shared prefixes, floods, re-asks restored from disk, a row
ceiling) until ``--duration-s`` has passed, ending at the end of a phase, then drains. Between
two steps, once ``--sample-interval-s`` has passed since the last sample, it samples
(``soak_probe``): the process's RSS, the aggregator's journal length (now and its largest
since the last sample), the series kvscope's endpoints export, kvscope_telemetry_errors_total,
the pending gauges and the sizes of kvscope's scheduler-side containers. A thread scrapes
the endpoints every ``--scrape-interval-s`` meanwhile, as Prometheus would.

Passes (exit 0) when, after the drain: every re-ask restored all the tiers held with the
same output and every ceiling re-ask finished with its output and no more than held
(engine truth); no telemetry error; every pending gauge 0; no failed scrape; and RSS grew
less than ``--max-rss-growth`` after warm-up. Warm-up: the first ``--warmup-fraction`` of
the samples (at least one); growth = (largest RSS after warm-up - the first sample after
it) / that sample. Exit 1 otherwise (2: the fs directory is tmpfs).

Writes OUT.jsonl (every phase's engine truth and every sample, as they happen), OUT.json
(the summary, the command and the checks) and OUT.png (``soak_plot``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from kvscope.sim import soak_report  # noqa: E402


def fs_type(path: str) -> str:
    """The file system type of the mount holding ``path`` (/proc/mounts)."""
    path, best, kind = os.path.realpath(path), "", ""
    with open("/proc/mounts") as f:
        for line in f:
            _, mount, fstype, *_ = line.split()
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) \
                    and len(mount) > len(best):
                best, kind = mount, fstype
    return kind


def wait_pending_zero(engine, urls: list[str], timeout_s: float) -> dict:
    """After the drain: refresh kvscope's gauges and scrape until no pending gauge is
    non-zero or ``timeout_s`` passed; the last view."""
    from kvscope.sim.soak_probe import kvscope_view

    deadline = time.monotonic() + timeout_s
    while True:
        engine.step()  # an idle step: kvscope refreshes its gauges on it
        engine.refresh()
        view = kvscope_view(urls)
        if not view["pending_nonzero"] or time.monotonic() >= deadline:
            return view
        time.sleep(0.2)


def run(args: argparse.Namespace) -> dict:
    from kvscope.sim.cpu_engine import CPUEngine
    from kvscope.sim.soak_phases import PLANS, Traffic
    from kvscope.sim.soak_probe import JournalWatch, Scraper, sample

    plan = PLANS[args.preset]
    plan.check()
    os.makedirs(args.fs_dir, exist_ok=True)
    fs_root = tempfile.mkdtemp(prefix="kvscope-soak-fs-", dir=args.fs_dir)
    out = soak_report.Output(args.out)
    summary: dict = {"command": shlex.join([Path(sys.executable).name, *sys.argv]),
                     "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
                     "fs_root": fs_root, "fs_type": fs_type(fs_root), "args": vars(args)}
    summary.update(soak_report.versions())
    tally = soak_report.Tally()
    try:
        with CPUEngine(plan.engine_config(os.path.join(fs_root, "fs"))) as e:
            summary["engine"] = {"num_gpu_blocks": e.cfg.num_gpu_blocks,
                                 "row_bytes": e.row_bytes, **asdict(plan)}
            observer = e.connector._kvscope_observer
            urls = [e.connector.kvscope_exporter.url] + [
                r.connector.kvscope_exporter.url for r in e.ranks]
            watch = JournalWatch(observer.agg.journal)
            scraper = Scraper(urls, args.scrape_interval_s)
            started = time.monotonic()
            due = [started]  # the next sample's time

            def maybe_sample(engine=e) -> None:
                if time.monotonic() >= due[0]:
                    out.write({"kind": "sample",
                               **sample(engine, urls, watch, started, tally.phases)})
                    due[0] = time.monotonic() + args.sample_interval_s

            maybe_sample()
            traffic = Traffic(e, plan, on_step=maybe_sample)
            phase_start = time.monotonic()
            try:
                for fact in traffic.phases():
                    now = time.monotonic()
                    fact.update(t_s=round(now - started, 1), wall_s=round(now - phase_start, 2))
                    out.write({"kind": "phase", **fact})
                    tally.add(fact)
                    maybe_sample()
                    if now - started >= args.duration_s:
                        break
                    phase_start = time.monotonic()
            except Exception:  # the engine stopped serving: reported, the checks fail
                summary["traffic_error"] = traceback.format_exc()
            summary["traffic_s"] = round(time.monotonic() - started, 1)
            summary["new_prompt_tokens"] = traffic.new_tokens
            e.drain()
            end_view = wait_pending_zero(e, urls, args.pending_timeout_s)
            final = sample(e, urls, watch, started, tally.phases)
            out.write({"kind": "final", **final})
            summary["engine_after_drain"] = {
                "has_requests": e.scheduler.has_requests(),
                "requests": len(e.scheduler.requests)}
            summary["pending_after_drain"] = end_view["pending_nonzero"]
            summary["telemetry_errors_after_drain"] = end_view["errors_by_where"]
            watch.close()
            scraper.close()
            summary["scrapes"] = {"done": scraper.scrapes, "failed": scraper.failures,
                                  "last_failure": scraper.last_failure}
    finally:
        out.close()
    summary["ended_utc"] = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        return soak_report.finish(summary, tally, out, args)
    finally:  # after the results are written: ~1.5 M files after an hour take minutes
        if not args.keep_fs:
            shutil.rmtree(fs_root, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=("full", "short"), default="full")
    p.add_argument("--duration-s", type=float, default=3720.0,
                   help="traffic for this long, then the phase in progress ends")
    p.add_argument("--sample-interval-s", type=float, default=60.0)
    p.add_argument("--scrape-interval-s", type=float, default=15.0)
    p.add_argument("--warmup-fraction", type=float, default=0.1)
    p.add_argument("--max-rss-growth", type=float, default=0.05)
    p.add_argument("--pending-timeout-s", type=float, default=60.0)
    p.add_argument("--fs-dir", default="/var/tmp", help="the fs tier's directory goes here")
    p.add_argument("--allow-tmpfs", action="store_true",
                   help="accept an fs directory on tmpfs (CI's short run)")
    p.add_argument("--keep-fs", action="store_true")
    p.add_argument("--out", default=os.path.join("benchmarks", "results", "soak_cpu"),
                   help="writes OUT.jsonl, OUT.json, OUT.png")
    p.add_argument("--no-plot", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.makedirs(args.fs_dir, exist_ok=True)
    if fs_type(args.fs_dir) == "tmpfs" and not args.allow_tmpfs:
        print(f"{args.fs_dir} is tmpfs: the fs tier belongs on disk (--fs-dir)", file=sys.stderr)
        return 2
    summary = run(args)
    print(json.dumps({k: summary[k] for k in ("ok", "checks", "rss", "cycles")}, indent=1))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
