"""The lookups read from vLLM's prefix scan (prefix_scan.py) are the lookups the per-key tap
records, scan by scan, on every CPU scenario run with the CPU tier alone and one KV group
(where the scan tap is what kvscope installs), and a scenario's series are the same
whichever of the two recorded them.

The per-key tap is the oracle here: it records what vLLM's manager answered to each key.
Each engine is built with ``per_key_lookups`` on; its scan is then wrapped twice: the scan
tap writing into a second log, and around it a check that the keys and results it wrote
equal what the per-key tap recorded during that scan. A difference fails inside vLLM's call.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from kvscope.connector import compat
from kvscope.connector.lookup import prefix_scan
from kvscope.connector.lookup.rounds import LookupLog
from kvscope.connector.lookup.scan_cache import DeferredScans
from kvscope.connector.scheduler.observer import SchedulerObserver
from kvscope.exporters import signals as S
from kvscope.sim.catalog import CATALOG
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt
from kvscope.sim.scenario_run import run_scenario
from tests.connector.support import rounds_answered

pytestmark = pytest.mark.vllm

# The CPU tier alone, one full-attention KV group: where kvscope reads the scan
ONE_GROUP_CPU = {"tiering": False, "kv_groups": 1}


def _no_switch() -> None:
    """The per-key tap's switch in the reference's tapped scan: it stays in place."""


def _results_beside(proxy, shadow: LookupLog) -> tuple:
    """The results-only switches of a reference's tapped scan: on, the per-key tap stays
    and each result is also appended to the shadow log; off, the per-key tap alone."""
    restore: list = []

    def on() -> None:
        full = proxy.lookup

        def both(key, req_context=None, *args):
            result = full(key, req_context, *args)
            shadow.results.append(result)
            return result

        restore.append(full)
        object.__setattr__(proxy, "lookup", both)

    def off() -> None:
        if restore:
            object.__setattr__(proxy, "lookup", restore.pop())

    return on, off


def _kind(results: list) -> str:
    if compat.HIT_PENDING in results:
        return "pending"
    if results and results[-1] is compat.MISS:
        return "stopped at a miss" if len(results) > 1 else "first key missed"
    return "reached the end" if results else "nothing scanned"


@pytest.fixture
def checked_scans(monkeypatch):
    """Every SchedulerObserver built meanwhile records per key, and its scans are checked
    against the scan tap; yields a Counter of the scans checked, by kind. Every scan is read
    and a bare rest taken wherever it may be (short scans too, which kvscope's own tap
    leaves to the results-only tap and runs without a bare rest: neither pays there), so
    each scenario checks them."""
    monkeypatch.setattr(prefix_scan, "SCAN_MIN_KEYS", 0)
    monkeypatch.setattr(prefix_scan, "BARE_MIN_KEYS", 2)
    monkeypatch.setattr(prefix_scan, "BARE_ROWS_PER_KEY", 1 << 40)
    return _checking(monkeypatch, short=False)


@pytest.fixture
def checked_short_scans(monkeypatch):
    """:func:`checked_scans` with kvscope's own cut: a tiering scan shorter than
    ``SCAN_MIN_KEYS`` runs with the proxy's results-only tap (each lookup's result; the
    scan's tap adds the keys it consumed after it), here beside the per-key reference."""
    return _checking(monkeypatch, short=True)


