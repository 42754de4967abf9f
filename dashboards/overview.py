"""KV offload overview: is offloading paying off, and how busy are the tiers and the links.

Rates the recording rules define are read from them (``rules.Recorded``: one definition per
expression, over ``Config.rate_window``); the rest are spelled here over ``$__rate_interval``.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from kvscope.exporters import signals as s

from . import common as c
from . import native
from .config import DEFAULT, Config
from .rules import Recorded

R = c.RATE_INTERVAL
TITLE = "KV offload / Overview"


def restore_coverage(cfg: Config):
    r = Recorded(cfg)
    held = f"sum({r.restore_held_tokens_rate}{c.rsel()})"
    short_of_held = s.L_REASON + '!~"' + "|".join(s.NOT_HELD) + '"'
    return c.timeseries(
        "Restore coverage (offered / held)",
        "Of the prompt-prefix tokens the offload tiers held when lookup rounds ended (vLLM's "
        "cross-group AND applied), the share offered to load; the rest was recomputed. Healthy: "
        "1. Below 1 the tiers had the data and kvscope_restore_short_tokens_total says why it "
        "was not restored: row_ceiling (the primary tier has fewer rows than the restore needs: "
        "a long prefix truncated at rows x chunk tokens, or concurrent restores), group_veto "
        "(another KV group missed), load_cap. Prefixes the tiers never held do not count here "
        "(not_stored; store_refused where their store jobs were refused for lack of a primary "
        "row). kv-diagnose names the form and the rows needed.",
        [
            (f"sum({r.hit_tokens_rate}{c.rsel()}) / {held}", "coverage"),
            (f"sum by ({s.L_REASON}) ({r.restore_short_tokens_rate}{c.rsel(short_of_held)})"
             f"\n/ ignoring({s.L_REASON}) group_left {held}",
             "held, not offered: {{" + s.L_REASON + "}}"),
        ],
        unit="percentunit", width=24,
    ).max(1)


def lookup_verdicts(cfg: Config):
    return c.timeseries(
        "Lookup rounds by verdict",
        "Lookup rounds per second (one per get_num_new_matched_tokens call) by the verdict the "
        "KV groups reached together. Healthy: hit and miss dominate. A growing deferred share "
        "means requests wait for promotions from the disk tier; vetoed means some group found "
        "keys that were not ready, so the request recomputed. Deferred or vetoed above hit for "
        "minutes: open the incident dashboard (capacity ceiling).",
        [(f"sum by ({s.L_VERDICT}) ({Recorded(cfg).lookup_rounds_rate}{c.rsel()})",
          f"{{{{{s.L_VERDICT}}}}}")],
        unit="ops", stack=True,
    )


def group_outcomes(cfg: Config):
    return c.timeseries(
        "Lookup results per KV group",
        "Keys looked up per second, per KV-cache group and result. On hybrid models (full plus "
        "sliding-window attention) every group must hit for a round to hit: one group stuck on "
        "retry or hit_pending while the others hit explains vetoed rounds. retry means the disk "
        "tier is still checking whether it holds the key (an async lookup) or holds it and a "
        "promotion into the CPU tier has started; hit_pending means that promotion is in flight.",
        [(f"sum by ({s.L_KV_GROUP}, {s.L_RESULT}) ({Recorded(cfg).lookups_rate}{c.rsel()})",
          f"group {{{{{s.L_KV_GROUP}}}}} {{{{{s.L_RESULT}}}}}")],
        unit="ops",
    )


def restore_stopped_by_group(cfg: Config):
    return c.timeseries(
        "Short restores by the KV group that stopped them",
        "Lookup rounds per second that offered less than the request's loadable prefix, by the "
        "KV group whose scan stopped the offer and why: row_ceiling (that group's promotion "
        "found no free primary row), group_veto (that group missed while the others held "
        "more: on hybrid models usually the sliding-window group), not_stored / store_refused "
        "(that group's stored prefix ends there; store_refused: its store job was refused for "
        "lack of a primary row, so the prefix was stored in part). Which group it is decides "
        "the fix: more rows, a smaller step, or that group's block size.",
        [(f"sum by ({s.L_KV_GROUP}, {s.L_REASON}) "
          f"({Recorded(cfg).restore_stopped_rounds_rate}{c.rsel()})",
          f"group {{{{{s.L_KV_GROUP}}}}} {{{{{s.L_REASON}}}}}")],
        unit="ops",
    )


def hit_ratio_per_tier(cfg: Config):
    r = Recorded(cfg)
    total = f"sum({r.lookups_rate}{c.rsel()})"
    return c.timeseries(
        "Hit ratio per tier",
        "CPU tier: keys found ready in the primary tier per key looked up. Disk tier: keys "
        "promoted from the secondary tier per key looked up. vLLM external: vLLM's own ratio of "
        "external prefix-cache hit tokens (when vLLM's /metrics is scraped). A ratio that drops "
        "to 0 after a restart points at a changed hash seed or block size; a CPU ratio far below "
        "the disk ratio means the primary tier is too small for the working set.",
        [
            (f"sum({r.lookups_rate}{c.rsel(c.eq(s.L_RESULT, s.LookupResult.HIT.value))})"
             f" / {total}", "CPU tier (keys)"),
            (f"sum({r.promotions_rate}"
             f"{c.rsel(c.eq(s.L_RESULT, s.PromotionResult.COMPLETED.value))}) / {total}",
             "disk tier (keys promoted)"),
            (f"sum(rate({s.VLLM_EXTERNAL_PREFIX_HITS}{c.dsel(cfg, vllm=True)}[{R}])) / "
             f"sum(rate({s.VLLM_EXTERNAL_PREFIX_QUERIES}{c.dsel(cfg, vllm=True)}[{R}]))",
             "vLLM external (tokens)"),
        ],
        unit="percentunit",
    ).max(1)


def hit_tokens(cfg: Config):
    return c.timeseries(
        "Tokens offered from the offload tiers",
        "Tokens per second the connector offered vLLM to load instead of recomputing. Flat at 0 "
        "while bytes are being stored (Transfers row) means stores without restores.",
        [(f"sum by (instance, {s.VLLM_LABEL_MODEL}) ({Recorded(cfg).hit_tokens_rate}{c.rsel()})",
          "{{instance}} {{" + s.VLLM_LABEL_MODEL + "}}")],
    )


def bytes_by_rank_direction(cfg: Config):
    return c.timeseries(
        "Transfer bandwidth by rank and direction",
        "Bytes per second moved per rank and direction (disk directions are made by the "
        "scheduler-side manager, rank=\"manager\"). Ranks of one engine should move the same "
        "bytes GPU->CPU; one rank lagging the others points at that rank's host or link. "
        "gpu_to_cpu without cpu_to_gpu for long stretches: nothing is read back.",
        [(f"sum by ({s.L_RANK}, {s.L_DIRECTION}) "
          f"({Recorded(cfg).transfer_bytes_rate}{c.rsel(rank=True)})",
          f"rank {{{{{s.L_RANK}}}}} {{{{{s.L_DIRECTION}}}}}")],
        unit="Bps",
    )


def vllm_offload_bytes(cfg: Config):
    return c.timeseries(
        "vLLM's own offload bandwidth",
        "vLLM's built-in offload counters, for comparison with kvscope's per-rank bytes. A gap "
        "between the two totals means one side misses transfers (usually a version mismatch). "
        "Empty when only the standalone kvscope exporter is scraped.",
        [
            (f"sum(rate({s.VLLM_OFFLOAD_STORE_BYTES}{c.dsel(cfg, vllm=True)}[{R}]))", "store"),
            (f"sum(rate({s.VLLM_OFFLOAD_LOAD_BYTES}{c.dsel(cfg, vllm=True)}[{R}]))", "load"),
        ],
        unit="Bps",
    )


def transfers_in_flight(cfg: Config):
    return c.timeseries(
        "Transfers in flight",
        "Transfer jobs submitted and not yet finished, per rank and direction. It should fall "
        "back to 0 between bursts. A line that stays up while traffic stops is a stuck transfer "
        "(see the incident dashboard and KVOffloadTransfersPendingAtIdle).",
        [(f"sum by ({s.L_RANK}, {s.L_DIRECTION}) "
          f"({s.TRANSFERS_IN_FLIGHT.name}{c.dsel(cfg, rank=True)})",
          f"rank {{{{{s.L_RANK}}}}} {{{{{s.L_DIRECTION}}}}}")],
    )


def transfer_latency(cfg: Config):
    b = f"{s.TRANSFER_SECONDS.name}_bucket{c.dsel(cfg, rank=True)}"
    return c.timeseries(
        "Transfer duration (p50, p99)",
        "Duration of finished transfer jobs by direction. CPU<->GPU jobs take milliseconds; a "
        "p99 in seconds means PCIe contention or pinned-memory trouble. disk_to_cpu p99 rising "
        "while its bandwidth stays flat: the disk is the bottleneck.",
        c.p50_p99(b, s.L_DIRECTION),
        unit="s",
    )


def primary_rows(cfg: Config):
    return c.timeseries(
        "Primary (CPU) tier rows",
        "Rows of the CPU primary tier: total, occupied by a key, and held by running writes or "
        "promotions (in_flight). occupied near total is normal (a full cache evicts LRU). "
        "in_flight near total is not: every row is pinned by a transfer, new promotions find no "
        "row and lookups hit the row ceiling.",
        [(f"sum by ({s.L_STATE}) ({s.PRIMARY_ROWS.name}{c.dsel(cfg)})", f"{{{{{s.L_STATE}}}}}")],
    )


def promotions(cfg: Config):
    return c.timeseries(
        "Promotions (disk -> CPU)",
        "Keys promoted from the secondary (disk) tier into the primary tier, by result. "
        "no_row > 0 means the primary tier had no evictable row: promotions cannot land and "
        "requests that need them are deferred. failed > 0: read errors on the disk tier.",
        [(f"sum by ({s.L_RESULT}) ({Recorded(cfg).promotions_rate}{c.rsel()})",
          f"{{{{{s.L_RESULT}}}}}")],
        unit="ops",
    )


def cascades(cfg: Config):
    return c.timeseries(
        "Cascades (CPU -> disk)",
        "Keys written from the primary tier down to the disk tier, by result. started well "
        "above completed for long: the disk cannot keep up with evictions. failed > 0: write "
        "errors (disk full, permissions).",
        [(f"sum by ({s.L_RESULT}) (rate({s.CASCADES.name}{c.dsel(cfg)}[{R}]))",
          f"{{{{{s.L_RESULT}}}}}")],
        unit="ops",
    )


def store_jobs(cfg: Config):
    return c.timeseries(
        "Store jobs",
        "prepare_store calls by result. no_space means one scheduler step's store job was "
        "larger than the whole primary tier: nothing of it reaches any tier. Sustained no_space "
        "is a sizing error (primary tier smaller than a batch), not a transient.",
        [(f"sum by ({s.L_RESULT}) ({Recorded(cfg).store_jobs_rate}{c.rsel()})",
          f"{{{{{s.L_RESULT}}}}}")],
        unit="ops",
    )


def restore_vs_recompute(cfg: Config):
    ttft = f"{s.VLLM_TTFT}_bucket{c.dsel(cfg, vllm=True)}"
    load = (f"{s.TRANSFER_SECONDS.name}_bucket"
            f"{c.dsel(cfg, c.eq(s.L_DIRECTION, s.Direction.CPU_TO_GPU.value), rank=True)}")
    return c.timeseries(
        "Restore time vs time to first token",
        "CPU->GPU restore duration (kvscope) beside vLLM's time to first token. Restoring should "
        "cost a small fraction of TTFT; when restore p99 approaches TTFT p50, loading from the "
        "tier is no cheaper than recomputing the prefix. TTFT lines are empty when vLLM's "
        "/metrics is not scraped.",
        [
            (f"histogram_quantile(0.5, sum by (le) (rate({ttft}[{R}])))", "TTFT p50"),
            (f"histogram_quantile(0.99, sum by (le) (rate({ttft}[{R}])))", "TTFT p99"),
            (f"histogram_quantile(0.5, sum by (le) (rate({load}[{R}])))", "restore p50"),
            (f"histogram_quantile(0.99, sum by (le) (rate({load}[{R}])))", "restore p99"),
        ],
        unit="s", width=24,
    )


def restore_time_by_prefix(cfg: Config):
    b = f"{s.RESTORE_DURATION.name}_bucket{c.dsel(cfg)}"
    return c.timeseries(
        "Restore time by prefix length (p50, p99)",
        "Per restore, from the request's first lookup round to the step that ran it with its "
        "KV loaded, by the restored prefix's length (le_16k .. gt_1m tokens). Time that grows "
        "faster than the prefix (a 1M-token restore far above 8x a 131k one) is the "
        "scheduler's deferred rescans: see the phase panel beside it.",
        c.p50_p99(b, s.L_PREFIX),
        unit="s",
    )


def restore_time_by_phase(cfg: Config):
    return c.timeseries(
        "Where restore time goes",
        "Seconds per second restores spent, by phase: deferred_rescans (the scheduler "
        "looking the prompt's keys up again every step while a promotion reads), "
        "waiting_for_rows (no free primary row), tier_reads (the promotions reading from "
        "disk), gpu_load (the load to the GPU). deferred_rescans above the rest: kv-diagnose "
        "names restore_slowed_by_rescans with what shortens it.",
        [(f"sum by ({s.L_PHASE}) (rate({s.RESTORE_PHASE_SECONDS.name}{c.dsel(cfg)}[{R}]))",
          f"{{{{{s.L_PHASE}}}}}")],
        unit="s",
    )


def build(cfg: Config = DEFAULT) -> db.Dashboard:
    dash = (
        c.dashboard(
            cfg, cfg.overview_uid, TITLE,
            "vLLM KV-cache offloading (kvscope): lookups, hit ratios, transfers and tiers.",
        )
        .link(c.link_to("Incident view", cfg.incident_uid))
        .with_row(db.Row("Lookups"))
        .with_panel(restore_coverage(cfg))
        .with_panel(lookup_verdicts(cfg))
        .with_panel(group_outcomes(cfg))
        .with_panel(restore_stopped_by_group(cfg))
        .with_panel(hit_ratio_per_tier(cfg))
        .with_panel(hit_tokens(cfg))
        .with_row(db.Row("Transfers"))
        .with_panel(bytes_by_rank_direction(cfg))
        .with_panel(vllm_offload_bytes(cfg))
        .with_panel(transfers_in_flight(cfg))
        .with_panel(transfer_latency(cfg))
        .with_row(db.Row("Tiers"))
        .with_panel(primary_rows(cfg))
        .with_panel(promotions(cfg))
        .with_panel(cascades(cfg))
        .with_panel(store_jobs(cfg))
        .with_row(db.Row("Latency"))
        .with_panel(restore_vs_recompute(cfg))
        .with_panel(restore_time_by_prefix(cfg))
        .with_panel(restore_time_by_phase(cfg))
        .with_row(db.Row(native.ROW_TITLE))
    )
    for panel in native.panels(cfg):
        dash = dash.with_panel(panel)
    return dash
