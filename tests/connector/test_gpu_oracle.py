"""The GPU oracle's parts that run without a GPU: its geometries, the per-geometry judging
window, the scoring it writes, and the models it builds (kvscope.sim.gpu_oracle_driver and
gpu_oracle_geometry, run on a GPU by the GPU oracle benchmark)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from kvscope.diagnostics.evidence.build import build_evidence  # noqa: E402
from kvscope.diagnostics.model import Facts, Finding  # noqa: E402
from kvscope.exporters import signals as S  # noqa: E402
from kvscope.sim import gpu_oracle_driver as gpu_oracle  # noqa: E402
from kvscope.sim import gpu_oracle_geometry as geo  # noqa: E402
from kvscope.sim.oracle import judgment, summarize  # noqa: E402
from kvscope.sim.oracle_geometry import REPORTED  # noqa: E402


def test_geometries_are_seeded_and_span_what_the_oracle_must_cover():
    phases = geo.generate(0)
    assert [p.as_dict() for p in phases] == [p.as_dict() for p in geo.generate(0)]
    assert [g for p in phases for g in p.geometries] == \
        [g for p in geo.generate(0) for g in p.geometries]
    assert geo.generate(1)[2].as_dict() != phases[2].as_dict()
    geoms = [g for p in phases for g in p.geometries]
    assert len(phases) == 8 and len(geoms) >= 30
    assert len({g.index for g in geoms}) == len(geoms)
    assert {p.kv_groups for p in phases} == {1, 2} and {p.tiering for p in phases} == {True, False}
    assert all(geo.MIN_PROMPT <= g.prompt_tokens <= geo.MAX_PROMPT for g in geoms)
    assert max(g.prompt_tokens for g in geoms) > 16_000
    assert {g.concurrency for g in geoms} == {1, 2, 3, 4}
    assert len({p.step_tokens for p in phases}) >= 3
    for p in phases:
        for g in p.geometries:
            assert g.prompt_tokens + g.output_tokens <= p.max_model_len
            # the widest re-ask fits the GPU blocks, and the floods evict it from them
            assert g.concurrency * p.kv_groups * (g.chunks + 1) <= p.num_gpu_blocks
            assert g.floods * p.kv_groups * g.chunks >= p.num_gpu_blocks
            prompts = g.prompts(gpu_oracle.VOCAB)
            assert len(prompts) == g.concurrency and {len(x) for x in prompts} == {g.prompt_tokens}
            assert all(3 <= t < 3 + gpu_oracle.VOCAB for x in prompts for t in x)
            assert not set(map(tuple, prompts)) & set(map(tuple, g.flood_prompts(gpu_oracle.VOCAB)))


def test_the_reported_h200_geometries_lead_the_gpu_run():
    """The geometries the CPU harness reproduced (kvscope.sim.oracle_geometry.REPORTED)
    are the GPU run's first two engines, with the reported shapes."""
    one, hybrid = geo.generate(0)[:2]
    cpu_one, cpu_hybrid = REPORTED["h200-48rows-384step"], REPORTED["h200-hybrid-80rows-256step"]
    for gpu, cpu in ((one, cpu_one), (hybrid, cpu_hybrid)):
        assert (gpu.rows, gpu.step_tokens, gpu.kv_groups, gpu.tiering) == \
            (cpu.rows, cpu.step_tokens, cpu.kv_groups, cpu.tiering)
        g = gpu.geometries[0]
        assert (g.prompt_tokens, g.concurrency, g.floods, g.output_tokens) == \
            (cpu.prompt_tokens, 1, cpu.floods, cpu.output_tokens)
    assert hybrid.window_tokens == geo.WINDOW_TOKENS and one.window_tokens is None


def _samples(store_refused: float, t: float) -> list:
    return [(S.RESTORE_SHORT_ROUNDS.name, (("reason", "store_refused"),), store_refused),
            (S.INFO.name, (("kvscope_version", "0.1.0"), ("primary_rows", "48"),
                           ("vllm_version", "0.26.0")), 1.0),
            (S.LAST_STEP_TIMESTAMP.name, (), t)]


