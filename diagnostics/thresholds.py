"""Every knob kv-diagnose judges with, in one place, with the operator-facing why.

Defaults come from the system's own scales (transfer-time buckets, scrape
intervals, the primary tier's row count), never from one recorded run.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S


@dataclass(frozen=True)
class Thresholds:
    # A busy engine's kvscope_last_step_timestamp_seconds moves at 1 s resolution,
    # stamped within kvscope's flush_interval_s (default 1 s) of each step. Four
    # default Prometheus scrape intervals (15 s) of silence while work is unfinished
    # means the engine or its stats path stopped.
    stale_after_s: float = 60.0

    # A transfer older than the top bucket of kvscope_transfer_seconds (a cold
    # disk read under load) is stuck, not slow. CLI: --stuck-after SECONDS.
    # Lower it only where transfers are known to be fast (tests, CPU demos).
    pending_after_s: float = S.TRANSFER_SECONDS_BUCKETS[-1]

    # Head-room on top of the rows one request needs resident at once
    # (partial tail chunks, a second request restoring concurrently).
    row_margin: float = 0.25

    # Livelock: deferred again and again (a healthy disk promotion defers a
    # request 2-3 rounds, then hits) ...
    livelock_min_deferred_rounds: int = 5
    # ... while promotions rewrite at least this fraction of the primary tier
    # per scheduler step (the measured livelock churns 0.5-1 row budget/step).
    livelock_churn_fraction: float = 0.25

    # Unclassified anomalies (invariants no known class may break unexplained):
    # at least this many lookup rounds before their verdict mix means anything
    anomaly_min_rounds: int = 20
    # ... of which at least this fraction vetoed (or deferred with not one hit);
    # a healthy tiered engine defers most rounds for a moment, then hits
    anomaly_failing_fraction: float = 0.5
    # a transfer pending this many --stuck-after thresholds is no slow transfer
    anomaly_stuck_factor: float = 10.0
    # restore hit ratio (hits / rounds that found something) that "collapsed":
    # at least anomaly_collapse_before earlier, at most anomaly_collapse_after now
    anomaly_collapse_before: float = 0.5
    anomaly_collapse_after: float = 0.1
    # tokens offered / tokens the tiers held for ended rounds: below this, held
    # prefixes were recomputed for a reason no class named (the dashboards'
    # Config.restore_coverage_min). Healthy engines sit at ~1 (vLLM's load cap
    # costs the last token of a fully held prompt).
    anomaly_coverage_min: float = 0.5

    # Not settled at idle, the host side: the host's available memory (MemAvailable, which
    # counts reclaimable page cache, so the disk tier's writes do not lower it) falling by at
    # least this many bytes, and still falling, while nothing runs or waits. An idle engine
    # allocates nothing; a gibibyte gone with no load is no allocator's jitter.
    idle_memory_drop_bytes: int = 1 << 30
    # Tier flooded by one KV group: one group holds at least this share of the keys in the
    # CPU primary tier (a hybrid model's sub-block or drafter group legitimately holds most
    # of it: 8x the keys per token of a group with 8x its block size, 80 % beside two such
    # groups, 96.5 % at 56x) ...
    flood_share: float = 0.75
    # ... while a full-attention group stored fewer than this fraction of the prompt tokens
    # that group stored (kvscope_store_tokens_total: groups storing in proportion to their
    # block sizes store about the same tokens; a prompt's unaligned tail costs a large-block
    # group at most one chunk, so healthy ratios stay near 1 once prompts span a few chunks)
    flood_victim_fraction: float = 0.25

    # Restore slowed by rescans: restores that took at least this many seconds (summed over
    # the window's restores) ...
    slow_restore_s: float = 10.0
    # ... of which at least this share went to the scheduler's deferred rescans (a 131k-token
    # restore from disk spends a few percent there; a 1M-token one most of its 80 s)
    rescan_share: float = 0.5

    # Bytes of one primary-tier row (all rank slots), if the operator knows it;
    # lets the capacity verdicts give cpu_bytes_to_use, not only a row count.
    # Overrides kvscope_primary_row_bytes (which kvscope exports itself).
    row_bytes: int | None = None
