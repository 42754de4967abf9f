"""``kvscope dashboards`` and ``kvscope rules``: (re)generate, write where provisioning finds them.

The ``kvscope`` console script wires these in with::

    from kvscope.dashboards import cli as dashboards_cli
    dashboards_cli.add_subcommands(subparsers)
    ...
    return args.func(args)

Examples::

    kvscope dashboards --out /var/lib/grafana/dashboards/kvscope \\
        --provider /etc/grafana/provisioning/dashboards/kvscope.yaml
    kvscope rules --out /etc/prometheus/rules --selector 'job="vllm"'
    kvscope dashboards --check          # exit 1 when dashboards/generated/ is stale (CI)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from . import artifacts as g
from .config import DEFAULT, Config


def _config(args: argparse.Namespace) -> Config:
    changes = {}
    for field in ("selector", "vllm_selector", "runbook_base_url"):
        value = getattr(args, field, None)
        if value is not None:
            changes[field] = value
    return dataclasses.replace(DEFAULT, **changes) if changes else DEFAULT


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=g.GENERATED_DIR,
                        help="directory to write into (default: the package's generated/ dir)")
    parser.add_argument("--selector", help="label matchers for kvscope series, e.g. 'job=\"vllm\"'")
    parser.add_argument("--vllm-selector", dest="vllm_selector",
                        help="label matchers for vLLM's vllm:* series (default: --selector)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the files in --out differ from a fresh render")


def _write_or_check(files: dict[str, str], out: Path, check: bool) -> int:
    if check:
        problems = []
        for name, want in sorted(files.items()):
            path = out / name
            if not path.exists() or path.read_text(encoding="utf-8") != want:
                problems.append(str(path))
        for p in problems:
            print(f"stale: {p}", file=sys.stderr)
        if problems:
            print("regenerate with `kvscope dashboards` and `kvscope rules`", file=sys.stderr)
        return 1 if problems else 0
    out.mkdir(parents=True, exist_ok=True)
    for name, text in sorted(files.items()):
        (out / name).write_text(text, encoding="utf-8")
        print(out / name)
    return 0


def cmd_dashboards(args: argparse.Namespace) -> int:
    cfg = _config(args)
    rc = _write_or_check(g.render_dashboards(cfg), args.out, args.check)
    if rc == 0 and args.provider and not args.check:
        args.provider.parent.mkdir(parents=True, exist_ok=True)
        args.provider.write_text(g.grafana_provider_yaml(args.out, args.folder), encoding="utf-8")
        print(args.provider)
    return rc


def cmd_rules(args: argparse.Namespace) -> int:
    return _write_or_check(g.render_rules(_config(args)), args.out, args.check)


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``dashboards`` and ``rules``; each sets ``func`` to its handler."""
    p = subparsers.add_parser(
        "dashboards", help="write the Grafana dashboards (JSON) for file provisioning",
        description="Render the KV offload Grafana dashboards (Grafana 11.6 schema).")
    _common(p)
    p.add_argument("--provider", type=Path,
                   help="also write a Grafana dashboard provider YAML here (put it in "
                        "provisioning/dashboards/); it points Grafana at --out")
    p.add_argument("--folder", default="kvscope", help="Grafana folder for --provider")
    p.set_defaults(func=cmd_dashboards)

    p = subparsers.add_parser(
        "rules", help="write the Prometheus recording and alerting rules (YAML)",
        description="Render kvscope-rules.yaml; list it under rule_files in prometheus.yml.")
    _common(p)
    p.add_argument("--runbook-base-url", dest="runbook_base_url",
                   help="prefix for runbook_url annotations, e.g. "
                        "https://github.com/<org>/kvscope/blob/v0.1.0/")
    p.set_defaults(func=cmd_rules)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m kvscope.dashboards.cli rules --out DIR``)."""
    parser = argparse.ArgumentParser(prog="kvscope")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
