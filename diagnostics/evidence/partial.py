"""Partial exports: a label value kvscope always exports, missing from the input.

kvscope exports every value of the closed labels of
:data:`kvscope.exporters.signals.PRESET_VALUES` from a process's first step on, so a
value missing where its series is present is no zero: a relabel rule, a federation
filter or a cut scrape dropped it. The evidence keeps such fields as
:class:`LabelValues`, which know their missing values and note every read of one (by
key, by membership, or by iterating all values) while :func:`reads` is active. The
engine runs each classifier inside it: one that read a missing value is reported
"could not check", never judged on a zero that was never exported.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from kvscope.exporters import signals as S

from ..model import Quantity

_PRESET: dict[str, S.Metric] = {m.name: m for m in S.PRESET_VALUES}
_WITH_WORLD_SIZE = frozenset(m.name for m in S.PRESET_WITH_WORLD_SIZE)
_READS: ContextVar[set[tuple[str, str, str]] | None] = ContextVar("kvscope_partial_reads",
                                                                  default=None)


class LabelValues(dict[str, Quantity]):
    """Quantities by label value, with the preset values the input lacks."""

    __slots__ = ("series", "label", "missing")

    def __init__(self, values: dict[str, Quantity], series: str, label: str,
                 missing: frozenset[str]) -> None:
        super().__init__(values)
        self.series, self.label, self.missing = series, label, missing

    def _read(self, keys) -> None:
        seen = _READS.get()
        if seen is not None:
            seen.update((self.series, self.label, k) for k in keys)

    def get(self, key, default=None):
        if key in self.missing:
            self._read((key,))
        return super().get(key, default)

    def __getitem__(self, key):
        if key in self.missing:
            self._read((key,))
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        if key in self.missing:
            self._read((key,))
        return super().__contains__(key)

    def __iter__(self):
        self._read(self.missing)
        return super().__iter__()

    def keys(self):
        self._read(self.missing)
        return super().keys()

    def values(self):
        self._read(self.missing)
        return super().values()

    def items(self):
        self._read(self.missing)
        return super().items()


def label_values(values: dict[str, Quantity], series: str, label: str,
                 others_present: bool = False,
                 world_size_known: bool = True) -> dict[str, Quantity]:
    """``values`` as :class:`LabelValues` when ``series`` presets ``label``'s values.

    Empty ``values`` (the series absent: classifiers/needs.py's "missing") are no partial export,
    unless ``others_present``: the same series has values for another KV group. A series
    of ``signals.PRESET_WITH_WORLD_SIZE`` counts as preset only in an input whose
    kvscope_info carries world_size (``world_size_known``): an older kvscope did not preset it.
    """
    m = _PRESET.get(series)
    closed = m.label_values.get(label) if m is not None else None
    if not closed or not (values or others_present):
        return values
    if series in _WITH_WORLD_SIZE and not world_size_known:
        return values
    return LabelValues(values, series, label, frozenset(closed) - set(values))


def note_missing(series: str, label: str, value: str) -> None:
    """A classifier needed ``series`` for ``label``=``value`` (a KV group kvscope exports it
    for from the first step, as it does for the others) and the input lacks it: noted as a
    read of a missing value, so the check reads "could not check", never a pass."""
    seen = _READS.get()
    if seen is not None:
        seen.add((series, label, value))


@contextmanager
def reads() -> Iterator[set[tuple[str, str, str]]]:
    """The missing (series, label, value) read inside the block."""
    seen: set[tuple[str, str, str]] = set()
    token = _READS.set(seen)
    try:
        yield seen
    finally:
        _READS.reset(token)


def reasons(seen: set[tuple[str, str, str]]) -> tuple[str, ...]:
    by_series: dict[str, list[str]] = {}
    for series, label, value in sorted(seen):
        by_series.setdefault(series, []).append(f'{label}="{value}"')
    return tuple(f"series {s} has no {', '.join(v)} (kvscope exports every value from the "
                 "first step: a partial export)" for s, v in by_series.items())
