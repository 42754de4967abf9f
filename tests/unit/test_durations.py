"""The one duration parser (rules, kv-diagnose's options, benchmarks)."""

from __future__ import annotations

import pytest

from kvscope.durations import seconds


@pytest.mark.parametrize("text, want", [
    ("250ms", 0.25), ("30s", 30), ("5m", 300), ("1h30m", 5400), ("2d", 172800), ("1w", 604800),
    ("1y", 31536000), ("1.5h", 5400), ("90", 90), (" 30 m ", 1800), ("0s", 0),
])
def test_durations(text, want):
    assert seconds(text) == want


@pytest.mark.parametrize("text", ["", "soon", "m", "-1s", "1e3s", "5mm", "1h x", "1 h 2"])
def test_not_durations(text):
    with pytest.raises(ValueError):
        seconds(text)
