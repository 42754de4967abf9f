"""The truncated and concurrency forms of the capacity ceiling, from synthetic windows
shaped like the reported GPU run (the live CPU runs are in test_scenarios.py)."""

from __future__ import annotations

import gzip
import re
from collections import defaultdict
from pathlib import Path

import pytest

from kvscope.diagnostics.classifiers.shared_facts import StoppedGroup
from kvscope.diagnostics.classifiers.store_never_fits import MOSTLY_REFUSED, StoredInPartFacts
from kvscope.diagnostics.model import RawWindow, Series, SourceInfo
from kvscope.diagnostics.verdict.diagnose import diagnose, diagnose_raw
from kvscope.exporters import signals as S

from .support import L, base, evidence, info

ROWS = 100  # the H200 report: a 2,000-token prompt (125 chunks of 16), fewer rows than chunks


def _gpu_report(over: dict | None = None) -> dict:
    """1 hit round restoring exactly rows x 16 tokens, 27 deferred, 0 at the row ceiling."""
    d = base(rows=ROWS)
    del d[info(rows=ROWS)]
    d[info(rows=ROWS, chunk_tokens="16")] = [1, 1]
    d[L(S.LOOKUP_ROUNDS.name, verdict="hit")] = [0, 1]
    d[L(S.LOOKUP_ROUNDS.name, verdict="deferred")] = [0, 27]
    d[S.HIT_TOKENS.name] = [0, ROWS * 16]
    d[L(S.CASCADES.name, result="completed")] = [125, 125]
    d[L(S.PROMOTIONS.name, result="started")] = [0, ROWS]
    d[L(S.PROMOTIONS.name, result="no_row")] = [0, 1]
    d[S.RESTORE_HELD_TOKENS.name] = [0, 2000]
    d[L(S.RESTORE_SHORT_ROUNDS.name, reason="row_ceiling")] = [0, 1]
    d[L(S.RESTORE_SHORT_TOKENS.name, reason="row_ceiling")] = [0, 2000 - ROWS * 16]
    d[S.LAST_CEILING_OFFERED_TOKENS.name] = [ROWS * 16, ROWS * 16]
    d[S.LAST_CEILING_HELD_TOKENS.name] = [2000, 2000]
    d[S.LAST_CEILING_ROWS_NEEDED.name] = [125, 125]
    d[S.LAST_CEILING_CONCURRENT_REQUESTS.name] = [1, 1]
    d[S.LAST_CEILING_CONCURRENT_ROWS.name] = [125, 125]
    d[L(S.RESTORE_CEILING_ROUNDS.name, form="alone")] = [0, 1]  # 125 rows needed > 100
    d.update(over or {})
    return d


def test_the_reported_gpu_run_is_named_truncated():
    report = diagnose(evidence(_gpu_report()))
    top = report.top
    assert top.id == "capacity_ceiling_truncated", [f.id for f in report.verdicts]
    assert report.exit_code == 1
    x = top.facts
    assert (x.latest_offered_tokens, x.latest_held_tokens) == (1600, 2000), x  # 80 %
    assert (x.primary_rows, x.kv_groups, x.chunk_tokens, x.tokens_cap) == (100, 1, 16, 1600), x
    assert x.rows_needed == 125, x
    assert x.coverage.ratio == 0.8, x
    assert (x.rows_wanted, x.primary_rows) == (157, 100), x


def test_a_restore_that_got_everything_held_is_healthy():
    d = _gpu_report()
    d[S.HIT_TOKENS.name] = [0, 2000]
    d[L(S.RESTORE_SHORT_ROUNDS.name, reason="row_ceiling")] = [0, 0]
    d[L(S.RESTORE_SHORT_TOKENS.name, reason="row_ceiling")] = [0, 0]
    d[L(S.RESTORE_CEILING_ROUNDS.name, form="alone")] = [0, 0]
    for m in (S.LAST_CEILING_OFFERED_TOKENS, S.LAST_CEILING_HELD_TOKENS, S.LAST_CEILING_ROWS_NEEDED,
              S.LAST_CEILING_CONCURRENT_REQUESTS, S.LAST_CEILING_CONCURRENT_ROWS):
        del d[m.name]
    report = diagnose(evidence(d))
    assert report.top.id == "healthy", [f.id for f in report.verdicts]