def test_a_geometry_is_judged_on_its_own_window_not_the_engine_lifetime():
    """Earlier geometries on the same engine left 5 store-refused rounds; this one adds
    1: its window says 1."""
    raw = geo.window(_samples(5, 100.0), 100.0,
                     [(_samples(6, 110.0), 110.0), (_samples(6, 110.5), 110.5)], "u")
    assert not raw.source.lifetime
    assert (raw.source.start, raw.source.end) == (100.0, 110.5)
    assert raw.source.recent_span == pytest.approx(0.5, abs=2e-3)
    ev = build_evidence(raw)
    q = ev.coverage.rounds(S.ShortReason.STORE_REFUSED)
    assert (q.increase, q.recent, q.last) == (1, 0, 6)  # not still happening
    raw = geo.window(_samples(5, 100.0), 100.0,
                     [(_samples(6, 110.0), 110.0), (_samples(8, 110.5), 110.5)], "u")
    q = build_evidence(raw).coverage.rounds(S.ShortReason.STORE_REFUSED)
    assert (q.increase, q.recent) == (3, 2)


@dataclass(frozen=True)
class _OneLine(Facts):
    """A stand-in verdict's facts: one evidence line."""

    line: str

    def lines(self) -> list[str]:
        return [self.line]


def _report(*ids_conf):
    return SimpleNamespace(verdicts=[Finding(id=i, title=i.replace("_", " "), confidence=c,
                                             facts=_OneLine(f"{i} line"), next_step="")
                                     for i, c in ids_conf])


def test_scoring_agreement_false_healthy_and_confusion(tmp_path):
    rows = [
        {"truth": "never_stored", "live": judgment("never_stored", _report(
            ("store_never_fits", 0.85))), "bundle": judgment("never_stored", _report(
                ("store_never_fits", 0.85)))},
        {"truth": "truncated", "live": judgment("truncated", _report(("healthy", 1.0))),
         "bundle": judgment("truncated", _report(("capacity_ceiling_truncated", 0.9),
                                                 ("store_never_fits", 0.5)))},
        {"error": "RuntimeError: engine died"},
    ]
    assert rows[0]["live"] == {"top": "store_never_fits", "title": "store never fits",
                               "confidence": 0.85, "evidence": ["store_never_fits line"],
                               "verdicts": ["store_never_fits"], "agree": True}
    args = argparse.Namespace(seed=0, out=str(tmp_path / "gpu_oracle.json"))
    gpu_oracle.write(rows, args, 0.0, summarize)
    doc = json.loads((tmp_path / "gpu_oracle.json").read_text())
    assert doc["partial"]  # rows so far: the phases have not all ended
    assert (doc["geometries"], doc["judgments"], doc["agreement"], doc["false_healthy"]) == \
        (2, 4, 0.75, 1)
    assert doc["confusion"] == {"never_stored": {"store_never_fits": 2},
                                "truncated": {"capacity_ceiling_truncated": 1, "healthy": 1}}
    assert doc["errors"] == [{"error": "RuntimeError: engine died"}] and len(doc["rows"]) == 3


def test_rows_are_taken_in_as_phases_append_them(tmp_path):
    path = tmp_path / "rows.jsonl"
    got: list[dict] = []
    assert gpu_oracle.read_rows(str(path), 0, got.append) == 0
    path.write_text(json.dumps({"n": 1}) + "\n" + json.dumps({"n": 2}) + "\n" + '{"n": ')
    assert gpu_oracle.read_rows(str(path), 0, got.append) == 2  # the third is mid-write
    with path.open("a") as f:
        f.write("3}\n")
    assert gpu_oracle.read_rows(str(path), 2, got.append) == 3
    assert [r["n"] for r in got] == [1, 2, 3]


@pytest.mark.parametrize("kv_groups,model_type", [(1, "llama"), (2, "gemma2")])
def test_the_models_built_on_the_spot(tmp_path, kv_groups, model_type):
    gpu_oracle.make_model(str(tmp_path), kv_groups, 32_064)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == model_type
    assert cfg["max_position_embeddings"] >= 32_064 and cfg["num_hidden_layers"] == 4
    if kv_groups == 2:
        assert cfg["sliding_window"] == geo.WINDOW_TOKENS
    assert not list(tmp_path.glob("*.safetensors"))  # dummy weights
    assert (tmp_path / "tokenizer.json").exists()


