"""Backfill a synthetic history into a Prometheus TSDB with ``promtool tsdb create-blocks-from
openmetrics``: one input and one 24 h block per UTC day, the next day written while promtool
reads the previous one."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

WriteChunk = Callable[[float, float, Path], int]  # (from, to, path) -> samples written


def backfill(chunks: Iterable[tuple[float, float]], write: WriteChunk, data: Path,
             work: Path, log: Callable[[str], None] = lambda _: None) -> int:
    """Every chunk written by ``write`` into the TSDB at ``data``; returns the samples."""
    samples = 0
    pending: tuple[subprocess.Popen, Path] | None = None
    try:
        for i, (lo, hi) in enumerate(chunks):
            om = work / f"chunk{i}.om"
            samples += write(lo, hi, om)
            _finish(pending)
            pending = (subprocess.Popen(
                ["promtool", "tsdb", "create-blocks-from", "openmetrics",
                 "--max-block-duration=24h", str(om), str(data)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), om)
            log(f"chunk {i} written ({samples:,} samples so far)")
        _finish(pending)
        pending = None
    finally:
        if pending is not None:
            pending[0].kill()
            pending[0].wait()
    return samples


def _finish(pending: tuple[subprocess.Popen, Path] | None) -> None:
    if pending is None:
        return
    proc, om = pending
    _, err = proc.communicate()
    om.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise RuntimeError(f"promtool failed on {om.name}: {err[-2000:]}")
