"""The evidence layer alone: aggregation, counter semantics per source, missing metrics."""

from __future__ import annotations

import pytest

from kvscope.diagnostics.evidence.build import aggregate, build_evidence
from kvscope.diagnostics.model import DiagnoseError, RawWindow, Series, SourceInfo
from kvscope.exporters import signals as S

from .support import T0, L, base, evidence, window

PROM = dict(lifetime=False, t0=T0, t1=T0 + 600, recent_span=120)


def _series(name, samples, **labels):
    return Series(name, tuple(sorted(labels.items())), "t", tuple(samples))


def _src(lifetime, start=T0, end=T0 + 600, recent=120):
    return SourceInfo("prometheus", "p", start, end, end, lifetime, recent)


def test_counter_reset_is_growth_not_loss():
    s = _series(S.HIT_TOKENS.name, [(T0, 100), (T0 + 300, 150), (T0 + 400, 10), (T0 + 600, 30)])
    q = aggregate([s], _src(False))
    assert q.increase == 50 + 10 + 20
    assert q.recent == 30 - 10  # last 120 s: from the sample at T0+400 (before the span) on


def test_counter_born_inside_the_window_counts_from_zero():
    s = _series(S.HIT_TOKENS.name, [(T0 + 300, 7), (T0 + 600, 9)])
    assert aggregate([s], _src(False)).increase == 9


def test_scrape_window_counters_are_lifetime_totals():
    ev = evidence({L(S.LOOKUP_ROUNDS.name, verdict="hit"): [40, 42]} | base())
    q = ev.rounds.get(S.Verdict.HIT)
    assert (q.increase, q.recent, q.first, q.last) == (42, 2, 40, 42)


def test_series_only_in_second_scrape_is_recent():
    ev = evidence({L(S.LOOKUP_ROUNDS.name, verdict="vetoed"): [3]} | base())
    q = ev.rounds.get(S.Verdict.VETOED)
    assert (q.increase, q.recent) == (3, 3)


def test_history_before_a_targets_first_sample_is_not_recent():
    # Prometheus started scraping an old process 20 s before the window end: the
    # totals it found count for the window, but none of it is "still happening".
    src = _src(False, recent=120)
    old = _series(S.LOOKUP_ROUNDS.name, [(T0 + 580, 5), (T0 + 590, 5), (T0 + 600, 5)])
    q = aggregate([old], src, first_seen={"t": T0 + 580})
    assert (q.increase, q.recent) == (5, 0)
    # a series that appears after its target was first scraped was born then
    born = _series(S.LOOKUP_ROUNDS.name, [(T0 + 590, 2), (T0 + 600, 3)])
    q = aggregate([born], src, first_seen={"t": T0 + 580})
    assert (q.increase, q.recent) == (3, 3)


def test_retry_is_not_found_promotions_are():
    d = base() | {L(S.LOOKUPS.name, kv_group="0", result="retry"): [10, 12],
                  L(S.LOOKUPS.name, kv_group="0", result="miss"): [2, 2]}
    ev = evidence(d)
    assert ev.lookups["0"].found == 0 and ev.found_anywhere == 0
    ev = evidence(d | {L(S.PROMOTIONS.name, result="started"): [6, 6]})
    assert ev.found_anywhere == 6


def test_new_info_labels_and_signals():
    d = base()
    d = {k: v for k, v in d.items() if not (isinstance(k, tuple) and k[0] == S.INFO.name)}
    d[L(S.INFO.name, hash_seed="a", primary_rows="4", checksum_policy="observe",
        chunk_tokens="16", max_num_batched_tokens="256")] = [1, 1]
    d[L(S.LAST_ROUND_REQUEST_KEYS.name, verdict="vetoed")] = [12, 6]
    d[S.PRIMARY_ROW_BYTES.name] = [8192, 8192]
    d[S.QUARANTINED_KEYS.name] = [0, 6]
    ev = evidence(d)
    t = ev.targets[0]
    assert (t.checksum_policy, t.chunk_tokens, t.max_num_batched_tokens) == ("observe", "16", "256")
    assert ev.info_int("chunk_tokens") == 16 and ev.info_int("max_num_batched_tokens") == 256
    assert ev.rounds.request_keys(S.Verdict.VETOED).max == 12
    assert ev.tiers.row_bytes.last == 8192 and ev.tiers.quarantined_keys.last == 6


