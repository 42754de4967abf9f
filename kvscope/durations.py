"""Durations as Prometheus writes them (``250ms``, ``30s``, ``5m``, ``1h30m``): one parser
for the rules generator, kv-diagnose's options and the benchmarks.

kv-diagnose's options also take a fraction (``1.5h``) and a bare number of seconds.
"""

from __future__ import annotations

import re

UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800,
                "y": 31536000}
_UNIT = "ms|s|m|h|d|w|y"  # "ms" before "m": the alternation is tried in order
_PART = re.compile(rf"(\d+(?:\.\d+)?)\s*({_UNIT})")
_WHOLE = re.compile(rf"^\s*(?:(?:\d+(?:\.\d+)?\s*(?:{_UNIT})\s*)+|\d+(?:\.\d+)?\s*)$")


def seconds(text: str) -> float:
    """Seconds of ``text``; ValueError when it is no duration."""
    if not _WHOLE.match(text or ""):
        raise ValueError(f"not a duration: {text!r}")
    parts = _PART.findall(text)
    if not parts:  # a bare number
        return float(text)
    return sum(float(n) * UNIT_SECONDS[unit] for n, unit in parts)
