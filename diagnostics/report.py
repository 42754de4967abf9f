"""The report: one model, three renderings (text, JSON, PNG in :mod:`.plot`).

JSON schema (``schema_version`` 1) is documented in ``diagnostics/SCHEMA.md``;
additions are backwards compatible, a removal or a meaning change bumps it.
"""

from __future__ import annotations

import io
import json
import textwrap
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvscope.exporters import signals as S

from .evidence import Evidence, TargetInfo
from .model import Finding, SourceInfo

SCHEMA_VERSION = 1
EXIT_HEALTHY, EXIT_INCIDENT, EXIT_CANNOT = 0, 1, 2


def _kvscope_version() -> str:
    try:
        from kvscope import __version__

        return __version__
    except Exception:  # pragma: no cover
        return "unknown"


@dataclass
class Report:
    source: SourceInfo
    targets: tuple[TargetInfo, ...]
    verdicts: list[Finding]  # ranked, best first; [healthy] when nothing holds
    checked: list[str]
    notes: list[str]
    summary: dict
    evidence: Evidence | None = field(default=None, repr=False)
    elapsed_s: float = 0.0

    @classmethod
    def from_findings(cls, ev: Evidence, findings, checks, notes) -> Report:
        return cls(
            source=ev.source,
            targets=ev.targets,
            verdicts=list(findings),
            checked=list(checks),
            notes=list(notes),
            summary=_summary(ev),
            evidence=ev,
        )

    @property
    def healthy(self) -> bool:
        return len(self.verdicts) == 1 and self.verdicts[0].id == "healthy"

    @property
    def exit_code(self) -> int:
        return EXIT_HEALTHY if self.healthy else EXIT_INCIDENT

    @property
    def top(self) -> Finding:
        return self.verdicts[0]

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "kv-diagnose",
            "kvscope_version": _kvscope_version(),
            "generated_at": self.source.now,
            "generated_at_iso": _iso(self.source.now),
            "status": "healthy" if self.healthy else "incident",
            "exit_code": self.exit_code,
            "source": self.source.to_dict(),
            "targets": [
                {
                    "target": t.target,
                    "model_name": t.model_name,
                    "engine": t.engine,
                    "kvscope_version": t.kvscope_version,
                    "vllm_version": t.vllm_version,
                    "spec": t.spec,
                    "tiers": t.tiers,
                    "primary_rows": t.primary_rows,
                    "hash_seeds": list(t.hash_seeds),
                    "hash_seeds_ordered": t.seeds_ordered,
                    "checksum_policy": t.checksum_policy,
                    "chunk_tokens": t.chunk_tokens,
                    "max_num_batched_tokens": t.max_num_batched_tokens,
                }
                for t in self.targets
            ],
            "verdicts": [
                {
                    "rank": i,
                    "id": f.id,
                    "title": f.title,
                    "confidence": round(f.confidence, 3),
                    "confidence_label": f.confidence_label,
                    "severity": f.severity,
                    "evidence": list(f.evidence),
                    "next_step": f.next_step,
                    "marks": [{"panel": m.series, "t": m.t, "text": m.text} for m in f.marks],
                }
                for i, f in enumerate(self.verdicts, 1)
            ],
            "checked": list(self.checked),
            "notes": list(self.notes),
            "summary": self.summary,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


def _summary(ev: Evidence) -> dict:
    r = ev.rounds
    return {
        "lookup_rounds": {v.value: r.get(v).increase for v in S.Verdict},
        "rounds_at_row_ceiling": {
            v: r.ceiling(S.Verdict(v)).increase for v in (S.Verdict.VETOED.value, S.Verdict.DEFERRED.value)
        },
        "hit_tokens": r.hit_tokens.increase,
        "lookups": {
            g.group: {k: q.increase for k, q in g.results.items()} for g in ev.lookups.values()
        },
        "primary_rows": {k: q.last for k, q in ev.tiers.rows.items()},
        "primary_row_bytes": ev.tiers.row_bytes.last if ev.tiers.row_bytes.present else None,
        "last_round_request_keys": {k: q.max for k, q in ev.rounds.last_request_keys.items()},
        "quarantined_keys": ev.tiers.quarantined_keys.last if ev.tiers.quarantined_keys.present else None,
        "promotions": {k: q.increase for k, q in ev.tiers.promotions.items()},
        "cascades": {k: q.increase for k, q in ev.tiers.cascades.items()},
        "store_jobs": {k: q.increase for k, q in ev.tiers.store_jobs.items()},
        "pending_transfers": {k: q.last for k, q in ev.pending.transfers.items()},
        "oldest_pending_transfer_seconds": {k: q.last for k, q in ev.pending.oldest_seconds.items()},
        "requests": {k: q.last for k, q in ev.requests.states.items()},
        "ranks": {
            rk: {
                "transfer_bytes": {d: q.increase for d, q in rt.bytes.items()},
                "transfers_in_flight": {d: q.last for d, q in rt.in_flight.items()},
                "row_checksums": {o: q.increase for o, q in rt.checksums.items()},
                "loads_refused": {o: q.increase for o, q in rt.refused.items()},
            }
            for rk, rt in ev.ranks.items()
        },
        "last_step_age_seconds": ev.freshness.newest_age,
    }


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _source_line(src: SourceInfo) -> str:
    if src.kind == "scrape":
        what = (
            f"scrape of {src.location} (window: process lifetime; 2 scrapes "
            f"{src.end - src.start:.1f} s apart)"
        )
    else:
        what = f"Prometheus {src.location}, {_iso(src.start)} .. {_iso(src.end)}"
        if src.selector:
            what += f", selector {src.selector}"
    if src.bundle:
        what = f"bundle {src.bundle}, recorded from {what}"
    return what


