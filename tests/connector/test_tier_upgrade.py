"""An fs tier written by the previous vLLM release, read by this one after an upgrade.

vLLM 0.34 changed how offload keys are hashed only for models with an EAGLE/MTP drafter
(lookahead block hashes, ``connector.compat.hash_lookahead``). Without one, an operator who
upgrades with a populated disk tier keeps every restore: the previous release (its venv
beside this one, as ``make test`` builds them) fills the tier, this release re-asks the same
prompts with kvscope's connector and must restore each whole with the first outputs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kvscope.connector.compat import versions
from kvscope.sim.cpu_engine import CPUEngine, prompt
from tests.support import tier_populate

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS = {"0.34": ("0.33", ROOT / ".venv033")}  # this release -> the one before, its venv


def test_a_tier_written_by_the_previous_release_restores_whole(tmp_path):
    this = ".".join(str(p) for p in versions.release()[:2])
    if this not in PREVIOUS or not (PREVIOUS[this][1] / "bin" / "python").exists():
        pytest.skip(f"no venv of the release before vLLM {versions.VLLM_VERSION} beside this one")
    release, venv = PREVIOUS[this]
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "tests.support.tier_populate",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=True)
    before = json.loads(done.stdout.strip().splitlines()[-1])
    assert before["vllm"].startswith(release + ".") and before["block_files"] > 0
    with CPUEngine(tier_populate.config(str(tmp_path), "ObservedOffloadingConnector")) as e:
        again = []
        for seed in tier_populate.SEEDS:
            again.append(e.generate(prompt(seed, tier_populate.PROMPT_TOKENS), 2))
            e.drain()
    assert [a.output for a in again] == before["outputs"]
    assert [a.num_external_tokens for a in again] == \
        [tier_populate.PROMPT_TOKENS] * len(again)
