"""The restore witness's view of vLLM 0.32's prefill checkpoints.

From vLLM 0.32 a prefill chunk's forward also writes the state at a checkpoint position
(`compute_mamba_prefill_checkpoints`) into a block-table column of its own, which the
prefix cache then serves. The witness must know that write to recognise the state later:
this wraps the backends' `MambaPrefillCheckpointBuilder.build` and notes each checkpoint
as one more block the step's forward writes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

# Called with a step's checkpoints: batch rows, offsets into their queries, block columns.
OnCheckpoints = Callable[[list[int], list[int], list[int]], None]


def _wrap(original, on_checkpoints: OnCheckpoints, on_error: Callable[[Exception], None]):
    @functools.wraps(original)
    def build(self, m, request_rows, *args, **kwargs):
        result = original(self, m, request_rows, *args, **kwargs)
        try:
            if result is not None and result.block_cols is not None:
                offsets = result.offsets
                if offsets is None:
                    offsets = result.checkpoint_offsets.tolist()
                on_checkpoints(list(request_rows), list(offsets), result.block_cols.tolist())
        except Exception as exc:  # noqa: BLE001 - a witness must never stop the engine
            on_error(exc)
        return result

    build.repro_witness_wrapper = True  # type: ignore[attr-defined]
    return build


def install(on_checkpoints: OnCheckpoints, on_error: Callable[[Exception], None]) -> bool:
    """Wrap vLLM 0.32's prefill checkpoint builder, where it exists."""
    try:
        # lazy: vllm, found only in an engine environment
        from vllm.model_executor.layers.mamba import checkpoint
    except ImportError:
        return False  # releases before prefill checkpoints: nothing more is written
    builder = checkpoint.MambaPrefillCheckpointBuilder
    if not getattr(builder.build, "repro_witness_wrapper", False):
        builder.build = _wrap(builder.build, on_checkpoints, on_error)
    return True
