"""What the CPU engine served: each finished request's tokens and cache facts.

These are the engine facts verdicts are judged by (outputs, tokens served from the prefix
cache and from the connector), taken from vLLM's own ``EngineCoreOutput``s, never from
kvscope's counters; so they are collected apart from the stepping that produces them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Finished:
    request_id: str
    output: list[int]
    num_cached_tokens: int
    num_external_tokens: int


class RequestResults:
    """Tokens as each step's outputs bring them; a :class:`Finished` when a request ends."""

    def __init__(self) -> None:
        self._outputs: dict[str, list[int]] = {}
        self._prefill: dict[str, Any] = {}  # request id -> vLLM's prefill stats, until it ends
        self.finished: dict[str, Finished] = {}

    def expect(self, request_id: str) -> None:
        self._outputs[request_id] = []

    def collect(self, engine_outputs) -> None:
        """One step's ``EngineCoreOutputs`` per client, as ``update_from_output`` returns them."""
        for eco in engine_outputs.values():
            for out in eco.outputs:
                self._outputs[out.request_id].extend(out.new_token_ids)
                if out.prefill_stats is not None:
                    self._prefill[out.request_id] = out.prefill_stats
                if out.finished:
                    ps = self._prefill.pop(out.request_id, None)
                    self.finished[out.request_id] = Finished(
                        out.request_id, list(self._outputs[out.request_id]),
                        int(getattr(ps, "num_cached_tokens", 0) or 0),
                        int(getattr(ps, "num_external_cached_tokens", 0) or 0))
