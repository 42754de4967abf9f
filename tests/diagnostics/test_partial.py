"""A label value kvscope always exports, dropped from the input (a relabel rule, a
federation filter, a cut scrape): the check that reads it could not check; an incident
so stripped is never called healthy. Recorded real runs (tests/diagnostics/fixtures/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvscope.diagnostics.evidence import partial
from kvscope.diagnostics.evidence.build import build_evidence
from kvscope.diagnostics.model import ABSENT, DiagnoseError, RawWindow
from kvscope.diagnostics.sources.bundle import read_bundle
from kvscope.diagnostics.verdict.diagnose import diagnose
from kvscope.exporters import signals as S

FIXTURES = Path(__file__).parent / "fixtures"
# fixtures recorded from an incident scenario (test_fuzz judges the same ones)
INCIDENTS = ("capacity-ceiling", "livelock", "stale-rows", "store-never-fits",
             "stores-without-restores", "queue-wait", "truncated", "concurrency",
             "stored-in-part", "tier-data-lost", "tier-flooded")

# Labels whose values kvscope bounds: the closed sets of the contract, and the KV groups
# (kvscope_kv_group_info lists them) and worker ranks every process declares series for.
# Not: kvscope_info's facts (hash_seed, versions): a window that starts after a restart
# has only the new seed, which no export can tell from a dropped one.
BOUNDED = {lb for m in S.ALL_METRICS for lb in m.label_values} | {S.L_KV_GROUP, S.L_RANK}


def bounded_values(raw: RawWindow) -> list[tuple[str, str, str]]:
    """Every (kvscope series, bounded label, value) in ``raw``."""
    return sorted({(s.name, k, v) for s in raw.series if s.name.startswith(S.PREFIX)
                   and s.name != S.INFO.name for k, v in s.labels if k in BOUNDED})


def without(raw: RawWindow, name: str, label: str, value: str) -> RawWindow:
    return dataclasses.replace(raw, series=tuple(
        s for s in raw.series if not (s.name == name and (label, value) in s.labels)))


@pytest.mark.parametrize("name", sorted(INCIDENTS))
def test_an_incident_missing_any_one_label_value_is_never_healthy(name):
    raw = read_bundle(str(FIXTURES / f"{name}.kvb"))
    values = bounded_values(raw)
    assert len(values) > 50  # the fixture is a real run's full export
    healthy = []
    for drop in values:
        try:
            report = diagnose(build_evidence(without(raw, *drop)))
        except DiagnoseError:
            continue
        if report.exit_code == 0:
            healthy.append(drop)
    assert not healthy, f"{name} called healthy without: {healthy}"


def test_the_dropped_value_is_named_where_it_was_read():
    # The livelock run without its deferred rounds read as healthy before partial.py
    raw = read_bundle(str(FIXTURES / "livelock.kvb"))
    report = diagnose(build_evidence(without(raw, S.LOOKUP_ROUNDS.name, S.L_VERDICT,
                                             S.Verdict.DEFERRED.value)))
    assert report.exit_code == 3 and report.status == "inconclusive"
    lines = [u.line for u in report.unchecked if u.check == "capacity_ceiling_livelock"]
    assert lines and f'series {S.LOOKUP_ROUNDS.name} has no verdict="deferred"' in lines[0]


def test_a_value_no_check_reads_voids_nothing():
    # e.g. a recording made before a value was added to the contract: checks that never
    # read it still judge (the healthy run stays healthy without an unread reason)
    raw = read_bundle(str(FIXTURES / "healthy.kvb"))
    got = diagnose(build_evidence(without(raw, S.RESTORE_SHORT_ROUNDS.name, S.L_REASON,
                                          S.ShortReason.OTHER.value)))
    assert got.exit_code == 0 and not got.unchecked


def test_a_kv_group_listed_but_without_lookups_is_partial():
    raw = read_bundle(str(FIXTURES / "livelock.kvb"))
    ev = build_evidence(without(raw, S.LOOKUPS.name, S.L_KV_GROUP, "1"))
    results = ev.lookups["1"].results
    assert not dict(results) and results.missing == {r.value for r in S.LookupResult}


def test_reads_are_noted_only_for_missing_values_and_only_while_tracking():
    d = partial.label_values({"hit": ABSENT}, S.LOOKUP_ROUNDS.name, S.L_VERDICT)
    assert isinstance(d, partial.LabelValues)
    assert d.missing == {v.value for v in S.Verdict} - {"hit"}
    d.get("vetoed")  # outside reads(): nothing to note
    with partial.reads() as seen:
        d.get("hit")
        assert "hit" in d
        assert not seen  # present values are no gap
        assert d.get("vetoed") is None
    assert seen == {(S.LOOKUP_ROUNDS.name, S.L_VERDICT, "vetoed")}
    with partial.reads() as seen:
        sum(q.increase for q in d.values())  # a total over every value reads them all
    assert {v for _, _, v in seen} == d.missing
    # a series that is not preset, or absent altogether, is a plain dict
    assert type(partial.label_values({"x": ABSENT}, S.TRANSFERS_IN_FLIGHT.name,
                                     S.L_DIRECTION)) is dict
    assert type(partial.label_values({}, S.LOOKUP_ROUNDS.name, S.L_VERDICT)) is dict
    # the latest-round gauges are preset by the kvscope that labels world_size, not before
    vetoed = {S.Verdict.VETOED.value: ABSENT}
    assert partial.label_values(vetoed, S.LAST_ROUND_PENDING_KEYS.name, S.L_VERDICT).missing \
        == {S.Verdict.DEFERRED.value}
    assert type(partial.label_values(vetoed, S.LAST_ROUND_PENDING_KEYS.name, S.L_VERDICT,
                                     world_size_known=False)) is dict


def test_every_preset_metric_has_closed_values_to_miss():
    for m in S.PRESET_VALUES:
        assert m in S.ALL_METRICS and m.label_values, m.name
        assert set(m.label_values) <= set(m.labels), m.name


def test_a_veto_told_only_by_the_latest_round_gauges_is_unchecked_without_them():
    """The veto check also fires on the latest vetoed round's gauges alone (its pending keys
    pinned at the rows, its request larger than the tier) when no round was counted at the
    ceiling. kvscope presets both values of those gauges (0: no such round yet) where it labels
    world_size, so one dropped there is a partial export, not a quiet tier."""
    from .support import evidence, info
    from .test_classifiers import veto_case

    d = veto_case()
    d[info(rows=4, world_size="1")] = d.pop(info(rows=4))
    d[(S.ROUNDS_AT_ROW_CEILING.name, (("verdict", "vetoed"),))] = [0, 0]
    d[(S.PROMOTIONS.name, (("result", "no_row"),))] = [0, 5]
    for m in S.PRESET_WITH_WORLD_SIZE:
        d[(m.name, (("verdict", "deferred"),))] = [0, 0]
    whole = diagnose(evidence(d))
    assert "capacity_ceiling_veto" in {v.id for v in whole.verdicts}
    for m in S.PRESET_WITH_WORLD_SIZE:
        del d[(m.name, (("verdict", "vetoed"),))]
    report = diagnose(evidence(d))
    assert "capacity_ceiling_veto" not in {v.id for v in report.verdicts}
    (u,) = [u for u in report.unchecked if u.check == "capacity_ceiling_veto"]
    assert any(r.startswith(f'series {S.LAST_ROUND_PENDING_KEYS.name} has no verdict="vetoed"')
               for r in u.reasons), u.reasons
    assert report.exit_code != 0
