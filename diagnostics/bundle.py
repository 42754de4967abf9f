"""Source (c): a recorded incident bundle (``.kvb``).

Format, version 1: gzip-compressed UTF-8 JSON::

    {
      "format": "kvscope-bundle",
      "version": 1,
      "created_at": 1700000000.0,          # unix seconds
      "kvscope_version": "0.1.0",
      "source": {kind, location, start, end, now, lifetime, recent_span, selector, bundle},
      "series": [{"name": ..., "labels": {...}, "target": ..., "samples": [[t, v], ...]}, ...]
    }

Only the series kv-diagnose reads are kept (kvscope's and the few vLLM ones
named in ``signals``). Those carry bounded labels only: no prompts, no request
ids, no block hashes (``hash_seed`` is a fingerprint of the seed, not a key).
"""

from __future__ import annotations

import gzip
import json
import os
import time
import zlib

from .evidence import WANTED_SERIES
from .model import DiagnoseError, RawWindow, Series, SourceInfo

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
    }


def write_bundle(raw: RawWindow, path: str, created_at: float | None = None) -> int:
    """Write atomically (``path.tmp`` then rename); returns the number of series kept."""
    doc = to_dict(raw, created_at)
    tmp = f"{path}.tmp"
    try:
        data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        with open(tmp, "wb") as f:
            f.write(gzip.compress(data, mtime=0))
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise DiagnoseError(f"cannot write bundle {path}: {e.strerror or e}") from None
    return len(doc["series"])


def read_bundle(path: str) -> RawWindow:
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            if head != b"\x1f\x8b":
                raise DiagnoseError(f"{path} is not a kvscope bundle (not gzip data)")
            text = gzip.decompress(f.read()).decode("utf-8")
    except FileNotFoundError:
        raise DiagnoseError(f"bundle {path} does not exist") from None
    except IsADirectoryError:
        raise DiagnoseError(f"bundle {path} is a directory") from None
    except (EOFError, gzip.BadGzipFile, zlib.error):
        raise DiagnoseError(f"bundle {path} is truncated or corrupt (gzip stream broken)") from None
    except UnicodeDecodeError:
        raise DiagnoseError(f"bundle {path} is corrupt (not UTF-8 JSON)") from None
    except OSError as e:
        raise DiagnoseError(f"cannot read bundle {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except ValueError:
        raise DiagnoseError(f"bundle {path} is corrupt (invalid JSON)") from None
    return from_dict(doc, path)


def from_dict(doc, path: str = "<bundle>") -> RawWindow:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DiagnoseError(f"{path} is not a kvscope bundle (format is not {FORMAT!r})")
    version = doc.get("version")
    if version != VERSION:
        raise DiagnoseError(
            f"bundle {path} has version {version!r}; this kv-diagnose reads version {VERSION}"
        )
    try:
        src = SourceInfo.from_dict(doc["source"])
        src = SourceInfo(**{**src.to_dict(), "bundle": path})
        series = tuple(
            Series(
                name=str(s["name"]),
                labels=tuple(sorted((str(k), str(v)) for k, v in s["labels"].items())),
                target=str(s["target"]),
                samples=tuple((float(t), float(v)) for t, v in s["samples"]),
            )
            for s in doc["series"]
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DiagnoseError(f"bundle {path} is corrupt (bad field: {e})") from None
    return RawWindow(src, series)
