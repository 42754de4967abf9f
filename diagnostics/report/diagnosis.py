"""The report: one model, three renderings (text, JSON, PNG in :mod:`.plot`).

JSON schema (``schema_version`` 1) is documented in ``diagnostics/SCHEMA.md``;
additions are backwards compatible, a removal or a meaning change bumps it.
"""

from __future__ import annotations

import io
import json
import re
import textwrap
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from kvscope.exporters import signals as S

from ..evidence.build import Evidence, TargetInfo
from ..model import Finding, SourceInfo, Unchecked
from ..thresholds import Thresholds

if TYPE_CHECKING:  # rich is imported where a report is rendered: --json never needs it
    from rich.console import Console
    from rich.text import Text

SCHEMA_VERSION = 1
EXIT_HEALTHY, EXIT_INCIDENT, EXIT_CANNOT, EXIT_INCONCLUSIVE = 0, 1, 2, 3
EXIT_INTERRUPTED = 130
EXIT_CODES = {"healthy": EXIT_HEALTHY, "incident": EXIT_INCIDENT, "inconclusive": EXIT_INCONCLUSIVE}

# C0/C1 controls, DEL and the bidi/zero-width format characters: a label value
# carrying them must not move the cursor, recolour the terminal or reorder text.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def safe(text: str) -> str:
    """``text`` with control and format characters escaped (\\x1b, \\u202e): shown, never obeyed."""
    return _UNSAFE.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
        str(text))


def kvscope_version() -> str:
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
    unchecked: list[Unchecked] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    thresholds: Thresholds | None = field(default=None, repr=False)

    @classmethod
    def from_findings(cls, ev: Evidence, findings, checks, notes, unchecked=(),
                      thresholds: Thresholds | None = None) -> Report:
        return cls(
            source=ev.source,
            targets=ev.targets,
            verdicts=list(findings),
            checked=list(checks),
            notes=list(notes),
            summary=_summary(ev),
            evidence=ev,
            unchecked=list(unchecked),
            failures=list(ev.failures),
            thresholds=thresholds,
        )

    @property
    def status(self) -> str:
        """healthy (every check ran, none holds) | incident | inconclusive (none holds,
        but a check could not run or failed: never healthy)."""
        if any(f.kind == "incident" for f in self.verdicts):
            return "incident"
        if self.unchecked or any(f.kind != "healthy" for f in self.verdicts):
            return "inconclusive"
        return "healthy"

    @property
    def healthy(self) -> bool:
        return self.status == "healthy"

    @property
    def incidents(self) -> list[Finding]:
        return [f for f in self.verdicts if f.kind == "incident"]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def top(self) -> Finding:
        return self.verdicts[0]

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "kv-diagnose",
            "kvscope_version": kvscope_version(),
            "generated_at": self.source.now,
            "generated_at_iso": _iso(self.source.now),
            "status": self.status,
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
                    "world_size": t.world_size,
                }
                for t in self.targets
            ],
            "verdicts": [
                {
                    "rank": i,
                    "id": f.id,
                    "kind": f.kind,
                    "title": f.title,
                    "confidence": round(f.confidence, 3),
                    "confidence_label": f.confidence_label,
                    "severity": f.severity,
                    "evidence": list(f.evidence),
                    "facts": f.facts.to_dict(),
                    "next_step": f.next_step,
                    "marks": [{"panel": m.series, "t": m.t, "text": m.text} for m in f.marks],
                }
                for i, f in enumerate(self.verdicts, 1)
            ],
            "checked": list(self.checked),
            "unchecked": [
                {"check": u.check, "what": u.what, "reasons": list(u.reasons)} for u in self.unchecked
            ],
            "failures": list(self.failures),
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
        "checksum_ranks": {k: q.last for k, q in ev.tiers.checksum_ranks.items()},
        "promotions": {k: q.increase for k, q in ev.tiers.promotions.items()},
        "cascades": {k: q.increase for k, q in ev.tiers.cascades.items()},
        "store_jobs": {k: q.increase for k, q in ev.tiers.store_jobs.items()},
        "pending_transfers": {k: q.last for k, q in ev.pending.transfers.items()},
        "oldest_pending_transfer_seconds": {k: q.last for k, q in ev.pending.oldest_seconds.items()},
        "requests": {k: q.last for k, q in ev.requests.states.items()},
        "gpu_blocks": {k: q.last for k, q in ev.settling.gpu_blocks.items()},
        "idle_gpu_blocks_in_use": _last(ev.settling.idle_gpu_blocks),
        "host_memory_available_bytes": _last(ev.settling.host_available),
        "process_resident_memory_bytes": _last(ev.settling.process_resident),
        "vllm_faults_contained": {k: q.increase for k, q in ev.vllm_faults.items()},
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


