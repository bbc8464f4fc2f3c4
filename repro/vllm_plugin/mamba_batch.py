"""What ``mamba_utils.preprocess_mamba``'s arguments say: where each Mamba layer's states
live, each request's running state column, and which requests resume from cached state.

Shared by the positive control (`fault_injection`) and the restore witness
(`restore_witness`), which both wrap that function.
"""

from __future__ import annotations

import itertools
from typing import Any


def mamba_layers(kv_cache_config: Any, forward_context: dict[str, Any]):
    """Yield (group_id, block_size, layer_name, state tensors) for every Mamba layer."""
    # lazy: vllm, found only in an engine environment
    from vllm.v1.kv_cache_interface import MambaSpec

    try:
        # lazy: vllm, found only in an engine environment
        from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs
    except ImportError:  # older releases
        UniformTypeKVCacheSpecs = ()  # noqa: N806

    for gid, group in enumerate(kv_cache_config.kv_cache_groups):
        for layer_name in group.layer_names:
            spec = group.kv_cache_spec
            if UniformTypeKVCacheSpecs and isinstance(spec, UniformTypeKVCacheSpecs):
                spec = spec.kv_cache_specs[layer_name]
            if not isinstance(spec, MambaSpec):
                continue
            layer = forward_context.get(layer_name)
            states = getattr(layer, "kv_cache", None)
            if states is None:
                continue
            if not isinstance(states, (list, tuple)):
                states = [states]
            yield gid, spec.block_size, layer_name, states


class RunningColumns:
    """Where ``preprocess_mamba`` keeps each request's running state column.

    vLLM 0.32.0 passes a dict ``mamba_state_idx`` (req_id -> column); other releases keep a
    per-row array ``input_batch.mamba_state_idx_cpu`` with -1 for "no running state yet".
    """

    def __init__(self, bound: dict[str, Any]) -> None:
        self.mapping = bound.get("mamba_state_idx")
        self.batch = bound["input_batch"]

    @property
    def supported(self) -> bool:
        return (
            self.mapping is not None or getattr(self.batch, "mamba_state_idx_cpu", None) is not None
        )

    def get(self, req_id: str) -> int | None:
        if self.mapping is not None:
            return self.mapping.get(req_id)
        row = self.batch.req_id_to_index.get(req_id)
        if row is None:
            return None
        col = int(self.batch.mamba_state_idx_cpu[row])
        return col if col >= 0 else None


def restoring_requests(bound: dict[str, Any], columns: RunningColumns) -> list[str]:
    """Requests ``preprocess_mamba`` is about to treat as new or resumed (no running column,
    or one it drops first), whose computation starts from cached tokens."""
    sched = bound["scheduler_output"]
    dropped = set(
        itertools.chain(
            sched.finished_req_ids,
            getattr(sched, "preempted_req_ids", None) or (),
            getattr(sched.scheduled_cached_reqs, "resumed_req_ids", None) or (),
        )
    )
    requests = bound["requests"]
    return [
        rid
        for rid in bound["input_batch"].req_ids
        if (columns.get(rid) is None or rid in dropped) and requests[rid].num_computed_tokens > 0
    ]
