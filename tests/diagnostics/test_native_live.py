"""The committed native captures still come out of today's code and vLLM (>= 0.33 only; each
release's own captures).

Runs the disk-tier fault runs of ``native/runs.py`` (and the store-never-fits scenario) again
with the stock connector, scrapes
vLLM's /metrics as ``capture.py`` does and diagnoses the fresh scrape: the engine facts and the
verdicts must be the committed capture's. The stalled-tier run mounts a ramfs (root only).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvscope.diagnostics.cli import main
from tests.diagnostics.test_native import NATIVE, _facts
from tests.support.static_metrics import serving

versions = pytest.importorskip("kvscope.connector.compat.versions")
pytestmark = pytest.mark.vllm

if not versions.at_least("0.33.0"):
    pytest.skip("vLLM < 0.33 exports no native tiering metrics", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]


def _can_mount_ramfs() -> bool:
    with tempfile.TemporaryDirectory() as d:
        if subprocess.run(["mount", "-t", "ramfs", "ramfs", d], capture_output=True).returncode:
            return False
        subprocess.run(["umount", d], check=False)
        return True


def _verdicts(path, capsys) -> list[str]:
    with serving(path) as url:
        main(["--scrape", url, "--interval", "0.05", "--json"])
    return [v["id"] for v in json.loads(capsys.readouterr().out)["verdicts"]]


@pytest.mark.parametrize("name", ["tier-failures", "restart-without-seed", "store-never-fits",
                                  "tier-stall", "queue-wait"])
def test_capture_reproduces(name, tmp_path, capsys):
    if name == "tier-stall" and not _can_mount_ramfs():
        pytest.skip("mounting a ramfs needs root")
    committed = NATIVE / f"vllm-{versions.VLLM_VERSION}-{name}.prom"
    if not committed.exists():
        pytest.skip(f"no capture of vLLM {versions.VLLM_VERSION}'s /metrics committed: make one "
                    "with tests/diagnostics/native/capture.py (docs/releases.md)")
    fresh = tmp_path / committed.name
    # In its own process: vLLM's /metrics is the process-wide prometheus-client registry,
    # which earlier tests in this process filled with kvscope's series (the stock engine
    # would then not read as stock).
    subprocess.run([sys.executable, "-m", "tests.diagnostics.native.capture", name, str(fresh)],
                   cwd=ROOT, check=True, timeout=600, capture_output=True)
    assert _facts(fresh) == _facts(committed)
    assert _verdicts(fresh, capsys) == _verdicts(committed, capsys)
