"""The workload ``kv-diagnose plan`` is checked on: waves of concurrent re-asks of long prompts.

One :class:`Workload` on one CPU engine (:mod:`kvscope.sim.cpu_engine`, vLLM's real
scheduler, the tiering manager with its CPU primary tier and the fs tier): ask
``concurrency`` prompts one by one (each is stored and cascades to disk), then
``waves`` times: flood the GPU blocks and the primary tier with other prompts, take the
truth of what the tiers hold for each prompt, re-ask every prompt at once. Each re-ask
restores its prefix from disk through the primary tier's rows, all of them at the same
time: the concurrency form of the capacity ceiling when the rows are too few.

The truth (:class:`WaveTruth`) is the engine's, never kvscope's counters: ``held`` from
the tiers themselves before the re-ask (``oracle_truth.held_tokens``: the tokens a full
restore would give), ``restored`` from vLLM's scheduler (the re-ask's
``num_external_cached_tokens``: tokens the connector loaded instead of computing).
Coverage = restored / held, summed over every re-ask of every wave that ended (restored,
or cut and recomputed); a re-ask still deferred when the wave's step budget ran out (the
self-evicting livelock) is neither and is counted apart (``unfinished``): the same rounds
kvscope's coverage counts (``kvscope_restore_held_tokens_total`` grows when a round ends).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt

CHUNK = 16  # tokens per block = per offloaded chunk
ASK_TOKENS = 2  # tokens each ask generates
SCRAPE_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Workload:
    concurrency: int = 24  # prompts re-asked at once
    prompt_tokens: int = 2048
    waves: int = 1  # times every prompt is re-asked together (a flood before each)
    step_tokens: int = 256  # max_num_batched_tokens
    seed: int = 0
    promotion_delay_steps: int = 0  # a promotion completes this many steps later (a slow disk)
    kv_groups: int = 1  # KV groups: a restore pins a row per chunk of each full-attention one
    # tokens of the last group's attention window (a hybrid model's sliding-window group:
    # a restore pins that group's rows for the window alone); None: every group full
    sliding_window: int | None = None

    @property
    def chunks(self) -> int:
        return -(-self.prompt_tokens // CHUNK)

    @property
    def gpu_blocks(self) -> int:
        """GPU blocks for every re-ask at once (a block per chunk of each KV group), and a
        little more."""
        return self.kv_groups * self.concurrency * (self.chunks + 2) + 16

    @property
    def floods(self) -> int:
        """Prompts that push every re-asked prompt out of the GPU prefix cache."""
        return self.gpu_blocks // (self.kv_groups * self.chunks) + 1

    def prompts(self) -> list[list[int]]:
        return [prompt(self.seed * 10_000 + i, self.prompt_tokens) for i in range(self.concurrency)]

    def flood_prompts(self, wave: int) -> list[list[int]]:
        base = self.seed * 10_000 + 5_000 + wave * 1_000
        return [prompt(base + i, self.prompt_tokens) for i in range(self.floods)]

    def engine_config(self, rows: int, **over) -> EngineConfig:
        cfg = EngineConfig(rows=rows, tiering=True, block_size=CHUNK,
                           num_gpu_blocks=self.gpu_blocks,
                           max_num_batched_tokens=self.step_tokens,
                           max_num_seqs=max(8, self.concurrency),
                           max_model_len=max(4096, self.prompt_tokens + 64),
                           promotion_delay_steps=self.promotion_delay_steps,
                           kv_groups=self.kv_groups, sliding_window=self.sliding_window)
        for k, v in over.items():
            setattr(cfg, k, v)
        return cfg

    @property
    def window_chunks(self) -> int | None:
        return -(-self.sliding_window // CHUNK) if self.sliding_window else None

    def step_budget(self) -> int:
        """Steps one wave may take: prefilling every prompt from scratch, four times."""
        return 4 * -(-self.concurrency * self.prompt_tokens // self.step_tokens) + 200

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class WaveTruth:
    held: list[int]  # per re-ask: tokens the tiers held for its prefix right before it
    restored: list[int] = field(default_factory=list)  # per re-ask: tokens vLLM loaded
    finished: bool = True
    # re-asks still not finished when the wave's step budget ran out (deferred forever, say):
    # left out of the coverage and reported apart: a request that never ends neither
    # restored nor recomputed
    unfinished: int = 0
    ended: list[bool] = field(default_factory=list)  # per re-ask (empty: every one ended)


def truth_totals(waves: list[dict]) -> dict:
    """Engine truth summed over ``waves`` (each a :class:`WaveTruth` as a dict, from the
    CPU engine or a GPU engine process): held and restored tokens of the re-asks that
    ended, their coverage, how many ended whole, and how many never ended."""
    held = restored = whole = restores = unfinished = 0
    for w in waves:
        ended = w.get("ended")
        if ended is None:  # recorded before re-asks were told apart: only if none hung
            if w.get("unfinished"):
                raise ValueError("a wave with unfinished re-asks but no per-re-ask 'ended'")
            ended = [True] * len(w["held"])
        for h, r, e in zip(w["held"], w["restored"], ended, strict=True):
            restores += 1
            if not e:
                unfinished += 1
                continue
            held += h
            restored += min(r, h)
            whole += 1 if h and r >= h else 0
    return {"held_tokens": held, "restored_tokens": restored,
            "coverage": restored / held if held else None, "restores": restores,
            "restores_whole": whole, "unfinished": unfinished}


@dataclass
class RunResult:
    rows: int
    row_bytes: int
    waves: list[WaveTruth]
    seconds: float
    window: object | None = None  # the kvscope exporter's RawWindow, when asked for

    def totals(self) -> dict:
        return truth_totals([asdict(w) for w in self.waves])

    @property
    def coverage(self) -> float | None:
        """Engine truth: tokens restored / tokens the tiers held, over the re-asks that ended."""
        return self.totals()["coverage"]

    def as_dict(self) -> dict:
        return {"rows": self.rows, "row_bytes": self.row_bytes, **self.totals(),
                "waves": [asdict(w) for w in self.waves], "seconds": round(self.seconds, 1)}


def ask_each(engine: CPUEngine, work: Workload) -> None:
    """Ask every prompt of ``work`` one by one, each stored and cascaded to disk."""
    for p in work.prompts():
        engine.generate(p, ASK_TOKENS, max_steps=work.step_budget())
        engine.drain()


def flood(engine: CPUEngine, work: Workload, wave: int) -> None:
    """Push every prompt out of the GPU blocks and the primary tier before ``wave``."""
    for f in work.flood_prompts(wave):
        engine.generate(f, 1, max_steps=work.step_budget())
        engine.drain()


def run_cpu(work: Workload, rows: int, *, window: bool = False) -> RunResult:
    """Run ``work`` on a CPU engine of ``rows`` primary rows; ``window``: also scrape
    kvscope's exporter after the last wave (the RawWindow ``kv-diagnose plan`` reads)."""
    from kvscope.sim.oracle_truth import held_tokens, request_keys, tier_lookup

    t0 = time.monotonic()
    engine = CPUEngine(work.engine_config(rows))
    try:
        holds = tier_lookup(engine)
        prompts = work.prompts()
        ask_each(engine, work)
        keys = [request_keys(engine, p) for p in prompts]
        waves = []
        for w in range(work.waves):
            flood(engine, work, w)
            truth = WaveTruth(held=[held_tokens(k, holds, len(p), CHUNK, work.window_chunks)
                                    for k, p in zip(keys, prompts, strict=True)])
            rids = [engine.add_request(p, ASK_TOKENS) for p in prompts]
            try:
                engine.run_until_done(rids, max_steps=work.step_budget())
            except TimeoutError:
                pass  # the budget ran out: what ended is in engine.finished
            truth.ended = [r in engine.finished for r in rids]
            truth.finished, truth.unfinished = all(truth.ended), truth.ended.count(False)
            truth.restored = [engine.finished[r].num_external_tokens if e else 0
                              for r, e in zip(rids, truth.ended, strict=True)]
            engine.drain()
            waves.append(truth)
        raw = _scrape(engine) if window else None
        return RunResult(rows, engine.row_bytes, waves, time.monotonic() - t0, raw)
    finally:
        engine.close()


