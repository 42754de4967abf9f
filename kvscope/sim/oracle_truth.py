"""Engine truth for the oracle matrix: what the engine did, never kvscope's counters.

The facts, per re-asked request (read from vLLM and from the tiers themselves):

* ``held``: tokens the offload tiers hold for the request's prefix right before
  the re-ask: for each KV group, which of its chunk keys the CPU primary tier
  (a ready row) or the fs tier (the key's file) holds; a full-attention group
  covers its longest stored prefix, a sliding-window group the end of its
  last stored window; vLLM's cross-group AND (each group can only shorten the
  hit, a sliding-window hit stops one token short of the prompt) gives the
  tokens a full restore would have given.
* ``served``: tokens the re-ask did not recompute (vLLM's ``num_cached_tokens``:
  the GPU prefix cache plus ``restored``, the tokens the connector loaded,
  ``num_external_cached_tokens``).
* ``stored_first``: keys of the prompt the tiers held right after its first ask
  (``lost_first``: with tiering, a full-attention key of it reached no tier).
* ``same_output``: the re-ask produced the first ask's tokens.
* ``need``: rows a full restore of ``held`` needs resident at once: its keys in
  every group (a sliding-window group's too: see ``restore_keys``) past the tokens
  the GPU prefix cache had (``served - restored``); ``rows``: the primary tier's rows.
* ``finished``; ``pending_at_end``: the engine still has transfer work after
  every request finished and the engine was stepped idle.

The truth class of a geometry, first rule that holds:

==================  ==================================================================
``wrong_output``     a re-ask's output differs from its first ask
``pending_at_idle``  every request done, transfers still pending after idle steps
``healthy``          every prompt was stored, every re-ask finished and served at
                     least what the tiers held
==================  ==================================================================

Otherwise each request whose prompt was never stored, that never finished or that
was served less than held (short) has a form, and the class names every form
present, joined by ``+`` (e.g. ``veto+concurrency``):

==================  ==================================================================
``never_stored``     its prompt (a full chunk at least) left nothing in any tier after
                     its first ask; with tiering (evictions cascade to disk, nothing is
                     dropped), also when a full-attention chunk of it reached no tier
``livelock``         the request is still unfinished after the step budget
``veto``             short, needs more rows than the tier has, got 0 tokens, and the
                     model has several KV groups
``truncated``        short, needs more rows than the tier has, got some tokens; or got
                     0 with one KV group
``concurrency``      short, fits the tier alone, the concurrent asks together do not
``short_unexplained`` short, and none of the above explains it (a bug somewhere)
==================  ==================================================================

Why one KV group never makes a ``veto``: the veto form is vLLM's cross-group AND
giving 0 because one group missed while others found keys (kv-diagnose reads it
from vetoed rounds). With one KV group there is nothing to veto: a restore that
got 0 tokens there stopped at its first chunk, whose promotion found no free row,
which is the truncated form at its floor (offered <= rows x chunk tokens, here 0;
the same cut the H200 runs and the truncated demo show). The matrix's first runs
called g017 and g070 of seed 0 (and one request of g002) ``veto``; kv-diagnose,
seeing no vetoed round, named them truncated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vllm.sampling_params import SamplingParams
from vllm.v1.kv_offload.base import make_offload_key
from vllm.v1.request import Request

from kvscope.connector import compat

TRUTH_CLASSES = ("healthy", "wrong_output", "pending_at_idle", "never_stored", "livelock",
                 "veto", "truncated", "concurrency", "short_unexplained")

# truth class -> the kv-diagnose verdict that must rank first
EXPECTED_VERDICT: dict[str, str | None] = {
    "healthy": "healthy",
    "veto": "capacity_ceiling_veto",
    "truncated": "capacity_ceiling_truncated",
    "concurrency": "capacity_ceiling_concurrency",
    "livelock": "capacity_ceiling_livelock",
    "never_stored": "store_never_fits",
    "pending_at_idle": "pending_at_idle",
    "wrong_output": "stale_row_corruption",
    "short_unexplained": None,  # no verdict names it; anything but healthy is accepted
}


@dataclass
class RequestTruth:
    held: int
    need_keys: frozenset  # the keys a full restore of `held` needs resident at once
    stored_first: int  # keys of the prompt (all groups) the tiers held after its first ask
    prompt_keys: int = 0  # keys of the prompt, all groups
    # With tiering (an evicted key cascades to disk, none is dropped): some key of a
    # full-attention group reached no tier by the end of the first ask (refused stores)
    lost_first: bool = False
    served: int = 0
    restored: int = 0
    finished: bool = False
    same_output: bool = True

    @property
    def need(self) -> int:
        return len(self.need_keys)

    @property
    def short(self) -> bool:
        return self.finished and self.served < self.held


def request_keys(engine, tokens: Sequence[int]) -> list[list[bytes]]:
    """Each KV group's offload keys for ``tokens`` (one per full chunk), as vLLM
    computes them: the request's block hashes with the group index appended."""
    req = Request(request_id="oracle-keys", prompt_token_ids=list(tokens),
                  sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                  block_hasher=engine._block_hasher)
    return [[make_offload_key(h, g) for h in req.block_hashes]
            for g in range(engine.cfg.kv_groups)]


