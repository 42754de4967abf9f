"""Prometheus recording and alerting rules for KV offloading, built from the signal contract.

``rules(cfg)`` returns the rule-file document (``{"groups": [...]}``); ``generate()`` writes
it as ``kvscope-rules.yaml``. Recording rules follow ``level:metric:operations`` where the
level is ``Config.engine_labels`` joined by ``_`` (plus any extra ``by`` label).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope import durations
from kvscope.exporters import signals as s

from .config import DEFAULT, Config

ALERT_PENDING_AT_IDLE = "KVOffloadTransfersPendingAtIdle"
ALERT_CAPACITY_CEILING = "KVOffloadCapacityCeiling"
ALERT_CHECKSUM_MISMATCH = "KVOffloadRowChecksumMismatch"
ALERT_STORES_WITHOUT_RESTORES = "KVOffloadStoresWithoutRestores"
ALERT_STATS_STALE = "KVOffloadStatsStale"
ALERT_RESTORE_COVERAGE = "KVOffloadRestoreCoverageCollapsed"
ALERT_TIER_WRITES_FAILING = "KVOffloadTierWritesFailing"
ALERT_STORES_REFUSED = "KVOffloadStoresRefused"
ALERT_TIER_DATA_LOST = "KVOffloadTierDataLost"
ALERT_TRANSFER_STUCK = "KVOffloadTransferStuck"
ALERT_TELEMETRY_ERRORS = "KVOffloadTelemetryErrors"
ALERT_GPU_BLOCKS_HELD_AT_IDLE = "KVOffloadGpuBlocksHeldAtIdle"
ALERT_TIER_FLOODED = "KVOffloadTierFloodedByGroup"
ALERT_VLLM_FAULT_CONTAINED = "KVOffloadVllmFaultContained"

ALERT_NAMES: tuple[str, ...] = (
    ALERT_PENDING_AT_IDLE,
    ALERT_CAPACITY_CEILING,
    ALERT_CHECKSUM_MISMATCH,
    ALERT_STORES_WITHOUT_RESTORES,
    ALERT_STATS_STALE,
    ALERT_RESTORE_COVERAGE,
    ALERT_TIER_WRITES_FAILING,
    ALERT_STORES_REFUSED,
    ALERT_TIER_DATA_LOST,
    ALERT_TRANSFER_STUCK,
    ALERT_GPU_BLOCKS_HELD_AT_IDLE,
    ALERT_TELEMETRY_ERRORS,
    ALERT_VLLM_FAULT_CONTAINED,
    ALERT_TIER_FLOODED,
)

RECORDING_GROUP = "kvscope.rules"
ALERT_GROUP = "kvscope.alerts"

# Rendered into descriptions: "vllm/10.0.0.1:8000 (model llama)" - the model part only where
# the series carries vLLM's labels (the standalone exporter's series don't).
_WHO = (
    "{{ $labels.job }}/{{ $labels.instance }}"
    f"{{{{ with $labels.{s.VLLM_LABEL_MODEL} }}}} (model {{{{ . }}}}){{{{ end }}}}"
    f"{{{{ with $labels.{s.VLLM_LABEL_ENGINE} }}}} engine {{{{ . }}}}{{{{ end }}}}"
)


@dataclass(frozen=True)
class Recorded:
    """Names of the recording rules, so alerts and dashboards refer to them, not re-spell."""

    cfg: Config

    def _n(self, extra: str, metric: str, ops: str) -> str:
        level = self.cfg.engine_level + (f"_{extra}" if extra else "")
        return f"{level}:{metric}:{ops}"

    def _w(self) -> str:
        return self.cfg.rate_window

    @property
    def lookup_rounds_rate(self) -> str:
        return self._n(s.L_VERDICT, s.LOOKUP_ROUNDS.base, f"rate{self._w()}")

    @property
    def lookups_rate(self) -> str:
        return self._n(f"{s.L_KV_GROUP}_{s.L_RESULT}", s.LOOKUPS.base, f"rate{self._w()}")

    @property
    def lookup_hit_ratio(self) -> str:
        return self._n("", f"{s.LOOKUPS.base}_{s.LookupResult.HIT.value}", f"ratio_rate{self._w()}")

    @property
    def hit_tokens_rate(self) -> str:
        return self._n("", s.HIT_TOKENS.base, f"rate{self._w()}")

    @property
    def ceiling_rate(self) -> str:
        return self._n("", s.ROUNDS_AT_ROW_CEILING.base, f"rate{self._w()}")

    @property
    def restore_held_tokens_rate(self) -> str:
        return self._n("", s.RESTORE_HELD_TOKENS.base, f"rate{self._w()}")

    @property
    def restore_coverage_ratio(self) -> str:
        return self._n("", s.PREFIX + "restore_coverage", f"ratio_rate{self._w()}")

    @property
    def restore_short_tokens_rate(self) -> str:
        return self._n(s.L_REASON, s.RESTORE_SHORT_TOKENS.base, f"rate{self._w()}")

    @property
    def restore_stopped_rounds_rate(self) -> str:
        return self._n(f"{s.L_KV_GROUP}_{s.L_REASON}", s.RESTORE_STOPPED_ROUNDS.base,
                       f"rate{self._w()}")

    @property
    def transfer_bytes_rate(self) -> str:
        return self._n(f"{s.L_RANK}_{s.L_DIRECTION}", s.TRANSFER_BYTES.base, f"rate{self._w()}")

    @property
    def store_jobs_rate(self) -> str:
        return self._n(s.L_RESULT, s.STORE_JOBS.base, f"rate{self._w()}")

    @property
    def store_tokens_rate(self) -> str:
        return self._n(s.L_KV_GROUP, s.STORE_TOKENS.base, f"rate{self._w()}")

    @property
    def promotions_rate(self) -> str:
        return self._n(s.L_RESULT, s.PROMOTIONS.base, f"rate{self._w()}")

    @property
    def pending_transfers(self) -> str:
        return self._n(s.L_KIND, s.PENDING_TRANSFERS.name, "sum")

    @property
    def last_step_age(self) -> str:
        # time() - max(timestamp): the age in seconds of the newest scheduler step.
        return self._n("", s.LAST_STEP_TIMESTAMP.name, "age")


def recording_rules(cfg: Config = DEFAULT) -> list[dict]:
    r = Recorded(cfg)
    by, w, sel = cfg.by_engine, cfg.rate_window, cfg.sel
    hit = s.LookupResult.HIT.value
    return [
        {"record": r.lookup_rounds_rate,
         "expr": f"sum by ({by}, {s.L_VERDICT}) (rate({s.LOOKUP_ROUNDS.name}{sel()}[{w}]))"},
        {"record": r.lookups_rate,
         "expr": f"sum by ({by}, {s.L_KV_GROUP}, {s.L_RESULT}) (rate({s.LOOKUPS.name}{sel()}[{w}]))"},
        {"record": r.lookup_hit_ratio,
         "expr": (f"sum by ({by}) (rate({s.LOOKUPS.name}{sel(eq(s.L_RESULT, hit))}[{w}]))\n"
                  f"/\nsum by ({by}) (rate({s.LOOKUPS.name}{sel()}[{w}]))")},
        {"record": r.hit_tokens_rate,
         "expr": f"sum by ({by}) (rate({s.HIT_TOKENS.name}{sel()}[{w}]))"},
        {"record": r.ceiling_rate,
         "expr": f"sum by ({by}) (rate({s.ROUNDS_AT_ROW_CEILING.name}{sel()}[{w}]))"},
        {"record": r.restore_held_tokens_rate,
         "expr": f"sum by ({by}) (rate({s.RESTORE_HELD_TOKENS.name}{sel()}[{w}]))"},
        # offered / held; NaN while nothing held was looked up (never below a threshold)
        {"record": r.restore_coverage_ratio,
         "expr": (f"sum by ({by}) (rate({s.HIT_TOKENS.name}{sel()}[{w}]))\n"
                  f"/\nsum by ({by}) (rate({s.RESTORE_HELD_TOKENS.name}{sel()}[{w}]))")},
        {"record": r.restore_short_tokens_rate,
         "expr": (f"sum by ({by}, {s.L_REASON}) "
                  f"(rate({s.RESTORE_SHORT_TOKENS.name}{sel()}[{w}]))")},
        {"record": r.restore_stopped_rounds_rate,
         "expr": (f"sum by ({by}, {s.L_KV_GROUP}, {s.L_REASON}) "
                  f"(rate({s.RESTORE_STOPPED_ROUNDS.name}{sel()}[{w}]))")},
        {"record": r.transfer_bytes_rate,
         "expr": (f"sum by ({by}, {s.L_RANK}, {s.L_DIRECTION}) "
                  f"(rate({s.TRANSFER_BYTES.name}{sel()}[{w}]))")},
        {"record": r.store_jobs_rate,
         "expr": f"sum by ({by}, {s.L_RESULT}) (rate({s.STORE_JOBS.name}{sel()}[{w}]))"},
        {"record": r.store_tokens_rate,
         "expr": (f"sum by ({by}, {s.L_KV_GROUP}) "
                  f"(rate({s.STORE_TOKENS.name}{sel()}[{w}]))")},
        {"record": r.promotions_rate,
         "expr": f"sum by ({by}, {s.L_RESULT}) (rate({s.PROMOTIONS.name}{sel()}[{w}]))"},
        {"record": r.pending_transfers,
         "expr": f"sum by ({by}, {s.L_KIND}) ({s.PENDING_TRANSFERS.name}{sel()})"},
        {"record": r.last_step_age,
         "expr": f"time() - max by ({by}) ({s.LAST_STEP_TIMESTAMP.name}{sel()})"},
    ]


def duration_seconds(duration: str) -> int | float:
    """Seconds of a Prometheus duration (``5m`` -> 300), an int when whole (rule text)."""
    total = durations.seconds(duration)
    return int(total) if total == int(total) else total


def eq(label: str, value: str) -> str:
    """``label="value"`` matcher."""
    return f'{label}="{value}"'


def engine_requests(cfg: Config = DEFAULT) -> str:
    """Unfinished requests of each engine (by ``engine_labels``), counted on every view of it:
    kvscope's request gauges plus, where vLLM's series share the target, vLLM's running and
    waiting gauges (vLLM holds a request before kvscope sees it, e.g. one still queued). A
    request may count more than once: only "> 0" (busy) or "== 0" (idle) is read. Defined once
    for both alerts, so their clauses are exact complements: KVOffloadTransferStuck's busy is
    "> 0", KVOffloadTransfersPendingAtIdle's idle "== 0". Absent where kvscope's request
    gauges are (a target no longer scraped): neither fires, nothing read says idle."""
    by, sel, vsel = cfg.by_engine, cfg.sel(), cfg.sel(vllm=True)
    kvscope = (f"sum by ({by}) ({s.REQUESTS_IN_FLIGHT.name}{sel})\n"
               f"+ sum by ({by}) ({s.REQUESTS.name}{sel})")
    vllm = (f"sum by ({by}) ({s.VLLM_REQUESTS_RUNNING}{vsel})\n"
            f"+ sum by ({by}) ({s.VLLM_REQUESTS_WAITING}{vsel})")
    # vLLM's gauges where they share the target, kvscope's alone where they don't
    return f"{kvscope}\n+ on ({by}) (\n{_indent(vllm)}\n)\nor\n{kvscope}"


def _indent(expr: str) -> str:
    return "\n".join("  " + line for line in expr.splitlines())


def _alert(cfg: Config, name: str, expr: str, for_: str, severity: str, summary: str,
           description: str) -> dict:
    rule: dict = {"alert": name, "expr": expr}
    if for_ not in ("0m", "0s"):
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": cfg.runbook_url(name),
    }
    return rule


def _born_within(series: str, by: str, window: str) -> str:
    """A ``series`` first scraped above 0 within ``window``, summed by ``by``. increase() and
    rate() need two samples, so they miss the first: a child the exporter creates lazily, one
    an exporter older than the preset leaves out, a target scraped after the fact or after a
    restart (the events happened before Prometheus' first scrape of it)."""
    return f"sum by ({by}) ({series} > 0 unless {series} offset {window})"


def _rose_within(series: str, by: str, window: str) -> str:
    """The counter ``series`` rose within ``window``, summed by ``by``: its increase, or a
    series born within the window with a value > 0 (:func:`_born_within`)."""
    return (f"sum by ({by}) (increase({series}[{window}])) > 0\n"
            f"or {_born_within(series, by, window)}")


def _disk_tier_holds_data(cfg: Config) -> str:
    """Something was ever cascaded to the disk tier."""
    by, completed = cfg.by_engine, s.CascadeResult.COMPLETED.value
    return f"sum by ({by}) ({s.CASCADES.name}{cfg.sel(eq(s.L_RESULT, completed))}) > 0"


def _pending_at_idle(cfg: Config) -> dict:
    r, by = Recorded(cfg), cfg.by_engine
    expr = (
        # something is pending on an engine without requests (TransferStuck: with requests)
        f"{r.pending_transfers} > 0\n"
        f"and on ({by}) (\n{_indent(engine_requests(cfg))}\n) == 0"
    )
    return _alert(
        cfg, ALERT_PENDING_AT_IDLE, expr, cfg.pending_at_idle_for,
        cfg.severity_warning,
        "KV offload transfers are pending on an idle engine.",
        f"{_WHO} has had {{{{ $value | humanize }}}} pending {{{{ $labels.{s.L_KIND} }}}} "
        f"transfer(s) for more than {cfg.pending_at_idle_for} while no request is running "
        f"or waiting.",
    )


def _capacity_ceiling(cfg: Config) -> dict:
    r, by = Recorded(cfg), cfg.by_engine
    ceiling = f"{s.ROUNDS_AT_ROW_CEILING.name}{cfg.sel()}"
    expr = (
        f"(\n"
        f"  {r.ceiling_rate} > 0\n"
        # a ceiling counter first scraped above 0 within the rate window, counted as if it
        # had risen from 0 over the window
        f"  or {_born_within(ceiling, by, cfg.rate_window)}\n"
        f"  / {duration_seconds(cfg.rate_window)}\n"
        f")\n"
        f"and on ({by}) {_disk_tier_holds_data(cfg)}"
    )
    return _alert(
        cfg, ALERT_CAPACITY_CEILING, expr, cfg.capacity_ceiling_for,
        cfg.severity_warning,
        "KV offload lookups keep hitting the primary tier's row ceiling.",
        f"{_WHO}: {{{{ printf \"%.2f\" $value }}}} lookup rounds/s have needed at least as many "
        f"primary-tier rows as exist for more than {cfg.capacity_ceiling_for}, while the "
        f"disk tier holds data; those requests are deferred or recompute.",
    )


def _checksum_mismatch(cfg: Config) -> dict:
    cw = cfg.checksum_mismatch_window
    mm = f"{s.ROW_CHECKSUMS.name}{cfg.sel(eq(s.L_OUTCOME, s.ChecksumOutcome.MISMATCH.value))}"
    return _alert(
        cfg, ALERT_CHECKSUM_MISMATCH, _rose_within(mm, f"{cfg.by_engine}, {s.L_RANK}", cw),
        cfg.checksum_mismatch_for, cfg.severity_critical,
        "A promoted KV row failed its checksum.",
        f"Rank {{{{ $labels.{s.L_RANK} }}}} of {_WHO} saw {{{{ printf \"%.0f\" $value }}}} row "
        f"checksum mismatch(es) in the last {cw}: an offload tier holds wrong data. Loads "
        f"refused (checksum_policy refuse) were recomputed; any not refused were served.",
    )


def _stores_without_restores(cfg: Config) -> dict:
    by, sel, sw = cfg.by_engine, cfg.sel, cfg.stores_without_restores_window
    prepared, verdict_hit = s.StoreJobResult.PREPARED.value, s.Verdict.HIT.value
    expr = (
        f"sum by ({by}) (increase({s.STORE_JOBS.name}{sel(eq(s.L_RESULT, prepared))}[{sw}])) > 0\n"
        f"unless on ({by}) sum by ({by}) (increase({s.HIT_TOKENS.name}{sel()}[{sw}])) > 0\n"
        f"unless on ({by}) sum by ({by}) "
        f"(increase({s.LOOKUP_ROUNDS.name}{sel(eq(s.L_VERDICT, verdict_hit))}[{sw}])) > 0"
    )
    return _alert(
        cfg, ALERT_STORES_WITHOUT_RESTORES, expr,
        cfg.stores_without_restores_for, cfg.severity_warning,
        "KV blocks are offloaded but never restored.",
        f"{_WHO} prepared {{{{ $value | humanize }}}} store jobs in the last {sw} and served "
        f"no external prefix-cache hit.",
    )


def _stats_stale(cfg: Config) -> dict:
    by, sel = cfg.by_engine, cfg.sel
    expr = (
        # the age itself, not the recorded last_step_age: that one is as old as the
        # recording group's last evaluation, which need not precede this group's
        f"time() - max by ({by}) ({s.LAST_STEP_TIMESTAMP.name}{sel()}) > {cfg.stale_stats_seconds}\n"
        # only while there is work: an idle engine does not step at all
        f"and on ({by}) sum by ({by}) ({s.REQUESTS_IN_FLIGHT.name}{sel()}) > 0\n"
        # and only while Prometheus still scrapes the target (else TargetDown is the alert)
        f"and on (job, instance) max by (job, instance) (up{cfg.up_sel()}) == 1"
    )
    return _alert(
        cfg, ALERT_STATS_STALE, expr, cfg.stale_stats_for, cfg.severity_warning,
        "kvscope statistics stopped advancing while requests are in flight.",
        f"The last scheduler step of {_WHO} is {{{{ $value | humanizeDuration }}}} old "
        f"although requests are in flight and the target is up; its kvscope gauges are stale.",
    )


def _restore_coverage(cfg: Config) -> dict:
    expr = (
        # restores offered less than the tiers held, over the rate window ...
        f"{Recorded(cfg).restore_coverage_ratio} < {cfg.restore_coverage_min:g}\n"
        # ... while the disk tier holds data
        f"and on ({cfg.by_engine}) {_disk_tier_holds_data(cfg)}"
    )
    return _alert(
        cfg, ALERT_RESTORE_COVERAGE, expr, cfg.restore_coverage_for,
        cfg.severity_warning,
        "KV offload restores recompute much of what the tiers hold.",
        f"{_WHO} offered {{{{ $value | humanizePercentage }}}} of the prefix tokens its offload "
        f"tiers held for more than {cfg.restore_coverage_for} (threshold "
        f"{cfg.restore_coverage_min:.0%}) while the disk tier holds data: restores are cut "
        f"at the primary tier's row ceiling or vetoed, the rest is recomputed.",
    )


def _tier_writes_failing(cfg: Config) -> dict:
    fw = cfg.tier_write_failures_window
    failed = f"{s.CASCADES.name}{cfg.sel(eq(s.L_RESULT, s.CascadeResult.FAILED.value))}"
    return _alert(
        cfg, ALERT_TIER_WRITES_FAILING, _rose_within(failed, cfg.by_engine, fw),
        cfg.tier_write_failures_for, cfg.severity_warning,
        "Writes to the KV offload disk tier are failing.",
        f"{_WHO} failed {{{{ printf \"%.0f\" $value }}}} cascade write(s) to its secondary "
        f"tier in the last {fw}, for more than {cfg.tier_write_failures_for}: the tier is "
        f"full, gone or not writable; what does not reach it cannot be restored.",
    )


def _stores_refused(cfg: Config) -> dict:
    rw = cfg.stores_refused_window
    # tokens re-asks recomputed because their prompts' store jobs had been refused
    refused = (f"{s.RESTORE_SHORT_TOKENS.name}"
               f"{cfg.sel(eq(s.L_REASON, s.ShortReason.STORE_REFUSED.value))}")
    return _alert(
        cfg, ALERT_STORES_REFUSED, _rose_within(refused, cfg.by_engine, rw),
        cfg.stores_refused_for, cfg.severity_warning,
        "KV offload stores are refused: prompts are stored only in part.",
        f"{_WHO} recomputed {{{{ printf \"%.0f\" $value }}}} prompt tokens in the last {rw} "
        f"(for more than {cfg.stores_refused_for}) because their store jobs had been refused "
        f"for lack of a free primary-tier row: those prompts were stored only in part and "
        f"every re-ask recomputes the rest.",
    )


def _tier_data_lost(cfg: Config) -> dict:
    lw = cfg.tier_data_lost_window
    lost = f"{s.TIER_LOST_KEYS.name}{cfg.sel()}"
    return _alert(
        cfg, ALERT_TIER_DATA_LOST, _rose_within(lost, f"{cfg.by_engine}, {s.L_TIER}", lw),
        "0m", cfg.severity_warning,
        "A KV offload tier lost data it had confirmed written.",
        f"The {{{{ $labels.{s.L_TIER} }}}} tier of {_WHO} lost {{{{ printf \"%.0f\" $value }}}} "
        f"key(s) it had confirmed written, in the last {lw}: their files are gone (directory "
        f"removed, volume unmounted or wiped). Those prefixes are recomputed; nothing fails.",
    )


def _transfer_stuck(cfg: Config) -> dict:
    by = cfg.by_engine
    oldest = f"{s.OLDEST_PENDING_TRANSFER.name}{cfg.sel()}"
    expr = (
        # a transfer of some kind unfinished for longer than a slow one takes ...
        f"max by ({by}, {s.L_KIND}) ({oldest}) > {cfg.transfer_stuck_after_s:g}\n"
        # ... while the engine has requests (idle: KVOffloadTransfersPendingAtIdle)
        f"and on ({by}) (\n{_indent(engine_requests(cfg))}\n) > 0"
    )
    return _alert(
        cfg, ALERT_TRANSFER_STUCK, expr, cfg.transfer_stuck_for,
        cfg.severity_warning,
        "A KV offload transfer is stuck while requests wait.",
        f"{_WHO} has had a {{{{ $labels.{s.L_KIND} }}}} transfer unfinished for "
        f"{{{{ $value | humanizeDuration }}}} (more than {cfg.transfer_stuck_after_s:g}s, for "
        f"more than {cfg.transfer_stuck_for}) while it has requests: a request waiting for "
        f"it waits too (a stalled tier read or write pool, a completion never reported).",
    )


def _gpu_blocks_held_at_idle(cfg: Config) -> dict:
    by = cfg.by_engine
    expr = (
        # GPU blocks vLLM's pool still held when the latest step left nothing in flight ...
        f"max by ({by}) ({s.IDLE_GPU_BLOCKS.name}{cfg.sel()}) > 0\n"
        # ... and the engine still has no request (the gauge keeps its value while busy)
        f"and on ({by}) (\n{_indent(engine_requests(cfg))}\n) == 0"
    )
    return _alert(
        cfg, ALERT_GPU_BLOCKS_HELD_AT_IDLE, expr, cfg.gpu_blocks_held_at_idle_for,
        cfg.severity_warning,
        "An idle engine still holds GPU KV blocks: they leaked.",
        f"{_WHO} still held {{{{ $value | humanize }}}} GPU KV block(s) when its latest step "
        f"left no request and no load or store in flight, and no request has run or waited "
        f"for more than {cfg.gpu_blocks_held_at_idle_for}: no request holds them and nothing "
        f"frees them before a restart; every later request has that much less KV cache.",
    )


def _telemetry_errors(cfg: Config) -> dict:
    ew = cfg.telemetry_errors_window
    errs = f"{s.TELEMETRY_ERRORS.name}{cfg.sel()}"
    return _alert(
        cfg, ALERT_TELEMETRY_ERRORS, _rose_within(errs, f"{cfg.by_engine}, {s.L_WHERE}", ew),
        "0m", cfg.severity_warning,
        "kvscope's instrumentation is failing: its counters miss events.",
        f"kvscope on {_WHO} caught {{{{ printf \"%.0f\" $value }}}} error(s) in its own "
        f"instrumentation ({s.L_WHERE}={{{{ $labels.{s.L_WHERE} }}}}) in the last {ew}. Serving "
        f"goes on, but the events those calls were recording are missing from kvscope's "
        f"counters: the other KV offload alerts may miss an incident, and kv-diagnose reads "
        f"inconclusive.",
    )


def _vllm_fault_contained(cfg: Config) -> dict:
    vw = cfg.vllm_faults_window
    faults = f"{s.VLLM_FAULTS_CONTAINED.name}{cfg.sel()}"
    return _alert(
        cfg, ALERT_VLLM_FAULT_CONTAINED, _rose_within(faults, f"{cfg.by_engine}, {s.L_FAULT}", vw),
        "0m", cfg.severity_warning,
        "A known vLLM bug would have stopped this engine; kvscope contained it. Upgrade vLLM.",
        f"{_WHO}: the installed vLLM would have raised out of its scheduler step "
        f"{{{{ printf \"%.0f\" $value }}}} time(s) in the last {vw} (known vLLM bug "
        f"{s.L_FAULT}={{{{ $labels.{s.L_FAULT} }}}}), which stops the engine; kvscope answered "
        f"those calls as vLLM's quiet path and the engine went on. Nothing is wrong with "
        f"serving now; the vLLM release needs upgrading (the runbook and kv-diagnose name "
        f"the release that fixed it).",
    )


def _tier_flooded_by_group(cfg: Config) -> dict:
    return _alert(
        cfg, ALERT_TIER_FLOODED, _tier_flooded(cfg), cfg.tier_flood_for, cfg.severity_warning,
        "One KV group's keys flood the KV offload tiers; another group's never reach them.",
        f"{_WHO}: a full-attention KV group stored {{{{ printf \"%.0f\" $value }}}} prompt "
        f"tokens in the last {cfg.tier_flood_window}, under "
        f"{cfg.tier_flood_victim_fraction:.0%} of the KV group that stored most, while one "
        f"group holds at least {cfg.tier_flood_share:.0%} of the primary tier's keys (for "
        f"more than {cfg.tier_flood_for}): the tiers fill with keys no restore can use, since "
        f"a restore needs every group's chunks.",
    )


# Each alert's rule, in the rule file's order.
_ALERTS = (
    _pending_at_idle, _capacity_ceiling, _checksum_mismatch, _stores_without_restores,
    _stats_stale, _restore_coverage, _tier_writes_failing, _stores_refused, _tier_data_lost,
    _transfer_stuck, _gpu_blocks_held_at_idle, _telemetry_errors, _vllm_fault_contained,
    _tier_flooded_by_group,
)


def alert_rules(cfg: Config = DEFAULT) -> list[dict]:
    return [alert(cfg) for alert in _ALERTS]


def _tier_flooded(cfg: Config) -> str:
    """A full-attention KV group stored under a fraction of the prompt tokens of the group that
    stored most, over the window, while one group holds most of the primary tier's keys."""
    by, sel, kv = cfg.by_engine, cfg.sel, s.L_KV_GROUP
    fw = cfg.tier_flood_window
    tokens = f"{s.STORE_TOKENS.name}{sel()}"
    # per group: tokens stored within the window; a series born within it with its whole value
    # (increase() misses the first sample of a target scraped after the fact); else 0, so a
    # group that stored nothing is there to compare
    per_group = (f"sum by ({by}, {kv}) (\n"
                 f"  increase({tokens}[{fw}]) > 0\n"
                 f"  or {tokens} * 1 unless {tokens} offset {fw}\n"
                 f"  or {tokens} * 0\n"
                 f")")
    full = f"{s.KV_GROUP_INFO.name}{sel(eq(s.L_KIND, 'full_attention'))}"
    keys = f"{s.PRIMARY_KEYS.name}{sel()}"
    return (
        f"min by ({by}) (\n{_indent(per_group)}\n  and on ({by}, {kv}) {full}\n)\n"
        f"< {cfg.tier_flood_victim_fraction:g} * max by ({by}) (\n{_indent(per_group)}\n)\n"
        # ... while one group holds most of the primary tier's keys
        f"and on ({by})\n"
        f"max by ({by}) (sum by ({by}, {kv}) ({keys}))\n"
        f">= {cfg.tier_flood_share:g} * sum by ({by}) ({keys})"
    )


def rules(cfg: Config = DEFAULT) -> dict:
    return {
        "groups": [
            {"name": RECORDING_GROUP, "interval": cfg.rule_interval,
             "rules": recording_rules(cfg)},
            {"name": ALERT_GROUP, "interval": cfg.rule_interval, "rules": alert_rules(cfg)},
        ]
    }