def _scrape(engine: CPUEngine):
    from kvscope.diagnostics.sources.scrape import scrape_window
    from kvscope.exporters.prometheus import start_exporter

    engine.refresh()
    exporter = start_exporter([engine.connector.kvscope_recorder]
                              + [r.connector.kvscope_recorder for r in engine.ranks], 0)
    try:
        return scrape_window([exporter.url], SCRAPE_INTERVAL_S)
    finally:
        exporter.close()


# ---- the check: plan from a window, then the planned size and 10 % fewer -------------------
def plan_window(raw, target: float):
    """``kv-diagnose plan`` on a RawWindow: its parser, model (the formatter reads the result)."""
    from kvscope.diagnostics.evidence.build import build_evidence
    from kvscope.diagnostics.plan.coverage import make_plan
    from kvscope.diagnostics.plan.inputs import read_inputs

    return make_plan(read_inputs(build_evidence(raw)), target)


def check_sizes(plan, fewer: tuple[float, ...] = (0.10,)) -> dict[str, int]:
    """The row counts the plan is checked at: its own, and each share ``fewer`` rows
    (``plan - 10 %``: the tightness check; 20 % fewer shows where the misses go on)."""
    import math

    return {"plan": plan.rows, **{f"plan - {f:.0%}".replace("%", " %"):
                                  math.floor(plan.rows * (1 - f)) for f in fewer}}


