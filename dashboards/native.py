"""Panels from vLLM's own offload metrics (vLLM >= 0.33), for engines with or without kvscope.

0.33 adds waiting requests by KV-fetch stage; 0.34 the primary chunks failed promotions hold
until their reads end (deferred releases).

vLLM 0.33's tiering manager exports per-tier chunk lookups, tier jobs in flight, job failures,
the share of the primary tier pinned by tier jobs, and prompt tokens cached by source. They add
what kvscope's own series do not carry (cached tokens by source, vLLM's view of each tier) and
they are all there is on a stock engine (kv-diagnose's reduced-evidence path reads the same
series). vLLM 0.26 exports none of them: these panels stay empty there
(``NATIVE_SINCE``; the live query checks know which version produces them).
"""

from __future__ import annotations

from kvscope.exporters import signals as s

from . import common as c
from .config import Config

R = c.RATE_INTERVAL
NATIVE_SINCE = s.VLLM_NATIVE_SINCE
ROW_TITLE = f"vLLM native offload metrics (vLLM >= {NATIVE_SINCE})"
TIER = s.VLLM_TIER_LABEL


def _sel(cfg: Config, *matchers: str) -> str:
    return c.dsel(cfg, *matchers, vllm=True)


def tier_chunk_hit_ratio(cfg: Config):
    return c.timeseries(
        "Chunk hit ratio per tier (vLLM)",
        "vLLM's own lookup outcome per tier: chunks found per chunk looked up (resolved lookups "
        "only; tier 0:primary is the CPU tier, 1:fs etc. the secondary tiers). A secondary tier "
        "that hits while nothing is restored (Tokens cached by source: no host/disk tokens) "
        "points at the capacity ceiling: promotions land in a primary tier too small to hold a "
        f"request. Empty on vLLM < {NATIVE_SINCE}.",
        [(f"sum by ({TIER}) (rate({s.VLLM_TIERING_CHUNK_HITS}{_sel(cfg)}[{R}]))\n"
          f"/ sum by ({TIER}) (rate({s.VLLM_TIERING_CHUNK_QUERIES}{_sel(cfg)}[{R}]))",
          f"{{{{{TIER}}}}}")],
        unit="percentunit",
    ).max(1)


def cached_tokens_by_source(cfg: Config):
    return c.timeseries(
        "Prompt tokens cached by source (vLLM)",
        "Prompt tokens per second not recomputed, by where vLLM found them: device (the GPU "
        "prefix cache), host (the CPU offload tier), disk (a secondary tier), p2p. Offloading "
        "pays off when host and disk carry a share of the traffic; bytes stored (Transfers row) "
        f"with host and disk flat at 0 means stores without restores. Empty on vLLM < "
        f"{NATIVE_SINCE}.",
        [(f"sum by (source) (rate({s.VLLM_PROMPT_TOKENS_CACHED_BY_SOURCE}{_sel(cfg)}[{R}]))",
          "{{source}}")],
        stack=True,
    )


def tier_jobs_in_flight(cfg: Config):
    return c.timeseries(
        "Tier jobs in flight (vLLM)",
        "Promotion (secondary tier -> CPU) and cascade (CPU -> secondary tier) jobs vLLM's tiering "
        "manager has started and not seen finish, per secondary tier. They fall back to 0 when "
        "traffic stops; a line that stays up while no request runs or waits is a stalled tier "
        "(storage that no longer answers). kvscope adds the GPU<->CPU side (Transfers in "
        f"flight). Empty on vLLM < {NATIVE_SINCE}.",
        [
            (f"sum by ({TIER}) ({s.VLLM_TIERING_ACTIVE_PROMOTIONS}{_sel(cfg)})",
             f"promotions {{{{{TIER}}}}}"),
            (f"sum by ({TIER}) ({s.VLLM_TIERING_ACTIVE_CASCADES}{_sel(cfg)})",
             f"cascades {{{{{TIER}}}}}"),
        ],
    )


