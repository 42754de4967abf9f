"""kv-diagnose: which known KV-offload failure class is this, with evidence.

    kv-diagnose --scrape http://127.0.0.1:8000/metrics [URL ...] [--interval 1s]
    kv-diagnose --prometheus http://prom:9090 --since 30m [--selector '{model_name="x"}']
    kv-diagnose --bundle incident.kvb [--json] [--plot incident.png]
    kv-diagnose ... --each-engine     (a window of several engines: one verdict each)
    kv-diagnose ... [--stuck-after 30] [--stale-after 60s] [--row-bytes N]
    kv-diagnose record --prometheus http://prom:9090 --since 1h -o incident.kvb
    kv-diagnose plan --bundle incident.kvb [--target 99%]   (primary rows for a coverage)

Exit codes: 0 healthy, 1 incident found, 2 could not diagnose, 3 inconclusive
(no incident found, but a check could not run: never healthy), 130 interrupted. With
--each-engine: 1 when an engine has an incident, 0 only when every engine is healthy.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence

from . import native
from .evidence.build import build_evidence
from .model import DiagnoseError, RawWindow
from .options import (
    MAX_INTERVAL_S,
    parse_duration,
    parse_time,
    positive_duration,
    refuse_inapplicable,
    window,
)
from .report.diagnosis import (
    EXIT_CANNOT,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    Report,
    format_text,
    safe,
)
from .sources.bundle import STDIO, read_bundle, write_bundle
from .sources.limits import DEFAULT_DEADLINE_S, DEFAULT_TIMEOUT_S, Deadline
from .sources.prometheus import prometheus_window
from .thresholds import Thresholds
from .verdict import per_engine
from .verdict.diagnose import diagnose_raw

# Imported where used: the scrape source (prometheus-client's parser) and the plot
# (its panels) cost a fleet-scale --prometheus run a tenth of its latency budget.

PROG = "kv-diagnose"
__all__ = ["main", "parse_duration", "parse_time"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        self.exit(EXIT_CANNOT, f"{PROG}: {message} (see {PROG} --help)\n")


def _add_source_args(p: argparse.ArgumentParser, bundle: bool, required: bool = True) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--prometheus", metavar="URL", help="Prometheus (or Thanos/Mimir) base URL")
    g.add_argument("--scrape", metavar="URL", nargs="+", help="/metrics URL(s), one per process/rank")
    if bundle:
        g.add_argument("--bundle", metavar="FILE",
                       help="a bundle written by `kv-diagnose record` (- reads stdin)")
    p.add_argument("--since", metavar="DUR", help="Prometheus window ending now: 30m, 1h, ...")
    p.add_argument("--start", metavar="TIME", help="window start: unix seconds, RFC 3339, now-1h")
    p.add_argument("--end", metavar="TIME", help="window end (default now; a future end is clipped to now)")
    p.add_argument("--selector", default=None, metavar="MATCHERS",
                   help="label matchers for every query, e.g. '{model_name=\"x\"}'")
    p.add_argument("--interval", default=None, metavar="DUR", help="between the two scrapes (default 1s)")
    p.add_argument("--timeout", default=None, metavar="DUR",
                   help=f"bound on each whole HTTP request (default {DEFAULT_TIMEOUT_S:g}s)")
    p.add_argument("--deadline", default=None, metavar="DUR",
                   help=f"bound on the whole run's waiting (default {DEFAULT_DEADLINE_S:g}s)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_source_args(p, bundle=True)
    p.add_argument("--json", action="store_true", help="print the report as JSON (schema_version 1)")
    p.add_argument("--each-engine", action="store_true",
                   help="a window of several engines: cut it per engine and judge each alone "
                        "(where every series names its engine; else judged whole)")
    p.add_argument("--plot", metavar="PNG",
                   help="also write a timeline (.png, .svg or .pdf) of each finding's decisive series, "
                        "after the report is printed")
    p.add_argument("--row-bytes", type=int, metavar="N",
                   help="bytes of one primary-tier row, to turn row counts into cpu_bytes_to_use")
    p.add_argument("--stale-after", default=None, metavar="DUR", help="step timestamp age that is stale (60s)")
    p.add_argument("--stuck-after", "--pending-after", dest="stuck_after", default=None,
                   metavar="SECONDS",
                   help="age at which a pending transfer counts as stuck: seconds or a duration "
                        "(default 30s, the top transfer-time bucket)")
    return p


def build_record_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=f"{PROG} record", description="Record an incident bundle (no prompts, no block hashes).")
    _add_source_args(p, bundle=False)
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="bundle to write (.kvb); - writes to stdout")
    p.add_argument("--force", action="store_true", help="replace an existing bundle file")
    return p


def build_plan_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=f"{PROG} plan", formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Primary rows (and cpu_bytes_to_use) for a target restore coverage, "
                            "from a window's held prefixes, concurrency and row bytes, with the "
                            "reasoning and the coverage predicted at other row counts. Without a "
                            "source: from --held-tokens, --concurrency and --chunk-tokens.",
                epilog="coverage = tokens restored / tokens the tiers held for re-asked prefixes. "
                       "Exit codes: 0 planned, 2 could not plan, 3 the target is out of reach "
                       "with rows alone (losses rows do not fix).")
    _add_source_args(p, bundle=True, required=False)
    p.add_argument("--target", default="99%", metavar="COVERAGE",
                   help="coverage to plan for: 99%%, 99 or 0.99 (default 99%%)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--predict", type=int, nargs="+", default=(), metavar="ROWS",
                   help="also predict the coverage of these row counts")
    for flag, kind, what in (
            ("--held-tokens", int, "tokens the tiers hold per re-asked prefix (replaces the window's mean)"),
            ("--concurrency", float, "restores asking for rows at once (replaces the window's estimate)"),
            ("--chunk-tokens", int, "tokens per offloaded chunk (kvscope_info chunk_tokens)"),
            ("--kv-groups", int, "KV-cache groups of the model (one row per group per chunk)"),
            ("--rows", int, "the primary tier's rows now (kvscope_primary_rows)"),
            ("--row-bytes", int, "bytes of one primary-tier row (kvscope_primary_row_bytes)"),
            ("--reserve-rows", int, "headroom for in-flight stores (default: one step's store job)"),
            ("--step-tokens", int, "max_num_batched_tokens (sizes the default headroom)")):
        p.add_argument(flag, type=kind, metavar="N", help=what)
    return p


def parse_target(text: str) -> float:
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise DiagnoseError(f"bad --target {text!r} (expected e.g. 99%, 99 or 0.99)") from None
    if v > 1 and not t.endswith("%"):
        v /= 100
    if not 0 < v <= 1:
        raise DiagnoseError(f"--target {text!r} must be above 0 and at most 100 %")
    return v


def _plan(argv: list[str]) -> int:
    from .plan.coverage import make_plan
    from .plan.format import format_plan, plan_to_json
    from .plan.inputs import Given, native_inputs, read_inputs

    args = build_plan_parser().parse_args(argv)
    target = parse_target(args.target)
    given = Given(held_tokens=args.held_tokens, concurrency=args.concurrency,
                  chunk_tokens=args.chunk_tokens, kv_groups=args.kv_groups, rows=args.rows,
                  row_bytes=args.row_bytes, reserve_rows=args.reserve_rows,
                  step_tokens=args.step_tokens)
    inputs = None
    if args.scrape or args.prometheus or args.bundle:
        raw = load_source(args)
        if native.applies(raw):  # a stock vLLM: its geometry, the command line's restores
            inputs = native_inputs(raw, given)
        else:
            ev = build_evidence(raw)
    else:
        given_opts = [f"--{k}" for k in ("since", "start", "end", "selector", "interval",
                                         "timeout", "deadline") if getattr(args, k, None)]
        if given_opts:
            verb = "apply" if len(given_opts) > 1 else "applies"
            raise DiagnoseError(f"{'/'.join(given_opts)} only {verb} with a source (--scrape, "
                                "--prometheus or --bundle)")
        ev = None
    plan = make_plan(inputs or read_inputs(ev, given), target, tuple(args.predict))
    sys.stdout.write(plan_to_json(plan) + "\n" if args.json else format_plan(plan))
    sys.stdout.flush()
    return 0 if plan.reachable else EXIT_INCONCLUSIVE


def load_source(args, now: float | None = None) -> RawWindow:
    now = time.time() if now is None else now
    refuse_inapplicable(args)
    if getattr(args, "bundle", None):
        return read_bundle(args.bundle)
    timeout = positive_duration(args.timeout or f"{DEFAULT_TIMEOUT_S:g}s", "--timeout")
    deadline = Deadline(positive_duration(args.deadline or f"{DEFAULT_DEADLINE_S:g}s", "--deadline"))
    if args.scrape:
        from .sources.scrape import scrape_window

        interval = positive_duration(args.interval or "1s", "--interval", MAX_INTERVAL_S)
        return scrape_window(args.scrape, interval, timeout, deadline=deadline)
    start, end, notes = window(args, now)
    raw = prometheus_window(args.prometheus, start, end, args.selector or "", timeout,
                            deadline=deadline)
    return dataclasses.replace(raw, notes=tuple(notes) + raw.notes) if notes else raw


def _thresholds(args) -> Thresholds:
    kw = {}
    if args.row_bytes is not None:
        if args.row_bytes <= 0:
            raise DiagnoseError("--row-bytes must be > 0")
        kw["row_bytes"] = args.row_bytes
    if args.stale_after:
        kw["stale_after_s"] = positive_duration(args.stale_after, "--stale-after")
    if args.stuck_after:
        kw["pending_after_s"] = positive_duration(args.stuck_after, "--stuck-after")
    return Thresholds(**kw)


def _print_report(report: Report, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(report.to_json() + "\n")
    elif sys.stdout.isatty():
        from rich.console import Console

        from .report.diagnosis import render

        render(report, Console(highlight=False, emoji=False))
    else:
        sys.stdout.write(format_text(report))
    sys.stdout.flush()


def _record(argv: list[str]) -> int:
    args = build_record_parser().parse_args(argv)
    if args.output != STDIO and os.path.isdir(args.output):
        raise DiagnoseError(f"refusing to write bundle {args.output}: it is a directory")
    raw = load_source(args)
    build_evidence(raw)  # refuse to record a bundle nothing can be diagnosed from
    n = write_bundle(raw, args.output, force=args.force)
    src = raw.source
    where = "stdout" if args.output == STDIO else args.output
    print(f"wrote {where}: {n} series, {src.kind} {src.location}, window {src.end - src.start:.0f} s"
          + (f"; {len(raw.failures)} target(s) unusable, listed in the bundle" if raw.failures else ""),
          file=sys.stderr)
    return 0


def _run(argv: list[str]) -> int:
    if argv and argv[0] == "record":
        return _record(argv[1:])
    if argv and argv[0] == "plan":
        return _plan(argv[1:])
    args = build_parser().parse_args(argv)
    th = _thresholds(args)
    if args.plot:
        if args.each_engine:
            raise DiagnoseError("--plot draws one engine's window: leave out --each-engine "
                                "and pick the engine with --selector or --scrape")
        from .report.plot import check_plot_path

        check_plot_path(args.plot)  # before any waiting: a typo must not cost the run
    raw = load_source(args)
    if args.each_engine:
        if native.applies(raw):
            raise DiagnoseError("--each-engine reads kvscope's series; this window has vLLM's "
                                "native offload metrics only (leave it out)")
        parts, why = per_engine.split(raw)
        if parts:
            verdicts = per_engine.diagnose_each(parts, th)
            sys.stdout.write(per_engine.to_json(verdicts) + "\n" if args.json
                             else per_engine.format_each(verdicts))
            sys.stdout.flush()
            return per_engine.exit_code(verdicts)
        if why:  # judged whole (inconclusive as several engines are), and why
            raw = dataclasses.replace(raw, notes=(*raw.notes,
                                                  f"--each-engine: not cut per engine: {why}"))
    if native.applies(raw):  # a stock vLLM 0.33 without kvscope: reduced evidence
        nreport = native.diagnose_native(raw)
        text = nreport.to_json() if args.json else "\n".join(
            safe(line) for line in nreport.to_text().splitlines())
        sys.stdout.write(text + "\n")
        if args.plot:
            print(f"{PROG}: --plot: no plot from vLLM's native metrics (kvscope not installed)",
                  file=sys.stderr)
        return nreport.exit_code
    report = diagnose_raw(raw, th)
    # The verdict first: a plot that cannot be written must not swallow it.
    _print_report(report, args.json)
    if args.plot:
        from .report.plot import write_plot

        try:
            write_plot(report, args.plot)
            print(f"{PROG}: plot written to {args.plot}", file=sys.stderr)
        except DiagnoseError as e:
            print(f"{PROG}: {e} (the report above stands)", file=sys.stderr)
    return report.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(argv)
    except DiagnoseError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_CANNOT
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else EXIT_CANNOT
    except BrokenPipeError:
        return EXIT_CANNOT
    except MemoryError:
        print(f"{PROG}: out of memory reading the source (narrow the window or --selector)",
              file=sys.stderr)
        return EXIT_CANNOT
    except Exception as e:
        if os.environ.get("KVSCOPE_DEBUG"):
            raise
        print(f"{PROG}: internal error: {type(e).__name__}: {e} (set KVSCOPE_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return EXIT_CANNOT


# ---- Python API ------------------------------------------------------------
def diagnose_scrape(
    urls: Sequence[str], interval: float = 1.0, timeout: float = 10.0,
    thresholds: Thresholds | None = None,
) -> Report:
    """Scrape ``urls`` twice ``interval`` seconds apart and diagnose (raises DiagnoseError)."""
    from .sources.scrape import scrape_window

    return diagnose_raw(scrape_window(list(urls), interval, timeout), thresholds)


def diagnose_prometheus(
    url: str, start: float, end: float, selector: str = "", timeout: float = 10.0,
    thresholds: Thresholds | None = None,
) -> Report:
    return diagnose_raw(prometheus_window(url, start, end, selector, timeout), thresholds)


def diagnose_bundle(path: str, thresholds: Thresholds | None = None) -> Report:
    return diagnose_raw(read_bundle(path), thresholds)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
