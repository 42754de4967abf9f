"""Source (c): a recorded incident bundle (``.kvb``).

Format, version 1: gzip-compressed UTF-8 JSON::

    {
      "format": "kvscope-bundle",
      "version": 1,
      "created_at": 1700000000.0,          # unix seconds
      "kvscope_version": "0.1.0",
      "source": {kind, location, start, end, now, lifetime, recent_span, selector, bundle},
      "series": [{"name": ..., "labels": {...}, "target": ..., "samples": [[t, v], ...]}, ...],
      "failures": ["cannot reach metrics endpoint at ...", ...],   # optional: targets that
      "notes": [...]                                               # gave nothing usable
    }

Reading is bounded (``limits``): at most MAX_BUNDLE_BYTES after gunzip, MAX_SERIES
series, MAX_SAMPLES samples; non-finite window fields are refused as corrupt.

Only the series kv-diagnose reads are kept (kvscope's and the few vLLM ones
named in ``signals``). Those carry bounded labels only: no prompts, no request
ids, no block hashes (``hash_seed`` is a fingerprint of the seed, not a key).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import stat
import sys
import time
import zlib

from ..atomic import write_atomically
from ..model import DiagnoseError, RawWindow, Series, SourceInfo
from .limits import (
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_COMMAS,
    MAX_BUNDLE_CONTAINERS,
    MAX_SAMPLES,
    MAX_SERIES,
    too_many,
)
from .wanted import WANTED_SERIES

FORMAT = "kvscope-bundle"
VERSION = 1


def _kvscope_version() -> str:
    from kvscope import __version__

    return __version__


def to_dict(raw: RawWindow, created_at: float | None = None) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "created_at": time.time() if created_at is None else created_at,
        "kvscope_version": _kvscope_version(),
        "source": raw.source.to_dict(),
        "series": [
            {
                "name": s.name,
                "labels": dict(s.labels),
                "target": s.target,
                "samples": [[t, v] for t, v in s.samples],
            }
            for s in raw.series
            if s.name in WANTED_SERIES
        ],
        # targets that gave nothing usable when it was recorded: still evidence
        "failures": list(raw.failures),
        "notes": list(raw.notes),
    }


STDIO = "-"


def write_bundle(raw: RawWindow, path: str, created_at: float | None = None,
                 force: bool = False) -> int:
    """Write the bundle; returns the number of series kept.

    ``-`` writes to stdout. A file is written to a fresh temporary file beside
    the target (``O_EXCL``, never through a symlink) and renamed over it: an
    interrupted write leaves no half bundle, and a pre-planted ``<out>.tmp``
    link redirects nothing. An existing target is replaced only with ``force``
    and only if it is a regular file (or a link, which is replaced, not followed).
    """
    doc = to_dict(raw, created_at)
    data = gzip.compress(json.dumps(doc, separators=(",", ":")).encode("utf-8"), mtime=0)
    if path == STDIO:
        out = sys.stdout.buffer
        if out.isatty():
            raise DiagnoseError("refusing to write a gzip bundle to a terminal: redirect -o - to a file or pipe")
        out.write(data)
        out.flush()
        return len(doc["series"])
    _check_target(path, force)
    def write(f) -> None:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())

    write_atomically(path, "bundle", write)
    return len(doc["series"])


def _check_target(path: str, force: bool) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise DiagnoseError(f"cannot write bundle {path}: {e.strerror or e}") from None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise DiagnoseError(f"refusing to write bundle {path}: it is {kind}")
    if not force:
        raise DiagnoseError(f"refusing to overwrite {path}: it exists (pass --force to replace it)")


def _inflate(f, path: str) -> bytearray:
    """gunzip ``f`` up to MAX_BUNDLE_BYTES (a small bundle may inflate a thousandfold)."""
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = bytearray()
    while not d.eof:
        chunk = f.read(1 << 16)
        if not chunk:
            raise DiagnoseError(f"bundle {path} is truncated or corrupt (gzip stream broken)")
        while chunk:
            out += d.decompress(chunk, MAX_BUNDLE_BYTES + 1 - len(out))
            if len(out) > MAX_BUNDLE_BYTES:
                raise DiagnoseError(
                    f"bundle {path} inflates to more than {MAX_BUNDLE_BYTES >> 20} MiB "
                    "(kv-diagnose's limit): not a bundle kv-diagnose record writes")
            chunk = d.unconsumed_tail
            if d.eof:
                break
    return out


def read_bundle(path: str) -> RawWindow:
    try:
        if path == STDIO:
            f = sys.stdin.buffer
            name = "<stdin>"
        else:
            st = os.stat(path)
            if stat.S_ISDIR(st.st_mode):
                raise DiagnoseError(f"bundle {path} is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise DiagnoseError(f"bundle {path} is not a regular file")
            f = open(path, "rb")  # noqa: SIM115  closed below
            name = path
        try:
            head = f.read(2)
            if head != b"\x1f\x8b":
                raise DiagnoseError(f"{name} is not a kvscope bundle (not gzip data)")
            data = _inflate_after(head, f, name)
            _check_shape(data, name)
            text = data.decode("utf-8")
            del data
        finally:
            if f is not sys.stdin.buffer:
                f.close()
    except FileNotFoundError:
        raise DiagnoseError(f"bundle {path} does not exist") from None
    except (EOFError, gzip.BadGzipFile, zlib.error):
        raise DiagnoseError(f"bundle {path} is truncated or corrupt (gzip stream broken)") from None
    except UnicodeDecodeError:
        raise DiagnoseError(f"bundle {path} is corrupt (not UTF-8 JSON)") from None
    except OSError as e:
        raise DiagnoseError(f"cannot read bundle {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise DiagnoseError(f"bundle {path} is corrupt (invalid JSON)") from None
    return from_dict(doc, name)


def _inflate_after(head: bytes, f, name: str) -> bytearray:
    """Inflate the gzip stream whose first two bytes were already read."""

    class _Rest:
        def __init__(self):
            self.first = head

        def read(self, n: int) -> bytes:
            if self.first:
                out, self.first = self.first, b""
                return out
            return f.read(n)

    return _inflate(_Rest(), name)


def _check_shape(data: bytearray, path: str) -> None:
    """Refuse, before parsing, a document that would parse into millions of objects."""
    containers = data.count(b"[") + data.count(b"{")
    if containers > MAX_BUNDLE_CONTAINERS or data.count(b",") > MAX_BUNDLE_COMMAS:
        raise too_many(f"JSON values in bundle {path}", MAX_BUNDLE_COMMAS,
                       "not a bundle kv-diagnose record writes")


def _finite(x, what: str) -> float:
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"{what} is not finite")
    return v


def from_dict(doc, path: str = "<bundle>") -> RawWindow:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DiagnoseError(f"{path} is not a kvscope bundle (format is not {FORMAT!r})")
    version = doc.get("version")
    if version != VERSION:
        raise DiagnoseError(
            f"bundle {path} has version {repr(version)[:20]}; this kv-diagnose reads version {VERSION}"
        )
    try:
        src = SourceInfo.from_dict(doc["source"])
        for what in ("start", "end", "now", "recent_span"):
            _finite(getattr(src, what), f"source.{what}")
        if src.end < src.start or src.recent_span < 0:
            raise ValueError("source window ends before it starts")
        src = SourceInfo(**{**src.to_dict(), "bundle": path})
        if not isinstance(doc["series"], list):
            raise TypeError("series is not a list")
        if len(doc["series"]) > MAX_SERIES:
            raise too_many(f"series in bundle {path}", MAX_SERIES, "not a bundle kv-diagnose record writes")
        series, n = [], 0
        for s in doc["series"]:
            n += len(s["samples"])
            if n > MAX_SAMPLES:
                raise too_many(f"samples in bundle {path}", MAX_SAMPLES,
                               "not a bundle kv-diagnose record writes")
            series.append(Series(
                name=str(s["name"]),
                labels=tuple(sorted((str(k), str(v)) for k, v in s["labels"].items())),
                target=str(s["target"]),
                samples=tuple((float(t), float(v)) for t, v in s["samples"]),
            ))
        failures = tuple(str(x) for x in doc.get("failures", ()))
        notes = tuple(str(x) for x in doc.get("notes", ()))
    except DiagnoseError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise DiagnoseError(f"bundle {path} is corrupt (bad field: {str(e)[:120]})") from None
    return RawWindow(src, tuple(series), failures=failures, notes=notes)
