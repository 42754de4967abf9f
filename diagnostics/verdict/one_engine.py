"""One engine per window: a healthy verdict about several engines at once is no verdict.

The evidence sums every series of the window: requests, pending transfers, primary
tier rows, lookup rounds. Over several engines (a ``--selector`` that matches a
model's replicas, several ``--scrape`` URLs) those sums hide one engine's incident
behind the others: a transfer stuck on an idle engine while another serves reads
"busy", and a row ceiling is judged against the rows of all tiers together. An
incident found anyway still stands (each classifier's tell is an engine's own
counter); silence is no pass. So more than one engine (``kvscope_info`` scopes:
target, vLLM model and engine, with the scheduler's step-timestamp series, one per engine,
in case an info series is missing) makes the window "could not check one engine",
inconclusive, with the per-engine runs to do instead.
"""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Unchecked

ID = "one_engine"
CHECK = f"one engine in the window: one scheduler's {S.INFO.name}, so the sums are its own"
_SHOWN = 6  # engines named in the reason; the targets table lists them all


def names(ev: Evidence) -> list[str]:
    """One name per engine (``targets.scope_key``): kvscope_info's scopes and the
    scheduler's own step-timestamp series, together (an info series dropped on one
    engine leaves its steps)."""
    return sorted({t.key for t in ev.targets} | set(ev.freshness.last_step))


def unchecked(ev: Evidence) -> Unchecked | None:
    engines = names(ev)
    if len(engines) <= 1:
        return None
    more = f" and {len(engines) - _SHOWN} more" if len(engines) > _SHOWN else ""
    return Unchecked(ID, CHECK, (
        f"{len(engines)} engines in this window: {', '.join(engines[:_SHOWN])}{more}",
        "their series are summed (requests, pending transfers, primary-tier rows), so one "
        "engine's incident can hide behind another's work: a transfer stuck on an idle engine "
        "while another serves, a row ceiling judged against every tier's rows",
    ))


def next_step(ev: Evidence) -> str:
    """What to do instead (the inconclusive finding's next step)."""
    first = ev.targets[0].target if ev.targets else "<target>"
    if ev.source.kind == "prometheus":
        how = (f"a --selector that matches one of them, e.g. '{{instance=\"{first}\"}}' (with "
               "model_name/engine where one /metrics serves several)")
    else:
        how = f"--scrape with one engine's URL (e.g. {first}) and its ranks' URLs"
    return (f"Run kv-diagnose once per engine: {how}; or add --each-engine (one verdict per "
            "engine, where every series names its engine).")
