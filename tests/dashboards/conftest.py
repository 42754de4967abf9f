"""The Prometheus shared by the live query checks of this folder (see ``live.py``), and the
Prometheus replaying the recorded fault campaigns (test_campaign_replay.py and
test_victoriametrics.py compare against it)."""

from __future__ import annotations

import pytest

from tests.dashboards import live
from tests.support.prometheus import require_binaries


@pytest.fixture(scope="session")
def live_pool(tmp_path_factory):
    require_binaries("prometheus")
    with live.pool(tmp_path_factory.mktemp("live")) as p:
        yield p


@pytest.fixture(scope="session")
def campaign_prom():
    require_binaries()
    replay = pytest.importorskip("tests.support.campaign_replay")
    if not replay.recordings():
        pytest.skip("no campaign recordings committed")
    with replay.replayed() as p:
        yield p
