"""One module per incident class. Each exposes ``ID``, ``TITLE``, ``SEVERITY``,
``CHECK`` (what it verifies, said when the verdict is healthy) and
``classify(evidence, thresholds) -> Finding | None``.
"""

from __future__ import annotations

from . import (
    capacity_ceiling_livelock,
    capacity_ceiling_veto,
    pending_at_idle,
    queue_wait,
    stale_rows,
    stale_telemetry,
    store_never_fits,
    stores_without_restores,
)

CLASSIFIERS = (
    stale_telemetry,
    stale_rows,
    capacity_ceiling_veto,
    capacity_ceiling_livelock,
    store_never_fits,
    pending_at_idle,
    stores_without_restores,
    queue_wait,
)

__all__ = ["CLASSIFIERS"]
