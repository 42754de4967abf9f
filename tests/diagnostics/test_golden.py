"""The formatter against golden text, with a fixed clock (ray-status style).

Regenerate after an intended change: KVSCOPE_UPDATE_GOLDEN=1 pytest tests/diagnostics/test_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvscope.diagnostics.report.diagnosis import format_text
from kvscope.diagnostics.verdict.diagnose import diagnose

from . import test_classifiers as C
from .support import L, base, evidence, info, on

GOLDEN = Path(__file__).parent / "golden"


def _healthy():
    d = base() | C.rounds(hit=[10, 12], miss=[2, 2]) | C.lookups("0", hit=[60, 72])
    d[info(world_size="1")] = d.pop(info())  # a current exporter: the world size is known
    d[C.S.HIT_TOKENS.name] = [160, 192]
    d[L(C.S.ROW_CHECKSUMS.name, rank="0", outcome="match")] = [6, 6]
    return d


CASES = {
    "healthy": _healthy,
    "capacity_ceiling_veto": C.veto_case,
    "stale_rows_and_veto": lambda: C.stale_case(refused=False) | C.veto_case(),
    "pending_at_idle": C.pending_case,
    "not_settled_at_idle": C.settle_case,
    "queue_wait": C.queue_case,
    "tier_flooded_by_group": C.flood_case,
    "inconclusive_telemetry_errors": lambda: _healthy() | {
        L(C.S.TELEMETRY_ERRORS.name, where="aggregator"): [0, 5],
    },
    "inconclusive_two_engines": lambda: on("10.0.0.1:9400", C.pending_case()) | on(
        "10.0.0.2:9400", base() | C.rounds(hit=[10, 12], miss=[2, 2])
        | {L(C.S.REQUESTS.name, state="running"): [3, 3]}),
    "stale_telemetry": lambda: C.pending_case() | {
        C.S.LAST_STEP_TIMESTAMP.name: [C.T0 - 600, C.T0 - 600],
        C.S.SCHEDULER_STEPS.name: [500, 500],
    },
}


def _check(name: str, got: str):
    path = GOLDEN / name
    if os.environ.get("KVSCOPE_UPDATE_GOLDEN"):
        path.write_text(got)
    assert path.exists(), f"{path} missing: run with KVSCOPE_UPDATE_GOLDEN=1"
    assert got == path.read_text()


@pytest.mark.parametrize("case", sorted(CASES))
def test_text(case):
    _check(f"{case}.txt", format_text(diagnose(evidence(CASES[case]()))))


def test_json():
    _check("stale_rows_and_veto.json", diagnose(evidence(CASES["stale_rows_and_veto"]())).to_json() + "\n")
