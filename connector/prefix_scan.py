"""A round's lookups read from vLLM's prefix scan: one tap per scan, none per key.

Where compat.prefix_scan allows it (vLLM's CPU manager alone, one full-attention KV
group), the manager proxy leaves ``lookup`` untapped and this tap on the connector
scheduler's scan writes, after each scan, what its per-key lookups were into the same
slots the per-key tap fills (lookup_rounds.LookupLog): everything after that (the
round's hand-over, its verdict, coverage and counts) is unchanged. An answer of ``n``
is n HITs and a MISS (unless the scan reached the end): two list extends in C. A
deferred answer (None: some key was pending) reads each key's result from the CPU tier's cache
policy (compat.scan_reader), as the lookups did, up to the first key it lacks.

The per-key tap cost a Python frame per key looked up (~6,200 per iteration in the
H200 benchmark: 96 re-asks of 64 chunks); this costs one per round.
``tests/connector/test_prefix_scan.py`` checks, scan by scan on every CPU scenario, that
it writes what the per-key tap records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvscope.connector import compat
from kvscope.connector.compat.prefix_scan import SCAN_METHOD
from kvscope.connector.lookup_rounds import LookupLog
from kvscope.exporters.signals import ErrorSite


def scan_tap(inner_scan: Callable[..., Any], log: LookupLog, result_of: Callable[[bytes], Any],
             error: Callable[[ErrorSite, BaseException], None]) -> Callable[..., Any]:
    """The scan's stand-in: vLLM's scan, then its lookups written into ``log``.
    ``result_of``: a key's lookup result read without a lookup (compat.scan_reader)."""
    keys_out, results_out = log.keys, log.results
    add_keys, add_results, add_key, add_result = (
        keys_out.extend, results_out.extend, keys_out.append, results_out.append)
    hit, miss = compat.HIT, compat.MISS

    # *rest: 0.33 passes the request, the group's config and the first chunk's index
    def scan(keys, req_context, *rest):
        n = inner_scan(keys, req_context, *rest)
        k0, r0 = len(keys_out), len(results_out)
        try:
            if n is not None:  # n HITs, then the MISS that stopped it (if it stopped)
                if n < len(keys):
                    add_keys(keys[:n + 1])
                    add_results([hit] * n)
                    add_result(miss)
                else:
                    add_keys(keys)
                    add_results([hit] * n)
            else:  # deferred: what the lookups read, up to the first key the tier lacks
                for key in keys:
                    result = result_of(key)
                    add_key(key)
                    add_result(result)
                    if result is miss:
                        break
        except Exception as exc:  # this scan's lookups are lost, the slots stay paired
            del keys_out[k0:], results_out[r0:]
            error(ErrorSite.LOOKUP, exc)
        return n

    setattr(scan, compat.WRAPPED_MARK, True)
    return scan


def install(connector_scheduler: Any, log: LookupLog, result_of: Callable[[bytes], Any],
            error: Callable[[ErrorSite, BaseException], None]) -> bool:
    """Tap the connector scheduler's scan (an instance attribute shadowing vLLM's method);
    False when it already is."""
    inner = getattr(connector_scheduler, SCAN_METHOD)
    if getattr(inner, compat.WRAPPED_MARK, False):
        return False
    setattr(connector_scheduler, SCAN_METHOD, scan_tap(inner, log, result_of, error))
    return True
