"""--plot: each finding's decisive comparison is drawn, empty panels are left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.diagnostics import Thresholds, diagnose_bundle
from kvscope.diagnostics.report.panels import panels_for
from kvscope.diagnostics.report.plot import write_plot

FIXTURES = Path(__file__).parent / "fixtures"

# fixture -> (the verdict it shows, the panel holding its decisive comparison)
DECISIVE = {
    "capacity-ceiling": ("capacity_ceiling_veto", "ceiling"),
    "livelock": ("capacity_ceiling_livelock", "promotions"),
    "stale-rows": ("stale_row_corruption", "checksums"),
    "stale-rows-observe": ("stale_row_corruption", "checksums"),
    "pending-at-idle": ("pending_at_idle", "pending"),
    "not-settled-at-idle": ("not_settled_at_idle", "settling"),
    "store-never-fits": ("store_never_fits", "stores"),
    "stored-in-part": ("store_never_fits", "stores"),
    "stores-without-restores": ("stores_without_restores", "lookups"),
    "queue-wait": ("queue_wait", "requests"),
    "truncated": ("capacity_ceiling_truncated", "coverage"),
    "concurrency": ("capacity_ceiling_concurrency", "coverage"),
}


@pytest.mark.parametrize("name", sorted(DECISIVE))
def test_the_decisive_panel_is_drawn_and_no_panel_is_empty(name, tmp_path):
    verdict, key = DECISIVE[name]
    report = diagnose_bundle(str(FIXTURES / f"{name}.kvb"), Thresholds(pending_after_s=2.0))
    assert verdict in [v.id for v in report.verdicts]
    panels = panels_for(report)
    assert key in [p.key for p in panels]
    assert all(p.shows_something for p in panels)
    decisive = next(p for p in panels if p.key == key)
    assert decisive.note, "the decisive numbers are written on the panel"
    out = tmp_path / f"{name}.png"
    write_plot(report, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_healthy_plot_shows_the_overview_as_svg(tmp_path):
    report = diagnose_bundle(str(FIXTURES / "healthy.kvb"))
    assert report.healthy
    assert [p.key for p in panels_for(report)] == ["rounds", "hit_tokens"]
    out = tmp_path / "h.svg"
    write_plot(report, str(out))
    assert out.read_text().lstrip().startswith("<?xml")
