"""The rest of a promoting scan, after its first key, without the primary tier's tap.

A restore from disk's promoting scan looks up each of its keys and, for each, vLLM's tiering
manager asks the primary tier for a row (``prepare_write``): ~8,190 calls in a 131k-token
restore, ~25,000 at 400k, each evicting a row of a full tier. kvscope's tap there is a
Python frame per call (tiers/taps.py). Where no key of the request has a primary row when
the scan starts, what those calls did can be read from the primary rows once the scan
returns instead: a promotion inserts its key's row at the end of the cache policy's dict
(the only insert during a scan), an eviction deletes a row, and a refused promotion stops
the scan at its key. So the scan's first key is looked up with the tap (the step's poll of
finished tier jobs, which may remove rows, happens in that lookup), and then this empty
iterator, reached between the first key and the rest, notes the rows' keys and puts vLLM's
own ``prepare_write`` back until the scan returns (prefix_scan.tiered_scan_tap).
``tests/connector/test_prefix_scan.py`` checks every such scan against the per-key
reference.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import filterfalse, islice
from typing import Any

from kvscope.exporters.signals import ErrorSite


class BareRest:
    """An empty iterator vLLM's scan reaches between its first key and the others
    (``chain((first,), rest, others)``: every key stays a C-level step). Reached, it notes
    the primary tier's rows (their keys, one C-level copy) and puts vLLM's own
    ``prepare_write`` back (``bare(True)``): the rest of the scan's promotions, each a
    frame of kvscope's before (a 131k-token restore's ~8,190, each evicting a row), are
    read from the rows as the scan returns (:meth:`sweep`). Only where no key of the request
    had a primary row before the scan (none can be found, then evicted) and the scan opens
    its round."""

    __slots__ = ("rows", "bare", "error", "before", "reached")

    def __init__(self, rows: Callable[[], dict], bare: Callable[[bool], bool],
                 error: Callable[[ErrorSite, BaseException], None]) -> None:
        self.rows = rows
        self.bare = bare
        self.error = error
        self.before: list[bytes] | None = None  # the rows' keys when reached, if bare
        self.reached = False

    def __iter__(self) -> BareRest:
        return self

    def __next__(self) -> bytes:
        try:  # never an exception into vLLM's scan but the end of this empty part
            if not self.reached:
                self.reached = True
                before = list(self.rows())
                if self.bare(True):
                    self.before = before
        except Exception as exc:
            self.error(ErrorSite.LOOKUP, exc)
        raise StopIteration

    def sweep(self, keys: list[bytes], m: int, cursor: Any, req_context: Any,
              promotes: Callable[[bytes, Any], bool]) -> None:
        """The scan returned, its tap back in place: what the promotions after its first
        key did, read from the primary tier's rows. A promotion inserts its key's row at
        the end of the rows (the only insert during a scan), an eviction deletes one, so
        the keys added are the rows' last ones and the keys evicted those noted and gone.
        The promotions join the tap's in ``cursor.promoted``, the evictions go to
        ``cursor.swept`` (none of them a key of the request: never the round's). A
        promotion the primary tier refused stopped the scan at its key: the last key
        looked up, which has no row, though a secondary tier has it (``promotes``)."""
        before, rows = self.before, self.rows()
        n0, n1 = len(before), len(rows)
        if n1 == n0 and (not n0 or next(reversed(rows)) == before[-1]):
            gone: list[bytes] = []  # no row added (the last is the same), none deleted
        else:
            gone = list(filterfalse(rows.__contains__, before))
        added = n1 - n0 + len(gone)
        if added:
            cursor.promoted.extend(islice(rows, n1 - added, None))
        if gone:
            cursor.swept.extend(gone)
        last = keys[m - 1]
        if last not in rows and promotes(last, req_context):
            cursor.refusals.append((len(keys) - m, 1))  # as the tap notes it: a hint
