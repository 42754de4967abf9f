"""The one configuration object of the kvscope dashboards and rules (a mixin's ``_config``).

Everything an operator may need to change without forking lives here. Build a
variant with ``dataclasses.replace(DEFAULT, selector='job="vllm"')`` and pass it
to ``generate()`` / the ``kvscope dashboards|rules`` commands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvscope.exporters import signals

_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


@dataclass(frozen=True)
class Config:
    # ---- selectors ---------------------------------------------------------------------------
    # Label matchers inserted between {} of every kvscope_* series selector, e.g. 'job="vllm"'
    # or 'job=~"vllm|kvscope-exporter",cluster="eu1"'. Leave empty when the Prometheus only
    # scrapes kvscope's targets; set it as soon as unrelated jobs could export same-named series
    # (two vLLM fleets, a staging copy), or alerts will join series across them.
    selector: str = ""
    # Matchers for vLLM's own vllm:* series (request queues, TTFT, vLLM's offload bytes). These
    # come from vLLM's /metrics, which may be a different job than the standalone kvscope
    # exporter. Empty means "same as selector".
    vllm_selector: str = ""
    # Matchers for the `up` series used to decide "the target is being scraped". Empty means
    # "same as selector" restricted to the job/instance labels Prometheus adds.
    up_selector: str = ""

    # Labels that identify one engine (one scheduler with its offload manager). Alerts aggregate
    # and join by exactly these. Series scraped from vLLM's /metrics carry model_name/engine;
    # series from the standalone exporter don't - a missing label is just empty, so one list
    # serves both. Add e.g. "cluster" or "namespace" when several Prometheus targets share an
    # instance name. Worker-rank series (transfer bytes, checksums) add "rank" on top.
    engine_labels: tuple[str, ...] = (
        "job",
        "instance",
        signals.VLLM_LABEL_MODEL,
        signals.VLLM_LABEL_ENGINE,
    )

    # ---- windows -----------------------------------------------------------------------------
    # Window of the recorded rates (and of the alert rates built on them). 5m smooths the bursty
    # per-step counters enough that one idle minute does not flap an alert; must be >= 4x the
    # scrape interval.
    rate_window: str = "5m"
    # Evaluation interval written into the rule groups. Leave at 1m unless your Prometheus
    # evaluates faster and you want alerts to react within seconds.
    rule_interval: str = "1m"

    # ---- pending transfers at idle -----------------------------------------------------------
    # How long transfers may stay pending while no request runs or waits before paging.
    # Healthy stores finish within seconds of their request finishing; a cascade to a slow disk
    # may take a minute under load. 10m is far beyond both: a transfer pending that long on an
    # idle engine is not going to finish (lost completion, stuck rank, leaked job).
    pending_at_idle_for: str = "10m"

    # ---- GPU blocks held at idle -------------------------------------------------------------
    # kvscope_idle_gpu_blocks_in_use: the GPU KV blocks vLLM's block pool still held at the end
    # of the latest step that left nothing in flight (no request, no load or store job). A
    # healthy engine reads 0 there exactly, whatever its load was: vLLM frees a request's
    # blocks when it finishes. Above 0 while no request runs or waits, blocks leaked; they stay
    # until a restart. The reading is exact, so `for` only rides out a request arriving just
    # as Prometheus evaluates.
    gpu_blocks_held_at_idle_for: str = "5m"

    # ---- capacity ceiling --------------------------------------------------------------------
    # How long lookup rounds must keep hitting the primary tier's row ceiling (pending keys >=
    # rows) while the disk tier holds data. A short burst happens when a large batch arrives;
    # 10m of it means promotions can never all land and requests are deferred or recomputed
    # forever. Raise it for workloads with long prompt bursts.
    capacity_ceiling_for: str = "10m"

    # ---- restore coverage ----------------------------------------------------------------------
    # Tokens offered / tokens the tiers held (kvscope_hit_tokens_total / kvscope_restore_held_tokens
    # _total) over the rate window. A healthy tier restores what it holds: 1.0. Below this for
    # `restore_coverage_for` while the disk tier holds data, restores are being cut (row ceiling,
    # group veto) and the prefix is recomputed. Prefixes the tiers do not hold never count against
    # it (not_stored). 0.5: half of what is held recomputed is never a blip.
    restore_coverage_min: float = 0.5
    restore_coverage_for: str = "15m"

    # ---- tier writes failing ------------------------------------------------------------------
    # Cascades (CPU -> disk tier writes) that failed within the window, continuously for `for`:
    # the disk tier is full, its directory or mount is gone, or it is not writable. Restores from
    # it stop silently (what never reached disk cannot come back). One failed write is a blip;
    # failures for 5 minutes are a broken tier.
    tier_write_failures_window: str = "10m"
    tier_write_failures_for: str = "5m"

    # ---- stores refused (prompts stored in part) -----------------------------------------------
    # Lookup rounds whose offer stopped at a chunk whose store job the primary tier had refused
    # for lack of a free row (kvscope_restore_short_tokens_total{reason="store_refused"}): a
    # prompt was stored only in part, and each re-ask recomputes the rest. Refusals alone are
    # not enough (a flood of one-off prompts refused and never asked again costs nothing); a
    # re-ask cut at one is. Tokens of that kind within the window, continuously for `for`.
    stores_refused_window: str = "10m"
    stores_refused_for: str = "5m"

    # ---- tier data lost ----------------------------------------------------------------------
    # Keys a secondary tier had confirmed written whose files the tier probe found gone (the
    # directory removed, the volume unmounted or wiped). Each one is a fact, not a blip, so
    # there is no "for": it fires at once and stays while a loss is within the window.
    tier_data_lost_window: str = "30m"

    # ---- tier flooded by one KV group ----------------------------------------------------------
    # A hybrid model's sub-block (or drafter) group stores many times the keys of its other KV
    # groups per token and legitimately holds most of the CPU primary tier (8x: 80 % beside two
    # large-block groups). It is flooded when, over `tier_flood_window`, a full-attention group
    # stored fewer than `tier_flood_victim_fraction` of the prompt tokens the group that stored
    # most did (kvscope_store_tokens_total: groups storing in proportion to their block sizes
    # store about the same tokens), while one group holds at least `tier_flood_share` of the
    # tier's keys (kvscope_primary_keys): the tiers fill with keys no restore can use (vLLM's
    # cross-group AND needs every group). A window of only short prompts looks the same for a
    # while: hence the long window and `for`.
    tier_flood_window: str = "30m"
    tier_flood_for: str = "15m"
    tier_flood_share: float = 0.75
    tier_flood_victim_fraction: float = 0.25

    # ---- kvscope's own errors ---------------------------------------------------------------
    # A guarded kvscope hook raised (kvscope_telemetry_errors_total{where}): serving went on, the
    # event it was recording is missing from every kvscope counter, so the other alerts and
    # kv-diagnose may miss an incident (kv-diagnose says inconclusive). A fact, no "for".
    telemetry_errors_window: str = "30m"

    # ---- a vLLM bug kvscope contained ----------------------------------------------------------
    # The installed vLLM would have raised out of its scheduler step (a known bug of that
    # release: kvscope_vllm_faults_contained_total{fault}) and kvscope answered the call quietly
    # instead, so the engine lives; the release still needs upgrading. A fact, no "for"; the
    # window is long so a page at night is still there in the morning.
    vllm_faults_window: str = "6h"

    # ---- transfer stuck while busy -----------------------------------------------------------
    # A transfer (store, promotion, cascade, load) unfinished for longer than the top bucket of
    # kvscope_transfer_seconds (a cold disk read under load takes seconds, not this) while the
    # engine has requests (kvscope's or vLLM's request gauges, rules.engine_requests): the
    # request waiting for it waits with it (a stalled read pool, a lost completion). On an idle
    # engine (the exact complement) KVOffloadTransfersPendingAtIdle is the alert.
    transfer_stuck_after_s: float = signals.TRANSFER_SECONDS_BUCKETS[-1]
    transfer_stuck_for: str = "2m"

    # ---- row checksum mismatch ---------------------------------------------------------------
    # A mismatch means a rank read bytes for a promoted row that differ from what was written:
    # the load was refused (vLLM recomputed), but the tier is corrupt or mis-addressed. One is
    # enough to page; there is no "for" on purpose.
    checksum_mismatch_for: str = "0m"
    # How far back a mismatch still counts as "new". Use at least 2x the rule interval so a
    # single mismatch is not missed between evaluations.
    checksum_mismatch_window: str = "10m"

    # ---- stores without restores -------------------------------------------------------------
    # Window over which stores must happen while no external hit is served. Offloading costs
    # GPU->CPU bandwidth on every request; if nothing is ever read back, the tier is dead weight
    # (wrong hash seed across restarts, block size mismatch, a prompt prefix that changes every
    # request). Workloads with no prefix reuse at all legitimately look like this: raise the
    # window, or silence the alert for them.
    stores_without_restores_window: str = "30m"
    stores_without_restores_for: str = "30m"

    # ---- stale stats -------------------------------------------------------------------------
    # Seconds the scheduler's last step may lie in the past while requests are in flight. An
    # engine with work steps many times a second; an idle engine does not step at all (so idle
    # engines never trigger this). 120s tolerates a long prefill or a GC pause.
    stale_stats_seconds: int = 120
    stale_stats_for: str = "5m"

    # ---- severities --------------------------------------------------------------------------
    # Mixin convention: critical pages someone now, warning goes to a ticket queue, info is for
    # dashboards and inhibition only. Map them to your Alertmanager routes here.
    severity_critical: str = "critical"
    severity_warning: str = "warning"
    severity_info: str = "info"

    # ---- runbooks ----------------------------------------------------------------------------
    # runbook_url = runbook_base_url + runbook_path_pattern. The runbooks live in this repository
    # under docs/runbooks/; point the base at where your team can open them, e.g.
    # "https://github.com/<org>/kvscope/blob/v0.1.0/" (pin a tag so a page links to the runbook
    # of the version that is deployed). Empty keeps a repository-relative path.
    runbook_base_url: str = ""
    runbook_path_pattern: str = "docs/runbooks/{alert}.md"

    # ---- dashboards --------------------------------------------------------------------------
    # Stable UIDs: links and bookmarks survive re-provisioning. Change them only when two copies
    # of the dashboards must live in one Grafana.
    overview_uid: str = "kvscope-kv-offload-overview"
    incident_uid: str = "kvscope-kv-offload-incident"
    dashboard_tags: tuple[str, ...] = ("kvscope", "vllm", "kv-offload")
    # Grafana dashboard refresh and default time range.
    refresh: str = "30s"
    time_from: str = "now-1h"

    def __post_init__(self) -> None:
        for name in (
            "rate_window", "rule_interval", "pending_at_idle_for", "capacity_ceiling_for",
            "gpu_blocks_held_at_idle_for",
            "restore_coverage_for",
            "checksum_mismatch_for", "checksum_mismatch_window", "stores_without_restores_window",
            "stores_without_restores_for", "stale_stats_for", "tier_write_failures_window",
            "tier_write_failures_for", "stores_refused_window", "stores_refused_for",
            "tier_data_lost_window", "telemetry_errors_window", "vllm_faults_window",
            "transfer_stuck_for",
            "tier_flood_window", "tier_flood_for",
        ):
            value = getattr(self, name)
            if not _DURATION.match(value):
                raise ValueError(f"Config.{name}={value!r} is not a Prometheus duration")
        for name in ("selector", "vllm_selector", "up_selector"):
            value = getattr(self, name)
            if "{" in value or "}" in value:
                raise ValueError(f"Config.{name} holds matchers only, without braces: {value!r}")
        if not self.transfer_stuck_after_s > 0:
            raise ValueError("Config.transfer_stuck_after_s must be > 0")
        if not 0 < self.restore_coverage_min <= 1:
            raise ValueError("Config.restore_coverage_min must be in (0, 1]")
        if not 0 < self.tier_flood_share <= 1 or not 0 < self.tier_flood_victim_fraction < 1:
            raise ValueError("Config.tier_flood_share must be in (0, 1] and "
                             "Config.tier_flood_victim_fraction in (0, 1)")
        if not self.engine_labels:
            raise ValueError("Config.engine_labels must name at least one label")
        if "{alert}" not in self.runbook_path_pattern:
            raise ValueError("Config.runbook_path_pattern must contain {alert}")

    # ---- derived ----------------------------------------------------------------------------
    @property
    def by_engine(self) -> str:
        """``job, instance, model_name, engine`` - for ``by (...)`` / ``on (...)``."""
        return ", ".join(self.engine_labels)

    @property
    def engine_level(self) -> str:
        """The ``level`` part of recording-rule names aggregated by ``engine_labels``."""
        return "_".join(self.engine_labels)

    def runbook_url(self, alert: str) -> str:
        return self.runbook_base_url + self.runbook_path_pattern.format(alert=alert)

    def sel(self, *matchers: str, vllm: bool = False) -> str:
        """``{<selector>,<matchers>}`` for a rule expression."""
        base = (self.vllm_selector or self.selector) if vllm else self.selector
        inner = ",".join(m for m in (base, *matchers) if m)
        return "{" + inner + "}" if inner else ""

    def up_sel(self) -> str:
        inner = self.up_selector or self.selector
        return "{" + inner + "}" if inner else ""


DEFAULT = Config()
