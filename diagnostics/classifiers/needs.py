"""Healthy means checked: which series each classifier needs, and whether it has them.

Every classifier module declares ``NEEDS``: the series it cannot judge without
(a :class:`kvscope.exporters.signals.Metric`, a vLLM series name, or a
:class:`Need` naming the labels it reads). A module whose needs depend on the
engine's configuration defines ``needs(ev)`` instead. Before a classifier runs,
:func:`unmet` says what is absent, non-finite, or stripped of a label; such a
check is reported as "could not check X: series Y missing", never as a pass.

An absent series is not a zero: an older exporter, a relabel rule or a partial
scrape drops series, and a classifier that read them as 0 would call an
incident healthy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType

from kvscope.exporters import signals as S

from ..evidence.build import Evidence


@dataclass(frozen=True)
class Need:
    series: str  # as scraped (a histogram: its _count)
    labels: tuple[str, ...] = ()  # label names its series must carry


def need(metric: S.Metric | str, *labels: str) -> Need:
    """A Need for ``metric``; its contract labels unless ``labels`` names some."""
    if isinstance(metric, str):
        return Need(metric, labels)
    name = metric.name + ("_count" if metric.kind is S.Kind.HISTOGRAM else "")
    return Need(name, labels or metric.labels)


def tiered(ev: Evidence) -> bool:
    """True unless every target says it has only the CPU tier (then promotion and
    cascade series are never exported); unknown counts as tiered."""
    tiers = {t.tiers for t in ev.targets}
    return not tiers or any(t != "cpu" for t in tiers)


def needs_of(mod: ModuleType, ev: Evidence) -> tuple[Need, ...]:
    fn = getattr(mod, "needs", None)
    raw: Iterable = fn(ev) if callable(fn) else getattr(mod, "NEEDS", ())
    return tuple(n if isinstance(n, Need) else need(n) for n in raw)


def unmet(ev: Evidence, needs: Iterable[Need]) -> list[str]:
    """Why these needs cannot be met on ``ev``, one phrase each ([] = all met)."""
    out: list[str] = []
    for nd in needs:
        if nd.series in ev.nonfinite:
            out.append(f"series {nd.series} non-finite (NaN/Inf samples)")
        elif nd.series not in ev.present:
            out.append(f"series {nd.series} missing")
        else:
            have = ev.label_names.get(nd.series, frozenset())
            lacking = [lb for lb in nd.labels if lb not in have]
            if lacking:
                out.append(f"series {nd.series} has no {', '.join(repr(x) for x in lacking)} "
                           f"label{'s' if len(lacking) > 1 else ''}")
    return out
