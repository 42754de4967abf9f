"""The CPU scenarios, each described once: what it runs, what it reproduces, what it proves.

Importable without vLLM (``kvscope scenarios`` lists them without loading torch): a
scenario names its run function in :mod:`kvscope.sim.scenarios`, which imports vLLM,
and :meth:`Scenario.runner` imports it only when the scenario runs. The demo, the
scenario tests and the dashboards' live checks read this one table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Facts = Mapping[str, Any]


@dataclass(frozen=True)
class Scenario:
    name: str
    # The function of kvscope.sim.scenarios that drives the engine (run, cfg) -> None.
    run: str
    doc: str
    # The kv-diagnose verdict that must rank first on what the run serves.
    expected_verdict: str
    # From the run's engine facts (never kvscope's counters): did the incident happen?
    # A run whose premise does not hold did not reproduce its incident, so its verdict
    # proves nothing either way.
    premise: Callable[[Facts], bool]
    premise_doc: str
    # A version-specific path of a catalogued incident, or a healthy control run of one's
    # geometry: run by name, never iterated.
    variant: bool = False

    def runner(self) -> Callable[..., None]:
        """The run function (imports vLLM)."""
        return getattr(importlib.import_module("kvscope.sim.scenarios"), self.run)


def _all(*scenarios: Scenario) -> dict[str, Scenario]:
    return {s.name: s for s in scenarios}


CATALOG: dict[str, Scenario] = _all(
    Scenario(
        "healthy", "healthy",
        "Store, evict to disk, ask again: promotions, then a hit; output identical.",
        "healthy",
        lambda f: f["same_output"] and f["restored_tokens"] > 0,
        "the re-ask restored tokens and produced the same output"),
    Scenario(
        "capacity-ceiling", "capacity_ceiling",
        "Primary tier (6 rows) smaller than the prompt's 6 chunks x 2 groups: vetoed.",
        "capacity_ceiling_veto",
        lambda f: f["restored_tokens"] == 0,
        "the re-ask restored nothing"),
    Scenario(
        "livelock", "livelock",
        "8 rows, between one and two groups' worth: deferred round after round.",
        "capacity_ceiling_livelock",
        lambda f: not f["stuck_request_done"],
        "the re-asked request is still unfinished after 40 steps"),
    Scenario(
        "stale-rows", "stale_rows",
        "Rank 1 maps its own /dev/shm (another node): promotions never reach it.",
        "stale_row_corruption",
        lambda f: f["same_output"] and f["restored_tokens"] == 0,
        "the stale load was refused (nothing restored) and the output stayed the same"),
    Scenario(
        "stale-rows-observe", "stale_rows_observe",
        "As stale-rows, with checksum_policy=observe: the stale load is served.",
        "stale_row_corruption",
        lambda f: f["restored_tokens"] > 0,
        "the stale load was served (tokens restored)"),
    Scenario(
        "pending-at-idle", "pending_at_idle",
        "Rank 1 never reports its store jobs: the engine idles with a transfer in flight.",
        "pending_at_idle",
        lambda f: f["request_done"] and f["has_pending_work"],
        "the request finished while the scheduler still has work (the unreported store)"),
    Scenario(
        "not-settled-at-idle", "not_settled_at_idle",
        "Each finished request leaves its GPU blocks pinned: the engine idles holding them.",
        "not_settled_at_idle",
        lambda f: f["requests_done"] and not f["has_requests"] and f["gpu_blocks_held"] > 0,
        "every request finished and vLLM holds none, yet its GPU block pool holds blocks"),
    Scenario(
        "queue-wait", "queue_wait",
        "One long decode holds the only running slot; later requests queue behind it.",
        "queue_wait",
        lambda f: f["long_running"] and f["queued_done"] == 0,
        "the long decode still runs and no queued request finished"),
    Scenario(
        "store-never-fits", "store_never_fits",
        "A whole prompt prefilled in one step: its store job is larger than the tier.",
        "store_never_fits",
        lambda f: f["restored_tokens"] == 0,
        "the re-ask restored nothing"),
    Scenario(
        "stored-in-part", "stored_in_part",
        "A 12-chunk prompt whose later store jobs find no free row: stored in part, its "
        "re-ask restores that part and recomputes the rest.",
        "store_never_fits",
        # with tiering nothing stored is dropped: held < prompt means part never reached a tier
        lambda f: f["finished"] and f["same_output"]
        and 0 < f["held_tokens"][0] < f["prompt_tokens"]
        and f["restored_tokens"][0] >= f["held_tokens"][0],
        "the tiers held part of the prompt (never all of it), the re-ask restored all they held "
        "with the same output"),
    Scenario(
        "stores-without-restores", "stores_without_restores",
        "The engine restarts without PYTHONHASHSEED: the same prompt gets new keys.",
        "stores_without_restores",
        lambda f: f["restored_tokens"] == 0,
        "the restarted engine restored nothing of the prompt it had stored"),
    Scenario(
        "tier-data-lost", "tier_data_lost",
        "The fs tier's directory removed mid-run: writes go on, what was on disk is gone.",
        "tier_data_lost",
        lambda f: f["block_files_before"] > 0 and f["same_output"] and f["restored_tokens"] == 0,
        "the prompt was on disk before the removal; the re-ask restored nothing, same output"),
    Scenario(
        "truncated", "truncated",
        "One 12-chunk prompt, 8 primary rows, 1 KV group: the restore stops at the rows.",
        "capacity_ceiling_truncated",
        lambda f: f["finished"] and f["same_output"]
        and f["restored_tokens"][0] < f["held_tokens"][0],
        "the re-ask finished with the same output, restoring fewer tokens than the tiers held"),
    Scenario(
        "concurrency", "concurrency",
        "Three 8-chunk prompts re-asked at once, 12 rows: each fits alone, not together.",
        "capacity_ceiling_concurrency",
        lambda f: f["finished"] and f["same_output"]
        and any(r < h for r, h in zip(f["restored_tokens"], f["held_tokens"], strict=True)),
        "the re-asks finished with the same outputs, one restoring fewer tokens than held"),
    Scenario(
        "tier-flooded", "tier_flooded",
        "KV groups of 128, 128 and 16 tokens per block, prompts of 112 tokens: only the "
        "sub-block group's keys are stored; they fill the primary tier and the disk.",
        "tier_flooded_by_group",
        lambda f: f["restored_tokens"] == 0 and f["disk_files"][2] > 0
        and f["disk_files"][0] == f["disk_files"][1] == 0
        and f["primary_keys"][2] == f["rows"] and f["primary_keys"][0] == f["primary_keys"][1] == 0,
        "every file on disk and every key of the (full) primary tier is the sub-block group's, "
        "and the re-ask restored nothing"),
    Scenario(
        "healthy-hybrid", "healthy_hybrid",
        "As tier-flooded with prompts of 256 tokens: every group stores its chunks in "
        "proportion to its block size, and the re-ask is restored.",
        "healthy",
        lambda f: f["same_output"] and f["restored_tokens"] > 0
        and all(n > 0 for n in f["disk_files"])
        and f["disk_files"][2] == 8 * f["disk_files"][0] == 8 * f["disk_files"][1]
        and f["primary_keys"][2] >= 0.75 * sum(f["primary_keys"]),
        "every group reached disk in proportion to its block size (8:1:1), the sub-block group "
        "holds >= 75 % of the primary tier, and the re-ask restored tokens with the same output",
        variant=True),
    Scenario(
        "stale-rows-hybrid", "stale_rows_hybrid",
        "As stale-rows on a model with two KV groups: vLLM 0.33 fails the refused load per "
        "request (failed_recving) and recomputes it; 0.26 cannot, so refuse degrades to observe.",
        "stale_row_corruption",
        lambda f: (f["same_output"] and f["restored_tokens"] == 0)
        or (not f["same_output"] and f["restored_tokens"] > 0),
        "refused and recomputed (same output, nothing restored; 0.33) or served and wrong (0.26)",
        variant=True),
    Scenario(
        "drafter-group", "drafter_group",
        "A hybrid model speculating with an EAGLE drafter whose KV group has a 16-token "
        "window (full-attention blocks of 32 tokens, the drafter's of 16): vLLM before 0.34 "
        "stores one drafter chunk per segment and its lookup needs two in a row, so every "
        "restore is vetoed; 0.34 keys blocks with lookahead tokens and restores.",
        "known_vllm_bug",
        lambda f: f["same_output"] and f["restored_tokens"] == 0
        and all(n > 0 for n in f["disk_files"]),
        "every group reached disk, and the re-ask restored nothing (same output)",
        variant=True),
)

# The catalogued incidents (the demo, and the tests that iterate every scenario).
SCENARIOS: dict[str, Scenario] = {n: s for n, s in CATALOG.items() if not s.variant}
