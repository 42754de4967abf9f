"""The scrape source: exposition parsing and the two-scrape window."""

from __future__ import annotations

import pytest

from kvscope.diagnostics.model import DiagnoseError
from kvscope.diagnostics.sources.scrape import parse_exposition, scrape_window
from kvscope.exporters import signals as S

from .support import contract_registry, info_values, serve, serve_registry

GOOD = """\
# HELP kvscope_lookup_rounds_total Lookup rounds.
# TYPE kvscope_lookup_rounds_total counter
kvscope_lookup_rounds_total{verdict="vetoed"} 3.0
kvscope_lookup_rounds_created{verdict="vetoed"} 1.7e9
# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# HELP kvscope_round_pending_keys Keys.
# TYPE kvscope_round_pending_keys histogram
kvscope_round_pending_keys_bucket{le="1.0"} 1.0
kvscope_round_pending_keys_bucket{le="+Inf"} 2.0
kvscope_round_pending_keys_count 2.0
kvscope_round_pending_keys_sum 9.0
# HELP python_gc_objects_collected_total Objects.
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1.0
"""


def test_parser_keeps_only_wanted_series():
    got = parse_exposition(GOOD, "u", 0.0)
    assert got == [
        ("kvscope_lookup_rounds_total", (("verdict", "vetoed"),), 3.0),
        ("vllm:num_requests_waiting", (("engine", "0"), ("model_name", "m")), 2.0),
        ("kvscope_round_pending_keys_count", (), 2.0),
        ("kvscope_round_pending_keys_sum", (), 9.0),
    ]


@pytest.mark.parametrize("text", [
    "kvscope_lookup_rounds_total{verdict=\"vetoed\" 3\n",
    "kvscope_lookup_rounds_total{verdict=\"vetoed\"} three\n",
    "kvscope_lookup_rounds_total{verdict=\"hit\"} 1 x\n",
])
def test_parser_rejects_malformed_text(text):
    with pytest.raises(DiagnoseError, match="^malformed exposition text from u: "):
        parse_exposition(text, "u", 0.0)


@pytest.mark.parametrize("extra", [{}, {"model_name": "m", "engine": "0"}])
def test_scrape_twice_from_a_contract_registry(extra):
    reg, m = contract_registry(extra)
    lbl = list(extra.values())
    m[S.LOOKUP_ROUNDS.name].labels(*lbl, "hit").inc(5)
    m[S.INFO.name].labels(*lbl, *info_values(spec="spec", hash_seed="s1")).set(1)
    ticks = iter([100.0, 101.0])

    def bump(_):  # between the scrapes, instead of sleeping
        m[S.LOOKUP_ROUNDS.name].labels(*lbl, "hit").inc(2)

    with serve_registry(reg) as url:
        raw = scrape_window([url], interval=1.0, clock=lambda: next(ticks), wait=bump)
    rounds = [s for s in raw.series if s.name == S.LOOKUP_ROUNDS.name]
    assert [s.samples for s in rounds] == [((100.0, 5.0), (101.0, 7.0))]
    assert rounds[0].label("model_name") == extra.get("model_name", "")
    assert raw.source.lifetime and raw.source.recent_span == 1.0 and raw.source.now == 101.0


def test_one_url_per_rank():
    regs = [contract_registry() for _ in range(2)]
    for rank, (_, m) in enumerate(regs):
        m[S.ROW_CHECKSUMS.name].labels(str(rank), "match").inc(3)
    with serve_registry(regs[0][0]) as u0, serve_registry(regs[1][0]) as u1:
        raw = scrape_window([u0, u1], interval=0.01)
    targets = {s.target for s in raw.series if s.name == S.ROW_CHECKSUMS.name}
    assert targets == {u0, u1}


def test_a_series_twice_in_one_exposition_keeps_the_first():
    # e.g. one endpoint serving two engines' histograms under the same labels;
    # Prometheus keeps the first sample too, so both sources see the same thing.
    body = (b"# TYPE kvscope_round_pending_keys histogram\n"
            b'kvscope_round_pending_keys_count 4\nkvscope_round_pending_keys_sum 40\n'
            b'kvscope_round_pending_keys_count 1\nkvscope_round_pending_keys_sum 12\n')
    with serve(lambda: body) as url:
        raw = scrape_window([url], interval=0.01)
    counts = [s for s in raw.series if s.name == "kvscope_round_pending_keys_count"]
    assert len(counts) == 1 and [v for _, v in counts[0].samples] == [4.0, 4.0]


def test_garbage_in_series_kv_diagnose_does_not_read_is_skipped_unparsed():
    text = "# TYPE kvscope_x counter\n# TYPE kvscope_x gauge\nkvscope_x{ 1\n{}\nfoo bar baz\n" + GOOD
    assert parse_exposition(text, "u", 0.0) == parse_exposition(GOOD, "u", 0.0)


def test_malformed_endpoint():
    with serve(lambda: b"kvscope_lookup_rounds_total{ 1\n") as url:
        with pytest.raises(DiagnoseError, match="malformed exposition text"):
            scrape_window([url], interval=0.01)