def tier_lookup(engine) -> Callable[[bytes], bool]:
    """Whether any tier of ``engine`` holds a key, from the tiers' own state."""
    manager = engine.connector.connector_scheduler.manager
    tiers = compat.secondary_tiers(manager)
    return lambda key: compat.primary_holds(manager, key) or any(
        compat.secondary_holds(t, key) for t in tiers)


def held_tokens(keys: list[list[bytes]], holds: Callable[[bytes], bool], num_tokens: int,
                chunk: int, window_chunks: int | None) -> int:
    """Tokens a full restore from the tiers gives: vLLM's cross-group AND over the
    stored chunks (full groups: prefix; sliding-window group: a stored window)."""
    stored = [[holds(k) for k in group] for group in keys]
    swa = len(keys) - 1 if window_chunks else None
    limit = num_tokens - (1 if window_chunks else 0)
    while True:
        before = limit
        for g, flags in enumerate(stored):
            limit = min(limit, len(flags) * chunk)
            end = -(-limit // chunk)  # chunks looked up: a partial last one is loaded too
            if g == swa:
                end = _window_end(flags, end, window_chunks)
            else:
                end = next((i for i in range(end) if not flags[i]), end)
            limit = min(limit, end * chunk)
        if limit == before:
            break
    return limit if limit >= chunk else 0


def _window_end(flags: list[bool], end: int, window: int) -> int:
    """End (in chunks, <= end) of the last run of ``window`` stored chunks; a run
    reaching chunk 0 counts whole (vLLM's sliding-window lookup)."""
    run = 0
    for idx in range(end - 1, -1, -1):
        run = run + 1 if flags[idx] else 0
        if run == window:
            return idx + window
    return run


def restore_keys(keys: list[list[bytes]], held: int, chunk: int, local: int = 0) -> frozenset:
    """The keys a restore of ``held`` tokens pins rows for at once, past ``local`` tokens
    the GPU prefix cache already has: every chunk of every group. A sliding-window
    group loads only its window, but vLLM 0.26 scans its keys from the end and a
    promotion answers RETRY, which resets the window and keeps the scan going: while
    its keys are on disk it promotes every one of them, like a full group."""
    n = -(-held // chunk)
    start = local // chunk
    out = set()
    for group in keys:
        out.update(group[start:n])
    return frozenset(out)


def request_form(r: RequestTruth, rows: int, together: int, concurrent: int,
                 kv_groups: int) -> str | None:
    """The form of one finished request's short restore (None: not short)."""
    if not r.short:
        return None
    if r.need > rows:  # can never be restored whole, whatever else runs
        # one KV group: no cross-group AND to veto (see the module docstring)
        return "veto" if r.restored == 0 and kv_groups > 1 else "truncated"
    if concurrent > 1 and together > rows:
        return "concurrency"
    return "short_unexplained"


def classify(reqs: list[RequestTruth], rows: int, pending_at_end: bool, *,
             kv_groups: int) -> tuple[str, str]:
    """(truth class, why) from the facts; see the module docstring. Where requests of
    one geometry show different forms, the class names them all, joined by '+'."""
    if any(r.finished and not r.same_output for r in reqs):
        return "wrong_output", "a re-ask's output differs from its first ask"
    if pending_at_end and all(r.finished for r in reqs):
        return "pending_at_idle", "transfers pending after every request finished"
    together = len(frozenset().union(*(r.need_keys for r in reqs)))
    never = [r for r in reqs if (r.stored_first == 0 and r.prompt_keys > 0) or r.lost_first]
    stuck = [r for r in reqs if not r.finished and r not in never]
    # a prompt stored in part can also be restored short: it has both forms
    forms = {request_form(r, rows, together, len(reqs), kv_groups) for r in reqs} - {None}
    why = []
    if never:
        forms.add("never_stored")
        nothing = [r for r in never if r.stored_first == 0]
        if nothing:
            why.append(f"{len(nothing)} prompt(s) left no chunk in any tier after the first ask")
        if len(nothing) < len(never):
            part = [r for r in never if r.stored_first > 0]
            why.append(f"{len(part)} prompt(s) stored only in part after the first ask (e.g. "
                       f"{part[0].stored_first} of {part[0].prompt_keys} keys; a full-attention "
                       "chunk reached no tier)")
    if stuck:
        forms.add("livelock")
        why.append(f"{len(stuck)} re-asked request(s) never finished")
    if not forms:
        return "healthy", "every re-ask served what the tiers held"
    short = [r for r in reqs if r.short]
    if short:
        worst = min(short, key=lambda r: r.served / r.held)
        why.append(f"served {worst.served} (restored {worst.restored}) of {worst.held} held; "
                   f"its restore needs {worst.need} rows, the tier has {rows}; the "
                   f"{len(reqs)} asks need {together} together")
    return "+".join(c for c in TRUTH_CLASSES if c in forms), "; ".join(why)


def expected_verdicts(truth: str) -> set[str] | None:
    """The kv-diagnose verdicts that may rank first for a truth class (None: any incident)."""
    out = {EXPECTED_VERDICT[c] for c in truth.split("+")}
    return None if out == {None} else out - {None}
