"""The ``kvscope`` command: ``demo``, ``scenarios``, ``dashboards``, ``rules``.

``kvscope demo <scenario>`` is the embedded default: it runs one incident class
on vLLM's real scheduler-side objects on CPU with the instrumented connector,
serves the signals it produced on a local kvscope exporter, prints them, and
runs kv-diagnose against that endpoint. Exit 0 when kv-diagnose named the
incident the scenario reproduces, 1 otherwise; 2 a usage error, 3 the demo
could not run (one line on stderr: a taken port, vLLM missing, ...), 130/143
interrupted by SIGINT/SIGTERM (the engines' temp dirs and /dev/shm regions are
removed either way).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence

DEFAULT_SCENARIO = "capacity-ceiling"
EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, EXIT_DEMO_FAILED = 0, 1, 2, 3
EXIT_SIGINT, EXIT_SIGTERM = 130, 143

def _shown() -> tuple[str, ...]:
    """Names of the series the demo prints (the full exposition stays on the endpoint)."""
    from kvscope.exporters import signals as S

    return tuple(m.name for m in (
        S.LOOKUP_ROUNDS, S.LOOKUPS, S.ROUNDS_AT_ROW_CEILING, S.LAST_ROUND_PENDING_KEYS,
        S.LAST_ROUND_REQUEST_KEYS, S.RESTORE_HELD_TOKENS, S.RESTORE_SHORT_ROUNDS,
        S.LAST_CEILING_OFFERED_TOKENS, S.LAST_CEILING_HELD_TOKENS, S.LAST_CEILING_ROWS_NEEDED,
        S.LAST_CEILING_CONCURRENT_ROWS, S.PRIMARY_ROWS, S.PRIMARY_KEYS, S.PROMOTIONS,
        S.STORE_JOBS, S.STORE_TOKENS,
        S.PENDING_TRANSFERS, S.OLDEST_PENDING_TRANSFER, S.REQUESTS, S.HIT_TOKENS,
        S.TRANSFER_BYTES, S.TRANSFERS_IN_FLIGHT, S.ROW_CHECKSUMS, S.LOADS_REFUSED,
        S.QUARANTINED_KEYS, S.INFO))


def _signals_table(url: str) -> list[str]:
    from prometheus_client.parser import text_string_to_metric_families

    from kvscope.exporters import signals

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    rows = []
    shown = _shown()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name not in shown:
                continue
            if s.value == 0 and s.name != signals.INFO.name:
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            rows.append(f"  {s.name}{{{labels}}} {s.value:g}")
    return rows


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so every ``finally`` (engine close) runs."""


@contextlib.contextmanager
def _terminate_cleanly() -> Iterator[None]:
    def on_term(signum, frame):
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread (an embedding app): leave it alone
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _fail(msg: str) -> int:
    print(f"kvscope demo: {msg}", file=sys.stderr)
    return EXIT_DEMO_FAILED


