"""A loopback HTTP server answering every GET with one recorded /metrics body."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def serving(path: Path, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``path``'s bytes at ``http://host:port/metrics`` (port 0: a free one)."""
    body = path.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
