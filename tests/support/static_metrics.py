"""A loopback HTTP server answering every GET with a /metrics body: a recorded file
(:func:`serving`) or whatever a function returns at each request (:func:`serve`)."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = self.server.body_fn()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@contextlib.contextmanager
def serve(body_fn: Callable[[], bytes], host: str = "127.0.0.1",
          port: int = 0) -> Iterator[str]:
    """Serve ``body_fn()`` at ``http://host:port/metrics`` (port 0: a free one); yields the URL."""
    srv = http.server.ThreadingHTTPServer((host, port), _Handler)
    srv.body_fn = body_fn  # type: ignore[attr-defined]
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://{host}:{srv.server_address[1]}/metrics"
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(5)


@contextlib.contextmanager
def serving(path: Path, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``path``'s bytes (read once) at ``http://host:port/metrics``."""
    body = path.read_bytes()
    with serve(lambda: body, host, port) as url:
        yield url