def _checking(monkeypatch, short: bool) -> Counter:
    seen: Counter = Counter()
    original = SchedulerObserver.__init__
    wrote: list = []  # the keys a shadow scan's promotions wrote rows for, in order

    def bare_counted(bare):
        def counted(on: bool) -> bool:
            done = bare(on)
            if on and done:
                seen["bare rest"] += 1
            return done
        return counted

    def init(self, *args, **kwargs):
        kwargs["per_key_lookups"] = True
        # The reference, the per-key log, records each promotion's refusal and evictions
        # as it happens, at the lookup in progress, beneath kvscope's prepare_write tap:
        # it sees every call, also those of a scan's bare rest (bare_rest.BareRest),
        # which runs vLLM's own (here this) without kvscope's tap
        noted: list = []  # (log, cursor) once the observer is built
        primary = compat.primary_tier(kwargs["connector_scheduler"].manager)
        own = getattr(primary, "prepare_write", None)
        if own is not None:
            def write_noted(keys, req_context, *a, **kw):
                out = own(keys, req_context, *a, **kw)
                if noted and noted[1].it is not None:  # inside a shadow scan
                    if out is None:
                        noted[0].add_refusal(len(keys))
                    else:
                        wrote.extend(out.keys_to_store)
                        if out.evicted_keys:
                            noted[0].add_evictions(out.evicted_keys)
                return out

            primary.prepare_write = write_noted
        original(self, *args, **kwargs)
        cs = self.cs
        inner = cs.manager._inner
        shadow = LookupLog()
        errors: list = []
        scan, error = getattr(cs, compat.SCAN_METHOD), lambda site, exc: errors.append(exc)
        result_of = compat.scan_reader(cs, inner)
        read = compat.tiered_scan_reader(cs, inner) if result_of is None else None
        if result_of is not None:
            tapped = prefix_scan.scan_tap(scan, shadow, result_of, error)
        elif read is not None:  # the per-key tap stays in place: no switch (per_key)
            # every other scan of a plain round may be left counted from the kept row
            # states (scan_cache.py): the others are read key by key, as are rounds that
            # are not plain
            assert self.taps.changes_logged
            scans = DeferredScans(self.taps.changes, read.places)
            tapped = prefix_scan.tiered_scan_tap(scan, shadow, read, self.taps.cursor,
                                                 self.rows.quarantine,
                                                 (_no_switch, *_results_beside(cs.manager,
                                                                              shadow)),
                                                 error, scans,
                                                 None, bare_counted(self.taps.bare)
                                                 if read.bare_ok else None)
            noted[:] = [self.log, self.taps.cursor]
        else:
            return
        log = self.log
        turn = [0]

        def checking(keys, req_context, *rest):
            k0, r0, e0 = len(log.keys), len(log.refusals), len(log.evictions)
            quarantined = bool(self.rows.quarantine)
            shadow.start = 0 if log.start >= 0 else -1
            turn[0] += 1
            shadow.compact = read is not None and shadow.start == 0 and turn[0] % 2 == 0
            wrote.clear()
            try:
                n = tapped(keys, req_context, *rest)
            finally:
                shadow.compact = False
            assert not errors, errors
            if quarantined and read is not None:  # recorded by the per-key tap alone
                assert not shadow.keys
                seen["quarantined: per key"] += 1
                return n
            if short and type(keys) is list and len(keys) < prefix_scan.SCAN_MIN_KEYS:
                # the results-only tap beside the reference: its results, and the keys the
                # scan's tap added after it. A refusal or eviction meanwhile is the primary
                # tier's tap's, noted at once into the one log (as the reference's are)
                assert shadow.keys == log.keys[k0:], (n, shadow.keys, log.keys[k0:])
                assert shadow.results == log.results[k0:], (n, shadow.results)
                seen["short: " + _kind(shadow.results)] += 1
                if len(log.refusals) > r0 or len(log.evictions) > e0:
                    seen["short: refused or evicted"] += 1
                shadow.keys.clear()
                shadow.results.clear()
                return n
            if shadow.counted is not None:  # counted: the per-key tap's counts of the scan
                got, shadow.counted = shadow.counted, None
                results = log.results[k0:]
                assert not shadow.keys and results, (got, len(results))
                want = (*(results.count(v) for v in (compat.HIT, compat.HIT_PENDING,
                                                     compat.RETRY, compat.MISS)),
                        len(results), log.keys[-1])
                assert got == want, (n, got[:5], want[:5])
                seen["counted"] += 1
                seen[_kind(results)] += 1
                return n
            assert shadow.keys == log.keys[k0:], (n, len(keys))
            assert shadow.results == log.results[k0:], (n, shadow.results, log.results[k0:])
            assert shadow.refusals == [(i - k0, c) for i, c in log.refusals[r0:]]
            evictions = [(i - k0, ks) for i, ks in list(log.evictions)[e0:]]
            scanned = log.keys[k0:]
            if shadow.start == 0 and evictions and n is None and (
                    wrote == scanned or all(set(gone).isdisjoint(scanned)
                                            for _, gone in evictions)):
                # each lookup of a round promoted its own key, or its promotions evicted
                # none of its keys: the scan tap leaves the evictions out of the round,
                # because none took a row the round had found
                assert list(shadow.evictions) == []
                keys, results = log.keys[k0:], log.results[k0:]
                for i, gone in evictions:
                    found = {k for k, r in zip(keys[:i], results[:i]) if r is not compat.MISS}
                    assert found.isdisjoint(gone), (i, len(gone))
                seen["evictions left out" if wrote != scanned
                     else "own promotions' evictions left out"] += 1
            else:
                assert list(shadow.evictions) == evictions
            seen[_kind(shadow.results)] += 1
            if shadow.refusals:
                seen["refused a promotion"] += 1
            if shadow.evictions:
                seen["evicted"] += 1
            if compat.RETRY in shadow.results:
                seen["retry"] += 1
            for slot in (shadow.keys, shadow.results, shadow.refusals, shadow.evictions):
                slot.clear()
            return n

        setattr(cs, compat.SCAN_METHOD, checking)

    monkeypatch.setattr(SchedulerObserver, "__init__", init)
    return seen