def test_prefixes_that_fit_alone_but_not_together_are_the_concurrency_form():
    d = _gpu_report({
        S.LAST_CEILING_OFFERED_TOKENS.name: [0, 0],
        S.LAST_CEILING_HELD_TOKENS.name: [960, 960],
        S.LAST_CEILING_ROWS_NEEDED.name: [60, 60],
        S.LAST_CEILING_CONCURRENT_REQUESTS.name: [3, 3],
        S.LAST_CEILING_CONCURRENT_ROWS.name: [180, 180],
        L(S.RESTORE_CEILING_ROUNDS.name, form="alone"): [0, 0],
        L(S.RESTORE_CEILING_ROUNDS.name, form="concurrent"): [0, 1],  # 60 rows needed <= 100
    })
    report = diagnose(evidence(d))
    top = report.top
    assert top.id == "capacity_ceiling_concurrency", [f.id for f in report.verdicts]
    assert "capacity_ceiling_truncated" not in {f.id for f in report.verdicts}
    x = top.facts
    assert (x.admit_at_once, x.primary_rows, x.rows_per_request) == (1, 100, 60), x
    assert x.rows_wanted == 225, x


def test_an_earlier_concurrent_cut_is_not_lost_to_a_later_lone_round():
    """The form is counted per cut round: the latest round's gauges (one request left
    restoring) no longer show the concurrency an earlier cut round saw."""
    d = _gpu_report({
        S.LAST_CEILING_OFFERED_TOKENS.name: [0, 0],
        S.LAST_CEILING_HELD_TOKENS.name: [960, 960],
        S.LAST_CEILING_ROWS_NEEDED.name: [60, 60],
        S.LAST_CEILING_CONCURRENT_REQUESTS.name: [1, 1],
        S.LAST_CEILING_CONCURRENT_ROWS.name: [60, 60],
        L(S.RESTORE_CEILING_ROUNDS.name, form="alone"): [0, 0],
        L(S.RESTORE_CEILING_ROUNDS.name, form="concurrent"): [0, 2],
    })
    report = diagnose(evidence(d))
    assert report.top.id == "capacity_ceiling_concurrency", [f.id for f in report.verdicts]
    assert report.exit_code == 1


def test_a_window_without_the_form_counter_is_never_healthy():
    """Without kvscope_restore_ceiling_rounds_total neither ceiling form can be told (the
    latest cut round's gauges do not say how many rounds of each form there were): both
    checks say so, and a truncated restore is not called healthy."""
    d = _gpu_report()
    for k in [k for k in d if not isinstance(k, str) and k[0] == S.RESTORE_CEILING_ROUNDS.name]:
        del d[k]
    report = diagnose(evidence(d, declare=False))
    assert report.status != "healthy" and report.exit_code != 0, report.status
    unchecked = {u.check for u in report.unchecked}
    assert {"capacity_ceiling_truncated", "capacity_ceiling_concurrency"} <= unchecked, unchecked


def test_not_stored_shortfalls_are_healthy():
    d = _gpu_report()
    d[S.HIT_TOKENS.name] = [0, 1600]
    d[S.RESTORE_HELD_TOKENS.name] = [0, 1600]
    d[L(S.RESTORE_SHORT_ROUNDS.name, reason="row_ceiling")] = [0, 0]
    d[L(S.RESTORE_SHORT_ROUNDS.name, reason="not_stored")] = [0, 1]
    d[L(S.RESTORE_CEILING_ROUNDS.name, form="alone")] = [0, 0]
    for m in (S.LAST_CEILING_OFFERED_TOKENS, S.LAST_CEILING_HELD_TOKENS, S.LAST_CEILING_ROWS_NEEDED,
              S.LAST_CEILING_CONCURRENT_REQUESTS, S.LAST_CEILING_CONCURRENT_ROWS):
        del d[m.name]
    assert diagnose(evidence(d)).top.id == "healthy"


