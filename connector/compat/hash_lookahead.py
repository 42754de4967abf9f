"""vLLM 0.34's lookahead block hashes.

With speculative decoding that drops the EAGLE/MTP drafter's trailing block
(``speculative_config.use_eagle_block_drop()``), 0.34 hashes each block together with the
``num_hash_lookahead_tokens`` tokens after it (``VllmConfig.num_hash_lookahead_tokens``,
resolved at start-up; 0 keeps the legacy hashes), and ``OffloadingConnector`` accepts it
(``supports_lookahead_block_hashes``). That is the upstream fix for a drafter group whose
trailing chunk was never stored yet always looked up, which vetoed every restore through
the cross-group AND (0.26 .. 0.33). It also changes every offload key of such a model: a
tier written by 0.33 with a drafter stops hitting after the upgrade. Without a drafter the
keys are 0.33's (a 0.33-written fs tier restores whole on 0.34:
``tests/connector/test_tier_upgrade.py``).
"""

from __future__ import annotations

from typing import Any


def lookahead_tokens(vllm_config: Any) -> int:
    """Tokens after each block its hash covers (0: legacy hashes, every release < 0.34)."""
    try:
        return int(getattr(vllm_config, "num_hash_lookahead_tokens", 0) or 0)
    except (TypeError, ValueError):
        return 0
