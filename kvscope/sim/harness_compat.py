"""What the CPU harness builds differently per vLLM release: the harness's own compat.

The harness (``cpu_engine.py``, ``cpu_worker.py``) plays the model runner and the GPU;
these are the vLLM constructors and runner calls whose shape changed between 0.26 and
0.34. The served connector's differences are in ``kvscope.connector.compat``.
"""

from __future__ import annotations

from typing import Any

from kvscope.connector.compat import hash_lookahead, renames


def kv_cache_tensors(layers: list[str], num_blocks: int, page_bytes: int) -> list[Any]:
    """KVCacheTensor entries for layers that each own ``num_blocks`` pages, layer-outermost.

    0.26: one ``KVCacheTensor(size, shared_by=[layer])`` per layer. 0.33: every
    entry places layers within one backing allocation whose total ``size`` the
    offloading config reads from the first entry (``layers``, ``layer_stride``,
    ``block_stride``).
    """
    from vllm.v1.kv_cache_interface import KVCacheTensor

    per_layer = page_bytes * num_blocks
    if "shared_by" in KVCacheTensor.__dataclass_fields__:  # 0.26
        return [KVCacheTensor(size=per_layer, shared_by=[layer]) for layer in layers]
    return [KVCacheTensor(size=per_layer * len(layers), layers=list(layers),  # 0.33
                          layer_stride=per_layer, block_stride=page_bytes)]


def shared_region(engine_id: str, spec: Any, rank: int) -> Any:
    """A worker's SharedOffloadRegion (0.26 ``num_blocks``/``kv_bytes_per_block``,
    0.33 ``num_chunks``/``kv_bytes_per_chunk``)."""
    import inspect

    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

    params = inspect.signature(SharedOffloadRegion.__init__).parameters
    rows = renames.spec_rows_total(spec)
    sizes = ({"num_chunks": rows, "kv_bytes_per_chunk": spec.kv_bytes_per_chunk}
             if "num_chunks" in params else
             {"num_blocks": rows, "kv_bytes_per_block": spec.kv_bytes_per_chunk})
    return SharedOffloadRegion(engine_id=engine_id, rank=rank,
                               cpu_page_size=spec.cpu_page_size_per_worker, **sizes)


def region_view(region: Any, tensor_page_bytes: int) -> Any:
    """The next per-worker view of a region (0.33 ``create_next_worker_view``,
    0.26 ``create_next_view``)."""
    make = getattr(region, "create_next_worker_view", None) or region.create_next_view
    return make(tensor_page_bytes)


def finish_step(connector: Any, finished_req_ids: set[str]) -> tuple[set, set, set]:
    """What the model runner asks a worker-role connector after a forward.

    Both releases call ``wait_for_save`` first (0.33 queues stores there; a no-op
    in 0.26). 0.33 then calls ``get_transfer_results`` (with request-level
    ``failed_recving``), 0.26 ``get_finished``. Returns (sending, recving, failed).
    """
    connector.wait_for_save()
    get_results = getattr(connector, "get_transfer_results", None)
    if get_results is None:  # 0.26
        sending, recving = connector.get_finished(finished_req_ids)
        return set(sending or ()), set(recving or ()), set()
    res = get_results(finished_req_ids)
    return set(res.finished_sending), set(res.finished_recving), set(res.failed_recving)


def connector_output(failed_recving: set[str], **fields: Any) -> Any:
    """A KVConnectorOutput; ``failed_recving`` exists from 0.33 on."""
    from vllm.v1.outputs import KVConnectorOutput

    if "failed_recving" in KVConnectorOutput.__dataclass_fields__:
        fields["failed_recving"] = failed_recving
    return KVConnectorOutput(**fields)


def model_runner_output(req_ids: list[str], **fields: Any) -> Any:
    """A ModelRunnerOutput; ``req_id_to_index`` is a required field up to 0.33, gone in
    0.34 (the index is the position in ``req_ids``)."""
    from vllm.v1.outputs import ModelRunnerOutput

    if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:  # 0.26 .. 0.33
        fields["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
    return ModelRunnerOutput(req_ids=req_ids, **fields)


def gpu_blocks(spec: Any, tensors: list[Any], group_refs: list[Any]) -> tuple[list[int], list[int]]:
    """(GPU block ids, blocks per KV group) of a worker transfer's GPU side.

    0.26 and 0.33 hand the worker a ``GPULoadStoreSpec`` (``block_ids``, ``group_sizes``).
    0.34 hands it ``DevicePointers`` that vLLM resolved from those block ids as
    ``base + block * stride(0)`` of each layer tensor, group by group and layer by layer;
    the harness's "GPU" tensors are on the CPU, so each group's first layer maps back.
    """
    ids = getattr(spec, "block_ids", None)
    if ids is not None:
        sizes = list(spec.group_sizes) if spec.group_sizes else [len(ids)]
        return [int(b) for b in ids], sizes
    blocks: list[int] = []
    offset = 0
    for group, (n, refs) in enumerate(zip(spec.group_block_counts,
                                          spec.group_data_ref_counts)):
        if n:
            tensor = tensors[group_refs[group][0].tensor_idx]
            base, stride = tensor.data_ptr(), tensor.stride(0) * tensor.element_size()
            blocks += [(int(p) - base) // stride for p in spec.ptrs[offset:offset + n]]
        offset += n * refs
    return blocks, list(spec.group_block_counts)


def request_block_hasher(hash_block: int, hash_fn: Any, vllm_config: Any) -> Any:
    """vLLM's per-request block hasher, as its engine core builds it: 0.34 hashes each block
    with the tokens after it (``num_hash_lookahead_tokens``, with an EAGLE drafter that drops
    its trailing block), earlier releases the block alone."""
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    lookahead = hash_lookahead.lookahead_tokens(vllm_config)
    if lookahead:
        return get_request_block_hasher(hash_block, hash_fn, lookahead)
    return get_request_block_hasher(hash_block, hash_fn)

