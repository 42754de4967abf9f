"""The formatter of ``kv-diagnose plan``: a :class:`~.model.Plan` as text (ray-status
style: fixed sections, an explicit ``(none)``) or JSON (``kind: "plan"``, schema_version 1:
``diagnostics/SCHEMA.md``). Deterministic for a given plan and clock."""

from __future__ import annotations

import json
import textwrap
import time

from kvscope.exporters import signals as S

from ..classifiers._common import n, nbytes
from ..report.diagnosis import SCHEMA_VERSION, _iso, _source_line, kvscope_version, safe
from .coverage import pct, scan_order_caps
from .model import Fact, Plan

COVERAGE = ("coverage = tokens restored from the offload tiers / tokens the tiers held for "
            "the re-asked prefixes (kvscope_hit_tokens_total / "
            "kvscope_restore_held_tokens_total); the rest was recomputed")
MODEL = ("model: C restores of k rows ask at once; R rows restore ceil(R / k) of them whole "
         "(a restore finding no free row is recomputed; the one finding part of its rows is "
         "deferred and waits for the rest); coverage = min(1, ceil(R / k) / C). At least: "
         "floor(R / k) / C, if that one is cut instead, as recomputes' stores can do (the "
         "window's engine shows which). Where every restore must end whole none is recomputed "
         "and the last waits: the plan is (C - 1) x k rows and the last one's first chunks; "
         "else it is sized for the restores that find every row. Below the plan restores cut "
         "late can find rows the first loads freed: more is possible")


def _facts(plan: Plan) -> list[tuple[str, Fact | None, str]]:
    i = plan.inputs
    return [
        ("restores (rounds the tiers held a prefix for)", i.restores, "n"),
        ("held tokens per restore (mean)", i.held_per_restore, "n"),
        ("largest restore seen (rows)", i.largest_rows, "n"),
        ("restores seen at once", i.concurrency_seen, "n"),
        ("restores asking at once (given)", i.concurrency_given, "n"),
        ("coverage in the window", i.coverage_now, "pct"),
        ("held tokens cut by the row ceiling", i.row_loss, "pct"),
        ("held tokens lost for other reasons", i.other_loss, "pct"),
        ("tokens per chunk", i.chunk_tokens, "n"),
        ("KV groups", i.kv_groups, "n"),
        *((f"chunks a restore promotes, sliding-window group{'s' if len(i.restore_caps) > 1 else ''}",
           Fact(float(c), f"{S.KV_GROUP_INFO.name}{{{S.L_RESTORE_CHUNKS}}}"), "n")
          for c in scan_order_caps(i.restore_caps, i.kv_groups.value)),
        ("primary rows now", i.rows_now, "n"),
        ("bytes per row", i.row_bytes, "bytes"),
        ("tokens per step (max_num_batched_tokens)", i.step_tokens, "n"),
        ("headroom rows (given)", i.reserve_given, "n"),
    ]


def _show(f: Fact, how: str) -> str:
    if how == "pct":
        return pct(f.value)
    if how == "bytes":
        return f"{n(f.value)} ({nbytes(f.value)})"
    return n(round(f.value, 1))


def format_plan(plan: Plan, now: float | None = None, width: int = 100) -> str:
    """The plan as plain text. ``now``: the header's clock (default: the source's end)."""
    src = plan.inputs.source
    clock = now if now is not None else (src.end if src is not None else time.time())
    out = [f"======== kv-diagnose plan: {_iso(clock)} ========",
           "Source: " + (safe(_source_line(src)) if src is not None else "the command line"),
           "", "Inputs"]
    rows = [(label, _show(f, how), f.source) for label, f, how in _facts(plan) if f is not None]
    w1 = max(len(r[0]) for r in rows)
    w2 = max(len(r[1]) for r in rows)
    out += [f"  {a:<{w1}}  {b:>{w2}}  {safe(c)}" for a, b, c in rows]
    out += ["", "Reasoning"]
    w = max(len(s.what) for s in plan.steps)
    out += [f"  {s.what:<{w}}  {s.how}  =>  {s.value}" for s in plan.steps]
    out += ["", f"Plan for {pct(plan.target)} coverage" + ("" if plan.reachable else
                                                          " (out of reach: see notes)")]
    out.append(f"  primary rows      {n(plan.rows)}" + (
        f" (now {n(plan.inputs.rows_now.value)})" if plan.inputs.rows_now else ""))
    out.append("  cpu_bytes_to_use  " + (f"≥ {plan.cpu_bytes} ({nbytes(plan.cpu_bytes)})"
                                         if plan.cpu_bytes is not None else "(row bytes unknown)"))
    out += ["", "Predicted coverage"]
    head = f"  {'rows':>10}  {'predicted':>9}  {'at least':>8}  {'measured':>8}  "
    out.append(head + "at")
    for p in plan.predictions:
        meas = pct(p.measured) if p.measured is not None else "-"
        out.append(f"  {n(p.rows):>10}  {pct(p.coverage):>9}  {pct(p.at_least):>8}  {meas:>8}  "
                   f"{p.label}")
    out += ["", "Definitions", _item(COVERAGE, width), _item(MODEL, width), "", "Notes"]
    out += [_item(safe(x), width) for x in plan.notes] or ["  - (none)"]
    return "\n".join(out) + "\n"


def _item(text: str, width: int) -> str:
    return textwrap.fill(text, width=width, initial_indent="  - ", subsequent_indent="    ",
                         break_long_words=False, break_on_hyphens=False)


def _fact(f: Fact | None) -> dict | None:
    return None if f is None else {"value": f.value, "source": f.source}


def plan_to_dict(plan: Plan) -> dict:
    i = plan.inputs
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "plan",
        "kvscope_version": kvscope_version(),
        "source": i.source.to_dict() if i.source is not None else None,
        "target": plan.target,
        "reachable": plan.reachable,
        "rows": plan.rows,
        "cpu_bytes_to_use": plan.cpu_bytes,
        "rows_per_restore": plan.rows_per_restore,
        "partial_reach": plan.partial_reach,
        "concurrency": plan.concurrency,
        "restores_needed": plan.restores_needed,
        "partial_cut": plan.partial_cut,
        "window_store_rows": plan.window_store_rows,
        "reserve_rows": plan.reserve,
        "inputs": {name: _fact(getattr(i, name)) for name in (
            "restores", "held_per_restore", "largest_rows", "concurrency_seen",
            "concurrency_given", "coverage_now", "row_loss", "other_loss", "chunk_tokens",
            "kv_groups", "rows_now", "row_bytes", "step_tokens", "reserve_given")},
        "restore_caps": list(i.restore_caps),
        "reasoning": [{"what": s.what, "how": s.how, "value": s.value} for s in plan.steps],
        "predictions": [{"rows": p.rows, "coverage": p.coverage, "at_least": p.at_least,
                         "measured": p.measured, "at": p.label} for p in plan.predictions],
        "notes": list(plan.notes),
    }


def plan_to_json(plan: Plan) -> str:
    return json.dumps(plan_to_dict(plan), indent=2)
