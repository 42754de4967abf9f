"""The CPU harness's model: KV bytes that follow the prefix, tokens that follow the KV.

No weights. Each scheduled token writes, into every layer of every rank, a pattern
derived from the hash of its prefix (and the rank, KV group and layer); the next token
is a digest of every KV byte the request's attention reads, on every rank. A restore
that loads the right bytes leaves the output as it was; wrong bytes change it, as on a
GPU. ``write_tiny_llama`` gives vLLM's scheduler the model shape it needs.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import torch

VOCAB = 1024


class PatternModel:
    """The forward pass and the sampler of the simulated ranks."""

    def __init__(self, layers: list[str], kv_groups: int, block_sizes: list[int],
                 page_bytes: int, sliding_window: int | None) -> None:
        """``block_sizes``: each KV group's block size in tokens (one page each: a group with
        larger blocks has fewer bytes per token, as vLLM's hybrid models unify page sizes)."""
        self.layers = layers
        self.kv_groups = kv_groups
        self.block_sizes = block_sizes
        self.page = page_bytes
        self.sliding_window = sliding_window
        self._prefix_digest: dict[str, tuple[int, bytes]] = {}

    def forward(self, scheduler: Any, so: Any, rank: int, kv: dict[str, torch.Tensor]) -> None:
        """Write each scheduled token's KV pattern into this rank's blocks."""
        for rid, n in so.num_scheduled_tokens.items():
            req = scheduler.requests[rid]
            end = req.num_computed_tokens  # already advanced by schedule()
            start = end - n
            tokens = req.all_token_ids
            block_ids = scheduler.kv_cache_manager.get_block_ids(rid)
            for pos in range(start, end):
                h = self._prefix_hash(rid, tokens, pos)
                for g, blocks in enumerate(block_ids):
                    bs = self.block_sizes[g]
                    tok_bytes = self.page // bs
                    for li, name in enumerate(self.layers[g::self.kv_groups]):
                        pattern = hashlib.blake2b(
                            h + bytes([rank, g, li]), digest_size=16).digest()
                        data = (pattern * (tok_bytes // len(pattern) + 1))[:tok_bytes]
                        off = (pos % bs) * tok_bytes
                        kv[name][blocks[pos // bs], off:off + tok_bytes] = torch.frombuffer(
                            bytearray(data), dtype=torch.int8)

    def _prefix_hash(self, rid: str, tokens, pos: int) -> bytes:
        done, h = self._prefix_digest.get(rid, (0, b""))
        if pos < done:  # recompute from scratch (preemption / recompute)
            done, h = 0, b""
        for p in range(done, pos + 1):
            h = hashlib.blake2b(h + int(tokens[p]).to_bytes(4, "little"), digest_size=16).digest()
        self._prefix_digest[rid] = (pos + 1, h)
        return h

    def sample_all(self, scheduler: Any, so: Any,
                   ranks_kv: list[dict[str, torch.Tensor]]) -> list[list[int]]:
        sampled = []
        for rid in so.num_scheduled_tokens:
            req = scheduler.requests[rid]
            sampled.append([self._sample(scheduler, req, ranks_kv)]
                           if req.num_computed_tokens >= req.num_tokens else [])
        return sampled

    def _sample(self, scheduler: Any, req: Any, ranks_kv: list[dict[str, torch.Tensor]]) -> int:
        """Next token = digest of every KV byte this request has, on every rank."""
        h = hashlib.blake2b(digest_size=8)
        n = req.num_computed_tokens  # attention reads positions < n, nothing beyond
        block_ids = scheduler.kv_cache_manager.get_block_ids(req.request_id)
        window = self.sliding_window
        for kv in ranks_kv:
            for g, blocks in enumerate(block_ids):
                bs = self.block_sizes[g]
                tok_bytes = self.page // bs
                # a sliding-window layer attends to the last `window` positions only
                # (vLLM frees the blocks before them)
                first = (max(n - window + 1, 0) // bs
                         if window is not None and g == self.kv_groups - 1 else 0)
                for name in self.layers[g::self.kv_groups]:
                    for i, b in enumerate(blocks[:-(-n // bs)]):
                        if i < first:
                            continue
                        used = min(bs, n - i * bs) * tok_bytes
                        h.update(kv[name][b, :used].numpy().tobytes())
        return int.from_bytes(h.digest(), "little") % VOCAB


def write_tiny_llama(path: str, num_layers: int, max_len: int) -> None:
    """A config-only Llama (no weights): the scheduler needs the model's shape, not its values."""
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=max_len).save_pretrained(path)


def prompt(seed: int, n: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(3, VOCAB) for _ in range(n)]