class CPUDriver(gpu_oracle.Driver):
    """gpu_oracle's driver on the CPU harness's engine (vLLM's real scheduler, the CPU
    copies standing in for the GPU): the same truth and judging code, run here."""

    def __init__(self, engine) -> None:
        self.e, self.sched, self.out, self.n = engine, engine.scheduler, {}, 0
        self.core = SimpleNamespace(request_block_hasher=engine._block_hasher)
        self.eng = SimpleNamespace(step=engine.step, abort_request=lambda ids: None)

    def run(self, prompts, max_tokens, budget, abort=True):
        rids = [self.e.add_request(p, max_tokens) for p in prompts]
        for _ in range(budget):
            if all(r in self.e.finished for r in rids):
                break
            self.e.step()
        got = []
        for r in rids:
            f = self.e.finished.get(r)
            got.append({"tokens": f.output if f else [], "finished": f is not None,
                        "cached": f.num_cached_tokens if f else 0,
                        "restored": f.num_external_tokens if f else 0})
        if not abort:
            self.out.update(zip(rids, got, strict=True))
        return got


def test_a_reported_geometry_through_the_gpu_oracles_own_flow():
    """The 48-row, 384-token-step H200 geometry through gpu_oracle.run_geometry on the
    CPU harness: per-key truth stored in part, judged on its own window (after an
    earlier geometry on the same engine) as the CPU oracle judges it."""
    from kvscope.exporters.prometheus import start_exporter
    from kvscope.sim.cpu_engine import CPUEngine
    from kvscope.sim.oracle import _recorders

    phase = geo.generate(0)[0]
    cpu = REPORTED["h200-48rows-384step"]
    engine = CPUEngine(cpu.engine_config())
    exporter = start_exporter(_recorders(engine), 0)
    try:
        drv = CPUDriver(engine)  # ids below 3 + gpu_oracle.VOCAB: the CPU model's 1,024
        earlier = gpu_oracle.run_geometry(drv, phase, phase.geometries[0], exporter.url)
        again = gpu_oracle.run_geometry(drv, phase, phase.geometries[1], exporter.url)
    finally:
        exporter.close()
        engine.close()
    for row in (earlier, again):
        assert row["truth"] == "never_stored", row
        (req,) = row["requests"]
        assert 0 < req["held"] == req["restored"] < 2000 and req["same_output"], row
        assert row["geometry"]["rows_actual"] == 48
        for source in ("live", "bundle"):
            assert row[source]["agree"] and row[source]["confidence"] >= 0.75, row
            assert row[source]["title"].endswith("(stored in part)"), row
    # the second geometry's window holds its own re-ask only, not the first's too
    assert any(line.startswith("1 lookup round in the window stopped at a chunk whose store")
               for line in again["live"]["evidence"]), again["live"]["evidence"]


def test_phases_run_as_processes_and_the_deadline_stops_them(tmp_path):
    """The parallel runner on stand-in phases (a process that writes one row, one that
    hangs): rows are taken in, a hung phase is stopped at the deadline, both reported."""
    phases = geo.generate(0)[:3]
    script = tmp_path / "fake_phase.py"
    script.write_text(
        "import json, sys, time\n"
        "a = sys.argv; phase, out = int(a[a.index('--phase') + 1]), a[a.index('--out') + 1]\n"
        "if phase == 1:\n    time.sleep(60)\n"
        "open(out, 'a').write(json.dumps({'name': f'p{phase}'}) + '\\n')\n")
    got: list[dict] = []
    status = gpu_oracle.phases_in_parallel(phases, 0, 2, str(tmp_path / "o.json"), got.append,
                                           deadline_s=8, script=str(script))
    assert sorted(r["name"] for r in got) == ["p0", "p2"]
    assert status[phases[0].name]["rc"] == 0 and status[phases[0].name]["rows"] == 1
    assert status[phases[1].name]["why"] == "stopped at the deadline"
    assert status[phases[2].name]["rows"] == 1