# Scenarios of a secondary tier itself (the fs tier's directory removed) need tiering
NEEDS_TIERING = {"tier-data-lost"}
# Scenarios that build their own KV groups (groups of different block sizes): several
# groups, so the per-key tap records their lookups whatever the test asks
OWN_KV_GROUPS = {"tier-flooded", "healthy-hybrid"}


def _runs_with_one_group_cpu_tier() -> list[str]:
    return [name for name, s in CATALOG.items()
            if not s.variant and name not in NEEDS_TIERING | OWN_KV_GROUPS]


@pytest.mark.parametrize("name", _runs_with_one_group_cpu_tier())
def test_each_scan_of_a_scenario_reads_what_the_lookups_answered(name, checked_scans):
    with run_scenario(name, exporter_port=None, **ONE_GROUP_CPU):
        pass
    assert sum(checked_scans.values()) > 0, f"{name}: no scan was checked"


def test_a_deferred_scan_reads_the_pending_keys(checked_scans):
    """A prompt asked while the same prompt's first chunks are still being stored: the
    scan meets HIT_PENDING rows (not ready) and is deferred."""
    cfg = replace(EngineConfig(rows=12, num_gpu_blocks=40, max_num_batched_tokens=16),
                  **ONE_GROUP_CPU)
    with CPUEngine(cfg) as e:
        target = prompt(1, 96)
        e.add_request(target, 4)
        for _ in range(3):  # its first chunks prefilled, their stores in flight
            e.step()
        e.add_request(target, 4)
        e.drain()
    assert checked_scans["pending"] > 0, checked_scans


def _mixed_workload(**options) -> CPUEngine:
    """Prompts sharing prefixes of several lengths, asked in batches, each batch followed by
    a long prompt that evicts the GPU prefix cache; the engine, drained (close it)."""
    rnd = random.Random(7)
    bases = [prompt(100 + b, 160) for b in range(3)]
    cfg = replace(EngineConfig(rows=200, num_gpu_blocks=40, max_num_seqs=4,
                               kvscope_options=options), **ONE_GROUP_CPU)
    e = CPUEngine(cfg)
    for i in range(10):
        batch = []
        for _ in range(4):
            head = rnd.choice(bases)[:16 * rnd.randrange(1, 11)]
            tail = prompt(rnd.randrange(10**6), rnd.randrange(0, 40))
            batch.append(e.add_request(head + tail, 2))
        e.run_until_done(batch)
        e.generate(prompt(1000 + i, 560), 1)  # evicts the GPU prefix cache
    e.drain()
    return e


def test_scans_of_a_mixed_workload(checked_scans):
    """Scans that hit to the end of the keys (a shorter prefix than the tier holds), that
    stop at a miss after hits (a longer one), and that miss at once."""
    _mixed_workload().close()
    for kind in ("stopped at a miss", "reached the end", "first key missed"):
        assert checked_scans[kind] > 0, checked_scans


# the host's memory and this process's RSS: readings of the machine, not of the lookups
MACHINE = (S.HOST_MEMORY_AVAILABLE, S.PROCESS_RESIDENT_MEMORY)


def _series(recorder, *left_out) -> tuple:
    """Every series but those in seconds (clock readings: ages, timestamps, durations, the
    seconds restores spent per phase), the machine's memory readings and the metrics
    ``left_out``."""
    snap = recorder.snapshot()

    def kept(items):
        return {k: v for k, v in items
                if "_seconds" not in k[0].name and k[0] not in left_out
                and k[0] not in MACHINE}

    return (kept(snap.counters.items()), kept(snap.gauges.items()),
            kept((k, (h.count, h.counts)) for k, h in snap.histograms.items()))


@pytest.mark.parametrize("name", ["truncated", "healthy", "pending-at-idle"])
def test_the_series_are_the_same_either_way(name):
    got = {}
    for per_key in (True, False):
        with run_scenario(name, exporter_port=None,
                          kvscope_options={"per_key_lookups": per_key}, **ONE_GROUP_CPU) as run:
            obs = run.engine.connector._kvscope_observer
            assert obs.lookups_from_scan is not per_key
            got[per_key] = [_series(r) for r in run.recorders]
    assert got[True] == got[False]


