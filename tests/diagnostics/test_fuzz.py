"""Property/fuzz campaign (hypothesis) over expositions, Prometheus answers and
bundles: kv-diagnose answers with a report or one DiagnoseError line, never a
traceback or a hang; and an input carrying an incident, stripped of evidence the
way a relabel rule, a federation filter or a partial scrape strips it (whole series,
label names, single label values), is never called healthy. Derandomized: CI runs the same examples every time."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import http.server
import json
import math
import threading
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvscope.diagnostics.evidence.build import WANTED_SERIES, build_evidence  # noqa: E402
from kvscope.diagnostics.model import DiagnoseError, RawWindow, Series  # noqa: E402
from kvscope.diagnostics.report.diagnosis import format_text  # noqa: E402
from kvscope.diagnostics.sources.bundle import from_dict, read_bundle  # noqa: E402
from kvscope.diagnostics.sources.limits import Deadline  # noqa: E402
from kvscope.diagnostics.sources.prometheus import prometheus_window  # noqa: E402
from kvscope.diagnostics.sources.scrape import parse_exposition  # noqa: E402
from kvscope.diagnostics.verdict.diagnose import diagnose  # noqa: E402
from kvscope.sim.catalog import SCENARIOS  # noqa: E402

from .test_partial import INCIDENTS as INCIDENT_FIXTURES  # noqa: E402
from .test_partial import bounded_values  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
CAMPAIGN = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
NAMES = sorted(WANTED_SERIES)
# fixtures recorded from a scenario run -> the verdict it must get (test_scenarios checks them)
INCIDENTS = {name: SCENARIOS[name].expected_verdict for name in INCIDENT_FIXTURES}


def judged(raw: RawWindow):
    """Diagnose ``raw`` like the CLI: a report (rendered both ways) or a DiagnoseError."""
    try:
        report = diagnose(build_evidence(raw))
    except DiagnoseError:
        return None
    format_text(report)
    json.loads(report.to_json())
    assert report.exit_code in (0, 1, 3)
    return report


# ---- expositions -------------------------------------------------------------------
label_value = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
value = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**20, 10**20))


@st.composite
def exposition_line(draw):
    name = draw(st.sampled_from(NAMES + ["kvscope_x", "vllm:y", "#", "# TYPE", ""]))
    labels = draw(st.dictionaries(st.sampled_from(["verdict", "kind", "rank", "state", "result",
                                                   "hash_seed", "le", "a b", "ß"]),
                                  label_value, max_size=3))
    body = ",".join(f'{k}="{json.dumps(v)[1:-1]}"' for k, v in labels.items())
    v = draw(value)
    tail = draw(st.sampled_from(["", " 123", "}", "{", " x", "\x00", " 1e999"]))
    line = f"{name}{{{body}}} {v}{tail}" if draw(st.booleans()) else f"{name} {v}{tail}"
    return line if draw(st.integers(0, 9)) else draw(st.text(max_size=40))


@CAMPAIGN
@given(st.lists(exposition_line(), max_size=25), st.lists(exposition_line(), max_size=25))
def test_any_exposition_is_a_report_or_one_error(first, second):
    series: dict[tuple, list] = {}
    for t, lines in ((1.0, first), (2.0, second)):
        try:
            parsed = parse_exposition("\n".join(lines) + "\n", "u", t)
        except DiagnoseError as e:
            assert "\n" not in str(e)
            return
        for name, labels, v in parsed:
            series.setdefault((name, labels), []).append((t, v))
    from kvscope.diagnostics.model import SourceInfo

    src = SourceInfo("scrape", "u", 1.0, 2.0, 2.0, True, 1.0)
    judged(RawWindow(src, tuple(Series(n, lb, "u", tuple(s)) for (n, lb), s in series.items())))


# ---- Prometheus answers (a real local server answering every query) ----------------
class _Prom:
    body = b"{}"


@contextlib.contextmanager
def _prometheus():
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(_Prom.body)))
            self.end_headers()
            self.wfile.write(_Prom.body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                      st.text(max_size=8))
json_any = st.recursive(json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(
    st.text(max_size=6), c, max_size=3), max_leaves=12)


@st.composite
def prom_answer(draw):
    pts = st.lists(st.tuples(st.one_of(st.floats(1.7e9, 1.7e9 + 600), json_leaf),
                             st.one_of(st.sampled_from(["1", "NaN", "+Inf", "-Inf", "x", "1e400"]),
                                       json_leaf)), max_size=4)
    result = st.lists(st.fixed_dictionaries({"metric": st.one_of(st.dictionaries(
        st.sampled_from(["verdict", "instance", "rank", "kind", "state"]), label_value, max_size=3),
        json_any), "values": st.one_of(pts, json_any)}), max_size=3)
    doc = draw(st.one_of(
        st.fixed_dictionaries({"status": st.just("success"), "data": st.fixed_dictionaries(
            {"resultType": st.sampled_from(["matrix", "vector", None]), "result": result})}),
        st.fixed_dictionaries({"status": st.sampled_from(["error", "success"]), "data": json_any,
                               "error": json_any}),
        json_any))
    raw = json.dumps(doc).encode()
    return raw if draw(st.integers(0, 7)) else raw[: draw(st.integers(0, len(raw)))]


@pytest.fixture(scope="module")
def prom_url():
    with _prometheus() as url:
        yield url


@CAMPAIGN
@given(body=prom_answer())
def test_any_prometheus_answer_is_a_report_or_one_error(prom_url, body):
    _Prom.body = body
    try:
        raw = prometheus_window(prom_url, 1.7e9, 1.7e9 + 600, "", 5.0, deadline=Deadline(30))
    except DiagnoseError as e:
        assert "\n" not in str(e)
        return
    judged(raw)


@settings(CAMPAIGN, max_examples=30)  # ten requests an example
@given(body=prom_answer())
def test_any_prometheus_answer_to_a_long_window_is_a_report_or_one_error(prom_url, body):
    """A day: read summarised (label-values index, instants, bucket queries), every
    endpoint answering the same hostile body."""
    _Prom.body = body
    try:
        raw = prometheus_window(prom_url, 1.7e9 - 86400 + 600, 1.7e9 + 600, "", 5.0,
                                deadline=Deadline(30))
    except DiagnoseError as e:
        assert "\n" not in str(e)
        return
    judged(raw)


# ---- bundles ----------------------------------------------------------------------
def _fixture_doc(name: str) -> dict:
    return json.loads(gzip.decompress((FIXTURES / f"{name}.kvb").read_bytes()))


@CAMPAIGN
@given(name=st.sampled_from(sorted(INCIDENTS) + ["healthy"]), data=st.data())
def test_any_mangled_bundle_is_a_report_or_one_error(tmp_path_factory, name, data):
    raw = bytearray((FIXTURES / f"{name}.kvb").read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    p = tmp_path_factory.mktemp("b") / "x.kvb"
    p.write_bytes(bytes(raw[:cut] if cut is not None else raw))
    try:
        got = read_bundle(str(p))
    except DiagnoseError as e:
        assert "\n" not in str(e)
        return
    judged(got)


@CAMPAIGN
@given(doc=json_any, src=json_any)
def test_any_bundle_document_is_a_report_or_one_error(doc, src):
    for d in (doc, {"format": "kvscope-bundle", "version": 1, "source": src, "series": doc}):
        try:
            got = from_dict(d)
        except DiagnoseError as e:
            assert "\n" not in str(e)
            continue
        judged(got)


# ---- never healthy on an incident stripped of evidence --------------------------------
def _mutate(raw: RawWindow, data) -> RawWindow:
    """Strip evidence as the field does: whole series names gone (partial scrape),
    a label name dropped (relabel rule), one label value of a present series dropped
    (a relabel or federation filter: verdict="vetoed" gone, verdict="hit" kept),
    a whole rank gone from every series (its endpoint not scraped), non-finite values."""
    names = sorted({s.name for s in raw.series})
    gone = set(data.draw(st.lists(st.sampled_from(names), max_size=6)))
    ranks = sorted({v for s in raw.series for k, v in s.labels if k == "rank"})
    rank_gone = data.draw(st.sampled_from(["", *ranks]))
    dropped = set(data.draw(st.lists(st.sampled_from(bounded_values(raw)), max_size=3)))
    strip = dict(data.draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from(
        ["verdict", "kind", "state", "result", "rank", "outcome", "reason", "hash_seed"])),
        max_size=3)))
    poison = set(data.draw(st.lists(st.sampled_from(names), max_size=2)))
    bad = data.draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    out = []
    for s in raw.series:
        if s.name in gone or any(n == s.name and (k, v) in s.labels for n, k, v in dropped):
            continue
        if rank_gone and s.label("rank") == rank_gone:
            continue
        labels = tuple((k, v) for k, v in s.labels if strip.get(s.name) != k)
        samples = s.samples
        if s.name in poison:
            samples = samples[:-1] + ((samples[-1][0], bad),)
        out.append(dataclasses.replace(s, labels=labels, samples=samples))
    return dataclasses.replace(raw, series=tuple(out))


@CAMPAIGN
@given(name=st.sampled_from(sorted(INCIDENTS)), data=st.data())
def test_an_incident_stripped_of_evidence_is_never_healthy(name, data):
    raw = from_dict(_fixture_doc(name), name)
    report = judged(_mutate(raw, data))
    assert report is None or report.exit_code != 0, (
        f"{name} stripped of evidence called healthy:\n{format_text(report)}")


@settings(CAMPAIGN, max_examples=400)  # cheap (no I/O): enough to reach the few decisive values
@given(name=st.sampled_from(sorted(INCIDENTS)), data=st.data())
def test_an_incident_missing_some_label_values_is_never_healthy(name, data):
    """Only values dropped (one to three, any bounded label, any kvscope series): the
    combinations test_partial's exhaustive single drops do not reach."""
    raw = from_dict(_fixture_doc(name), name)
    dropped = data.draw(st.lists(st.sampled_from(bounded_values(raw)), min_size=1, max_size=3))
    out = tuple(s for s in raw.series
                if not any(n == s.name and (k, v) in s.labels for n, k, v in dropped))
    report = judged(dataclasses.replace(raw, series=out))
    assert report is None or report.exit_code != 0, (
        f"{name} without {dropped} called healthy:\n{format_text(report)}")


@pytest.mark.parametrize("name", sorted(INCIDENTS))
def test_the_unstripped_incidents_are_named(name):
    report = judged(from_dict(_fixture_doc(name), name))
    assert report is not None and INCIDENTS[name] in [v.id for v in report.verdicts]
