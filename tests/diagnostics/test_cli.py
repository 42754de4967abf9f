"""CLI exit codes and one-line errors for every bad input; record -> bundle -> diagnose."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading

import pytest

from kvscope.diagnostics import cli
from kvscope.exporters import signals as S
from tests.support.ports import refusing_port

from .support import contract_registry, declare, info_values, serve, serve_registry


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, pattern):
    assert code == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kv-diagnose: ")
    assert pattern in lines[0], lines[0]


def _engine(mismatch=False, vllm_only=False):
    reg, m = contract_registry()
    if vllm_only:
        from prometheus_client import CollectorRegistry, Gauge

        reg = CollectorRegistry()
        Gauge(S.VLLM_REQUESTS_RUNNING, "running", registry=reg).set(1)
        return reg
    declare(m)
    m[S.INFO.name].labels(*info_values()).set(1)
    m[S.PRIMARY_ROWS.name].labels("total").set(8)
    m[S.LOOKUP_ROUNDS.name].labels("hit").inc(4)
    m[S.HIT_TOKENS.name].inc(64)
    m[S.SCHEDULER_STEPS.name].inc(10)
    import time

    m[S.LAST_STEP_TIMESTAMP.name].set(time.time())
    m[S.ROW_CHECKSUMS.name].labels("0", "match").inc(4)
    if mismatch:
        m[S.ROW_CHECKSUMS.name].labels("1", "mismatch").inc(2)
        m[S.PROMOTIONS.name].labels("completed").inc(2)
    return reg


def test_healthy_scrape_exits_0(capsys):
    with serve_registry(_engine()) as url:
        code, out, err = run(capsys, "--scrape", url, "--interval", "0.05s")
    assert code == 0, err
    assert "Verdict: HEALTHY (exit 0)" in out


def test_incident_scrape_exits_1_with_json(capsys):
    with serve_registry(_engine(mismatch=True)) as url:
        code, out, err = run(capsys, "--scrape", url, "--interval", "0.05s", "--json")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["status"] == "incident" and doc["exit_code"] == 1
    assert doc["verdicts"][0]["id"] == "stale_row_corruption"
    assert set(doc) == {"schema_version", "tool", "kvscope_version", "generated_at", "generated_at_iso",
                        "status", "exit_code", "source", "targets", "verdicts", "checked", "unchecked",
                        "failures", "notes",
                        "summary"}


def test_record_then_diagnose_bundle_and_plot(capsys, tmp_path):
    out_path = tmp_path / "incident.kvb"
    with serve_registry(_engine(mismatch=True)) as url:
        code, _, err = run(capsys, "record", "--scrape", url, "--interval", "0.05s", "-o", str(out_path))
    assert code == 0, err
    assert err.startswith(f"wrote {out_path}: ")
    png = tmp_path / "incident.png"
    code, out, err = run(capsys, "--bundle", str(out_path), "--plot", str(png))
    assert code == 1, err
    assert f"bundle {out_path}, recorded from scrape of" in " ".join(out.split())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _pending_engine(age_s: float):
    reg, m = contract_registry()
    declare(m)
    m[S.INFO.name].labels(*info_values()).set(1)
    m[S.PRIMARY_ROWS.name].labels("total").set(8)
    m[S.SCHEDULER_STEPS.name].inc(10)
    import time

    m[S.LAST_STEP_TIMESTAMP.name].set(time.time())
    m[S.REQUESTS_IN_FLIGHT.name].set(0)
    m[S.PENDING_TRANSFERS.name].labels("store").set(1)
    m[S.OLDEST_PENDING_TRANSFER.name].labels("store").set(age_s)
    return reg


@pytest.mark.parametrize("argv,code,verdict", [
    ((), 0, "healthy"),  # 5 s is a slow transfer, not a stuck one, by default (30 s)
    (("--stuck-after", "2"), 1, "pending_at_idle"),
    (("--stuck-after", "2s"), 1, "pending_at_idle"),
    (("--pending-after", "2"), 1, "pending_at_idle"),  # the older spelling still works
    (("--stuck-after", "10"), 0, "healthy"),
])
def test_stuck_after(capsys, argv, code, verdict):
    with serve_registry(_pending_engine(5.0)) as url:
        got, out, err = run(capsys, "--scrape", url, "--interval", "0.05s", "--json", *argv)
    assert got == code, err
    assert json.loads(out)["verdicts"][0]["id"] == verdict


def test_stuck_after_must_be_positive(capsys):
    code, _, err = run(capsys, "--bundle", "x.kvb", "--stuck-after", "0")
    assert_one_line_error(code, err, "--stuck-after must be > 0")


@pytest.mark.parametrize("flag", ["--prometheus", "--scrape"])
def test_unreachable(capsys, flag):
    extra = ["--since", "5m"] if flag == "--prometheus" else []
    with refusing_port() as port:
        code, _, err = run(capsys, flag, f"http://127.0.0.1:{port}", *extra, "--timeout", "2s")
    assert_one_line_error(code, err, "connection refused")


@contextlib.contextmanager
def stalling_server():
    release = threading.Event()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            release.wait(10)
            with contextlib.suppress(OSError):
                self.send_response(200)
                self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        release.set()
        srv.shutdown()
        srv.server_close()


def test_slow_prometheus_times_out(capsys):
    with stalling_server() as url:
        code, _, err = run(capsys, "--prometheus", url, "--since", "30m", "--timeout", "0.3s")
    assert_one_line_error(code, err, "did not answer within 0.3 s (timeout)")


@pytest.mark.parametrize("url,msg", [
    ("not-a-url", "is not an http(s) URL"),
    ("ftp://127.0.0.1/x", "is not an http(s) URL"),
])
def test_wrong_url(capsys, url, msg):
    code, _, err = run(capsys, "--prometheus", url, "--since", "30m")
    assert_one_line_error(code, err, msg)


def test_not_a_prometheus(capsys):
    with serve(lambda: b"hello, I am a web page") as url:
        code, _, err = run(capsys, "--prometheus", url.rsplit("/", 1)[0], "--since", "30m")
    assert_one_line_error(code, err, "does not look like a Prometheus API")


def test_http_404(capsys):
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_error(404, "nope")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        code, _, err = run(capsys, "--scrape", f"http://127.0.0.1:{srv.server_address[1]}/metricz")
    finally:
        srv.shutdown()
        srv.server_close()
    assert_one_line_error(code, err, "answered HTTP 404")


def test_malformed_exposition(capsys):
    with serve(lambda: b'kvscope_lookup_rounds_total{verdict="hit" 1\n') as url:
        code, _, err = run(capsys, "--scrape", url, "--interval", "0.01s")
    assert_one_line_error(code, err, "malformed exposition text")


def test_missing_kvscope_metrics(capsys):
    with serve_registry(_engine(vllm_only=True)) as url:
        code, _, err = run(capsys, "--scrape", url, "--interval", "0.01s")
    assert_one_line_error(code, err, "no kvscope metrics")


EMPTY = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode()


def test_empty_window(capsys):
    with serve(lambda: EMPTY) as url:
        base_url = url.rsplit("/", 1)[0]
        code, _, err = run(capsys, "--prometheus", base_url, "--since", "30m")
        assert_one_line_error(code, err, "in the window")
        code, _, err = run(capsys, "--prometheus", base_url, "--start", "now-1h", "--end", "now-2h")
        assert_one_line_error(code, err, "empty window")


@pytest.mark.parametrize("content,msg", [
    (b"\x1f\x8b\x08\x00\x00\x00", "truncated or corrupt"),
    (b'{"format": "something-else"}', "not a kvscope bundle"),
])
def test_bad_bundles(capsys, tmp_path, content, msg):
    p = tmp_path / "x.kvb"
    p.write_bytes(content)
    code, _, err = run(capsys, "--bundle", str(p))
    assert_one_line_error(code, err, msg)


@pytest.mark.parametrize("argv,msg", [
    ([], "one of the arguments"),
    (["--scrape", "http://127.0.0.1:1/m", "--since", "5m"], "applies to --prometheus"),
    (["--prometheus", "http://127.0.0.1:1"], "needs a window"),
    (["--prometheus", "http://127.0.0.1:1", "--since", "soon"], "bad duration"),
    (["--prometheus", "http://127.0.0.1:1", "--start", "yesterday"], "bad time"),
    (["--prometheus", "http://127.0.0.1:1", "--since", "5m", "--selector", "{a=\"b\"}}"], "--selector"),
    (["record", "--bundle", "x.kvb", "-o", "y.kvb"], "--prometheus --scrape is required"),
])
def test_usage_errors(capsys, argv, msg):
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, msg)


def test_help_exits_0(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "Exit codes: 0 healthy, 1 incident found, 2 could not diagnose, 3 inconclusive" in out
