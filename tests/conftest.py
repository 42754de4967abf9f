"""Shared fixtures. Keep this small; subsystem fixtures live beside their tests."""

from __future__ import annotations

import contextlib

import pytest


@pytest.fixture
def prometheus(tmp_path):
    """Factory fixture: ``prometheus(targets, rule_files=(), **kw)`` starts a real Prometheus.

    127.0.0.1 only, free port, fresh TSDB under ``tmp_path``; returns a
    ``tests.support.prometheus.Prometheus`` client once every target is up; stopped at teardown.
    Skips the test when the ``prometheus`` binary is not installed.
    """
    from tests.support.prometheus import require_binaries, running_prometheus

    require_binaries("prometheus")
    with contextlib.ExitStack() as stack:
        count = 0

        def start(targets=(), rule_files=(), **kwargs):
            nonlocal count
            count += 1
            workdir = tmp_path / f"prometheus-{count}"
            return stack.enter_context(
                running_prometheus(targets, rule_files, workdir=workdir, **kwargs))

        yield start
