"""``python -m kvscope.diagnostics`` (and ``.cli``) run kv-diagnose, quietly (no runpy warning)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["kvscope.diagnostics", "kvscope.diagnostics.cli"])
def test_python_m_kvscope_diagnostics(module):
    proc = subprocess.run([sys.executable, "-W", "default", "-m", module, "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: kv-diagnose")
    assert proc.stderr == ""


def test_the_package_api_is_there():
    import kvscope.diagnostics as d

    for name in d.__all__:
        assert getattr(d, name) is not None