def test_the_series_of_a_mixed_workload_are_the_same_either_way():
    got = {}
    for per_key in (True, False):
        with _mixed_workload(per_key_lookups=per_key) as e:
            assert e.connector._kvscope_observer.lookups_from_scan is not per_key
            got[per_key] = _series(e.connector.kvscope_recorder)
    assert got[True] == got[False]
    hits = got[True][0][(S.LOOKUPS, ("0", S.LookupResult.HIT.value))]
    assert hits > 0  # the workload's scans found keys


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_per_key_lookups_is_a_boolean(value):
    from kvscope.connector.settings import Settings

    with pytest.raises(ValueError, match="per_key_lookups must be true or false"):
        Settings.from_extra_config({"kvscope": {"per_key_lookups": value}})
    assert Settings.from_extra_config({"kvscope": {"per_key_lookups": True}}).per_key_lookups


def test_a_release_whose_scan_was_not_read_keeps_the_per_key_tap(monkeypatch):
    from kvscope.connector.compat import versions

    with CPUEngine(replace(EngineConfig(rows=12), **ONE_GROUP_CPU)) as e:
        obs = e.connector._kvscope_observer
        assert obs.lookups_from_scan  # this release, this engine: read from the scan
        assert compat.scan_reader(obs.cs, obs.primary) is not None
        monkeypatch.setattr(versions, "VLLM_VERSION", "0.35.0")
        assert compat.scan_reader(obs.cs, obs.primary) is None


# vLLM's tiering manager over the CPU tier and the fs tier, one full-attention KV group: the
# tiering scan tap (prefix_scan.tiered_scan_tap), the fs tier's I/O settled every step or not
ONE_GROUP_TIERING = {"tiering": True, "kv_groups": 1}


def _catalogued() -> list[str]:
    return [name for name, s in CATALOG.items() if not s.variant and name not in OWN_KV_GROUPS]


@pytest.mark.parametrize("settle", [True, False], ids=["settled", "racing"])
@pytest.mark.parametrize("name", _catalogued())
def test_each_scan_of_a_tiering_scenario_reads_what_the_lookups_answered(name, settle,
                                                                          checked_scans):
    with run_scenario(name, exporter_port=None, settle_tiers=settle, **ONE_GROUP_TIERING):
        pass
    assert sum(checked_scans.values()) > 0, f"{name}: no scan was checked"


@pytest.mark.parametrize("settle", [True, False], ids=["settled", "racing"])
@pytest.mark.parametrize("name", _catalogued())
def test_each_short_scan_of_a_tiering_scenario_reads_what_the_lookups_answered(
        name, settle, checked_short_scans):
    with run_scenario(name, exporter_port=None, settle_tiers=settle, **ONE_GROUP_TIERING):
        pass
    assert sum(n for kind, n in checked_short_scans.items() if kind.startswith("short: ")
               ) > 0, f"{name}: no short scan was checked"


def _long_restore(keys: int, held: int, floods: int = 1, **options) -> tuple:
    """A prompt of ``keys`` chunks stored, pushed out of the GPU and the CPU tier by
    ``floods`` others as long as it (two: every one of its primary rows taken), then asked
    again: restored from the fs tier, its promotions held ``held`` steps (as many deferred
    rounds of every key). The engine, drained (close it), the rounds' answers before the
    re-ask, the first ask and the re-ask."""
    r = random.Random(keys)
    prompts = [[r.randrange(1, 30_000) for _ in range(keys * 16)] for _ in range(1 + floods)]
    cfg = replace(EngineConfig(rows=keys + keys // 10, num_gpu_blocks=keys + 200,
                               max_num_batched_tokens=4096, max_num_seqs=4,
                               max_model_len=keys * 16 + 64, promotion_delay_steps=held,
                               kvscope_options=options), **ONE_GROUP_TIERING)
    e = CPUEngine(cfg)
    first = e.generate(prompts[0], 2, max_steps=1_000)
    for flood in prompts[1:]:  # evicts it from the GPU and the CPU tier
        e.generate(flood, 2, max_steps=1_000)
        e.drain(max_steps=1_000)
    answers = rounds_answered(e)
    again = e.generate(prompts[0], 2, max_steps=1_000)
    e.drain(max_steps=1_000)
    return e, answers, first, again


