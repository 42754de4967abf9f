"""The manager proxy: stands between the connector scheduler and vLLM's OffloadingManager.

Its own room so the per-key hot path (``lookup``, where the prefix scan cannot tell the
lookups: prefix_scan.py) and the two per-job taps read in one place. It forwards every
call unchanged and only records: appends into the lookup log,
one journal event per store job (its keys: counted per KV group off this thread), digests forgotten for rows a store rewrites. Recording
is guarded; an exception in kvscope is counted and never reaches vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from functools import partial
from typing import Any

from kvscope.connector import compat
from kvscope.connector.integrity.promoted_rows import PromotedRows
from kvscope.connector.lookup.rounds import LookupLog
from kvscope.exporters.signals import ErrorSite


class ManagerProxy:
    """Stands in for the OffloadingManager the connector scheduler talks to.

    Every method forwards to the real manager; ``lookup``, ``prepare_load`` and
    ``prepare_store`` (instance attributes: closures, see :func:`_lookup_tap` and
    :func:`_store_tap`) also record. Attributes not defined here (``primary_tier``,
    ``secondary_tiers``, 0.33's ``lock``, ...) resolve on the real manager.

    ``per_key_lookups`` False: ``lookup`` is the real manager's, untapped; the prefix
    scan's tap writes the lookups instead (prefix_scan.py: vLLM's CPU manager alone,
    where no key is quarantined, since only promoted rows are checked; or vLLM's tiering
    manager, where the scan's tap puts the per-key tap back for a scan while a key is
    quarantined: :meth:`per_key_switches`).
    """

    def __init__(self, inner: Any, *, log: LookupLog, rows: PromotedRows,
                 journal_extend: Callable[[tuple[Any, ...]], None],
                 store_job: Callable[..., None],
                 error: Callable[[ErrorSite, BaseException], None],
                 per_key_lookups: bool = True) -> None:
        """The scheduler side's pieces the taps write to: the lookup ``log``, the promoted
        ``rows``, the journal (``journal_extend``) and its handler of a store job
        (``store_job``: SchedulerObserver._store_job), the recorder's ``error``."""
        # object.__setattr__: this class's own __setattr__ forwards to the manager
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, compat.WRAPPED_MARK, True)
        tap = _lookup_tap(inner.lookup, log, rows.quarantine)
        object.__setattr__(self, "_lookups", (inner.lookup, tap))
        object.__setattr__(self, "_results_only", _results_tap(inner.lookup, log))
        object.__setattr__(self, "lookup", tap if per_key_lookups else inner.lookup)
        object.__setattr__(self, "prepare_load", _load_tap(inner.prepare_load, rows))
        store_tap = partial(_store_tap, inner.prepare_store, rows, journal_extend, store_job,
                            error)
        object.__setattr__(self, "_store_tap", store_tap)
        object.__setattr__(self, "prepare_store", store_tap())
        # what vLLM binds once and reads every step (0.34's lock: twice a lookup round),
        # kept here: a dict hit, not a __getattr__ frame (compat.bound_once)
        for name, value in compat.bound_once(inner).items():
            object.__setattr__(self, name, value)

    def per_key_switches(self) -> tuple[Callable[[], None], Callable[[], None],
                                        Callable[[], None]]:
        """For the tiering scan's tap (prefix_scan.tiered_scan_tap): the per-key tap in
        place (a scan while some key is quarantined), the results-only tap in place
        (:func:`_results_tap`: a short scan), and vLLM's own ``lookup`` again, as C-level
        calls (``functools.partial`` over ``object.__setattr__``): no Python frame of their
        own, since the tap switches on every short scan (most scans)."""
        plain, tap = self._lookups
        put = partial(object.__setattr__, self, "lookup")
        return partial(put, tap), partial(put, self._results_only), partial(put, plain)

    def direct_for(self, owner: Any) -> Callable[[bool], None]:
        """``direct(on)``: ``owner.manager`` (vLLM's connector scheduler's) is the real
        manager while on, this proxy again after (prefix_scan.tiered_scan_tap: a scan
        whose lookups the proxy does not record). Whoever replaced ``owner.manager``
        since (kvscope's switch turning it off) is left in place."""
        inner = self._inner

        def direct(on: bool) -> None:
            if on:
                if owner.manager is self:
                    owner.manager = inner
            elif owner.manager is inner:
                owner.manager = self

        return direct

    def guard_store(self, live: Container[str],
                    wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """``prepare_store`` of a request whose id is not in ``live`` goes to
        ``wrap(prepare_store)`` (contained_faults.py: the store vLLM would raise on); any
        other is the tap's own, the test inline in it (no frame of the guard per job)."""
        plain = self.prepare_store
        object.__setattr__(self, "prepare_store", self._store_tap(live, wrap(plain)))

    def __getattr__(self, name: str) -> Any:
        # Only reached on a miss of this object's own attributes (a slow path:
        # vLLM calls manager.touch etc. every step). The real manager's bound
        # methods are kept here after the first call; data attributes are not.
        value = getattr(self._inner, name)
        if getattr(value, "__self__", None) is self._inner:
            object.__setattr__(self, name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        self.__dict__.pop(name, None)  # a kept bound method must not shadow the new value
        setattr(self._inner, name, value)


def _lookup_tap(inner_lookup: Callable[..., Any], log: LookupLog,
                quarantine: dict[bytes, None]) -> Callable[..., Any]:
    """The proxy's ``lookup`` (once per key looked up): a plain function over closure
    variables (no bound method, no attribute lookups), two appends, nothing else."""
    add_key, add_result, miss = log.keys.append, log.results.append, compat.MISS

    # No **kwargs: CPython builds a dict per call for it. vLLM 0.26 .. 0.33 call
    # lookup(key, req_context) positionally.
    def lookup(key, req_context=None, *args):
        if quarantine and key in quarantine:  # a rank refused these bytes: recompute
            log.add_quarantined(key)
            return miss
        if args:
            result = inner_lookup(key, req_context, *args)
        else:
            result = inner_lookup(key, req_context)
        add_key(key)
        add_result(result)
        return result

    return lookup


def _results_tap(inner_lookup: Callable[..., Any], log: LookupLog) -> Callable[..., Any]:
    """The per-key tap of a tiering scan's short scan (prefix_scan.tiered_scan_tap): each
    lookup's result only. The scan looks its keys up in order, so its tap adds the keys
    consumed after it (one slice); no quarantine test: while a key is quarantined the scan's
    tap puts :func:`_lookup_tap` in place instead. A refusal or eviction during a lookup is
    still noted at its index (``len(log.results)``)."""
    add_result = log.results.append

    def lookup(key, req_context=None, *args):
        result = inner_lookup(key, req_context, *args) if args else inner_lookup(
            key, req_context)
        add_result(result)
        return result

    return lookup


def _load_tap(inner_prepare_load: Callable[..., Any], rows: PromotedRows
              ) -> Callable[..., Any]:
    """The proxy's ``prepare_load``: checked loads exist only once promoted rows were
    digested (tiering, ``rows.expected``), so the common case costs one dict test."""
    expected, on_prepare_load = rows.expected, rows.on_prepare_load  # kept for rows' life

    def prepare_load(keys, req_context, *args, **kwargs):
        spec = inner_prepare_load(keys, req_context, *args, **kwargs)
        if expected:
            on_prepare_load(keys, spec)
        return spec

    return prepare_load


def _store_tap(inner_prepare_store: Callable[..., Any], rows: PromotedRows,
               extend: Callable[[tuple[Any, ...]], None], handler: Callable[..., None],
               error: Callable[[ErrorSite, BaseException], None],
               live: Container[str] | None = None,
               elsewhere: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """The proxy's ``prepare_store`` (once per store job): the journal gets the job (the
    refused keys coverage reads change in journal order); promoted-row digests of the
    rows it evicts or rewrites are forgotten at once. With ``live``
    (:meth:`ManagerProxy.guard_store`), a job of a request not in it goes to
    ``elsewhere``."""
    expected, quarantine, forget = rows.expected, rows.quarantine, rows.forget

    def prepare_store(keys, req_context, *args, **kwargs):
        if live is not None and req_context.req_id not in live:
            return elsewhere(keys, req_context, *args, **kwargs)
        # vLLM passes (keys, req_context): a plain call then (no tuple, no dict built)
        out = inner_prepare_store(keys, req_context, *args, **kwargs) if args or kwargs \
            else inner_prepare_store(keys, req_context)
        try:
            # the keys and the counts the job needs, not vLLM's objects: those would
            # otherwise outlive vLLM's use of them until the journal is applied (up to
            # flush_interval_s), through garbage collections (aggregator.py: why flat)
            # tuples of the keys, of those it stores and of those it evicts (C-level copies;
            # the keys' own tuple when it stores them all): the journal's items per job are
            # bounded, and the aggregator counts them per KV group (group_stores.py)
            if out is None:  # refused: no row to store into
                extend((handler, 3, None, (), tuple(keys)))
            else:
                job, to_store = tuple(keys), out.keys_to_store
                extend((handler, 3, tuple(out.evicted_keys),
                        job if len(to_store) == len(job) else tuple(to_store), job))
                if expected or quarantine:  # digests: tiering only
                    forget(out.evicted_keys)
                    forget(out.keys_to_store)
        except Exception as exc:
            error(ErrorSite.MANAGER, exc)
        return out

    return prepare_store
