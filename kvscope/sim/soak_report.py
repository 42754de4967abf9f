"""The soak's output and verdict: the JSONL as it runs, then the summary's checks.

Kept apart from the traffic and the sampling: what counts as growth (after warm-up), the
checks the exit status follows, and the files under benchmarks/results/.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

MAX_FAILURES_KEPT = 20  # failing phases written into the summary (all are in the JSONL)


class Output:
    """OUT.jsonl, one record a line, flushed as written (a run cut short keeps its lines);
    the samples are kept for the summary and the plot."""

    def __init__(self, out: str) -> None:
        self.prefix = out
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        self._f = open(out + ".jsonl", "w")
        self.samples: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        if record["kind"] in ("sample", "final"):
            self.samples.append(record)
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class Tally:
    """Per-phase engine truth, summed: counts, failures (kept up to a bound), ceiling cuts."""

    def __init__(self) -> None:
        self.phases: Counter[str] = Counter()
        self.failures: list[dict[str, Any]] = []
        self.failed = 0
        self.cut: Counter[str] = Counter()  # ceiling re-asks cut, per form
        self.restored = Counter()  # tokens restored by re-asks, per phase
        self.cycles = 0

    def add(self, fact: dict[str, Any]) -> None:
        self.phases[fact["phase"]] += 1
        self.cycles = fact["cycle"] + 1
        if fact.get("ok") is False:
            self.failed += 1
            if len(self.failures) < MAX_FAILURES_KEPT:
                self.failures.append(fact)
        if fact["phase"] in ("reask", "ceiling"):
            self.restored[fact["phase"]] += sum(fact["restored_tokens"])
        if fact["phase"] == "ceiling" and fact["cut"]:
            self.cut[fact["form"]] += 1


def versions() -> dict[str, str]:
    import vllm

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, cwd=Path(__file__).parent,
                                    check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "", False
    return {"vllm": vllm.__version__, "commit": commit + ("-dirty" if dirty else "")}


def rss_growth(samples: list[dict[str, Any]], warmup_fraction: float) -> dict[str, Any]:
    """Growth after warm-up: the first ``warmup_fraction`` of the samples (at least one) are
    warm-up; the first sample after it is the baseline; growth is the largest RSS after it
    over the baseline (and the last one's, and the least-squares slope, as evidence)."""
    warm = max(1, math.ceil(warmup_fraction * len(samples)))
    post = samples[warm:]
    if len(post) < 2:
        return {"warmup_samples": warm, "samples_after_warmup": len(post), "growth": None}
    base = post[0]["rss_kib"]
    xs = [s["t_s"] / 60 for s in post]
    ys = [s["rss_kib"] for s in post]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return {"warmup_samples": warm, "warmup_end_s": post[0]["t_s"],
            "samples_after_warmup": len(post), "baseline_kib": base, "max_kib": max(ys),
            "last_kib": ys[-1], "growth": (max(ys) - base) / base,
            "growth_last": (ys[-1] - base) / base, "slope_kib_per_min": round(slope, 1),
            "first_kib": samples[0]["rss_kib"]}


def finish(summary: dict[str, Any], tally: Tally, out: Output, args) -> dict[str, Any]:
    samples = out.samples
    rss = rss_growth(samples, args.warmup_fraction)
    errors = max((s["telemetry_errors"] for s in samples), default=0)
    final = samples[-1] if samples and samples[-1]["kind"] == "final" else None
    summary.update(
        cycles=tally.cycles, phases=dict(tally.phases), truth_failed_phases=tally.failed,
        truth_failures=tally.failures, ceiling_cut=dict(tally.cut),
        restored_tokens=dict(tally.restored), samples=len(samples), rss=rss,
        max_rss_growth=args.max_rss_growth, telemetry_errors=errors,
        journal_len_max=max((s["journal_len_max"] for s in samples), default=0),
        series=[min(s["series"] for s in samples), max(s["series"] for s in samples)]
        if samples else None,
        kvscope_state_items=[samples[0]["kvscope_state_items"], final["kvscope_state_items"]]
        if final else None)
    checks = {
        "traffic_ran": "traffic_error" not in summary and tally.phases["ceiling"] >= 2,
        "engine_truth": tally.failed == 0,
        "telemetry_errors_0": errors == 0 and final is not None
        and not summary.get("telemetry_errors_after_drain"),
        "pending_0_after_drain": final is not None and not summary["pending_after_drain"]
        and not summary["engine_after_drain"]["has_requests"],
        "scrapes_ok": summary.get("scrapes", {}).get("failed", 1) == 0,
        "rss_growth": rss["growth"] is not None and rss["growth"] < args.max_rss_growth,
    }
    summary["checks"] = checks
    summary["ok"] = all(checks.values())
    if not args.no_plot and samples:
        from kvscope.sim.soak_plot import plot

        summary["plot"] = Path(out.prefix + ".png").name
        plot(samples, rss, args, out.prefix + ".png")
    with open(out.prefix + ".json", "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    return summary