def render(report: Report, console: Console) -> None:
    width = console.width
    src = report.source
    console.print(Text(f"======== kv-diagnose: {_iso(src.now)} ========", style="bold"))
    console.print(_wrap(_source_line(src), width, "Source: ", "  "), markup=False, highlight=False)
    console.print()
    console.print(Text("Targets", style="bold"))
    if report.targets:
        t = Table(box=box.SIMPLE, show_edge=False, pad_edge=False, highlight=False)
        for col in ("target", "kvscope", "vLLM", "tiers", "rows", "hash_seed"):
            t.add_column(col, overflow="fold")
        for ti in report.targets:
            name = ti.target + "".join(f" {k}={v}" for k, v in (("model", ti.model_name), ("engine", ti.engine)) if v)
            t.add_row(name, ti.kvscope_version, ti.vllm_version, ti.tiers, ti.primary_rows,
                      (" -> " if ti.seeds_ordered else ", ").join(ti.hash_seeds) or "-")
        console.print(t)
    else:
        console.print(f" (no {S.INFO.name} series)")
    console.print()
    if report.healthy:
        console.print(Text("Verdict: HEALTHY (exit 0)", style="bold green"))
    else:
        k = len(report.verdicts)
        console.print(
            Text(f"Verdict: INCIDENT - {k} finding{'s' if k != 1 else ''} (exit 1)", style="bold red")
        )
        t = Table(box=box.SIMPLE, show_edge=False, pad_edge=False, highlight=False)
        t.add_column("#", justify="right")
        t.add_column("verdict")
        t.add_column("confidence")
        for i, f in enumerate(report.verdicts, 1):
            t.add_row(str(i), f.title, f"{f.confidence_label} ({f.confidence:.2f})")
        console.print(t)
    for i, f in enumerate(report.verdicts, 1):
        console.print()
        head = f"[{i}] {f.title}" + ("" if report.healthy else f" - confidence {f.confidence_label}")
        console.print(Text(head, style="bold yellow" if not report.healthy else "bold"))
        console.print("  Evidence:", markup=False, highlight=False)
        for line in f.evidence or ["(none)"]:
            console.print(_wrap(line, width, "    - ", "      "), markup=False, highlight=False)
        console.print(_wrap(f.next_step, width, "  Next step: ", "    "), markup=False, highlight=False)
    console.print()
    if not report.healthy:
        console.print("Checked:", markup=False, highlight=False)
        for c in report.checked:
            console.print(_wrap(c, width, "  - ", "    "), markup=False, highlight=False)
    console.print("Notes:", markup=False, highlight=False)
    for note in report.notes or ["(none)"]:
        console.print(_wrap(note, width, "  - ", "    "), markup=False, highlight=False)


def _wrap(text: str, width: int, first: str, rest: str) -> str:
    return textwrap.fill(
        text, width=max(width, 40), initial_indent=first, subsequent_indent=rest,
        break_long_words=False, break_on_hyphens=False,
    )


def format_text(report: Report, width: int = 100) -> str:
    """The human report as plain text (no colour), deterministic for a given report."""
    buf = io.StringIO()
    console = Console(
        file=buf, width=width, color_system=None, force_terminal=False, no_color=True,
        highlight=False, emoji=False, soft_wrap=False,
    )
    render(report, console)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"
