"""``--each-engine``: one verdict per engine of a window that holds several.

A window over several engines is inconclusive as a whole (:mod:`.one_engine`): its sums hide
one engine's incident behind another's work. Asked with ``--each-engine``, kv-diagnose
cuts it into one window per engine and diagnoses each as if it had been asked alone (the
same classifiers, thresholds and rules: a check that cannot run on an engine's window
leaves that engine inconclusive).

A series belongs to an engine when its target, with vLLM's model and engine labels where
it has them (``targets.scope_key``), names an engine of the window: one with a
``kvscope_info`` or a scheduler step-timestamp series. On vLLM's own /metrics every
series of an engine, its worker ranks' included (vLLM merges their stats), is so named.
The window is not cut when any series names no engine: a worker rank's standalone
endpoint (``exporter_port`` + 1 + rank) is a target of its own, and which engine it serves
is not in its series. Nor when a target gave nothing usable (its engine is unknown). Then
the window is diagnosed whole, inconclusive as before, with the reason in its notes.

Exit code: 1 when an engine has an incident; 0 only when every engine is healthy; 2 when
no engine could be diagnosed; else 3 (inconclusive: never healthy).
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import build_evidence
from ..evidence.targets import scope_key
from ..model import DiagnoseError, RawWindow
from ..report.diagnosis import (
    EXIT_CANNOT,
    EXIT_CODES,
    EXIT_HEALTHY,
    EXIT_INCIDENT,
    EXIT_INCONCLUSIVE,
    SCHEMA_VERSION,
    Report,
    format_text,
    kvscope_version,
    safe,
)
from ..thresholds import Thresholds
from . import one_engine
from .diagnose import diagnose_raw

_SHOWN = 3  # unattributed scopes named in the reason
CANNOT = "could not diagnose"  # an engine's status when its window could not be diagnosed
_STATUS_OF = {code: name for name, code in EXIT_CODES.items()}  # a report's exit code's name


def split(raw: RawWindow) -> tuple[list[tuple[str, RawWindow]], str]:
    """One (engine name, its window) per engine, in name order; or no windows and why the
    window cannot be cut ("" when it holds one engine or none). Raises DiagnoseError as
    :func:`..evidence.build.build_evidence` does (no kvscope series)."""
    names = set(one_engine.names(build_evidence(raw)))
    if len(names) <= 1:
        return [], ""
    if raw.failures:
        return [], (f"{len(raw.failures)} target(s) gave nothing usable, and which engine "
                    "each served is unknown")
    by_engine: dict[str, list] = defaultdict(list)
    stray: set[str] = set()
    for s in raw.series:
        key = scope_key(s.target, s.label(S.VLLM_LABEL_MODEL), s.label(S.VLLM_LABEL_ENGINE))
        if key in names:
            by_engine[key].append(s)
        else:
            stray.add(key)
    if stray:
        shown = sorted(stray)[:_SHOWN]
        more = f" and {len(stray) - _SHOWN} more" if len(stray) > _SHOWN else ""
        return [], (f"series of {', '.join(shown)}{more} name no engine of the window (a "
                    "worker rank's own endpoint?), so they cannot be given to one")
    return [(k, dataclasses.replace(raw, series=tuple(by_engine[k])))
            for k in sorted(names)], ""


@dataclass
class EngineVerdict:
    engine: str
    report: Report | None  # None: could not be diagnosed (``error``)
    error: str = ""

    @property
    def exit_code(self) -> int:
        return self.report.exit_code if self.report is not None else EXIT_CANNOT

    @property
    def status(self) -> str:
        return self.report.status if self.report is not None else CANNOT


def diagnose_each(parts: list[tuple[str, RawWindow]],
                  thresholds: Thresholds | None = None) -> list[EngineVerdict]:
    out = []
    for name, sub in parts:
        try:
            out.append(EngineVerdict(name, diagnose_raw(sub, thresholds)))
        except DiagnoseError as e:  # this engine's window alone: the others still stand
            out.append(EngineVerdict(name, None, str(e)))
    return out


def exit_code(verdicts: list[EngineVerdict]) -> int:
    codes = {v.exit_code for v in verdicts}
    if EXIT_INCIDENT in codes:
        return EXIT_INCIDENT
    if codes == {EXIT_HEALTHY}:
        return EXIT_HEALTHY
    if codes == {EXIT_CANNOT}:
        return EXIT_CANNOT
    return EXIT_INCONCLUSIVE


def status(verdicts: list[EngineVerdict]) -> str:
    return _STATUS_OF.get(exit_code(verdicts), CANNOT)


def headline(verdicts: list[EngineVerdict]) -> str:
    by: dict[str, list[str]] = defaultdict(list)
    for v in verdicts:
        by[v.status].append(v.engine)
    parts = [f"{k}: {', '.join(by[k])}" for k in
             ("incident", "inconclusive", CANNOT, "healthy") if by.get(k)]
    return safe(f"kv-diagnose --each-engine: {len(verdicts)} engines, {status(verdicts)} "
                f"({'; '.join(parts)})")


def format_each(verdicts: list[EngineVerdict], width: int = 100) -> str:
    out = [headline(verdicts), ""]
    for v in verdicts:
        out.append(safe(f"=== engine {v.engine}: {v.status} ==="))
        out.append(format_text(v.report, width) if v.report is not None
                   else safe(f"kv-diagnose: {v.error}") + "\n")
    return "\n".join(out)


def to_json(verdicts: list[EngineVerdict]) -> str:
    return json.dumps({
        "schema_version": SCHEMA_VERSION,
        "tool": "kv-diagnose",
        "kvscope_version": kvscope_version(),
        "each_engine": True,
        "status": status(verdicts),
        "exit_code": exit_code(verdicts),
        "engines": [{"engine": v.engine, "status": v.status, "exit_code": v.exit_code,
                     **({"report": v.report.to_dict()} if v.report is not None
                        else {"error": v.error})} for v in verdicts],
    }, indent=2)
