"""kv-diagnose: which known KV-offload failure class is this, with evidence.

    kv-diagnose --scrape http://127.0.0.1:8000/metrics [URL ...] [--interval 1s]
    kv-diagnose --prometheus http://prom:9090 --since 30m [--selector '{model_name="x"}']
    kv-diagnose --bundle incident.kvb [--json] [--plot incident.png]
    kv-diagnose ... [--stuck-after 30] [--stale-after 60s] [--row-bytes N]
    kv-diagnose record --prometheus http://prom:9090 --since 1h -o incident.kvb

Exit codes: 0 healthy, 1 incident found, 2 could not diagnose, 3 inconclusive
(no incident found, but a check could not run: never healthy), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Sequence
from datetime import datetime

from . import native
from .bundle import read_bundle, write_bundle
from .engine import diagnose_raw
from .evidence import build_evidence
from .model import DiagnoseError, RawWindow
from .prometheus import prometheus_window
from .report import EXIT_CANNOT, Report, format_text
from .scrape import scrape_window
from .thresholds import Thresholds

PROG = "kv-diagnose"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(text: str) -> float:
    m = _DURATION.match(text or "")
    if not m:
        raise DiagnoseError(f"bad duration {text!r} (expected e.g. 90s, 30m, 1h, 2d)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_time(text: str, now: float) -> float:
    """Unix seconds, RFC 3339 / ISO 8601, or 'now' / 'now-30m'."""
    t = text.strip()
    if t == "now":
        return now
    if t.startswith("now-"):
        return now - parse_duration(t[4:])
    try:
        return float(t)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise DiagnoseError(f"bad time {text!r} (expected unix seconds, RFC 3339 or now-30m)") from None
    if dt.tzinfo is None:
        raise DiagnoseError(f"time {text!r} has no timezone (add Z or +00:00)")
    return dt.timestamp()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        self.exit(EXIT_CANNOT, f"{PROG}: {message} (see {PROG} --help)\n")


def _add_source_args(p: argparse.ArgumentParser, bundle: bool) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prometheus", metavar="URL", help="Prometheus (or Thanos/Mimir) base URL")
    g.add_argument("--scrape", metavar="URL", nargs="+", help="/metrics URL(s), one per process/rank")
    if bundle:
        g.add_argument("--bundle", metavar="FILE", help="a bundle written by `kv-diagnose record`")
    p.add_argument("--since", metavar="DUR", help="Prometheus window ending now: 30m, 1h, ...")
    p.add_argument("--start", metavar="TIME", help="window start: unix seconds, RFC 3339, now-1h")
    p.add_argument("--end", metavar="TIME", help="window end (default now)")
    p.add_argument("--selector", default="", metavar="MATCHERS",
                   help="label matchers for every query, e.g. '{model_name=\"x\"}'")
    p.add_argument("--interval", default="1s", metavar="DUR", help="between the two scrapes (default 1s)")
    p.add_argument("--timeout", default="10s", metavar="DUR", help="per HTTP request (default 10s)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_source_args(p, bundle=True)
    p.add_argument("--json", action="store_true", help="print the report as JSON (schema_version 1)")
    p.add_argument("--plot", metavar="PNG", help="write a timeline of the key series with the evidence marked")
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
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="bundle to write (.kvb)")
    return p


def _window(args, now: float) -> tuple[float, float]:
    end = parse_time(args.end, now) if args.end else now
    if args.since and args.start:
        raise DiagnoseError("give --since or --start, not both")
    if args.since:
        start = end - parse_duration(args.since)
    elif args.start:
        start = parse_time(args.start, now)
    else:
        raise DiagnoseError("--prometheus needs a window: --since 30m or --start/--end")
    if end <= start:
        raise DiagnoseError("empty window: --end must be after --start")
    return start, end


def load_source(args, now: float | None = None) -> RawWindow:
    now = time.time() if now is None else now
    timeout = parse_duration(args.timeout)
    if timeout <= 0:
        raise DiagnoseError("--timeout must be > 0")
    if getattr(args, "bundle", None):
        return read_bundle(args.bundle)
    if args.scrape:
        if args.since or args.start or args.end or args.selector:
            raise DiagnoseError("--since/--start/--end/--selector apply to --prometheus, not --scrape")
        return scrape_window(args.scrape, parse_duration(args.interval), timeout)
    start, end = _window(args, now)
    return prometheus_window(args.prometheus, start, end, args.selector, timeout)


def _thresholds(args) -> Thresholds:
    kw = {}
    if args.row_bytes:
        if args.row_bytes <= 0:
            raise DiagnoseError("--row-bytes must be > 0")
        kw["row_bytes"] = args.row_bytes
    if args.stale_after:
        kw["stale_after_s"] = parse_duration(args.stale_after)
    if args.stuck_after:
        kw["pending_after_s"] = parse_duration(args.stuck_after)
        if kw["pending_after_s"] <= 0:
            raise DiagnoseError("--stuck-after must be > 0")
    return Thresholds(**kw)


def _print_report(report: Report, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(report.to_json() + "\n")
        return
    if sys.stdout.isatty():
        from rich.console import Console

        from .report import render

        render(report, Console(highlight=False))
    else:
        sys.stdout.write(format_text(report))


def _run(argv: list[str]) -> int:
    if argv and argv[0] == "record":
        args = build_record_parser().parse_args(argv[1:])
        raw = load_source(args)
        build_evidence(raw)  # refuse to record a bundle nothing can be diagnosed from
        n = write_bundle(raw, args.output)
        src = raw.source
        print(
            f"wrote {args.output}: {n} series, {src.kind} {src.location}, "
            f"window {src.end - src.start:.0f} s",
            file=sys.stderr,
        )
        return 0
    args = build_parser().parse_args(argv)
    th = _thresholds(args)
    raw = load_source(args)
    if native.applies(raw):  # a stock vLLM 0.33 without kvscope: reduced evidence
        nreport = native.diagnose_native(raw)
        sys.stdout.write((nreport.to_json() if args.json else nreport.to_text()) + "\n")
        return nreport.exit_code
    report = diagnose_raw(raw, th)
    if args.plot:
        from .plot import write_plot

        write_plot(report, args.plot)
    _print_report(report, args.json)
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
        return EXIT_CANNOT
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else EXIT_CANNOT
    except BrokenPipeError:
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