# ---- the H200 runs (tests/fixtures/truncated/: vllm.LLM, tiering + fs, 2000-token
# prompt all on disk, 100 or 80 rows; engine truth there: 0 tokens restored, same output;
# recorded 2026-12-01 with kvscope_restore_ceiling_rounds_total, which both ceiling checks
# need) ----
H200_RUNS = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "truncated")
                   .glob("truncated-*.om.gz"))
_SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+) (\S+)$')


def _recording(path: Path) -> RawWindow:
    """An OpenMetrics recording (one sample per line, with timestamps) as a scrape window."""
    data: dict = defaultdict(list)
    with gzip.open(path, "rt") as f:
        for line in f:
            m = _SAMPLE.match(line.strip())
            if m and not line.startswith("#"):
                name, labels, value, t = m.groups()
                data[(name, tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels or ""))))].append(
                    (float(t), float(value)))
    series = []
    for (name, labels), samples in data.items():
        lb = dict(labels)
        target = lb.pop("instance", "recording")
        lb.pop("job", None)
        series.append(Series(name, tuple(sorted(lb.items())), target, tuple(sorted(samples))))
    t0 = min(s.samples[0][0] for s in series)
    t1 = max(s.samples[-1][0] for s in series)
    return RawWindow(SourceInfo(kind="scrape", location=str(path), start=t0, end=t1, now=t1,
                                lifetime=True, recent_span=2.0), tuple(series))


@pytest.mark.parametrize("path", H200_RUNS, ids=[p.name for p in H200_RUNS])
def test_the_h200_runs_are_named_truncated(path):
    report = diagnose_raw(_recording(path))
    assert report.top.id == "capacity_ceiling_truncated", [f.id for f in report.verdicts]
    ev = report.evidence
    assert ev.coverage.ceiling_held.last == 2000  # 125 chunks on disk, as the engine had them
    assert ev.coverage.ceiling_rows_needed.last == 125 > ev.primary_rows
    assert ev.coverage.ceiling(S.CeilingForm.ALONE).last >= 1  # the series the form is read from


# ---- prompts stored in part (store jobs refused for lack of space), the oracle matrix's
# g124/g132/g198: the re-ask restored all the tiers held, the rest was never stored ----
def _stored_in_part(store_refused_rounds: int) -> dict:
    """32 store jobs fit and their keys reached the disk, 4 were refused; the re-ask
    got the 16 tokens the tiers held of a 144-token prefix."""
    d = base(rows=7)
    d[L(S.LOOKUP_ROUNDS.name, verdict="hit")] = [0, 1]
    d[L(S.LOOKUP_ROUNDS.name, verdict="miss")] = [0, 4]
    d[S.HIT_TOKENS.name] = [0, 16]
    d[S.RESTORE_HELD_TOKENS.name] = [0, 16]
    d[L(S.STORE_JOBS.name, result="prepared")] = [0, 32]
    d[L(S.STORE_JOBS.name, result="no_space")] = [0, 4]
    d[L(S.CASCADES.name, result="completed")] = [0, 60]
    d[L(S.RESTORE_SHORT_ROUNDS.name, reason="not_stored")] = [0, 4]  # the cold first asks
    d[L(S.RESTORE_SHORT_ROUNDS.name, reason="store_refused")] = [0, store_refused_rounds]
    d[L(S.RESTORE_SHORT_TOKENS.name, reason="store_refused")] = [0, 128 * store_refused_rounds]
    return d


