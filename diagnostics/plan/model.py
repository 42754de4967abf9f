"""The typed model of ``kv-diagnose plan``: what a window says (:class:`PlanInputs`) and the
sizing derived from it (:class:`Plan`).

Four layers, as the diagnosis has them: a source's :class:`~..model.RawWindow` ->
:func:`.inputs.read_inputs` (the parser: the evidence's series to facts, each with
where it came from) -> :func:`.coverage.make_plan` (the coverage model) ->
:mod:`.format` (text and JSON). Coverage, here and everywhere in kvscope: tokens
restored from the offload tiers / tokens the tiers held for the re-asked prefixes
(``kvscope_hit_tokens_total / kvscope_restore_held_tokens_total``); the rest was
recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import SourceInfo


@dataclass(frozen=True)
class Fact:
    """One number the plan reads, and where it came from (a series, a label, an option)."""

    value: float
    source: str


@dataclass(frozen=True)
class PlanInputs:
    """What the window (or the command line) says about the restores to size for."""

    source: SourceInfo | None  # None: planned from the command line alone
    chunk_tokens: Fact | None  # tokens per offloaded chunk (one row per KV group)
    kv_groups: Fact
    rows_now: Fact | None  # the primary tier's rows in the window
    row_bytes: Fact | None  # bytes of one row, every rank's slot
    step_tokens: Fact | None  # max_num_batched_tokens: what one step may store
    restores: Fact | None  # ended rounds the tiers held a prefix for
    held_per_restore: Fact | None  # tokens held per such round (mean)
    largest_rows: Fact | None  # rows the largest restore seen needed at once
    concurrency_seen: Fact | None  # most restores seen restoring at once
    concurrency_given: Fact | None  # --concurrency: replaces the estimate
    coverage_now: Fact | None  # offered / held in the window
    row_loss: Fact | None  # share of held tokens a promotion without a free row cut
    other_loss: Fact | None  # share lost for reasons rows do not fix (load cap, other)
    reserve_given: Fact | None  # --reserve-rows
    notes: tuple[str, ...] = ()
    # per sliding-window group whose restore promotes its window alone: the most chunks it
    # promotes (kvscope_kv_group_info{restore_chunks}); every other group a row per chunk
    restore_caps: tuple[int, ...] = ()


@dataclass(frozen=True)
class Step:
    """One line of the reasoning: what, how it was computed, the result."""

    what: str
    how: str
    value: str


@dataclass(frozen=True)
class Prediction:
    rows: int
    coverage: float  # restores that end whole when all ask at once (the model's prediction)
    at_least: float  # ... if the restore that found part of its rows is cut instead
    label: str  # "now", "plan", "plan - 10 %", "asked"
    measured: float | None = None  # the window's own coverage (at "now")


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    target: float
    rows_per_restore: int  # k
    # rows of k the restore that finds only part of them needs to wait for the rest
    # (coverage.partial_reach: every group scanned before the last whole, the last's first)
    partial_reach: int
    concurrency: float  # C: restores that ask for rows at once
    reserve: int  # rows left for one step's store job
    restores_needed: int  # restores that must fit whole at once for the target
    rows: int  # the plan: primary rows
    # the window showed the restore that found part of its rows cut (others recomputed)
    partial_cut: bool
    # rows the window showed one step's in-flight stores holding while the restores asked
    # (0: none); the predictions leave them to the stores
    window_store_rows: int
    cpu_bytes: int | None  # rows x row bytes (None: row bytes unknown)
    reachable: bool  # False: losses rows do not fix keep coverage under the target
    steps: tuple[Step, ...]
    predictions: tuple[Prediction, ...]
    notes: tuple[str, ...] = ()
