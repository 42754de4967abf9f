"""Store never fits: one step's store job is larger than the primary tier.

``prepare_store`` refuses the whole job (``no_space``), so nothing from it
reaches any tier, and the disk tier stays empty.

Partial form: some of a prompt's store jobs fit, the rest were refused, so the
prompt is stored only in part; its re-ask restores that part and recomputes the
rest, and the hit counters look fine. The connector names it at the lookup
(``kvscope_restore_short_rounds_total{reason="store_refused"}``: the round's
offer stopped at a chunk whose store job was refused): precise where the
refusal counts alone are not (floods refused and never asked again are harmless).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence, Quantity
from ..model import Facts, Finding, Mark
from ..thresholds import Thresholds
from ._common import n
from .needs import tiered
from .shared_facts import (
    RowBytes,
    StoppedGroup,
    bytes_for,
    read_row_bytes,
    stopped_groups,
    stopped_line,
    window_phrase,
)

# Refused store jobs per prepared one above which stores "never fit" even though
# some fit (see classify).
MOSTLY_REFUSED = 5

ID = "store_never_fits"
TITLE = "Store never fits the primary tier"
SEVERITY = 75
CHECK = ("store jobs refused for lack of space with nothing reaching the disk tier, or re-asks "
         "cut at a chunk whose store job was refused (stored in part)")
EXPLAINS = frozenset({"rounds", "coverage"})


def needs(ev: Evidence) -> tuple:
    """Cascades exist only with a secondary tier."""
    return (S.STORE_JOBS, S.PRIMARY_ROWS) + ((S.CASCADES,) if tiered(ev) else ())


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    # Re-asks cut short where their own prompts' store jobs were refused (any window:
    # the refusals may precede it, the recompute is now). Per key, judged by the
    # connector (the offer stopped at a key no tier holds, whose store job was refused):
    # once anything reached the last tier it decides the form, whatever the refusal
    # counts say (a refused job is retried every step, decode steps too, so refusals
    # outnumber prepared jobs many times over while each prompt is stored in part).
    short = ev.coverage.rounds(S.ShortReason.STORE_REFUSED)
    whole = _never_fits(ev, th)
    if short.increase > 0 and (whole is None or _reached(ev)):
        return _partial(ev, th, short)
    return whole


def _reached(ev: Evidence) -> bool:
    """Something reached the last tier: a completed cascade to disk, or, with the CPU
    tier alone (nothing cascades), a store job that fit."""
    if tiered(ev):
        return ev.tiers.cascade(S.CascadeResult.COMPLETED).last > 0
    return ev.tiers.store(S.StoreJobResult.PREPARED).increase > 0


@dataclass(frozen=True)
class JobSize:
    """Rows one step's store job can need: one request's store job in one step covers the
    full chunks its prefill completed in that step, in every KV group: up to
    ceil(max_num_batched_tokens / chunk_tokens) chunks × groups rows, which prepare_store
    must find free at once or refuses whole."""

    max_num_batched_tokens: int
    chunk_tokens: int
    kv_groups: int
    chunks: int
    rows_per_job: int

    def line(self, rows: int) -> str:
        g = self.kv_groups
        return (f"one step can prefill max_num_batched_tokens={self.max_num_batched_tokens} "
                f"tokens = {self.chunks} chunks of {self.chunk_tokens} tokens × {g} KV group"
                f"{'s' if g != 1 else ''} = {self.rows_per_job} rows per store job; primary "
                f"tier: {rows} rows")


def _job_size(ev: Evidence) -> JobSize | None:
    """None: kvscope_info lacks chunk_tokens or max_num_batched_tokens."""
    chunk = ev.info_int("chunk_tokens")
    batched = ev.info_int("max_num_batched_tokens")
    if not (chunk and batched):
        return None
    chunks = math.ceil(batched / chunk)
    return JobSize(batched, chunk, ev.kv_group_count, chunks, chunks * ev.kv_group_count)


def _size_lines(job: JobSize | None, rows: int) -> list[str]:
    return [job.line(rows) if job else f"primary tier: {rows} rows"]


@dataclass(frozen=True)
class NeverFitsFacts(Facts):
    lifetime: bool
    tiered: bool  # a disk tier behind the CPU tier
    refused_jobs: float  # store jobs refused for lack of space (no_space)
    prepared_jobs: float
    reached: bool  # something reached the last tier (a cascade; CPU alone: a job that fit)
    cascaded_keys: float  # keys on the disk tier (latest)
    recent_refused: float
    recent_span_s: float
    primary_rows: int
    kv_groups: int
    job: JobSize | None  # None: the job's size is unknown
    row_margin: float
    rows_wanted: int | None  # the tier that holds one job, with margin; None: job unknown
    row_bytes: RowBytes | None

    def lines(self) -> list[str]:
        w = window_phrase(self.lifetime)
        lines = [f"{n(self.refused_jobs)} store jobs refused for lack of space (no_space) {w}, "
                 f"{n(self.prepared_jobs)} prepared"]
        if not self.reached:
            lines.append("0 keys reached the disk tier (no completed cascade)" if self.tiered else
                         "0 store jobs fit the CPU tier (the only tier)")
        else:
            lines.append(f"refused jobs outnumber prepared ones "
                         f"{n(round(self.refused_jobs / self.prepared_jobs))}:1: the prompts "
                         "whose job is refused are never stored"
                         + (f" ({n(self.cascaded_keys)} keys reached the disk tier from the "
                            "jobs that fit)" if self.tiered else ""))
        if self.recent_refused > 0:
            lines.append(f"still happening: +{n(self.recent_refused)} refused in the last "
                          f"{self.recent_span_s:.0f} s")
        return lines + _size_lines(self.job, self.primary_rows)

    @property
    def fit_tokens(self) -> int | None:
        """The max_num_batched_tokens whose store job fits the rows: rows // groups chunks."""
        return (self.primary_rows // self.kv_groups) * self.job.chunk_tokens if self.job else None

    def next_step(self) -> str:
        rows, job = self.primary_rows, self.job
        if job is None or not job.rows_per_job:
            return ("One step's store job (a whole prompt prefilled in one step) is larger than "
                    f"the CPU primary tier ({rows} rows): raise cpu_bytes_to_use, or lower "
                    "max_num_batched_tokens so a step stores fewer rows.")
        per_step, groups, fit_tokens = job.rows_per_job, self.kv_groups, self.fit_tokens
        lower = (f"lower max_num_batched_tokens to ≤ {fit_tokens} (= {rows // groups} "
                 f"chunks × {job.chunk_tokens} tokens per group: a step's store job "
                 f"then fits {rows} rows, with no room left for restores)" if fit_tokens > 0 else
                 f"the tier cannot hold even one chunk of every group ({groups} rows)")
        return (f"One step's store job (up to {per_step} rows) is larger than the CPU primary tier "
                f"({rows} rows); a refused job is retried with the next step's chunks added, so "
                f"once refused it only grows and nothing is ever stored. Grow the tier to ≥ "
                f"{self.rows_wanted} rows ({per_step} + {self.row_margin:.0%} margin)"
                + bytes_for(self.rows_wanted, self.row_bytes) + f"; or {lower}.")


@dataclass(frozen=True)
class StoredInPartFacts(Facts):
    lifetime: bool
    short_rounds: float  # rounds stopped at a chunk whose store job was refused
    lost_tokens: float  # tokens of those prompts not restored (recomputed)
    offered_tokens: float
    held_tokens: float  # 0: not exported
    stopped_groups: tuple[StoppedGroup, ...]  # the KV groups whose next chunk was never stored
    refused_jobs: float | None  # store jobs refused (no_space); None: series absent
    prepared_jobs: float
    primary_rows: int
    job: JobSize | None  # None: the job's size is unknown
    row_margin: float
    rows_wanted: int  # rows + one job in flight (or twice the rows), with margin
    row_bytes: RowBytes | None

    def lines(self) -> list[str]:
        w, short, lost = window_phrase(self.lifetime), self.short_rounds, self.lost_tokens
        lines = [f"{n(short)} lookup round{'s' if short != 1 else ''} {w} stopped at a chunk "
                 "whose store job the primary tier had refused for lack of space: the prompt was "
                 "stored only in part"
                 + (f", {n(lost)} tokens of it not restored (recomputed)" if lost > 0 else "")]
        if self.held_tokens > 0:
            lines.append(f"{n(self.offered_tokens)} tokens offered of {n(self.held_tokens)} the "
                         "tiers held: the restores got what was stored, the stores were cut")
        lines += stopped_line(self.stopped_groups, "its next chunk was never stored (store job "
                              "refused)")
        refused, prepared = self.refused_jobs, self.prepared_jobs
        if refused is not None:
            lines.append(f"{n(refused)} store jobs refused (no_space) {w}, {n(prepared)} prepared"
                         + ("; the refusals came earlier" if refused <= 0 else "")
                         + ("; a refused job is retried every step until its request ends, so "
                            "refusals outnumber prepared jobs while each prompt is stored in part"
                            if refused > MOSTLY_REFUSED * prepared > 0 else ""))
        return lines + _size_lines(self.job, self.primary_rows)

    def next_step(self) -> str:
        rows, per_step = self.primary_rows, self.job.rows_per_job if self.job else 0
        job = f"a step's store job (up to {per_step} rows)" if per_step else "a step's store job"
        room = f"room for one more job in flight: {rows} + {per_step}" if per_step else "twice that"
        return (f"Part of each such prompt is recomputed on every re-ask: {job} found no free "
                f"primary row while the prompt was prefilled (rows pinned by earlier jobs still "
                f"being written or copied to the disk tier, by restores, by other requests); once "
                f"refused, a job is retried with the next step's chunks added. Grow the CPU "
                f"primary tier to ≥ {self.rows_wanted} rows (now {rows}; {room} + "
                f"{self.row_margin:.0%} margin)" + bytes_for(self.rows_wanted, self.row_bytes)
                + "; or lower max_num_batched_tokens so each job needs fewer rows.")


def _never_fits(ev: Evidence, th: Thresholds) -> Finding | None:
    no_space = ev.tiers.store(S.StoreJobResult.NO_SPACE)
    cascaded = ev.tiers.cascade(S.CascadeResult.COMPLETED)
    prepared = ev.tiers.store(S.StoreJobResult.PREPARED).increase
    # A job refused now and then (rows pinned by other requests' stores) is not
    # "never fits".
    reached = _reached(ev)
    # ... unless refusals outnumber fitting jobs many times over: a refused job is
    # retried (grown) every step, so the few that fit are other requests' (the
    # oracle matrix: 104 refused, 3 prepared, the re-asked prompts never stored).
    mostly_refused = prepared > 0 and no_space.increase > MOSTLY_REFUSED * prepared
    if no_space.increase <= 0 or (reached and not mostly_refused):
        return None
    rows = int(ev.primary_rows)
    job = _job_size(ev)
    facts = NeverFitsFacts(
        lifetime=ev.source.lifetime,
        tiered=tiered(ev),
        refused_jobs=no_space.increase,
        prepared_jobs=prepared,
        reached=reached,
        cascaded_keys=cascaded.last,
        recent_refused=no_space.recent,
        recent_span_s=ev.source.recent_span,
        primary_rows=rows,
        kv_groups=ev.kv_group_count,
        job=job,
        row_margin=th.row_margin,
        rows_wanted=_with_margin(job.rows_per_job, th) if job and job.rows_per_job else None,
        row_bytes=read_row_bytes(ev, th),
    )
    conf = _job_conf(0.9 if prepared == 0 else 0.6 if not reached else 0.5, job, rows)
    marks = [Mark("stores", no_space.samples[-1][0], "no_space")] if no_space.samples else []
    return Finding(
        id=ID,
        title=TITLE,
        confidence=conf,
        facts=facts,
        next_step=facts.next_step(),
        severity=SEVERITY,
        marks=marks,
    )


def _partial(ev: Evidence, th: Thresholds, short: Quantity) -> Finding:
    """Prompts stored in part: their re-asks came short at a refused store."""
    c = ev.coverage
    rows = int(ev.primary_rows)
    no_space = ev.tiers.store(S.StoreJobResult.NO_SPACE)
    job = _job_size(ev)
    per_step = job.rows_per_job if job else 0
    # A job that fits the tier alone is refused when earlier jobs' rows are still pinned
    # (being written to the primary tier, then copied to the disk tier): room for one
    # more job in flight than the tier holds now.
    facts = StoredInPartFacts(
        lifetime=ev.source.lifetime,
        short_rounds=short.increase,
        lost_tokens=c.tokens(S.ShortReason.STORE_REFUSED).increase,
        offered_tokens=ev.rounds.hit_tokens.increase,
        held_tokens=c.held_tokens.increase if c.held_tokens.present else 0,
        stopped_groups=stopped_groups(ev, S.ShortReason.STORE_REFUSED),
        refused_jobs=no_space.increase if no_space.present else None,
        prepared_jobs=ev.tiers.store(S.StoreJobResult.PREPARED).increase,
        primary_rows=rows,
        job=job,
        row_margin=th.row_margin,
        rows_wanted=_with_margin(rows + per_step if per_step else rows * 2, th),
        row_bytes=read_row_bytes(ev, th),
    )
    # Decided per key by the connector: the offer stopped at a key no tier holds whose
    # store job was refused, the tiers holding no more than was offered (a restore the
    # row ceiling cut, the tiers holding more, is the capacity ceiling's finding).
    conf = _job_conf(0.85, job, rows)
    marks = [Mark("rounds", short.samples[-1][0], "store refused")] if short.samples else []
    return Finding(id=ID, title=TITLE + " (stored in part)", confidence=conf, facts=facts,
                   next_step=facts.next_step(), severity=SEVERITY, marks=marks)


def _with_margin(rows: int, th: Thresholds) -> int:
    return math.ceil(rows * (1 + th.row_margin) - 1e-9)


def _job_conf(conf: float, job: JobSize | None, rows: int) -> float:
    """A job larger than the tier can never fit: surer."""
    return min(conf + 0.05, 0.95) if job is not None and job.rows_per_job > rows else conf
