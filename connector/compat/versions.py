"""Which vLLM release is installed (kvscope supports 0.26.0 .. 0.34.0)."""

from __future__ import annotations

import vllm

VLLM_VERSION: str = getattr(vllm, "__version__", "unknown")
SUPPORTED = ("0.26.0", "0.34.0")  # the range pyproject's ``vllm`` extra admits


def release(version: str = VLLM_VERSION) -> tuple[int, ...]:
    """(major, minor, patch) of a version string; dev/local suffixes ignored."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def at_least(version: str) -> bool:
    return release() >= release(version)
