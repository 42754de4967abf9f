"""One module per incident class. Each exposes ``ID``, ``TITLE``, ``SEVERITY``,
``CHECK`` (what it verifies, said when the verdict is healthy), ``NEEDS`` (or
``needs(ev)``: the series it cannot judge without, see :mod:`.needs`),
``EXPLAINS`` (the invariant kinds of :mod:`.unclassified_anomaly` its finding
accounts for) and ``classify(evidence, thresholds) -> Finding | None``.
A module with ``AFTER = True`` runs last and also gets the other findings.

A finding carries typed facts, not sentences: the module (or a ``*_facts`` module beside
it, as :mod:`.anomaly_facts`) declares a frozen dataclass subclassing
:class:`..model.Facts` (``VetoFacts``, ...; one per verdict form) whose fields
are the numbers and names the verdict rests on and whose ``lines()`` renders the evidence
from them alone; ``classify`` reads the evidence into it and returns
``Finding(..., facts=...)``. Records several classes share (row sizing, coverage, the KV
groups that stopped an offer) are in :mod:`.shared_facts`. Tests assert on the facts; the
golden reports (tests/diagnostics/golden) on the rendered text; ``diagnostics/SCHEMA.md``
lists each verdict's fields (``--json`` carries them as ``facts``).
"""

from __future__ import annotations

from . import (
    capacity_ceiling_concurrency,
    capacity_ceiling_livelock,
    capacity_ceiling_truncated,
    capacity_ceiling_veto,
    known_vllm_bug,
    not_settled_at_idle,
    pending_at_idle,
    promotion_stalled,
    queue_wait,
    restore_slowed_by_rescans,
    stale_rows,
    stale_telemetry,
    store_never_fits,
    stores_without_restores,
    tier_data_lost,
    tier_flooded_by_group,
    tier_writes_failing,
    unclassified_anomaly,
    unreachable_targets,
)

CLASSIFIERS = (
    unreachable_targets,
    stale_telemetry,
    stale_rows,
    known_vllm_bug,
    capacity_ceiling_veto,
    capacity_ceiling_livelock,
    capacity_ceiling_truncated,
    capacity_ceiling_concurrency,
    store_never_fits,
    tier_flooded_by_group,
    tier_writes_failing,
    tier_data_lost,
    pending_at_idle,
    not_settled_at_idle,
    promotion_stalled,
    stores_without_restores,
    queue_wait,
    restore_slowed_by_rescans,
    unclassified_anomaly,  # AFTER: last
)

__all__ = ["CLASSIFIERS"]