def _last(q) -> float | None:
    return q.last if q.present else None


def _iso(t: float) -> str:
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):  # a bundle can carry any number
        return f"unix {t:g}"


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


def _line(console: Console, text: str, first: str = "", rest: str = "", style: str = "") -> None:
    """One wrapped line, printed verbatim: no markup, no emoji codes, controls escaped."""
    from rich.text import Text

    wrapped = _wrap(safe(text), console.width, first, rest) if (first or rest) else safe(text)
    console.print(Text(wrapped, style=style), soft_wrap=True)


def _cell(text: str) -> Text:
    from rich.text import Text

    return Text(safe(text))


def render(report: Report, console: Console) -> None:
    from rich import box
    from rich.table import Table

    src = report.source
    _line(console, f"======== kv-diagnose: {_iso(src.now)} ========", style="bold")
    _line(console, _source_line(src), "Source: ", "  ")
    console.print()
    _line(console, "Targets", style="bold")
    if report.targets:
        t = Table(box=box.SIMPLE, show_edge=False, pad_edge=False, highlight=False)
        for col in ("target", "kvscope", "vLLM", "tiers", "rows", "hash_seed"):
            t.add_column(col, overflow="fold")
        for ti in report.targets:
            name = ti.target + "".join(f" {k}={v}" for k, v in (("model", ti.model_name), ("engine", ti.engine)) if v)
            t.add_row(*(_cell(x) for x in (
                name, ti.kvscope_version, ti.vllm_version, ti.tiers, ti.primary_rows,
                (" -> " if ti.seeds_ordered else ", ").join(ti.hash_seeds) or "-")))
        console.print(t)
    else:
        _line(console, f" (no {S.INFO.name} series)")
    console.print()
    status = report.status
    incidents = report.incidents
    if status == "healthy":
        _line(console, "Verdict: HEALTHY (exit 0)", style="bold green")
    elif status == "inconclusive":
        k = len(report.unchecked) + sum(f.kind == "error" for f in report.verdicts)
        _line(console, f"Verdict: INCONCLUSIVE - no incident found, {k} check{'s' if k != 1 else ''} "
              f"could not run (exit {EXIT_INCONCLUSIVE}; not healthy)", style="bold yellow")
    else:
        k = len(incidents)
        _line(console, f"Verdict: INCIDENT - {k} finding{'s' if k != 1 else ''} (exit 1)", style="bold red")
        t = Table(box=box.SIMPLE, show_edge=False, pad_edge=False, highlight=False)
        t.add_column("#", justify="right")
        t.add_column("verdict")
        t.add_column("confidence")
        for i, f in enumerate(report.verdicts, 1):
            conf = f"{f.confidence_label} ({f.confidence:.2f})" if f.kind == "incident" else "-"
            t.add_row(str(i), _cell(f.title), conf)
        console.print(t)
    for i, f in enumerate(report.verdicts, 1):
        console.print()
        head = f"[{i}] {f.title}" + (f" - confidence {f.confidence_label}" if f.kind == "incident" else "")
        _line(console, head, style="bold yellow" if f.kind == "incident" else "bold")
        _line(console, "  Evidence:")
        for line in f.evidence or ["(none)"]:
            _line(console, line, "    - ", "      ")
        _line(console, f.next_step, "  Next step: ", "    ")
    console.print()
    if report.unchecked and status != "inconclusive":
        _line(console, "Could not check:")
        for u in report.unchecked:
            _line(console, u.line, "  - ", "    ")
    if not report.healthy:
        _line(console, "Checked:")
        for c in report.checked:
            _line(console, c, "  - ", "    ")
    _line(console, "Notes:")
    for note in report.notes or ["(none)"]:
        _line(console, note, "  - ", "    ")


def _wrap(text: str, width: int, first: str, rest: str) -> str:
    return textwrap.fill(
        text, width=max(width, 40), initial_indent=first, subsequent_indent=rest,
        break_long_words=False, break_on_hyphens=False,
    )


def format_text(report: Report, width: int = 100) -> str:
    """The human report as plain text (no colour), deterministic for a given report."""
    from rich.console import Console

    buf = io.StringIO()
    console = Console(
        file=buf, width=width, color_system=None, force_terminal=False, no_color=True,
        highlight=False, emoji=False, soft_wrap=False,
    )
    render(report, console)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"
