"""The span of one lookup round (``kvscope.lookup_round``), for rounds judged while
tracing is on: per-group lookup results, verdict, hit/held tokens, the row ceiling's
tells. Its own room: only spans need the request's hash and these attributes.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Tracer

from kvscope.connector import compat
from kvscope.connector.lookup.coverage import Coverage
from kvscope.connector.lookup.rounds import _RESULTS, Round
from kvscope.exporters import signals
from kvscope.exporters.otel import request_id_hash
from kvscope.exporters.signals import Verdict


def lookup_round_span(tracer: Tracer, primary: Any, rnd: Round, verdict: Verdict, rid: str,
                      num_tokens: int | None, pending: int, rows_total: int, at_ceiling: bool,
                      cov: Coverage | None) -> None:
    """The ``kvscope.lookup_round`` span of one judged round, started at the round's
    start. ``rows_total`` 0 (a hit or a miss): the primary tier's rows and the round's
    pending keys are read here, only for a recording span."""
    span = tracer.start_span(signals.SPAN_LOOKUP_ROUND, start_time=rnd.started_ns)
    if span.is_recording():
        if not rows_total:
            rows_total = compat.rows_total(primary)
            pending = rnd.pending_keys
        per_group = rnd.per_group()
        groups = range(max(per_group, default=-1) + 1)
        for i, res in enumerate(_RESULTS):
            span.set_attribute(signals.A_GROUP_RESULT_PREFIX + res.value,
                               [per_group.get(g, [0] * len(_RESULTS))[i] for g in groups])
        span.set_attribute(signals.A_VERDICT, verdict.value)
        span.set_attribute(signals.A_REQUEST_ID_HASH,
                           request_id_hash(rid))
        span.set_attribute(signals.A_HIT_TOKENS, num_tokens or 0)
        span.set_attribute(signals.A_PENDING_KEYS, pending)
        span.set_attribute(signals.A_PRIMARY_ROWS, rows_total)
        span.set_attribute(signals.A_AT_ROW_CEILING, at_ceiling)
        if cov is not None:
            span.set_attribute(signals.A_HELD_TOKENS, cov.held)
            if cov.reason is not None:
                span.set_attribute(signals.A_SHORT_REASON, cov.reason.value)
    span.end()
