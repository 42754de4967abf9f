"""Spans go to the application's tracer provider; kvscope installs an OTLP/HTTP one
only when its own ``otlp_traces`` option says so.

A real OTLP/HTTP receiver on 127.0.0.1 decodes what arrives with OpenTelemetry's
own protobuf types; the scenario runs in a subprocess because installing the
global tracer provider is process-wide.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from kvscope.exporters import signals as S

pytestmark = pytest.mark.vllm

SCRIPT = """
import sys
from kvscope.sim.scenarios import run_scenario
options = {"otlp_traces": True} if sys.argv[1] == "on" else {}
with run_scenario("capacity-ceiling", exporter_port=None, kvscope_options=options) as sc:
    assert sc.facts["restored_tokens"] == 0
"""


def test_spans_reach_an_otlp_http_receiver(tmp_path):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    spans = [s for body in _run_with_receiver(tmp_path, "on")
             for s in _spans(ExportTraceServiceRequest.FromString(body))]
    names = {s.name for s in spans}
    assert {S.SPAN_LOOKUP_ROUND, S.SPAN_PROMOTION, S.SPAN_TRANSFER} <= names
    vetoed = [s for s in spans if s.name == S.SPAN_LOOKUP_ROUND and any(
        a.key == S.A_VERDICT and a.value.string_value == "vetoed" for a in s.attributes)]
    assert vetoed


def test_no_provider_of_its_own_without_the_option(tmp_path):
    """OTEL_EXPORTER_OTLP_ENDPOINT alone is the application's business: nothing is sent."""
    assert _run_with_receiver(tmp_path, "off") == []


def _spans(req):
    for rs in req.resource_spans:
        service = {a.key: a.value.string_value for a in rs.resource.attributes}
        assert service.get("service.name") == "kvscope-test"
        for ss in rs.scope_spans:
            assert ss.scope.name == S.TRACER_NAME
            yield from ss.spans


def _run_with_receiver(tmp_path, option: str) -> list[bytes]:
    received: list[bytes] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/v1/traces":
                received.append(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.server_port}",
                   OTEL_SERVICE_NAME="kvscope-test", VLLM_LOGGING_LEVEL="ERROR")
        proc = subprocess.run([sys.executable, "-c", SCRIPT, option], env=env,
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    finally:
        server.shutdown()
        server.server_close()
    return received
