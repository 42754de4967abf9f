"""vLLM's GPU KV-cache block pool, as the scheduler binds it to its connector.

Both supported releases hand the connector the scheduler's ``BlockPool`` once, after the
KV-cache manager is built: 0.26 calls ``connector.bind_gpu_block_pool(pool)``; 0.33 calls
``connector.bind_kv_cache_manager(manager)``, whose base implementation calls
``bind_gpu_block_pool(manager.block_pool)``. So overriding ``bind_gpu_block_pool`` (as
``ObservedOffloadingConnector`` does) sees the pool on both.

What is read (the same in 0.26 and 0.33): ``num_gpu_blocks`` and ``get_num_free_blocks()``
(the free queue's length: blocks no request holds, prefix-cached ones included). The pool
takes one block out of the free queue at start for good (its null block), which
``get_usage`` leaves out too; so does kvscope. Read only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def gpu_blocks_in_use(pool: Any) -> tuple[int, Callable[[], int]] | None:
    """(total blocks, a reader of the blocks in use now) for vLLM's block pool, the null
    block left out of both; None when ``pool`` is not one. The reader is a bound method and
    one subtraction: O(1), cheap enough for the end of a step on the scheduler thread."""
    free = getattr(pool, "get_num_free_blocks", None)
    try:
        total = int(getattr(pool, "num_gpu_blocks", 0) or 0) - 1  # the null block
    except (TypeError, ValueError):
        return None
    if free is None or total <= 0:
        return None

    def in_use() -> int:
        return total - free()

    return total, in_use
