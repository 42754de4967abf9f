"""Known bugs of vLLM's KV offloading, by release: what kv-diagnose can name, and when.

One :class:`KnownBug` per bug: the releases that have it and the release that fixed it
(each checked in vLLM's source as written beside it; what could not be checked says so),
the evidence rule (which series, which shape) where kvscope's or vLLM's series can show it,
and where it is reproduced (a scenario on vLLM's scheduler on CPU) or why it is not.
``classifiers/known_vllm_bug.py`` names a bug when its evidence matches and a target in the
window runs a release that has it, never on a release that fixed it. No vLLM import here:
versions are ``kvscope_info{vllm_version}`` strings.

Releases checked: 0.26.0 (installed), 0.27.0, 0.28.0, 0.29.0 (one file of each wheel),
0.33.0 and 0.34.0 (whole wheels). Releases between them were not checked: a bug fixed
"in 0.29.0" is absent from 0.29.0 and present in 0.28.0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvscope.exporters import signals as S

from .evidence.build import Evidence


def release(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a vLLM version string ("0.26.0", "0.26.1.dev3+g..."),
    None when it is not one ("", "unknown")."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    if len(parts) < 2:
        return None
    return (parts + [0, 0])[0], parts[1], (parts + [0, 0, 0])[2]


@dataclass(frozen=True)
class KnownBug:
    id: str
    title: str
    upstream: str  # vLLM's tracker: the issue and the fix
    since: str  # the oldest release checked to have it
    fixed_in: str | None  # the first release without it; None: no release checked fixes it
    verified: str  # what was checked, and where, in vLLM's source
    # The evidence rule in words (series and shape); "" where none of the series can show it.
    evidence_rule: str
    # The rule itself: the evidence lines when ``ev`` shows the shape, else None.
    evidence: Callable[[Evidence], list[str] | None] | None
    until_then: str  # what to do before the upgrade
    reproduced: str  # the CPU scenario (test) or recorded capture, or why neither exists
    # kv-diagnose classes that already name this behaviour (the known-bug class does not)
    named_by: tuple[str, ...] = ()
    # invariants of unclassified_anomaly its shape breaks, explained once it is named
    explains: frozenset[str] = frozenset()

    def affects(self, version: str) -> bool | None:
        """Whether ``version`` has the bug (None: not a version string)."""
        r = release(version)
        if r is None:
            return None
        since = release(self.since)
        return (since is None or r >= since) and (
            self.fixed_in is None or r < release(self.fixed_in))


def _contained(fault: S.VllmFault) -> Callable[[Evidence], list[str] | None]:
    def rule(ev: Evidence) -> list[str] | None:
        q = ev.vllm_faults.get(fault.value)
        if q is None or not q.present or q.increase <= 0:
            return None
        return [f"{S.VLLM_FAULTS_CONTAINED.name}{{{S.L_FAULT}=\"{fault.value}\"}} rose by "
                f"{q.increase:.0f}: each one a call vLLM would have raised on, out of its "
                f"scheduler step"]
    return rule


STORE_AFTER_FINISH = KnownBug(
    id=S.VllmFault.STORE_AFTER_FINISH.value,
    title="KeyError in TieringOffloadingManager.prepare_store kills the engine (store after "
          "finish)",
    upstream="vLLM issue #49635, fixed by #49671 (merged 2026-07-25); the request state came "
             "with #46284",
    since="0.26.0",
    fixed_in="0.27.0",
    verified=(
        "0.26.0: OffloadingConnectorScheduler.request_finished calls "
        "manager.on_request_finished (offloading/scheduler.py:1289-1292), which deletes "
        "_req_state when no store is pending (tiering/manager.py:709-721); _build_store_jobs "
        "then calls prepare_store for the finished request (scheduler.py:1003), which reads "
        "self._req_state[req_id] (tiering/manager.py:542, 546). 0.27.0 and 0.33.0: the "
        "finished requests' on_request_finished runs after the store jobs are built "
        "(0.27.0 scheduler.py:1257-1264; 0.33.0 scheduler.py:2175-2184)"),
    evidence_rule=(f"{S.VLLM_FAULTS_CONTAINED.name}{{fault=\"store_after_finish\"}} rose in the "
                   "window (kvscope contained it; without kvscope, or with contain_vllm_faults "
                   "off, the engine died instead and no series shows it)"),
    evidence=_contained(S.VllmFault.STORE_AFTER_FINISH),
    until_then=("keep kvscope's contain_vllm_faults on (the default): each occurrence skips "
                "one finished request's last store instead of killing the engine; size the CPU "
                "tier so stores stop being refused (kv-diagnose plan), the usual way there"),
    reproduced=("tests/connector/test_store_after_finish.py (kvscope.sim.store_after_finish), "
                "both ways there (a store refused, then retried after finish; with "
                "offload_prompt_only false, the last token filling a chunk): the stock "
                "connector raises KeyError on 0.26.0 and runs through on 0.33.0; kvscope "
                "contains it on 0.26.0. Capture: tests/diagnostics/known_bugs/"),
)

CAPACITY_CEILING = KnownBug(
    id="capacity_ceiling",
    title="A tiering lookup answers MISS when its promotion finds no free primary row",
    upstream="vLLM behaviour, not filed as a bug",
    since="0.26.0",
    fixed_in=None,
    verified=("0.34.0 tiering/manager.py:770-771: a promotion that finds no row "
              "(_initiate_promotion False) answers MISS; the same in 0.26.0 and 0.33.0"),
    evidence_rule="the capacity_ceiling_* classes' rules (rounds cut at the row ceiling)",
    evidence=None,
    until_then="size the primary tier (kv-diagnose plan); no release changes it",
    reproduced="the capacity-ceiling, livelock, truncated and concurrency CPU scenarios",
    named_by=("capacity_ceiling_veto", "capacity_ceiling_livelock",
              "capacity_ceiling_truncated", "capacity_ceiling_concurrency"),
)

HIT_PENDING_NO_DEADLINE = KnownBug(
    id="hit_pending_no_deadline",
    title="HIT_PENDING has no deadline: a write that never completes defers requests forever",
    upstream="vLLM issue #49829 (open); #49850 closed unmerged, #53087 open",
    since="0.26.0",
    fixed_in=None,
    verified=("a write-pending row answers HIT_PENDING with no deadline: 0.26.0 "
              "cpu/manager.py:132-133, 0.34.0 :215; 0.34.0's v1/kv_offload has no deadline "
              "outside its P2P tier"),
    evidence_rule="the pending_at_idle / promotion_stalled classes' rules (a transfer pending "
                  "far longer than any real one)",
    evidence=None,
    until_then="find the transfer that never completes (the stalled tier, the lost "
               "completion); a restart clears it",
    reproduced="the pending-at-idle CPU scenario (a rank that never reports its store)",
    named_by=("pending_at_idle", "promotion_stalled"),
)

HIT_PENDING_CASCADE_DROP = KnownBug(
    id="hit_pending_cascade_drop",
    title="HIT_PENDING keys dropped from the request-level cascade (a P2P producer leg's peer "
          "waits out its timeout and recomputes)",
    upstream="vLLM issue #53062, fixed by #53329 (merged 2026-08-25)",
    since="0.26.0",
    fixed_in="0.29.0",
    verified=("_cascade_existing_blocks_to_request_level_tiers keeps only keys whose primary "
              "lookup is HIT: 0.26.0 tiering/manager.py:573, 0.27.0 :577, 0.28.0 :618; "
              "0.29.0 and 0.33.0 park HIT_PENDING keys (RequestState.pending_cascade_keys)"),
    evidence_rule="",  # the dropped key is never submitted: no kvscope or vLLM series counts it
    evidence=None,
    until_then="upgrade; a request-level tier (vLLM's P2P tier) is the only one affected",
    reproduced=("not reproduced: it needs a request-level secondary tier (P2P), which the CPU "
                "harness does not build (its fs tier is block-level); no capture recorded"),
)

def _drafter_veto(ev: Evidence) -> list[str] | None:
    """A drafter's sliding-window group whose trailing chunk vLLM drops stopped restores by
    its miss (group_veto): the restore the cross-group AND gave 0 for that group alone."""
    dropped = {g for g, keys in ev.kv_group_drafters.items()
               if keys == S.DrafterKeys.TAIL_DROPPED.value}
    stops = [(g, rounds) for g, kind, rounds in ev.stopping_groups(S.ShortReason.GROUP_VETO)
             if g in dropped and kind == "sliding_window"]
    if not stops:
        return None
    return [f"{S.RESTORE_STOPPED_ROUNDS.name}{{{S.L_KV_GROUP}=\"{g}\",{S.L_REASON}="
            f"\"{S.ShortReason.GROUP_VETO.value}\"}} rose by {rounds:.0f} on KV group {g}, an "
            f"EAGLE/MTP drafter's sliding-window group ({S.KV_GROUP_INFO.name}{{{S.L_DRAFTER}="
            f"\"{S.DrafterKeys.TAIL_DROPPED.value}\"}}): its miss gave every other group's "
            "hit 0" for g, rounds in stops]


EAGLE_NEVER_CERTIFIES = KnownBug(
    id="eagle_group_never_hits",
    title="An EAGLE/MTP drafter's sliding-window group never certifies an offloaded hit "
          "(stores keep the window's trailing chunks of each full-attention chunk, the "
          "lookup needs one chunk more)",
    upstream="vLLM #44082 (the GPU prefix cache's twin); the offloading store stopped "
             "trimming in 0.27.0, and 0.34.0 keys a drafter's blocks with lookahead hashes",
    since="0.26.0",
    fixed_in="0.27.0",
    verified=("0.26.0 offloading/scheduler.py:994 (_build_store_jobs) keeps only the "
              "trailing `tail` chunks of each full-attention alignment segment, and :624 "
              "(_lookup) asks a drafter group (is_eagle_unverified) for `tail`+1 chunks in a "
              "row; 0.27.0 to 0.29.0 store every chunk; 0.32.0 and 0.33.0 key a partial tail "
              "with an EAGLE proof margin; 0.34.0 drops no drafter chunk under lookahead "
              "hashes (scheduler.py:971). Run on vLLM's scheduler on CPU (scenario "
              "drafter-group): 0.26.0 restores 0 tokens, 0.27.0, 0.28.0, 0.29.0, 0.32.0, "
              "0.33.0 and 0.34.0 restore"),
    evidence_rule=(f"{S.RESTORE_STOPPED_ROUNDS.name}{{reason=\"group_veto\"}} rose on a KV "
                   f"group whose {S.KV_GROUP_INFO.name} says kind=\"sliding_window\", "
                   f"drafter=\"tail_dropped\""),
    evidence=_drafter_veto,
    until_then="speculative decoding off restores the hits (the drafter's group is then no "
               "drafter's); or a full-attention chunk no longer than the drafter's "
               "(offloaded block_size), so no chunk is trimmed",
    reproduced=("scenario drafter-group (kvscope/sim/scenarios.py: an EAGLE drafter's "
                "sliding-window group beside a full-attention group of twice its block size), "
                "tests/diagnostics/test_drafter_group.py on 0.26.0 (every restore vetoed, "
                "named), 0.33.0 and 0.34.0 (restored, healthy, not named)"),
    explains=frozenset({"coverage", "rounds"}),
)

CPU_USAGE_GAUGE_ZERO = KnownBug(
    id="cpu_usage_gauge_zero",
    title="vllm:kv_offload_cpu_cache_usage_perc reads 0.0 while restores succeed (cosmetic)",
    upstream="vLLM #45737 (the gauge's definition: space pinned by transfers in flight)",
    since="0.26.0",
    fixed_in=None,
    verified=("0.26.0 cpu/manager.py:303-310, 0.33.0 :487-496: (allocated - free - "
              "evictable) / total, i.e. rows pinned by a transfer in flight, not rows holding "
              "KV; between transfers it is 0 however full the tier is"),
    # the shape (the gauge 0 at every scrape while restores load bytes) is cosmetic: kv-diagnose
    # gives no verdict for it, and does not read the gauge
    evidence_rule="",
    evidence=None,
    until_then="read kvscope_primary_rows{state=\"occupied\"} (or vLLM 0.33's tiering usage "
               "gauges) for how full the CPU tier is",
    reproduced=("recorded capture tests/diagnostics/native/vllm-0.33.0-healthy.prom (stock "
                "connector, vLLM 0.33.0 on CPU): the gauge reads 0.0 while the re-ask restored "
                "96 tokens (its engine facts); test_known_bugs.py checks the capture says so"),
)

STORE_BEFORE_KEY = KnownBug(
    id="store_before_key",
    title="AssertionError in _build_store_jobs kills the engine (a store job built for a chunk "
          "whose GPU block exists before its offload key)",
    upstream="vLLM issue #52170, fixed by #52923 (merged 2026-08-19)",
    since="0.26.0",
    fixed_in="0.30.0",
    verified=("0.26.0 offloading/scheduler.py:957-975: storable_chunks (:308-328) bounds the "
              "chunks to store by tokens only, and `assert len(offload_keys) == "
              "len(offload_block_ids)` fails when the request's blocks run ahead of its "
              "block hashes; 0.27.0 to 0.29.0 also bound by the allocated blocks, not the "
              "keys; 0.30.0 (:447-451), 0.31.0, 0.32.0, 0.33.0 and 0.34.0 bound by the keyed "
              "chunks (num_keyed_chunks), and the chunk waits for a later step"),
    # the engine dies inside vLLM's step: no series outlives it; the traceback is the evidence
    evidence_rule="",
    evidence=None,
    until_then=("upgrade vLLM to 0.30.0 or later (every engine it killed here ran with "
                "async scheduling, 0.26's default)"),
    reproduced=("not reproduced on CPU (kvscope's CPU harness schedules synchronously). On an "
                "H200, vLLM 0.26.0 with async scheduling (benchmarks/plan_verify.py --device "
                "cuda, tiering with an fs tier): 128,000- and 128,008-token prompts (3 at once, "
                "12,000 rows), a 64,000-token one (12,513 rows) and 40,000-token ones "
                "(14,410 rows) killed the engine in the steps after the concurrent re-asks "
                "ended (benchmarks/results/plan_verify_h200_e86bd7d_store_before_key.json); "
                "64,008-token ones, 16,000 and 1,600 ran through. The harness then aborted "
                "re-asks still unfinished at their step budget, which ends a 0.26 engine the "
                "same way when one was still waiting (abort_while_waiting): which of the two "
                "killed those engines was not told apart"),
)

ABORT_WHILE_WAITING = KnownBug(
    id="abort_while_waiting",
    title="AssertionError in _build_store_jobs kills the engine when a request waiting for "
          "its restore is aborted (a store job with the prompt's keys and no GPU block)",
    upstream="vLLM issue #49118 (closed); the bound on allocated blocks that avoids it is in "
             "0.27.0's storable chunks",
    since="0.26.0",
    fixed_in="0.27.0",
    verified=("0.26.0 offloading/scheduler.py:941-975: a finished request's store covers "
              "req.num_tokens, storable_chunks (:308-328) bounds it by tokens only, and an "
              "aborted request that never ran has every prompt chunk's key and no block id; "
              "0.27.0 to 0.29.0 also bound by the allocated blocks (as store_before_key's "
              "check read them); 0.33.0 (:442-473) and 0.34.0 (:439-476) bound by allocated "
              "and keyed chunks, and both store an aborted request's computed tokens only "
              "(0.33.0 :1830, 0.34.0 :1991)"),
    # the engine dies inside vLLM's step: no series outlives it; the traceback is the evidence
    evidence_rule="",
    evidence=None,
    until_then=("upgrade vLLM to 0.27.0 or later; until then a client that gives up on a "
                "request waiting for a restore from the secondary tier (a slow disk, the "
                "capacity ceiling's deferred restores) ends the engine: raise the client's "
                f"timeout above the restore time ({S.RESTORE_DURATION.name}) and size the CPU "
                "tier so restores are not deferred (kv-diagnose plan)"),
    reproduced=("tests/connector/test_abort_while_waiting.py (kvscope.sim.abort_while_waiting): "
                "a re-ask deferred while its promotions from the fs tier are in flight, "
                "aborted; the stock connector and kvscope raise the AssertionError on 0.26.0 "
                "and run through on 0.34.0. On an H100 (benchmarks/plan_verify.py --device "
                "cuda, async scheduling off): three 128,000- and 131,072-token re-asks aborted "
                "at their step budget while still waiting killed the engine "
                "(benchmarks/results/plan_verify_h100_d158475_aborted_waiting.json)"),
)

KNOWN_BUGS: tuple[KnownBug, ...] = (
    STORE_AFTER_FINISH, CAPACITY_CEILING, HIT_PENDING_NO_DEADLINE, HIT_PENDING_CASCADE_DROP,
    EAGLE_NEVER_CERTIFIES, CPU_USAGE_GAUGE_ZERO, STORE_BEFORE_KEY, ABORT_WHILE_WAITING,
)
BY_ID: dict[str, KnownBug] = {b.id: b for b in KNOWN_BUGS}
