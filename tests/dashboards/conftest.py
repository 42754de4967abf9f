"""The Prometheus shared by the live query checks of this folder (see ``live.py``)."""

from __future__ import annotations

import pytest

from tests.dashboards import live
from tests.support.prometheus import require_binaries


@pytest.fixture(scope="session")
def live_pool(tmp_path_factory):
    require_binaries("prometheus")
    with live.pool(tmp_path_factory.mktemp("live")) as p:
        yield p