def test_a_long_prefix_restored_from_the_fs_tier(checked_scans):
    """Thousands of keys, deferred round after round while their promotions are held: the
    first round starts them (RETRY on 0.26, HIT_PENDING on 0.33), the next ones find them
    being written, the last finds them ready."""
    e, answers, _, _ = _long_restore(2_000, held=6)
    with e:
        assert e.connector._kvscope_observer.lookups_from_scan is False  # checked per key
    assert answers.count(None) >= 5 and answers[-1] > 0, answers
    assert checked_scans["pending"] >= 5, checked_scans
    assert checked_scans["counted"] >= 2, checked_scans
    # its promoting scan evicted the other prompt's rows, left out of the round
    assert checked_scans["evictions left out"] >= 1, checked_scans


def test_a_restore_whose_rows_were_all_flooded_out_promotes_bare(checked_scans):
    """Every key of the prompt evicted from the primary tier, so its promoting scan runs its
    keys after the first without kvscope's primary-tier tap (bare_rest.BareRest) and reads
    its promotions and evictions from the rows: each scan's keys, results, refusals and
    evictions as the per-key reference recorded them."""
    e, _, first, again = _long_restore(1_500, held=3, floods=2)
    e.close()
    assert again.num_external_tokens == 1_500 * 16  # the whole prompt, from the fs tier
    assert again.output == first.output
    assert checked_scans["bare rest"] >= 1, checked_scans
    assert checked_scans["own promotions' evictions left out"] >= 1, checked_scans


def test_a_bare_rest_that_cannot_be_decided_leaves_the_scan_to_the_tap(monkeypatch):
    """The tiers' reader failing where the scan decides on a bare rest: the error counted,
    the scan run with the tap, vLLM's restore whole."""
    real = compat.tiered_scan_reader

    def failing(cs, manager):
        reader = real(cs, manager)
        if reader is None:
            return None

        def may_promote(key, req_context):
            raise RuntimeError("a tier state kvscope cannot read")

        return reader._replace(may_promote=may_promote)

    monkeypatch.setattr(compat, "tiered_scan_reader", failing)
    e, _, first, again = _long_restore(600, held=3, floods=2)
    with e:
        assert e.connector.kvscope_recorder.value(
            S.TELEMETRY_ERRORS, (S.ErrorSite.LOOKUP.value,)) >= 1
    assert again.num_external_tokens == 600 * 16
    assert again.output == first.output


def test_a_tapped_scan_looks_keys_up_on_vllms_own_manager():
    """While a tiering scan's tap reads its lookups (per-key tap off), vLLM's loop calls
    its own manager, not the proxy (whose ``__getattr__`` CPython cannot specialize), and
    the proxy is in place again after each scan."""
    r = random.Random(3)
    prompts = [[r.randrange(1, 30_000) for _ in range(300 * 16)] for _ in range(2)]
    cfg = replace(EngineConfig(rows=330, num_gpu_blocks=500, max_num_batched_tokens=4096,
                               max_num_seqs=4, max_model_len=300 * 16 + 64,
                               promotion_delay_steps=2,
                               kvscope_options={"per_key_lookups": False}),
                  **ONE_GROUP_TIERING)
    with CPUEngine(cfg) as e:
        cs = e.connector._kvscope_observer.cs
        proxy = cs.manager
        inner, real = proxy._inner, proxy._inner.lookup
        seen: list[bool] = []

        def lookup(key, req_context, *rest):  # vLLM's own, as the scan reaches it
            seen.append(cs.manager is inner)
            return real(key, req_context, *rest)

        inner.lookup = lookup
        e.generate(prompts[0], 2, max_steps=1_000)
        e.generate(prompts[1], 2, max_steps=1_000)
        e.drain(max_steps=1_000)
        e.generate(prompts[0], 2, max_steps=1_000)
        e.drain(max_steps=1_000)
        assert cs.manager is proxy
    assert len(seen) > 300  # the re-ask's scans looked every key up
    assert set(seen) == {True}


def test_a_long_restore_reads_its_lookups_from_the_scan():
    with _long_restore(600, held=3)[0] as e:
        assert e.connector._kvscope_observer.lookups_from_scan


@pytest.mark.parametrize("name", ["truncated", "healthy", "capacity-ceiling", "stale-rows",
                                  "store-never-fits"])
