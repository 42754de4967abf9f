"""Fill an fs tier with four prompts on whatever vLLM this interpreter has, stock connector.

    <venv>/bin/python -m tests.support.tier_populate DIR

Writes the tier under DIR/fs (the model under DIR/model, PYTHONHASHSEED pinned) and prints
one JSON line: the vLLM release, each prompt's output, and the tier's block files. An
upgrade test runs it on the older release and re-asks the prompts on the newer one.
"""

from __future__ import annotations

import json
import os
import sys

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt

PROMPT_TOKENS = 96
SEEDS = range(1, 5)


def config(shared: str, connector: str = "OffloadingConnector") -> EngineConfig:
    return EngineConfig(rows=12, kv_groups=2, world_size=1, num_gpu_blocks=40,
                        max_num_batched_tokens=16, connector=connector,
                        fs_root=os.path.join(shared, "fs"),
                        model_dir=os.path.join(shared, "model"), hash_seed="1")


def block_files(shared: str) -> int:
    return sum(1 for d, _, fs in os.walk(os.path.join(shared, "fs")) for f in fs
               if f != "config.json")


def main(shared: str) -> None:
    import vllm

    with CPUEngine(config(shared)) as e:
        outputs = []
        for seed in SEEDS:
            outputs.append(e.generate(prompt(seed, PROMPT_TOKENS), 2).output)
            e.drain()
    print(json.dumps({"vllm": vllm.__version__, "outputs": outputs,
                      "block_files": block_files(shared)}))


if __name__ == "__main__":
    main(sys.argv[1])