def test_seeds_served_side_by_side_are_not_ordered():
    d = base(seed="a") | {L(S.INFO.name, hash_seed="b", primary_rows="8"): [1, 1]}
    ev = evidence(d)
    assert set(ev.hash_seeds) == {"a", "b"} and not ev.targets[0].seeds_ordered


def test_gauges_sum_over_targets_and_oldest_age_is_a_max():
    d = base()
    d[L(S.PENDING_TRANSFERS.name, kind="load", __target__="a")] = [1, 2]
    d[L(S.PENDING_TRANSFERS.name, kind="load", __target__="b")] = [3, 3]
    d[L(S.OLDEST_PENDING_TRANSFER.name, kind="load", __target__="a")] = [5, 6]
    d[L(S.OLDEST_PENDING_TRANSFER.name, kind="load", __target__="b")] = [40, 41]
    ev = evidence(d)
    assert ev.pending.get(S.PendingKind.LOAD).last == 2 + 3 + 0  # base()'s own series is 0
    assert ev.pending.oldest(S.PendingKind.LOAD).last == 41


def test_vllm_labels_are_summed_away_and_per_rank_kept():
    d = base()
    for rank in ("0", "1"):
        d[L(S.ROW_CHECKSUMS.name, rank=rank, outcome="match", model_name="m", engine="0")] = [1, 2]
    ev = evidence(d)
    assert sorted(ev.ranks) == ["0", "1"]
    assert ev.ranks["1"].checksum(S.ChecksumOutcome.MATCH).increase == 2


def test_hash_seeds_in_order_of_appearance():
    d = base(seed="new")
    d[("kvscope_info", (("hash_seed", "old"), ("primary_rows", "8")))] = [1]
    raw = window(d)
    # make the old seed's sample earlier than the new one's
    series = tuple(
        Series(s.name, s.labels, s.target, ((T0 - 10, 1.0),)) if s.label("hash_seed") == "old" else s
        for s in raw.series
    )
    ev = build_evidence(RawWindow(raw.source, series))
    assert ev.hash_seeds == ("old", "new") and ev.targets[0].seeds_ordered


def test_no_kvscope_metrics_is_a_clear_error():
    with pytest.raises(DiagnoseError, match=r"no kvscope metrics .* \(only vLLM.s own\)"):
        evidence({S.VLLM_REQUESTS_RUNNING: [1, 1]}, declare=False)
    with pytest.raises(DiagnoseError, match="no kvscope or vLLM metrics"):
        evidence({"process_cpu_seconds_total": [1, 2]}, declare=False)


def test_groups_sorted_naturally():
    d = base()
    for g in ("10", "2", "1"):
        d[L(S.LOOKUPS.name, kv_group=g, result="hit")] = [0, 1]
    assert list(evidence(d).lookups) == ["1", "2", "10"]


def test_every_evidence_field_has_a_row_in_the_table():
    """A field added to the model without a row would silently stay at its default."""
    import dataclasses

    from kvscope.diagnostics.evidence import read_table as table

    def fields(cls):
        return {f.name for f in dataclasses.fields(cls)}

    for name, (cls, rows) in table.PARTS.items():
        assert fields(cls) == set(rows), name
    for split in (table.LOOKUPS, table.RANKS):
        assert fields(split.part) == set(split.rows) | {split.key}, split.part
    cls, rows = table.FRESHNESS
    assert fields(cls) == set(rows) | {"last_step", "now"}
    from kvscope.diagnostics.evidence.model import Evidence

    read_elsewhere = {"source", "targets", "kv_groups", "lookups", "ranks", "freshness", "present",
                      "kv_group_drafters", "kv_group_restore_chunks", "label_names", "nonfinite", "failures", "notes",
                      "rank_scopes"}
    assert fields(Evidence) == set(table.PARTS) | set(table.FIELDS) | read_elsewhere
    wanted = {row.name for _, rows in table.PARTS.values() for row in rows.values()}
    from kvscope.diagnostics.sources.wanted import WANTED_SERIES

    assert wanted <= WANTED_SERIES, wanted - WANTED_SERIES  # a row reading a dropped series
