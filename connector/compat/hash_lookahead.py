"""vLLM 0.34's lookahead block hashes, and how each release keys a drafter's KV group.

With speculative decoding that drops the EAGLE/MTP drafter's trailing block
(``speculative_config.use_eagle_block_drop()``), 0.34 hashes each block together with the
``num_hash_lookahead_tokens`` tokens after it (``VllmConfig.num_hash_lookahead_tokens``,
resolved at start-up; 0 keeps the legacy hashes), and ``OffloadingConnector`` accepts it
(``supports_lookahead_block_hashes``), so no drafter chunk is dropped. (The veto a
sliding-window drafter group caused on 0.26, whose store trimmed the chunk its lookup
needed, was gone from 0.27 on: ``diagnostics/known_bugs.py``, scenario drafter-group.)
It also changes every offload key of such a model: a
tier written by 0.33 with a drafter stops hitting after the upgrade. Without a drafter the
keys are 0.33's (a 0.33-written fs tier restores whole on 0.34:
``tests/connector/test_tier_upgrade.py``).
"""

from __future__ import annotations

from typing import Any

from kvscope.exporters.signals import DrafterKeys


def lookahead_tokens(vllm_config: Any) -> int:
    """Tokens after each block its hash covers (0: legacy hashes, every release < 0.34)."""
    try:
        return int(getattr(vllm_config, "num_hash_lookahead_tokens", 0) or 0)
    except (TypeError, ValueError):
        return 0


def drafter_keys(connector_scheduler: Any, vllm_config: Any) -> dict[int, str]:
    """How vLLM keys each KV group for speculative decoding, by group index (DrafterKeys
    values): tail_dropped for a group the connector flags as an EAGLE/MTP drafter's
    (``GroupOffloadConfig.is_eagle_group``, every release) under legacy hashes, lookahead
    under 0.34's lookahead hashes, none for the others. Read once, at the first refresh."""
    configs = getattr(getattr(connector_scheduler, "config", None), "kv_group_configs", ())
    drafter = (DrafterKeys.LOOKAHEAD if lookahead_tokens(vllm_config) > 0
               else DrafterKeys.TAIL_DROPPED).value
    return {int(getattr(c, "group_idx", i)):
            drafter if getattr(c, "is_eagle_group", False) else DrafterKeys.NONE.value
            for i, c in enumerate(configs or ())}
