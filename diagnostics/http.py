"""One HTTP GET with every failure turned into a one-line DiagnoseError."""

from __future__ import annotations

import socket
import urllib.error
import urllib.parse
import urllib.request

from .model import DiagnoseError

USER_AGENT = "kv-diagnose (kvscope)"


def check_url(url: str, what: str) -> str:
    p = urllib.parse.urlparse(url)
    if p.scheme not in ("http", "https") or not p.netloc:
        raise DiagnoseError(f"{what} URL {url!r} is not an http(s) URL (expected e.g. http://127.0.0.1:9090)")
    return url


def get(url: str, timeout: float, what: str) -> bytes:
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, "Accept": "*/*"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()
    except urllib.error.HTTPError as e:
        body = ""
        try:
            body = e.read(300).decode("utf-8", "replace").strip().replace("\n", " ")
        except Exception:
            pass
        hint = f": {body}" if body else ""
        raise DiagnoseError(f"{what} {_short(url)} answered HTTP {e.code}{hint[:200]}") from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise DiagnoseError(f"{what} {_short(url)} did not answer within {timeout:g} s (timeout)") from None
        if isinstance(reason, ConnectionRefusedError):
            raise DiagnoseError(f"cannot reach {what} at {_short(url)}: connection refused") from None
        raise DiagnoseError(f"cannot reach {what} at {_short(url)}: {reason}") from None
    except TimeoutError:
        raise DiagnoseError(f"{what} {_short(url)} did not answer within {timeout:g} s (timeout)") from None
    except (ConnectionError, OSError, ValueError) as e:
        raise DiagnoseError(f"cannot read {what} at {_short(url)}: {e}") from None


def _short(url: str) -> str:
    return url if len(url) <= 120 else url[:117] + "..."