def cmd_demo(args: argparse.Namespace) -> int:
    """The demo, with one-line errors and its files removed however it ends."""
    from kvscope.sim.catalog import SCENARIOS  # no vLLM yet: a usage error is answered at once

    if args.scenario not in SCENARIOS:
        print(f"kvscope demo: unknown scenario {args.scenario!r}; one of: "
              f"{', '.join(SCENARIOS)}", file=sys.stderr)
        return EXIT_USAGE
    _quiet_vllm()  # before vLLM and torch are imported: they log as they load
    sweep = None
    try:
        with _terminate_cleanly():
            try:
                from kvscope.sim.cpu_engine import sweep_leftovers as sweep
            except ImportError as e:
                return _fail(f"needs the sim extra (pip install 'kvscope[sim]'): {e}")
            return _demo(args)
    except KeyboardInterrupt:
        print("kvscope demo: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    except Terminated:
        print("kvscope demo: terminated", file=sys.stderr)
        return EXIT_SIGTERM
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return _fail(f"port {args.port} is taken (--port 0 picks a free one): {e.strerror}")
        return _fail(f"{e.strerror or e}")
    except Exception as e:
        from kvscope.diagnostics import DiagnoseError

        if os.environ.get("KVSCOPE_DEBUG"):
            raise
        if isinstance(e, DiagnoseError):
            return _fail(f"kv-diagnose could not diagnose the scenario: {e}")
        return _fail(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                     "(set KVSCOPE_DEBUG=1 for a traceback)")
    finally:
        if sweep is not None:
            sweep()


def _quiet_vllm() -> None:
    """The CLI's own lines only: vLLM's info logs and torch's no-CUDA notice stay out."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # vLLM 0.33 may log before its logging is configured (Python's last-resort handler
    # prints WARNING lines bare), so its logger is set too. torch: the no-CUDA notice, and
    # torch 2.14's (vLLM 0.33's) deprecation notices about names vLLM still uses.
    for name in ("vllm", "torch.utils.cpp_extension", "torch._opaque_base",
                 "torch._library.opaque_object"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _demo(args: argparse.Namespace) -> int:
    try:
        from kvscope.diagnostics import Thresholds, diagnose_scrape, format_text
    except ImportError as exc:
        return _needs_extra("diagnostics", exc)
    from kvscope.sim.catalog import SCENARIOS
    from kvscope.sim.scenarios import run_scenario, wait_until

    name = args.scenario

    t0 = time.monotonic()
    with run_scenario(name, exporter_port=args.port) as sc:
        print(f"== scenario {name}: {sc.description}")
        print(f"   ran on vLLM's scheduler (CPU) in {time.monotonic() - t0:.1f}s; "
              f"signals at {sc.metrics_url}")
        facts = {k: v for k, v in sc.facts.items() if k not in ("step_lock", "shared_dir")}
        for k, v in facts.items():
            print(f"   {k}: {v}")
        thresholds = Thresholds(pending_after_s=args.stuck_after) if name == "pending-at-idle" \
            else None
        if name == "pending-at-idle":  # let the stuck transfer age past the threshold
            from kvscope.exporters import signals
            rec = sc.engine.connector.kvscope_recorder
            wait_until(lambda: rec.value(signals.OLDEST_PENDING_TRANSFER,
                                         (signals.PendingKind.STORE.value,)) > args.stuck_after,
                       timeout=args.stuck_after + 30)
        print("\n== kvscope signals (non-zero)")
        print("\n".join(_signals_table(sc.metrics_url)))
        print(f"\n== kv-diagnose --scrape {sc.metrics_url} --interval {args.interval:g}")
        report = diagnose_scrape([sc.metrics_url], interval=args.interval,
                                 **({"thresholds": thresholds} if thresholds else {}))
        print(format_text(report))
        if args.serve:
            print(f"\nserving {sc.metrics_url} for {args.serve:g}s (Ctrl-C stops)")
            try:
                time.sleep(args.serve)
            except KeyboardInterrupt:
                pass
    ok = report.top is not None and report.top.id == SCENARIOS[name].expected_verdict
    print(f"\n{'OK' if ok else 'UNEXPECTED'}: scenario {name} -> verdict "
          f"{report.top.id if report.top else None}")
    return EXIT_OK if ok else EXIT_UNEXPECTED


def cmd_scenarios(args: argparse.Namespace) -> int:
    from kvscope.sim.catalog import SCENARIOS  # metadata only: no vLLM, no torch

    for s in SCENARIOS.values():
        print(f"{s.name:24} {s.doc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvscope", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run an incident scenario on CPU and diagnose it")
    demo.add_argument("scenario", nargs="?", default=DEFAULT_SCENARIO)
    demo.add_argument("--port", type=int, default=0, help="exporter port (0: a free one)")
    demo.add_argument("--interval", type=float, default=1.0, help="kv-diagnose scrape interval")
    demo.add_argument("--stuck-after", type=float, default=2.0,
                      help="pending-at-idle: seconds a transfer must be pending (demo only)")
    demo.add_argument("--serve", type=float, default=0.0,
                      help="keep serving the endpoint this many seconds afterwards")
    demo.set_defaults(func=cmd_demo)
    sc = sub.add_parser("scenarios", help="list the demo scenarios")
    sc.set_defaults(func=cmd_scenarios)
    try:
        from kvscope.dashboards import cli as dashboards_cli
    except ImportError as exc:  # the dashboards extra is not installed
        for name in ("dashboards", "rules"):
            missing = sub.add_parser(name, help="(needs pip install 'kvscope[dashboards]')")
            missing.set_defaults(func=lambda _args, exc=exc: _needs_extra("dashboards", exc))
    else:
        dashboards_cli.add_subcommands(sub)
    return p


def _needs_extra(extra: str, exc: ImportError) -> int:
    print(f"kvscope: this command needs pip install 'kvscope[{extra}]' ({exc})", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
