"""``python -m kvscope.diagnostics`` runs kv-diagnose, quietly (no runpy warning)."""

from __future__ import annotations

import subprocess
import sys


def test_python_m_kvscope_diagnostics():
    proc = subprocess.run([sys.executable, "-m", "kvscope.diagnostics", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: kv-diagnose")
    assert proc.stderr == ""
