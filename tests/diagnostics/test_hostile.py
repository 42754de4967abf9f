"""kv-diagnose against hostile and partial inputs: real local
servers, the real CLI; no hang, no traceback, no false healthy, bounded memory."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib

import pytest

from kvscope.diagnostics import cli
from kvscope.diagnostics.model import DiagnoseError
from kvscope.diagnostics.sources.bundle import read_bundle
from kvscope.exporters import signals as S
from tests.support.ports import refusing_port

from .support import contract_registry, declare, info_values, serve, serve_registry

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
KV_DIAGNOSE = os.path.join(os.path.dirname(sys.executable), "kv-diagnose")  # the console script


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code, err, pattern, want=2):
    assert code == want, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kv-diagnose: "), err
    assert pattern in lines[0], lines[0]


def _engine(**info):
    reg, m = contract_registry()
    declare(m)
    m[S.INFO.name].labels(*info_values(**info)).set(1)
    m[S.PRIMARY_ROWS.name].labels("total").set(8)
    m[S.LOOKUP_ROUNDS.name].labels("hit").inc(4)
    m[S.SCHEDULER_STEPS.name].inc(10)
    m[S.LAST_STEP_TIMESTAMP.name].set(time.time())
    m[S.ROW_CHECKSUMS.name].labels("0", "match").inc(4)
    return reg


@contextlib.contextmanager
def server(handler_body):
    """A server whose GET handler is ``handler_body(wfile)`` after a 200 + headers."""
    got = threading.Event()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            got.set()
            with contextlib.suppress(OSError):
                self.send_response(200)
                self.end_headers()
                handler_body(self.wfile)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics", got
    finally:
        srv.shutdown()
        srv.server_close()


def _drip(wfile):
    for _ in range(600):
        wfile.write(b"#")
        wfile.flush()
        time.sleep(0.2)


def _endless(wfile):
    chunk = b'kvscope_lookup_rounds_total{verdict="hit"} 1\n' * 20000
    for _ in range(10_000):
        wfile.write(chunk)


# ---- partial answers ----------------------------------------------------------
def test_one_dead_rank_does_not_abort_the_diagnosis(capsys):
    with refusing_port() as port, serve_registry(_engine()) as url:
        dead = f"http://127.0.0.1:{port}/metrics"
        code, out, err = run(capsys, "--scrape", url, dead, "--interval", "0.05s", "--json")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["verdicts"][0]["id"] == "targets_unreachable"
    assert any(dead in e and "connection refused" in e
               for e in doc["verdicts"][0]["facts"]["failures"])
    assert doc["failures"] and doc["targets"][0]["target"] == url


def test_every_target_dead_is_exit_2_naming_each(capsys):
    with refusing_port() as pa, refusing_port() as pb:
        a, b = (f"http://127.0.0.1:{p}/metrics" for p in (pa, pb))
        code, _, err = run(capsys, "--scrape", a, b, "--timeout", "2s")
    one_line(code, err, "connection refused")
    assert a in err and b in err


def test_a_dead_rank_recorded_stays_evidence_in_the_bundle(capsys, tmp_path):
    out = tmp_path / "x.kvb"
    with refusing_port() as port, serve_registry(_engine()) as url:
        dead = f"http://127.0.0.1:{port}/metrics"
        code, _, err = run(capsys, "record", "--scrape", url, dead, "--interval", "0.05s", "-o", str(out))
    assert code == 0 and "1 target(s) unusable" in err
    code, stdout, _ = run(capsys, "--bundle", str(out), "--json")
    assert code == 1 and json.loads(stdout)["verdicts"][0]["id"] == "targets_unreachable"


# ---- deadlines, not read timeouts -------------------------------------------------
def test_a_dripping_server_is_cut_off_at_the_timeout(capsys):
    with server(_drip) as (url, _):
        t0 = time.monotonic()
        code, _, err = run(capsys, "--scrape", url, "--timeout", "0.5s")
        elapsed = time.monotonic() - t0
    one_line(code, err, "did not answer within 0.5 s (timeout)")
    assert elapsed < 5


def test_the_deadline_bounds_the_whole_run(capsys):
    with server(_drip) as (url, _):
        t0 = time.monotonic()
        code, _, err = run(capsys, "--scrape", url, "--timeout", "30s", "--deadline", "0.5s")
        elapsed = time.monotonic() - t0
    assert code == 2 and elapsed < 5, err
    assert "did not answer within 0.5 s" in err or "--deadline" in err


def test_ctrl_c_stops_a_hung_request_at_once():
    with server(_drip) as (url, got):
        p = subprocess.Popen([KV_DIAGNOSE, "--scrape", url,
                              "--timeout", "60s"], stderr=subprocess.PIPE, text=True)
        try:
            assert got.wait(30), "kv-diagnose never connected"
            p.send_signal(signal.SIGINT)
            rc = p.wait(timeout=5)
        finally:
            if p.poll() is None:
                p.kill()
    assert rc == 130
    assert p.stderr.read().strip() == "kv-diagnose: interrupted"


# ---- bounded resources ----------------------------------------------------------
# Runs kv-diagnose in a fresh interpreter and reports its VmHWM (peak RSS of its own
# address space) at exit. Not ru_maxrss: Linux carries the forking parent's size
# (a pytest that imported vLLM: ~1 GB) into the child's ru_maxrss across exec.
_PEAK = (
    "import atexit, sys\n"
    "def peak():\n"
    "    with open('/proc/self/status') as f:\n"
    "        kb = [ln.split()[1] for ln in f if ln.startswith('VmHWM:')][0]\n"
    "    with open(sys.argv[1], 'w') as out:\n"
    "        out.write(kb)\n"
    "atexit.register(peak)\n"
    "from kvscope.diagnostics.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


def _child_peak_mb(argv) -> tuple[int, str, float]:
    """Run the CLI in a child; (exit code, stderr, its peak RSS in MB)."""
    import tempfile

    with tempfile.NamedTemporaryFile("r") as kb:
        p = subprocess.run([sys.executable, "-c", _PEAK, kb.name, *argv], capture_output=True,
                           text=True, timeout=120)
        return p.returncode, p.stderr, int(kb.read() or 0) / 1024


def test_an_endless_body_is_refused_within_bounded_memory():
    with server(_endless) as (url, _):
        code, err, peak = _child_peak_mb(["--scrape", url, "--timeout", "60s"])
    assert code == 2 and "sent more than 16 MiB" in err, err
    assert peak < 300, f"{peak:.0f} MB"


def test_a_gzip_bomb_bundle_is_refused_within_bounded_memory(tmp_path):
    bomb = tmp_path / "bomb.kvb"
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\0" * (1 << 20)
    with open(bomb, "wb") as f:
        for _ in range(200):  # 200 MiB inflated, ~200 KB on disk
            f.write(c.compress(zeros))
        f.write(c.flush())
    code, err, peak = _child_peak_mb(["--bundle", str(bomb)])
    assert code == 2 and "inflates to more than 24 MiB" in err, err
    assert peak < 300, f"{peak:.0f} MB"


def test_a_bundle_of_millions_of_tiny_samples_is_refused_before_parsing(tmp_path):
    head = ('{"format":"kvscope-bundle","version":1,"source":{"kind":"scrape","location":"x",'
            '"start":0,"end":1,"now":1,"lifetime":true,"recent_span":1},"series":[{"name":'
            '"kvscope_scheduler_steps_total","labels":{},"target":"","samples":[')
    body = head.encode() + b"[0,0]," * 3_500_000 + b"[0,0]]}]}"  # ~20 MiB inflated
    p = tmp_path / "tiny.kvb"
    p.write_bytes(gzip.compress(body, 1))
    code, err, peak = _child_peak_mb(["--bundle", str(p)])
    assert code == 2 and "JSON values in bundle" in err, err
    assert peak < 300, f"{peak:.0f} MB"


def test_a_prometheus_with_too_many_samples_is_refused_within_bounded_memory():
    """Every query answers 60,000 points (1 MB each, legal alone): the total is capped."""
    pts = ",".join(f'[{1_700_000_000 + i}.5,"1"]' for i in range(60_000))
    big = ('{"status":"success","data":{"resultType":"matrix","result":[{"metric":'
           '{"instance":"a"},"values":[' + pts + "]}]}}").encode()
    with serve(lambda: big) as url:  # the probe query gets the matrix too: it only needs JSON
        base = url.rsplit("/", 1)[0]
        code, err, peak = _child_peak_mb(["--prometheus", base, "--since", "1h", "--timeout", "60s"])
    assert code == 2 and "more than 600,000 samples" in err, err
    assert peak < 300, f"{peak:.0f} MB"


def test_too_many_series_is_one_line(tmp_path):
    doc = {"format": "kvscope-bundle", "version": 1, "source": {
        "kind": "scrape", "location": "x", "start": 0, "end": 1, "now": 1, "lifetime": True,
        "recent_span": 1}, "series": [{"name": "a", "labels": {}, "target": "", "samples": []}] * 20001}
    p = tmp_path / "many.kvb"
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(DiagnoseError, match="more than 20,000 series"):
        read_bundle(str(p))


def test_a_label_longer_than_the_cap_drops_its_series_with_a_note(capsys):
    with serve_registry(_engine(spec="x" * 5000)) as url:
        code, out, err = run(capsys, "--scrape", url, "--interval", "0.05s", "--json")
    doc = json.loads(out)
    assert code == 3, err  # kvscope_info dropped: stores_without_restores could not run
    assert any("longer than 1024 characters" in n for n in doc["notes"])


# ---- output safety -------------------------------------------------------------
@pytest.mark.parametrize("value", ["[fd00::5]:9400", "llama[int4]", "llama[/int4]", "[bold red]x",
                                   ":smile: \x1b]0;pwned\x07 \x1b[2J \u202egnp.exe"])
def test_label_values_are_printed_verbatim_and_controls_escaped(capsys, value):
    with serve_registry(_engine(tiers=value)) as url:
        code, out, err = run(capsys, "--scrape", url, "--interval", "0.05s")
    assert code == 0, err
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    shown = value.replace("\x1b", "\\x1b").replace("\x07", "\\x07").replace("\u202e", "\\u202e")
    assert shown in out.replace("\n", "") or shown.split()[0] in out


def test_the_tty_renderer_escapes_too():
    import io

    from rich.console import Console

    from kvscope.diagnostics.report.diagnosis import render
    from kvscope.diagnostics.verdict.diagnose import diagnose

    from .support import evidence, info

    d = {info(seed="llama[/int4]\x1b]0;pwned\x07"): [1, 1]}
    buf = io.StringIO()
    render(diagnose(evidence(d)), Console(file=buf, force_terminal=True, width=200, emoji=False))
    text = buf.getvalue()
    assert "llama[/int4]\\x1b]0;pwned\\x07" in text and "\x1b]0;" not in text


def test_the_report_comes_before_the_plot_and_a_bad_plot_path_is_refused_first(capsys, tmp_path):
    bundle = os.path.join(FIXTURES, "capacity-ceiling.kvb")
    code, out, err = run(capsys, "--bundle", bundle, "--plot", str(tmp_path / "x.xyz"))
    one_line(code, err, "name a .png, .svg, .pdf file")
    code, out, err = run(capsys, "--bundle", bundle, "--plot", str(tmp_path / "no" / "x.png"))
    one_line(code, err, "does not exist")
    png = tmp_path / "x.png"
    code, out, err = run(capsys, "--bundle", bundle, "--plot", str(png))
    assert code == 1 and "Capacity ceiling (veto form)" in out
    assert err.strip() == f"kv-diagnose: plot written to {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- record -o --------------------------------------------------------------------
def test_record_refuses_to_overwrite_without_force(capsys, tmp_path):
    out = tmp_path / "x.kvb"
    out.write_bytes(b"precious")
    with serve_registry(_engine()) as url:
        code, _, err = run(capsys, "record", "--scrape", url, "--interval", "0.05s", "-o", str(out))
        one_line(code, err, "pass --force")
        assert out.read_bytes() == b"precious"
        code, _, err = run(capsys, "record", "--scrape", url, "--interval", "0.05s", "-o", str(out),
                           "--force")
    assert code == 0, err
    assert read_bundle(str(out)).series


def test_record_never_writes_through_a_planted_tmp_link(capsys, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    out = tmp_path / "x.kvb"
    os.symlink(victim, f"{out}.tmp")
    with serve_registry(_engine()) as url:
        code, _, err = run(capsys, "record", "--scrape", url, "--interval", "0.05s", "-o", str(out))
    assert code == 0, err
    assert victim.read_bytes() == b"untouched" and read_bundle(str(out)).series
    assert sorted(os.listdir(tmp_path)) == ["victim", "x.kvb", "x.kvb.tmp"]


@pytest.mark.parametrize("target", ["/dev/null", "dir"])
def test_record_refuses_a_non_regular_target_even_with_force(capsys, tmp_path, target):
    path = target if target.startswith("/") else str(tmp_path)
    with serve_registry(_engine()) as url:
        code, _, err = run(capsys, "record", "--scrape", url, "--interval", "0.05s", "-o", path,
                           "--force")
    assert code == 2 and "refusing to write bundle" in err, err
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_record_dash_writes_the_bundle_to_stdout(tmp_path):
    with serve_registry(_engine()) as url:
        p = subprocess.run([KV_DIAGNOSE, "record", "--scrape",
                            url, "--interval", "0.05s", "-o", "-"], capture_output=True, timeout=60,
                           cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout[:2] == b"\x1f\x8b" and not os.path.exists(tmp_path / "-")
    assert b"wrote stdout:" in p.stderr
    q = subprocess.run([KV_DIAGNOSE, "--bundle", "-", "--json"],
                       input=p.stdout, capture_output=True, timeout=60)
    assert q.returncode == 0 and json.loads(q.stdout)["status"] == "healthy"


# ---- options and window sanity -----------------------------------------------------
B = os.path.join(FIXTURES, "healthy.kvb")


@pytest.mark.parametrize("argv,msg", [
    (["--bundle", B, "--selector", '{a="b"}'], "--selector applies to --prometheus, not --bundle"),
    (["--bundle", B, "--since", "5m"], "--since applies to --prometheus, not --bundle"),
    (["--bundle", B, "--timeout", "5s"], "--timeout applies to --prometheus and --scrape"),
    (["--prometheus", "http://127.0.0.1:1", "--since", "5m", "--interval", "2s"],
     "--interval applies to --scrape, not --prometheus"),
    (["--prometheus", "http://127.0.0.1:1", "--since", "9" * 400], "longer than 400 days"),
    (["--prometheus", "http://127.0.0.1:1", "--since", "99999999w"], "longer than 400 days"),
    (["--prometheus", "http://127.0.0.1:1", "--start", "1e300"], "not a plausible unix time"),
    (["--prometheus", "http://127.0.0.1:1", "--start", "nan"], "not a plausible unix time"),
    (["--prometheus", "http://127.0.0.1:1", "--start", "0001-01-01T00:00:00Z"], "longer than 400 days"),
    (["--prometheus", "http://127.0.0.1:1", "--start", "now+1h"], "bad time"),
    (["--prometheus", "http://127.0.0.1:1", "--since", "0s"], "--since must be > 0"),
    (["--scrape", "http://127.0.0.1:1/m", "--interval", "1d"], "--interval '1d' is more than"),
    (["--scrape", "http://127.0.0.1:99999/m"], "has a bad port"),
    (["--bundle", B, "--stale-after", "0"], "--stale-after must be > 0"),
    (["--bundle", "/dev/zero"], "not a regular file"),
])
def test_absurd_or_inapplicable_options_are_one_line(capsys, argv, msg):
    code, _, err = run(capsys, *argv)
    one_line(code, err, msg)


def test_an_end_in_the_future_is_clipped_and_said(capsys):
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode()
    with serve(lambda: body) as url:
        code, _, err = run(capsys, "--prometheus", url.rsplit("/", 1)[0], "--start", "now-1h",
                           "--end", "2999-01-01T00:00:00Z")
    one_line(code, err, "in the window")  # the clipped window is still diagnosed (empty here)
