"""The figures a worker process holds, readable from the front end by `collective_rpc`.

Under VLLM_ENABLE_V1_MULTIPROCESSING=1 the engine core (scheduler, executor) is another
process, and with tensor parallel > 1 each rank is one more: the Mamba block sizes of the KV
cache, the settings the workers run with and the positive control's count live there, not in
the process that drives the arms. The plugin, loaded by vLLM in every worker
(`WorkerWrapperBase.init_worker`), gives vLLM's worker class a method that returns them as
plain data, so ``LLM.collective_rpc(METHOD)`` reads them by name (no pickled callables, which
vLLM refuses without VLLM_ALLOW_INSECURE_SERIALIZATION). A worker without the method did not
load the plugin; `repro.engine.llm` then names the run inconclusive.
"""

from __future__ import annotations

import os
from typing import Any

from .fault_injection import applied_count, installed_kind

METHOD = "repro_kit_facts"


def worker_facts(worker: Any) -> dict[str, Any]:
    """This worker's figures (`worker` is vLLM's worker object)."""
    # lazy: vllm, found only in an engine environment
    from vllm.v1.kv_cache_interface import MambaSpec

    kv_cache_config = worker.model_runner.kv_cache_config
    config = worker.vllm_config
    return {
        "pid": os.getpid(),
        "rank": getattr(worker, "rank", None),
        "mamba_block_sizes": sorted(
            {
                group.kv_cache_spec.block_size
                for group in kv_cache_config.kv_cache_groups
                if isinstance(group.kv_cache_spec, MambaSpec)
            }
        ),
        "cache_block_size": config.cache_config.block_size,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "fault": installed_kind(),
        "fault_applied": applied_count(),
    }


def install() -> bool:
    """Give vLLM's worker base class the `METHOD`; idempotent."""
    # lazy: vllm, found only in an engine environment
    from vllm.v1.worker.worker_base import WorkerBase

    if getattr(WorkerBase, METHOD, None) is not worker_facts:
        setattr(WorkerBase, METHOD, worker_facts)
    return True
