"""The benchmarks' scripts, imported by tests as the scripts import one another: with
``benchmarks/`` on ``sys.path`` (each imports its siblings by bare name), only while
importing."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def import_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (cached in ``sys.modules`` as ``name``)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
