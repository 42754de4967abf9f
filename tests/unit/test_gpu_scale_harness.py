"""The GPU scale benchmark's harness (``benchmarks/gpu_scale.py``), where it acts on files:
its fs-tier pruning must remove only what no later re-ask reads."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_pruning_the_fs_tier_removes_only_block_files_older_than_the_ask(tmp_path):
    # gpu_scale --prune-fs: after re-asking prompt k, the fs files written before prompt k+1
    # was asked go (prompt k and older); prompt k+1's, and anything not a block, stay
    sys.path.insert(0, str(BENCHMARKS))  # gpu_scale imports its siblings as scripts do
    try:
        gpu_scale = importlib.import_module("gpu_scale")
    finally:
        sys.path.remove(str(BENCHMARKS))
    base = tmp_path / "model_abc_r0"
    old = [base / "0ab" / "cd_g0" / "0abcd1.bin", base / "f00" / "12_g1" / "f0012.bin"]
    new = [base / "0ab" / "cd_g0" / "0abcd2.bin", base / "777" / "77_g0" / "77777.bin"]
    config = tmp_path / "model_abc" / "config.json"
    for f in (*old, *new, config):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"kv")
    asked_at = 1_000_000.0
    for f in (*old, config):
        os.utime(f, (asked_at - 5, asked_at - 5))
    for f in new:
        os.utime(f, (asked_at + 1, asked_at + 1))
    assert gpu_scale.prune(str(tmp_path), asked_at) == 2
    assert not any(f.exists() for f in old)
    assert all(f.exists() for f in (*new, config))
