"""vLLM's first look at a model class, taken in this process when the engine runs here.

The first time a machine sees a model architecture, vLLM inspects its class in a new Python
process (`registry._run_in_subprocess`), "to avoid initializing CUDA" in a front end whose
engine core is another process, and caches the answer under VLLM_CACHE_ROOT/modelinfos. That
child imports torch and vLLM again: 37 s of a cold-race arm's 'derive' phase on a fresh H100,
49 s on a fresh H200 (docs/measured.md), where a machine that had run once before took 1.6 s.
The kit's engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), which imports
the same class at boot anyway, so the child buys nothing: the inspection runs here instead,
and vLLM's cache still gets the answer. Under a multiprocess engine vLLM's way is kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


def _here(fn: Callable[[], _T]) -> _T:
    return fn()


def inspect_in_this_process() -> str:
    """Route vLLM's model-class inspection into this process where the engine runs here;
    what was done, for the log: 'in this process', 'child process (multiprocess engine)' or
    'child process (this vLLM has no such hook)'. Idempotent."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
        return "child process (multiprocess engine)"
    try:
        # lazy: vllm, found only in an engine environment
        from vllm.model_executor.models import registry
    except ImportError:
        return "child process (this vLLM has no such hook)"
    if not callable(getattr(registry, "_run_in_subprocess", None)):
        return "child process (this vLLM has no such hook)"
    if registry._run_in_subprocess is not _here:
        registry._run_in_subprocess = _here
        # One line in the arm's log: the kit changed how vLLM starts, not what it computes.
        print("[repro] vLLM's model-class inspection runs in this process", file=sys.stderr)
    return "in this process"
