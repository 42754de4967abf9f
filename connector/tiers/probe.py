"""The secondary-tier probe: data a tier confirmed written that is gone.

vLLM's fs tier never deletes a file it wrote (no eviction; it removes only a file
it could not read back), and each write ``os.makedirs`` its folders again. So when
the tier's directory is removed (or its volume unmounted or wiped) mid-run, every
later write succeeds and every earlier key silently misses: the data is lost, the
restores are recomputed, and nothing fails or is counted anywhere.

The tier taps (``tiers/taps.py``) append the keys of each completed cascade to a
bounded deque on the aggregator thread (aggregator.py; one append per job). This
module's daemon thread, every ``interval_s`` seconds, moves them into a bounded
sample of the latest keys written with their file's identity (device, inode, mtime:
``os.stat`` through vLLM's file mapper, in ``compat``), checks that the directory the
tier created at start-up is there and, ``CHECK_KEYS`` of them a probe in turn, that each
sampled key still has that very file. A sampled key whose file is gone, or was replaced
by a new one (removed, then written anew before the probe looked), is counted once
(``kvscope_tier_lost_keys_total{tier}``) and leaves the sample.

Off the scheduler thread: file-system calls may block on a sick volume, and they
must never stall a step. Errors are caught, counted
(``kvscope_telemetry_errors_total{where="tier_probe"}``) and logged once.

While vLLM's tier I/O is in flight (``busy``: a promotion or a cascade, or one within the
last ``QUIET_S``) the probe waits, at most ``MAX_DEFER_S``. Its Python work between
system calls holds the GIL, and so do vLLM's read and write threads between theirs: a long
restore is its reads, and a thread beside them that keeps the GIL for a few milliseconds
slows every one of them (on the H200 a 131k-token restore's reads are most of its
1.2-1.8 s; the probe's intakes took ~30 ms of GIL per re-ask there). Taken in once the
tier is quiet, a burst of cascades costs one intake of its newest keys, not one per tick.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from itertools import islice
from typing import Any

from kvscope.connector import compat
from kvscope.connector.aggregator import HoldBack
from kvscope.exporters import signals
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import ErrorSite

logger = logging.getLogger("kvscope")

DEFAULT_INTERVAL_S = 5.0
# How often the thread takes newly written keys in (one os.stat each, once). A key whose
# directory is removed and that is written anew before it was taken in looks untouched;
# taking keys in often keeps that blind spot short, at no more stats overall.
INTAKE_S = 0.25
# Completed cascade jobs the taps keep for the probe between two probes (oldest dropped).
WRITTEN_JOBS = 1024
# Keys whose files the probe keeps checking: the latest written.
SAMPLE_KEYS = 1024
# Of those, how many one probe checks (os.stat each, off-thread), in turn: a whole sample
# every SAMPLE_KEYS / CHECK_KEYS probes (40 s by default). A removed directory shows in the
# first check all the same (every file of it gone). A whole sample's stats took 7-25 ms of
# the probe thread's CPU inside a 400k-token restore on CPU (a 1,024-key check there: 7-15
# ms, against 2.7 ms on a quiet tier), GIL time between the stats that a restore's reads and
# vLLM's engine thread wait for.
CHECK_KEYS = 128
# The tier counts as busy this long after its last job started or finished (vLLM starts a
# restore's promotions a step or two after the cascades before it end).
QUIET_S = 0.5
# The longest the probe waits for a quiet tier: under sustained traffic it runs anyway.
MAX_DEFER_S = 30.0
_ERROR = (ErrorSite.TIER_PROBE.value,)


class TierProbe:
    """Checks, off the scheduler thread, that recently written tier data still exists."""

    def __init__(self, *, recorder: Recorder, tiers: list[Any], written: deque,
                 interval_s: float = DEFAULT_INTERVAL_S, sample_keys: int = SAMPLE_KEYS,
                 check_keys: int = CHECK_KEYS, busy: Callable[[], bool] | None = None,
                 max_defer_s: float = MAX_DEFER_S) -> None:
        self.rec = recorder
        self.written = written  # (tier name, keys) per completed cascade, from the taps
        self.interval_s = interval_s
        self.sample_keys = sample_keys
        self.check_keys = check_keys
        # while vLLM's tier I/O is in flight (TierTaps.busy); None: never waits
        self.hold_back = HoldBack(busy, max_defer_s)
        # probed tiers: the file-backed ones (a name once: it is the series' label); none
        # when the probe is off (no series then: a gauge nobody updates would lie)
        self.tiers: dict[str, Any] = {}
        for tier in tiers if interval_s > 0 else ():
            name = compat.tier_type(tier)
            if compat.tier_home(tier) is not None and name not in self.tiers:
                self.tiers[name] = tier
        # tier -> key -> (device, inode, mtime ns) of its file when sampled, latest last
        self.samples: dict[str, OrderedDict[bytes, tuple]] = {n: OrderedDict() for n in self.tiers}
        # tier -> where in its sample the next check starts (the sample's order, oldest first)
        self._turn: dict[str, int] = {n: 0 for n in self.tiers}
        self.probes = 0  # completed probes (tests poll it)
        self._intake_lost: dict[str, int] = {}  # found lost on intake, not yet exported
        self._logged = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Declared on the constructing thread: the probe thread then only updates them.
        for name, tier in self.tiers.items():
            labels = (name,)
            recorder.declare(signals.TIER_LOST_KEYS, labels)
            recorder.set(signals.TIER_LAST_LOSS_TIMESTAMP, labels, 0.0)
            recorder.set(signals.TIER_ROOT_PRESENT, labels, float(_home_present(tier)))

    def start(self) -> TierProbe:
        if self.tiers and self.interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kvscope-tier-probe",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(self.interval_s, 1.0) + 5.0)
            self._thread = None

    def _run(self) -> None:
        intake_s = min(self.interval_s, INTAKE_S)
        checked = time.monotonic()
        while not self._stop.wait(intake_s):
            if self._held():
                continue
            if time.monotonic() - checked >= self.interval_s:
                checked = time.monotonic()
                self.probe()
            else:
                self.intake()

    def _held(self) -> bool:
        try:
            return self.hold_back.hold()
        except Exception as exc:
            self._error(exc)
            return False

    def intake(self) -> None:
        """Take the newly written keys in (their files' identities). Never raises."""
        try:
            for name, count in self._take_written().items():
                self._intake_lost[name] = self._intake_lost.get(name, 0) + count
        except Exception as exc:
            self._error(exc)

    def probe(self) -> None:
        """One pass: take the newly written keys in, check the sample, export. Never raises."""
        self.intake()
        try:
            lost, self._intake_lost = self._intake_lost, {}
            for name, tier in self.tiers.items():
                self._check(name, tier, lost.get(name, 0))
        except Exception as exc:
            self._error(exc)
        self.probes += 1

    def _take_written(self) -> dict[str, int]:
        """Newly written keys into the samples, with their file's identity; returns the keys
        found lost on the way, per tier (gone already, or replaced since it was sampled).
        Only each tier's newest ``sample_keys`` keys are looked at: the older ones would
        leave the sample at once, and a long prefix's cascades write thousands of keys an
        intake (a file-system call each, on a thread that shares the GIL with vLLM's)."""
        lost: dict[str, int] = {}
        newest: dict[str, list] = {}
        popleft = self.written.popleft
        while True:
            try:
                name, keys = popleft()  # the taps append on the aggregator thread meanwhile
            except IndexError:
                break
            if name in self.samples:
                taken = newest.setdefault(name, [])
                taken.extend(keys)
                if len(taken) > 2 * self.sample_keys:
                    del taken[:-self.sample_keys]
        for name, keys in newest.items():
            sample, tier = self.samples[name], self.tiers.get(name)
            for key in keys[-self.sample_keys:]:
                now = compat.secondary_file_identity(tier, key)
                if (sample[key] != now) if key in sample else now is None:
                    lost[name] = lost.get(name, 0) + 1
                if now is None:
                    sample.pop(key, None)
                else:
                    sample[key] = now
                    sample.move_to_end(key)
            while len(sample) > self.sample_keys:
                sample.popitem(last=False)
        return lost

    def _check(self, name: str, tier: Any, lost_on_intake: int) -> None:
        labels = (name,)
        self.rec.set_threadsafe(signals.TIER_ROOT_PRESENT, labels, float(_home_present(tier)))
        sample = self.samples[name]
        # this probe's turn of the sample: ``check_keys`` of it, from where the last check
        # stopped (keys come and go meanwhile: a turn is about, not exactly, the next ones)
        start = self._turn[name]
        if start >= len(sample):
            start = 0
        turn = list(islice(sample.items(), start, start + self.check_keys))
        # gone, or another file under its name (removed, then written anew: the data the
        # tier had confirmed is lost all the same)
        lost = [key for key, ident in turn
                if compat.secondary_file_identity(tier, key) != ident]
        self._turn[name] = start + len(turn) - len(lost)  # the lost leave: the rest move up
        for key in lost:
            del sample[key]
        count = len(lost) + lost_on_intake
        if not count:
            return
        self.rec.inc_threadsafe(signals.TIER_LOST_KEYS, labels, count)
        self.rec.set_threadsafe(signals.TIER_LAST_LOSS_TIMESTAMP, labels, time.time())
        logger.warning("kvscope: %d key(s) the %s tier confirmed written are gone (its "
                       "directory %s %s)", count, name, compat.tier_home(tier),
                       "exists" if _home_present(tier) else "is gone")

    def _error(self, exc: BaseException) -> None:
        try:
            self.rec.inc_threadsafe(signals.TELEMETRY_ERRORS, _ERROR)
            if not self._logged:
                self._logged = True
                logger.warning("kvscope telemetry error in the tier probe (serving continues; "
                               "further errors are only counted in %s): %r",
                               signals.TELEMETRY_ERRORS.name, exc, exc_info=exc)
        except Exception:  # pragma: no cover - last line of defence
            pass


def _home_present(tier: Any) -> bool:
    home = compat.tier_home(tier)
    return home is not None and os.path.isdir(home)
