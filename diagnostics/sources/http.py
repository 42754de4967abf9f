"""One HTTP GET, bounded in time and size, every failure one line (DiagnoseError).

The timeout bounds the *whole* request, not each socket read: a server that
drips a byte every few seconds is cut off when the time is up (a timer shuts
the socket down under the blocked read). The body is read in chunks and
refused past ``max_bytes``, so an endless body costs at most that much memory.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
import urllib.parse

from ..model import DiagnoseError
from .limits import MAX_BODY_BYTES, NO_DEADLINE, Deadline

USER_AGENT = "kv-diagnose (kvscope)"
MAX_REDIRECTS = 3
_CHUNK = 1 << 16


def check_url(url: str, what: str) -> str:
    p = urllib.parse.urlparse(url)
    if p.scheme not in ("http", "https") or not p.netloc:
        raise DiagnoseError(f"{what} URL {url!r} is not an http(s) URL (expected e.g. http://127.0.0.1:9090)")
    try:
        p.port  # noqa: B018  raises on a port out of range / not a number
    except ValueError:
        raise DiagnoseError(f"{what} URL {url!r} has a bad port") from None
    return url


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    p = urllib.parse.urlparse(url)
    host = p.netloc.rsplit("@", 1)[-1]  # no credentials in the Host header
    path = (p.path or "/") + (f"?{p.query}" if p.query else "")
    if p.scheme == "https":
        return http.client.HTTPSConnection(host, timeout=timeout,
                                           context=ssl.create_default_context()), path
    return http.client.HTTPConnection(host, timeout=timeout), path


class _Killer:
    """Shuts the request's socket down when its time is up. The socket is
    remembered at connect: http.client hands it to the response and forgets it."""

    def __init__(self, seconds: float):
        self.fired = threading.Event()
        self.sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket | None) -> None:
        with self._lock:
            self.sock = sock
            if self.fired.is_set():
                self._shutdown()

    def _fire(self) -> None:
        with self._lock:
            self.fired.set()
            self._shutdown()

    def _shutdown(self) -> None:
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked read at once
            except OSError:
                pass

    def cancel(self) -> None:
        self._timer.cancel()


def _read(resp: http.client.HTTPResponse, max_bytes: int, what: str, url: str) -> bytes:
    length = resp.getheader("Content-Length")
    if length and length.isdigit() and int(length) > max_bytes:
        raise _too_big(what, url, max_bytes)
    parts, total = [], 0
    while True:
        chunk = resp.read(_CHUNK)
        if not chunk:
            return b"".join(parts)
        total += len(chunk)
        if total > max_bytes:
            raise _too_big(what, url, max_bytes)
        parts.append(chunk)


def _too_big(what: str, url: str, max_bytes: int) -> DiagnoseError:
    return DiagnoseError(f"{what} {_short(url)} sent more than {max_bytes >> 20} MiB "
                         "(kv-diagnose's limit for one answer): not a metrics page, or narrow the query")


def get(url: str, timeout: float, what: str, deadline: Deadline = NO_DEADLINE,
        max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """GET ``url``: the body, within ``timeout`` seconds for the whole request."""
    budget = deadline.bound(timeout)
    t_end = time.monotonic() + budget
    for _ in range(MAX_REDIRECTS + 1):
        left = t_end - time.monotonic()
        if left <= 0:
            raise _timeout(what, url, budget)
        status, body, location = _get_once(url, left, budget, what, max_bytes)
        if location is None:
            return body
        url = check_url(urllib.parse.urljoin(url, location), what)
    raise DiagnoseError(f"{what} {_short(url)} redirected more than {MAX_REDIRECTS} times")


def _get_once(url: str, left: float, budget: float, what: str,
              max_bytes: int) -> tuple[int, bytes, str | None]:
    try:
        conn, path = _connection(url, left)
    except (http.client.InvalidURL, ValueError) as e:
        raise DiagnoseError(f"{what} URL {_short(url)} is not usable: {e}") from None
    killer = _Killer(left)
    fired = killer.fired
    try:
        conn.connect()
        killer.watch(conn.sock)
        conn.request("GET", path, headers={"User-Agent": USER_AGENT, "Accept": "*/*",
                                           "Accept-Encoding": "identity"})
        resp = conn.getresponse()
        if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
            return resp.status, b"", resp.getheader("Location")
        if resp.status >= 400:
            body = resp.read(300).decode("utf-8", "replace").strip().replace("\n", " ")
            hint = f": {body}" if body else ""
            raise DiagnoseError(f"{what} {_short(url)} answered HTTP {resp.status}{hint[:200]}")
        body = _read(resp, max_bytes, what, url)
        if fired.is_set():  # the shutdown ends a dripping body as if complete
            raise _timeout(what, url, budget)
        return resp.status, body, None
    except DiagnoseError:
        raise
    except TimeoutError:
        raise _timeout(what, url, budget) from None
    except ConnectionRefusedError:
        raise DiagnoseError(f"cannot reach {what} at {_short(url)}: connection refused") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        if fired.is_set():
            raise _timeout(what, url, budget) from None
        reason = e.strerror if isinstance(e, OSError) and e.strerror else (str(e) or type(e).__name__)
        raise DiagnoseError(f"cannot reach {what} at {_short(url)}: {reason}") from None
    finally:
        killer.cancel()
        conn.close()


def _timeout(what: str, url: str, budget: float) -> DiagnoseError:
    return DiagnoseError(f"{what} {_short(url)} did not answer within {budget:g} s (timeout)")


def _short(url: str) -> str:
    return url if len(url) <= 120 else url[:117] + "..."