def tier_job_failures(cfg: Config):
    return c.timeseries(
        "Tier job failures (vLLM)",
        "Failed promotion jobs (reads from the secondary tier: a missing or truncated file) and "
        "cascade jobs (writes: a full disk, a vanished mount) per tier, and promotions that found "
        "no free primary-tier row (no_row: the primary tier is too small for what is promoted, "
        f"the capacity ceiling's tell). Any failure rate above 0 deserves a look. Empty on "
        f"vLLM < {NATIVE_SINCE}.",
        [
            (f"sum by ({TIER}) (rate({s.VLLM_TIERING_PROMOTION_JOB_FAILURES}{_sel(cfg)}[{R}]))",
             f"promotion failed {{{{{TIER}}}}}"),
            (f"sum by ({TIER}) (rate({s.VLLM_TIERING_CASCADE_JOB_FAILURES}{_sel(cfg)}[{R}]))",
             f"cascade failed {{{{{TIER}}}}}"),
            (f"sum(rate({s.VLLM_TIERING_PROMOTION_ALLOC_FAILURES}{_sel(cfg)}[{R}]))",
             "promotion no_row"),
        ],
        unit="ops",
    )


def primary_pinned_by_tier_jobs(cfg: Config):
    return c.timeseries(
        "Primary tier pinned by tier jobs (vLLM)",
        "Share of the primary (CPU) tier's chunks that tier jobs hold right now: written by "
        "promotions from each secondary tier, read by cascades to it. Near 1, new promotions "
        "find no row (see Tier job failures: no_row) and requests wait for the disk tier. "
        f"Empty on vLLM < {NATIVE_SINCE}.",
        [
            (f"sum by ({TIER}) ({s.VLLM_TIERING_PRIMARY_WRITE_USAGE}{_sel(cfg)})",
             f"promotions from {{{{{TIER}}}}}"),
            (f"sum by ({TIER}) ({s.VLLM_TIERING_PRIMARY_READ_USAGE}{_sel(cfg)})",
             f"cascades to {{{{{TIER}}}}}"),
        ],
        unit="percentunit",
    ).max(1)


def waiting_by_kv_fetch_stage(cfg: Config):
    return c.timeseries(
        "Waiting requests by KV-fetch stage (vLLM)",
        "Requests vLLM holds waiting on an asynchronous KV load, by where the load stands: not "
        "started, in progress, finished but the request not yet running. Beside vLLM's waiting "
        "requests (Requests row): requests that wait while these stay at 0 wait for the "
        "scheduler (the GPU KV cache, the batch limits), not for the offload path: queue "
        "wait, not a failing load path. Empty on vLLM < 0.33.",
        [(f"sum by (stage) ({s.VLLM_KV_FETCH_BY_STAGE}{_sel(cfg)})", "{{stage}}")],
        stack=True,
    )


def deferred_releases(cfg: Config):
    return c.timeseries(
        "Primary chunks held by failed promotions (vLLM)",
        "Chunks of the primary (CPU) tier that failed promotions still hold, per secondary tier: "
        "vLLM 0.34 keeps them out of the free pool until the tier confirms its read can no "
        "longer write into them. A level that stays up means reads that never end "
        "(stalled storage): those rows are lost to restores meanwhile. Empty on vLLM < 0.34.",
        [
            (f"sum by ({TIER}) ({s.VLLM_TIERING_DEFERRED_RELEASE_CHUNKS}{_sel(cfg)})",
             f"held {{{{{TIER}}}}}"),
        ],
    )


def panels(cfg: Config) -> list:
    return [tier_chunk_hit_ratio(cfg), cached_tokens_by_source(cfg), tier_jobs_in_flight(cfg),
            tier_job_failures(cfg), primary_pinned_by_tier_jobs(cfg),
            waiting_by_kv_fetch_stage(cfg), deferred_releases(cfg).span(24)]
