"""Which request attribute tells the offloading connector not to read offloaded KV.

0.26 .. 0.33: ``Request.skip_reading_prefix_cache`` (on with ``prompt_logprobs`` or the
sampling parameter of that name), which the connector's lookup checks. 0.34:
``Request.skip_reading_external_kv``, a property true whenever the request bounds its
prefix-cache hit (``prefix_cache_hit_limit``: the same two cases, and prompt scoring), which
the connector checks instead; ``skip_reading_prefix_cache`` is then a sampling parameter only.
"""

from __future__ import annotations


def attribute() -> str:
    """The name the installed vLLM's connector reads on a request (getattr, default False)."""
    from vllm.v1.request import Request

    if isinstance(getattr(Request, "skip_reading_external_kv", None), property):  # 0.34
        return "skip_reading_external_kv"
    return "skip_reading_prefix_cache"
