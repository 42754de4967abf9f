"""vLLM 0.26's store after finish, reproduced on vLLM's scheduler on CPU, every run.

Four primary rows. Request A's store takes all four and stays in flight (a slow GPU->CPU
copy: the rank holds its report, :class:`HeldStores`). Request R's store finds no free row
(vLLM: "cannot store chunks") on every step it runs, so R finishes with no store pending and
vLLM 0.26 deletes its tiering state. A's store completes the step before, its rows become
evictable (their copy to the disk tier, started as the store completed, done by the next
step), and the step after R's finish prepares R's last store, which now fits: 0.26's
``TieringOffloadingManager.prepare_store`` raises ``KeyError(R)`` from the scheduler's step
(``connector.compat.store_after_finish``). vLLM 0.27+ prepares that store before it forgets
the request: the same drive runs through. With kvscope the store is skipped instead (no row
taken, A's rows kept), counted in ``kvscope_vllm_faults_contained_total``.

The other way there, :func:`drive_last_token`: with ``offload_prompt_only`` false, a request
whose last generated token fills a chunk; its store of that chunk is built the step after it
finished, its state already gone (no refused store needed: one request is enough).

The connector option is kvscope's ``contain_vllm_faults`` (:func:`kvscope_options`), the
same in any engine (``vllm serve``'s ``--kv-transfer-config`` carries it on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt

ROWS = 4
BLOCK = 16
HOLDER_TOKENS = ROWS * BLOCK  # A: one chunk per row, every row
SHORT_TOKENS = 2 * BLOCK  # R: two chunks, refused while A's store holds the rows
SHORT_MAX_TOKENS = 3
MAX_STEPS = 50


class HeldStores:
    """``EngineConfig.stuck``: the ranks hold their store reports while ``holding``."""

    def __init__(self) -> None:
        self.holding = True

    def __call__(self, rank: int, kind: str, job_id: int) -> bool:
        return self.holding and kind == "store"


def kvscope_options(contain: bool | None) -> dict[str, Any]:
    """kvscope's connector option for it; None: kvscope's default (contained)."""
    return {} if contain is None else {"contain_vllm_faults": contain}


def engine_config(connector: str = "ObservedOffloadingConnector", contain: bool | None = None,
                  **overrides: Any) -> EngineConfig:
    cfg: dict[str, Any] = dict(rows=ROWS, block_size=BLOCK, world_size=1, num_gpu_blocks=32,
                               kv_groups=1, tiering=True, stuck=HeldStores(),
                               connector=connector, kvscope_options=kvscope_options(contain))
    cfg.update(overrides)
    return EngineConfig(**cfg)


@dataclass
class Drive:
    holder: str  # A: its store held the rows
    short: str  # R: refused, finished, then its last store prepared
    holder_keys: list[bytes]  # A's offload keys (one KV group)
    short_steps: int  # steps R ran (on 0.26 each one a store refused) before it finished


def drive(e: CPUEngine) -> Drive:
    """The sequence above on a built engine; on vLLM 0.26 without containment the last
    step raises vLLM's KeyError. The engine is left as the sequence ends (keep stepping it)."""
    held: HeldStores = e.cfg.stuck
    a = e.add_request(prompt(1, HOLDER_TOKENS), 2)
    e.run_until_done([a], max_steps=MAX_STEPS)
    keys = list(e.connector.connector_scheduler._req_status[a].group_states[0].offload_keys)
    held.holding = False
    r = e.add_request(prompt(2, SHORT_TOKENS), SHORT_MAX_TOKENS)
    req = e.scheduler.requests[r]
    steps = 0
    while req.num_output_tokens < SHORT_MAX_TOKENS - 2:  # R's last two steps are next
        if steps >= MAX_STEPS:
            raise TimeoutError(f"{r} made no progress in {MAX_STEPS} steps")
        e.step()
        steps += 1
    # A's store completes with the next step; its rows are pinned by their copy to the
    # disk tier through the step that finishes R, and evictable on the one after
    for rank in e.ranks:
        rank.connector.connector_worker.spec._sim_worker.release_held()
    e.step()
    e.step()
    if r not in e.finished:
        raise AssertionError(f"{r} did not finish two steps after A's store was released")
    e.step()  # R's last store is prepared: vLLM 0.26 raises here
    return Drive(a, r, keys, steps + 2)


LAST_PROMPT_TOKENS = 6 * BLOCK
LAST_MAX_TOKENS = BLOCK  # 96 + 16 tokens: the last one fills chunk 7


def last_token_config(connector: str = "ObservedOffloadingConnector",
                      contain: bool | None = None, **overrides: Any) -> EngineConfig:
    cfg: dict[str, Any] = dict(rows=12, stuck=None,
                               offload_options={"offload_prompt_only": False})
    cfg.update(overrides)
    return engine_config(connector, contain, **cfg)


def drive_last_token(e: CPUEngine) -> str:
    """One request whose last token fills a chunk, then the step that prepares that chunk's
    store (vLLM 0.26 raises there); the request's id."""
    rid = e.add_request(prompt(1, LAST_PROMPT_TOKENS), LAST_MAX_TOKENS)
    e.run_until_done([rid], max_steps=MAX_STEPS)
    e.step()
    return rid


FLOOD_TOKENS = 28 * BLOCK  # pushes A and R out of the 32-block GPU prefix cache


def serve_after(e: CPUEngine) -> dict[str, Any]:
    """The engine goes on: a prompt that floods the GPU prefix cache, then A and R asked
    again (A restored from the offload tiers). Finished results by name."""
    done = {"flood": e.generate(prompt(3, FLOOD_TOKENS), 2, max_steps=MAX_STEPS)}
    e.drain()
    done["holder_again"] = e.generate(prompt(1, HOLDER_TOKENS), 2, max_steps=MAX_STEPS)
    done["short_again"] = e.generate(prompt(2, SHORT_TOKENS), SHORT_MAX_TOKENS,
                                     max_steps=MAX_STEPS)
    e.drain()
    return done


def clean_run(**overrides: Any) -> dict[str, Any]:
    """The same requests on an engine whose stores are never held (R's store fits, no
    store after finish happens): what every request gets when nothing goes wrong."""
    with CPUEngine(engine_config(stuck=None, **overrides)) as e:
        done = {"holder": e.generate(prompt(1, HOLDER_TOKENS), 2, max_steps=MAX_STEPS)}
        e.drain()
        done["short"] = e.generate(prompt(2, SHORT_TOKENS), SHORT_MAX_TOKENS,
                                   max_steps=MAX_STEPS)
        e.drain()
        done.update(serve_after(e))
    return done
