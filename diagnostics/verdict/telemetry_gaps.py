"""kvscope's own errors: a check that found nothing on counters with holes is no pass.

Every hook kvscope puts on vLLM catches what it raises, counts it in
``kvscope_telemetry_errors_total{where}`` and lets serving go on (never break
serving). The event that call was recording is then missing from the counters a
classifier reads: a lost round hides a veto or a truncated restore, a lost step
an idle engine. So a rise of that counter over the window makes every silent
check unproven: the verdict is "inconclusive" (exit 3), never healthy. An
incident found anyway still stands; the gap is named beside it.

The counter is declared at 0 for every site from a process's first step on
(``signals.PRESET_VALUES``): an input without it lost it (a relabel rule, an
exporter older than the contract) and cannot say whether kvscope erred, so that
too leaves the check unrun. One born inside the window (an older exporter) counts
from zero (:mod:`..evidence.quantities`).
"""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..classifiers._common import n, window_word
from ..classifiers.needs import need, unmet
from ..evidence.build import Evidence
from ..model import Unchecked

ID = "telemetry"
CHECK = f"kvscope recorded every event: {S.TELEMETRY_ERRORS.name} did not rise"


def unchecked(ev: Evidence) -> Unchecked | None:
    """The telemetry check as an :class:`Unchecked` when errors rose, else None."""
    name = S.TELEMETRY_ERRORS.name
    if missing := unmet(ev, [need(S.TELEMETRY_ERRORS)]):
        return Unchecked(ID, CHECK, tuple(missing))
    rose = {w: q.increase for w, q in sorted(ev.telemetry_errors.items())
            if q.present and q.increase > 0}
    if not rose:
        return None
    w = window_word(ev)
    reasons = tuple(f'{name}{{where="{site}"}} rose by {n(k)} {w}' for site, k in rose.items())
    tail = ("the events those calls were recording are missing from kvscope's counters: a check "
            "that found nothing may have missed an incident")
    if ev.source.lifetime:  # totals since start keep an old hole: a later window may not
        tail += ("; a scrape judges totals since process start, kv-diagnose --prometheus "
                 "--since judges a window that starts after the errors")
    return Unchecked(ID, CHECK, reasons + (tail,))


def next_step(ev: Evidence) -> str:
    """What to do instead (the inconclusive finding's next step)."""
    return ("kvscope caught errors in its own instrumentation, so its counters miss events: "
            "each process logs the first one per site (warning \"kvscope telemetry error in "
            "<where>\"); report it with that log line and the bundle (kv-diagnose record). "
            "Until then judge offload from vLLM's own series (prefix-cache hits, queue gauges) "
            "and the dashboards.")