def test_the_series_of_a_tiering_scenario_are_the_same_either_way(name):
    """Tiers settled every step: two runs do the same (racing tiers time each run anew, as
    the livelock's background stepping and concurrency's threads time theirs). stale-rows quarantines keys: its
    scans are recorded per key meanwhile (ManagerProxy.per_key_switches). The count of steps is
    left out: the fs tier's threads time how many steps a drain takes, per-key tap or not."""
    got = {}
    for per_key in (True, False):
        with run_scenario(name, exporter_port=None,
                          kvscope_options={"per_key_lookups": per_key},
                          **ONE_GROUP_TIERING) as run:
            obs = run.engine.connector._kvscope_observer
            assert obs.lookups_from_scan is not per_key
            got[per_key] = [_series(r, S.SCHEDULER_STEPS) for r in run.recorders]
    assert _differences(got[True], got[False]) == []


def test_the_series_of_a_long_restore_are_the_same_either_way():
    got = {}
    for per_key in (True, False):
        e, answers, _, _ = _long_restore(1_000, held=4, per_key_lookups=per_key)
        with e:
            assert e.connector._kvscope_observer.lookups_from_scan is not per_key
            got[per_key] = (_series(e.connector.kvscope_recorder), answers)
    assert got[True] == got[False]
    assert got[True][1].count(None) >= 3


def test_two_kv_groups_with_tiering_keep_the_per_key_tap():
    with CPUEngine(replace(EngineConfig(rows=12), tiering=True, kv_groups=2)) as e:
        obs = e.connector._kvscope_observer
        assert compat.tiered_scan_reader(obs.cs, obs.cs.manager._inner) is None
        assert not obs.lookups_from_scan


def _differences(a: list, b: list) -> list:
    """(metric, labels, a's value, b's) of each series that differs, per recorder."""
    out = []
    for ra, rb in zip(a, b, strict=True):
        for da, db in zip(ra, rb):
            out += [(k[0].name, k[1], da.get(k), db.get(k)) for k in sorted(
                set(da) | set(db), key=repr) if da.get(k) != db.get(k)]
    return out


def test_the_primary_tiers_tap_hands_vllm_exactly_the_arguments_it_was_given():
    # the tap calls vLLM's prepare_write plainly when given (keys, req_context), as vLLM
    # calls it, and spreads anything more: an argument vLLM's does not take fails as it
    # would without kvscope (nothing dropped, nothing added)
    with CPUEngine(EngineConfig(rows=64, tiering=True)) as e:
        primary = e.connector._kvscope_observer.taps.primary
        tap = primary.prepare_write
        own = tap.__wrapped__
        assert own is not tap and getattr(own, "__self__", None) is primary
        for extra, kw in (((7,), {}), ((), {"extra": 7}), ((7,), {"extra": 7})):
            with pytest.raises(TypeError) as vllms:
                own([b"k"], None, *extra, **kw)
            with pytest.raises(TypeError) as tapped:
                tap([b"k"], None, *extra, **kw)
            assert str(tapped.value) == str(vllms.value)


def test_the_primary_tiers_per_job_taps_are_set_once_a_deferred_scan_is_kept():
    """Until a deferred scan's row states are kept (scan_cache.py), nothing reads the log of
    primary rows changed, and a store job costs vLLM no frame of kvscope's there; from the
    first kept scan on, every store job's keys and every finished write are logged."""
    names = ("prepare_store", "complete_store", "complete_write")
    r = random.Random(3)
    short = [r.randrange(1, 30_000) for _ in range(8 * 16)]
    with CPUEngine(replace(EngineConfig(rows=64, num_gpu_blocks=64), **ONE_GROUP_TIERING)) as e:
        taps = e.connector._kvscope_observer.taps
        e.generate(short, 2, max_steps=1_000)  # short scans only: none kept
        e.drain(max_steps=1_000)
        assert taps.changes_logged and not taps.changes.watched
        assert not any(getattr(getattr(taps.primary, n), compat.WRAPPED_MARK, False)
                       for n in names)
    e, answers, _, _ = _long_restore(600, held=3)
    with e:
        taps = e.connector._kvscope_observer.taps
        assert answers.count(None) >= 2, answers  # deferred rounds: their states kept
        assert taps.changes.watched
        assert all(getattr(getattr(taps.primary, n), compat.WRAPPED_MARK, False)
                   for n in names)
        logged, epoch = len(taps.changes.keys), taps.changes.epoch
        after = e.generate(short, 2, max_steps=1_000)  # its 8 chunks stored: logged
        e.drain(max_steps=1_000)
        assert after.output
        assert taps.changes.epoch > epoch or len(taps.changes.keys) >= logged + 8, (
            len(taps.changes.keys), logged)