def judge_size(run: dict, k: int, concurrency: float, other_loss: float, reach: int,
               partial_cut: bool = False, store_rows: int = 0) -> dict:
    """One checked size: the model's prediction at ``run``'s rows against its measured
    coverage (``run``: a run's ``as_dict()``, or a recorded one's totals)."""
    from kvscope.diagnostics.plan.coverage import coverage_at

    predicted, at_least = coverage_at(run["rows"], k, concurrency, other_loss, reach,
                                      partial_cut, store_rows)
    meas = run["coverage"]
    return {"rows": run["rows"], "predicted": predicted, "at_least": at_least,
            "measured": meas, "error": abs(predicted - meas) if meas is not None else None,
            "unfinished": run.get("unfinished", 0),
            "at_least_held": meas is not None and meas >= at_least - 1e-9}


def judge(plan, runs: dict[str, dict], target: float, max_error: float) -> tuple[dict, dict]:
    """Predicted vs measured coverage at each checked size (``runs``: label -> a run's
    ``as_dict()``), and the checks: the plan reaches ``target`` with every re-ask finished,
    10 % fewer rows miss it (or the plan's notes say why they need not: its headroom for
    one step's stores is 10 % of it or more), the prediction is within ``max_error`` at
    every size."""
    from kvscope.diagnostics.plan.coverage import headroom_covers_short_by

    other = plan.inputs.other_loss.value if plan.inputs.other_loss else 0.0
    sizes, checks = {}, {}
    for label, run in runs.items():
        sizes[label] = s = judge_size(run, plan.rows_per_restore, plan.concurrency, other,
                                      plan.partial_reach, plan.partial_cut,
                                      plan.window_store_rows)
        checks[f"{label}: prediction error <= {max_error:g}"] = (s["error"] is not None
                                                                 and s["error"] <= max_error)
    plan_cov, short_cov = runs["plan"]["coverage"], runs["plan - 10 %"]["coverage"]
    checks[f"plan: measured >= target {target:g}"] = plan_cov is not None and plan_cov >= target - 1e-9
    checks["plan: every re-ask finished"] = runs["plan"].get("unfinished", 0) == 0
    said = headroom_covers_short_by(plan.rows, plan.reserve)
    checks[f"plan - 10 %: measured < target {target:g}" + (" (or headroom said)" if said else "")] = (
        short_cov is not None and (short_cov < target or said))
    return sizes, checks


def verify_cpu(work: Workload, target: float = 0.99, window_rows: int | None = None,
               max_error: float = 0.05, log=None) -> dict:
    """The whole check on CPU engines: a window at ``window_rows`` (default: half of every
    restore at once), the plan from it, the engine at the planned rows and at 10 % fewer."""
    from kvscope.diagnostics.plan.format import format_plan, plan_to_dict

    say = log or (lambda _msg: None)
    window_rows = window_rows or work.concurrency * work.chunks // 2
    win = run_cpu(work, window_rows, window=True)
    say(f"window: {window_rows} rows, measured coverage {win.coverage:.3f} ({win.seconds:.0f} s)")
    plan = plan_window(win.window, target)
    runs = {}
    for label, rows in check_sizes(plan).items():
        runs[label] = run_cpu(work, rows).as_dict()
        say(f"{label}: {rows} rows, measured coverage {runs[label]['coverage']:.3f} "
            f"({runs[label]['seconds']:.0f} s)")
    sizes, checks = judge(plan, runs, target, max_error)
    return {"workload": work.as_dict(), "target": target, "max_error": max_error,
            "window": win.as_dict(), "plan": plan_to_dict(plan), "plan_text": format_plan(plan),
            "sizes": sizes, "runs": runs, "checks": checks, "passed": all(checks.values())}
