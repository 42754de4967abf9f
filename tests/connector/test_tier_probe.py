"""The secondary-tier probe (connector/tiers/probe.py) on vLLM's real scheduler on CPU.

The fs tier's directory removed mid-run: every later write succeeds (vLLM recreates
the folders) and every earlier key silently misses. Judged by engine truth first (the
block files on disk before the removal, the tokens the re-ask restored), then by
what kvscope exported about it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import replace

import pytest

from kvscope.exporters import signals as S
from kvscope.exporters.prometheus import start_exporter
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt
from tests.connector.support import Exposition

pytestmark = pytest.mark.vllm

TOKENS = 96  # 6 chunks of 16 tokens
PROBE_S = 0.05
CFG = EngineConfig(rows=12, kv_groups=1, world_size=2, num_gpu_blocks=16,
                   max_num_batched_tokens=16, kvscope_options={"tier_probe_interval_s": PROBE_S})


@contextlib.contextmanager
def engine(**kw):
    e = CPUEngine(replace(CFG, **kw))
    exporter = start_exporter([e.connector.kvscope_recorder], 0)
    try:
        yield e, lambda: Exposition.scrape(exporter.url)
    finally:
        exporter.close()
        e.close()


def probe(e: CPUEngine):
    return e.connector._kvscope_observer.probe


def block_files(root: str) -> set[str]:
    return {os.path.join(d, f) for d, _, files in os.walk(root) for f in files
            if f.endswith(".bin")}


def until(cond, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(PROBE_S / 2)


def probes_after(e: CPUEngine, n: int) -> None:
    """Wait until ``n`` more probes than now have completed."""
    target = probe(e).probes + n
    until(lambda: probe(e).probes >= target, what=f"{n} probes")


def stored_then_flooded(e: CPUEngine):
    """The target's prompt, then others that push it out of the GPU and the CPU tier:
    from here on only the disk tier holds it."""
    target = prompt(1, TOKENS)
    first = e.generate(target, 4)
    e.drain()
    for seed in range(100, 103):
        e.generate(prompt(seed, TOKENS), 2)
        e.drain()
    return target, first


def test_directory_removed_mid_run_counts_every_key_that_was_on_disk():
    with engine() as (e, scrape):
        target, first = stored_then_flooded(e)
        on_disk = block_files(e.fs_root)
        assert on_disk  # engine truth: these blocks had been written
        # every file on disk came from a completed cascade the probe has taken in
        until(lambda: sum(map(len, probe(e).samples.values())) >= len(on_disk),
              what="the probe's sample to cover the files on disk")
        removed_at = time.time()
        shutil.rmtree(e.fs_root)
        # asked again at once: its blocks are recomputed and written anew, likely before the
        # probe looks; they count as lost all the same (another file under the same name)
        again = e.generate(target, 4)
        e.drain()
        assert not e.scheduler.has_requests()
        probes_after(e, 2)
        ex = scrape()
    # engine truth: the prefix that was on disk restored 0 tokens, recomputed, same tokens
    assert again.num_external_tokens == 0 and again.output == first.output
    (labels, lost), = ex.series(S.TIER_LOST_KEYS.name)
    tier = labels[S.L_TIER]
    assert lost == len(on_disk)  # each key confirmed written, found gone once
    # the start-up directory stays gone: vLLM's writes recreate only the block folders
    assert ex.value(S.TIER_ROOT_PRESENT.name, tier=tier) == 0
    assert removed_at <= ex.value(S.TIER_LAST_LOSS_TIMESTAMP.name, tier=tier) <= time.time()
    assert ex.value(S.TELEMETRY_ERRORS.name) == 0


def test_control_nothing_removed_nothing_lost():
    with engine() as (e, scrape):
        target, first = stored_then_flooded(e)
        probes_after(e, 3)
        again = e.generate(target, 4)
        e.drain()
        probes_after(e, 2)
        ex = scrape()
    # engine truth: the whole prompt came back from disk
    assert again.num_external_tokens == TOKENS and again.output == first.output
    assert ex.has(S.TIER_LOST_KEYS.name)
    assert ex.value(S.TIER_LOST_KEYS.name) == 0
    assert ex.value(S.TIER_LAST_LOSS_TIMESTAMP.name) == 0
    assert [v for _, v in ex.series(S.TIER_ROOT_PRESENT.name)] == [1.0]


def test_a_probe_error_is_counted_and_serving_goes_on():
    with engine() as (e, scrape):
        (tier,) = probe(e).tiers
        e.connector._kvscope_observer.taps.written.append((tier, [None]))  # not a key
        probes_after(e, 2)
        out = e.generate(prompt(5, TOKENS), 4)
        e.drain()
        ex = scrape()
    assert len(out.output) == 4
    assert ex.value(S.TELEMETRY_ERRORS.name, where=S.ErrorSite.TIER_PROBE.value) >= 1


def test_interval_zero_runs_no_probe_and_exports_none_of_its_series():
    with engine(kvscope_options={"tier_probe_interval_s": 0}) as (e, scrape):
        e.generate(prompt(5, TOKENS), 2)
        e.drain()
        ex = scrape()
        assert probe(e)._thread is None
    assert ex.has(S.CASCADES.name)
    for m in (S.TIER_LOST_KEYS, S.TIER_ROOT_PRESENT, S.TIER_LAST_LOSS_TIMESTAMP):
        assert not ex.series(m.name), m.name


def test_the_probe_waits_while_a_promotion_is_in_flight_then_goes_on():
    """vLLM's fs reads need the GIL between their system calls, and a long restore is its
    reads: the probe (Python work on its own thread) must not run beside them. Held in
    flight by a slow disk (promotion_delay_steps), the restore's promotion keeps the probe
    waiting; once it lands and the tier is quiet, the probe goes on."""
    with engine(promotion_delay_steps=100) as (e, scrape):  # landing 100 steps on
        target, first = stored_then_flooded(e)
        probes_after(e, 1)
        taps = e.connector._kvscope_observer.taps
        rid = e.add_request(target, 4)
        for _ in range(3):
            e.step()
        assert taps.promotions and rid not in e.finished  # engine truth: it waits on the disk
        p = probe(e)
        probes, held = p.probes, p.hold_back.held
        until(lambda: p.hold_back.held >= held + 20, what="20 ticks held back")
        assert p.probes == probes  # not one probe beside the reads
        e.run_until_done([rid])  # drained: the held promotion released
        e.drain()
        probes_after(e, 2)
        ex = scrape()
    again = e.finished[rid]
    assert again.num_external_tokens == TOKENS and again.output == first.output
    assert ex.value(S.TIER_LOST_KEYS.name) == 0 and ex.value(S.TELEMETRY_ERRORS.name) == 0


def test_a_busy_tier_defers_the_probe_at_most_max_defer_s():
    """Under sustained tier traffic the probe runs anyway: a tier never quiet must not blind
    it. A second probe on the same real tier, told the tier is always busy."""
    from collections import deque

    from kvscope.connector.tiers.probe import TierProbe

    with engine() as (e, _):
        p = probe(e)
        always_busy = TierProbe(recorder=e.connector.kvscope_recorder,
                                tiers=list(p.tiers.values()), written=deque(),
                                interval_s=PROBE_S, busy=lambda: True, max_defer_s=0.3).start()
        try:
            until(lambda: always_busy.probes + always_busy.hold_back.held >= 1, what="a tick")
            started = time.monotonic()
            until(lambda: always_busy.probes >= 2, what="2 probes of an always busy tier")
            assert always_busy.hold_back.held >= 2 * int(0.3 / PROBE_S) - 2
            assert time.monotonic() - started >= 0.3  # each waited its max_defer_s
        finally:
            always_busy.close()


def test_each_probe_checks_its_turn_of_the_sample_and_every_key_in_the_end():
    # CHECK_KEYS of the sample a probe (the stats' GIL time beside a long restore): with one
    # key a probe, a removed directory's keys are counted one probe at a time, each once
    with engine() as (e, scrape):
        stored_then_flooded(e)
        on_disk = block_files(e.fs_root)
        until(lambda: sum(map(len, probe(e).samples.values())) >= len(on_disk),
              what="the probe's sample to cover the files on disk")
        assert len(on_disk) >= 4
        probe(e).check_keys = 1
        p0 = probe(e).probes
        shutil.rmtree(e.fs_root)
        until(lambda: scrape().value(S.TIER_LOST_KEYS.name) == len(on_disk),
              what="every removed key counted")
        checks = probe(e).probes - p0
        probes_after(e, 3)
        ex = scrape()
    # one key a probe: as many probes as keys (the first may have started before the
    # removal, one more may end before the scrape that saw the whole count)
    assert checks >= len(on_disk) - 1
    assert ex.value(S.TIER_LOST_KEYS.name) == len(on_disk)  # each key once
    assert ex.value(S.TIER_ROOT_PRESENT.name) == 0
    assert ex.value(S.TELEMETRY_ERRORS.name) == 0