def test_a_prompt_stored_in_part_is_named_store_never_fits():
    report = diagnose(evidence(_stored_in_part(1)))
    top = report.top
    assert top.id == "store_never_fits", [f.id for f in report.verdicts]
    assert top.title == "Store never fits the primary tier (stored in part)"
    assert report.exit_code == 1
    x = top.facts
    assert (x.lifetime, x.short_rounds, x.lost_tokens) == (True, 1, 128), x
    assert (x.offered_tokens, x.held_tokens) == (16, 16), x
    assert (x.refused_jobs, x.prepared_jobs) == (4, 32), x
    assert top.next_step.startswith("Part of each such prompt is recomputed on every re-ask")
    assert (x.rows_wanted, x.primary_rows) == (18, 7), x


def test_refused_stores_never_asked_again_are_healthy():
    """Floods refused and never re-asked: no re-ask came short for it, so no incident
    (a looser rule on no_space alone read healthy geometries as incidents)."""
    report = diagnose(evidence(_stored_in_part(0)))
    assert report.top.id == "healthy", [f.id for f in report.verdicts]



# ---- the H200 geometries an outside probe could not tell apart (rows x 16 tokens
# restored): the CPU harness's per-key truth says stored in part for both
# (tests/connector/test_oracle_matrix.py runs them); a refused job is retried every step,
# decode steps too, so refusals outnumber the jobs that fit many times over ----
def _gpu_stored_in_part(groups: tuple[tuple[str, str], ...], rows: int, batched: int,
                        offered: int, prompt: int, refused: int, prepared: int) -> dict:
    d = base(rows=rows)
    del d[info(rows=rows)]
    d[info(rows=rows, chunk_tokens="16", max_num_batched_tokens=str(batched))] = [1, 1]
    for g, kind in groups:
        d[L(S.KV_GROUP_INFO.name, kv_group=g, kind=kind, tokens_per_block="16")] = [1, 1]
        d[L(S.LOOKUPS.name, kv_group=g, result="hit")] = [0, offered // 16]
    d[L(S.LOOKUP_ROUNDS.name, verdict="hit")] = [0, 1]
    d[L(S.LOOKUP_ROUNDS.name, verdict="miss")] = [0, 6]
    d[S.HIT_TOKENS.name] = [0, offered]
    d[S.RESTORE_HELD_TOKENS.name] = [0, offered]
    d[L(S.STORE_JOBS.name, result="prepared")] = [0, prepared]
    d[L(S.STORE_JOBS.name, result="no_space")] = [0, refused]
    d[L(S.CASCADES.name, result="completed")] = [0, 6 * offered // 16 * len(groups)]
    d[L(S.RESTORE_SHORT_ROUNDS.name, reason="not_stored")] = [0, 6]
    d[L(S.RESTORE_SHORT_ROUNDS.name, reason="store_refused")] = [0, 1]
    d[L(S.RESTORE_SHORT_TOKENS.name, reason="store_refused")] = [0, prompt - offered]
    d[L(S.RESTORE_STOPPED_ROUNDS.name, kv_group="0", reason="not_stored")] = [0, 6]
    d[L(S.RESTORE_STOPPED_ROUNDS.name, kv_group="0", reason="store_refused")] = [0, 1]
    return d


def test_the_h200_48_row_run_is_stored_in_part_with_confidence():
    """48 rows, a 2,000-token prompt, 384 tokens a step: 768 tokens restored, 122 jobs
    refused, 15 prepared (the CPU harness, 16 tokens out, as the H200 run: 123 and 15)."""
    report = diagnose(evidence(_gpu_stored_in_part(
        (("0", "full_attention"),), rows=48, batched=384, offered=768, prompt=2000,
        refused=122, prepared=15)))
    top = report.top
    assert top.id == "store_never_fits", [f.id for f in report.verdicts]
    assert top.title.endswith("(stored in part)"), top.title
    assert top.confidence >= 0.85, top.confidence
    x = top.facts
    assert isinstance(x, StoredInPartFacts), x  # not the never-stored form
    assert x.lost_tokens == 1232, x
    assert (x.offered_tokens, x.held_tokens) == (768, 768), x
    # refusals outnumber prepared jobs: a refused job is retried every step
    assert x.lifetime and (x.refused_jobs, x.prepared_jobs) == (122, 15), x
    assert x.refused_jobs > MOSTLY_REFUSED * x.prepared_jobs, x
    # room for one more job in flight: 48 + 24, + 25 %
    assert (x.rows_wanted, x.primary_rows, x.job.rows_per_job) == (90, 48, 24), x


def test_the_h200_hybrid_run_names_the_group_that_stopped_the_offer():
    """A Gemma2-style model (full + sliding window), 80 rows, 256 tokens a step: 512 of
    1,776 tokens restored, the full-attention group's stored prefix ended there."""
    report = diagnose(evidence(_gpu_stored_in_part(
        (("0", "full_attention"), ("1", "sliding_window")), rows=80, batched=256,
        offered=512, prompt=1776, refused=145, prepared=14)))
    top = report.top
    assert top.id == "store_never_fits" and top.confidence >= 0.85, \
        [(f.id, f.confidence) for f in report.verdicts]
    x = top.facts
    assert x.stopped_groups == (StoppedGroup("0", "full_attention", 1),), x
    assert (x.job.chunks, x.job.chunk_tokens, x.job.kv_groups, x.job.rows_per_job) \
        == (16, 16, 2, 32), x


def test_a_restore_cut_at_the_rows_while_more_was_held_is_the_ceiling_despite_refusals():
    """The same refusal counts, but the tiers held more of the prefix than the rows let
    through (cut at the row ceiling): the truncated form, naming its group."""
    d = _gpu_report({
        L(S.STORE_JOBS.name, result="prepared"): [0, 15],
        L(S.STORE_JOBS.name, result="no_space"): [0, 122],
        L(S.KV_GROUP_INFO.name, kv_group="0", kind="full_attention", tokens_per_block="16"):
            [1, 1],
        L(S.KV_GROUP_INFO.name, kv_group="1", kind="sliding_window", tokens_per_block="16"):
            [1, 1],
        L(S.LOOKUPS.name, kv_group="1", result="hit"): [0, 4],
        L(S.RESTORE_STOPPED_ROUNDS.name, kv_group="0", reason="row_ceiling"): [0, 1],
    })
    report = diagnose(evidence(d))
    top = report.top
    assert top.id == "capacity_ceiling_truncated", [f.id for f in report.verdicts]
    assert top.confidence >= 0.75
    x = top.facts
    assert x.ceiling_groups.no_free_row == (StoppedGroup("0", "full_attention", 1),), x


def test_a_concurrent_cut_of_a_hybrid_model_names_the_group_whose_miss_vetoed():
    """Two KV groups: the concurrent restores' window group missed (its promotion found no
    row) and vetoed the full-attention group's hits (the CPU harness's hybrid geometry)."""
    d = _gpu_report({
        S.LAST_CEILING_OFFERED_TOKENS.name: [0, 0],
        S.LAST_CEILING_HELD_TOKENS.name: [512, 512],
        S.LAST_CEILING_ROWS_NEEDED.name: [64, 64],
        L(S.RESTORE_CEILING_ROUNDS.name, form="alone"): [0, 0],
        L(S.RESTORE_CEILING_ROUNDS.name, form="concurrent"): [0, 3],
        L(S.KV_GROUP_INFO.name, kv_group="0", kind="full_attention", tokens_per_block="16"):
            [1, 1],
        L(S.KV_GROUP_INFO.name, kv_group="1", kind="sliding_window", tokens_per_block="16"):
            [1, 1],
        L(S.LOOKUPS.name, kv_group="1", result="miss"): [0, 9],
        L(S.RESTORE_STOPPED_ROUNDS.name, kv_group="1", reason="group_veto"): [0, 3],
    })
    report = diagnose(evidence(d))
    assert report.top.id == "capacity_ceiling_concurrency", [f.id for f in report.verdicts]
    assert report.top.facts.ceiling_groups.group_veto == (
        StoppedGroup("1", "sliding_window", 3),), report.top.facts
