"""Checks made before any engine starts: is the hardware the profile needs here?"""

from __future__ import annotations

from typing import Any

from repro.core.errors import HardwareUnavailable
from repro.profiles import Profile

GIB = 1 << 30


def check_hardware(profile: Profile, hardware: dict[str, Any]) -> None:
    """Refuse a profile whose GPUs are absent, naming what is needed and what was found."""
    if profile.min_gpus == 0:
        return
    gpus = hardware.get("gpus") or []
    big_enough = [g for g in gpus if g["memory_bytes"] >= profile.min_gpu_memory_gib * GIB * 0.97]
    if len(big_enough) >= profile.min_gpus:
        return
    found = (
        ", ".join(f"{g['name']} ({g['memory_bytes'] / GIB:.0f} GiB)" for g in gpus)
        if gpus
        else "no NVIDIA GPU (nvidia-smi found none)"
    )
    raise HardwareUnavailable(
        f"profile {profile.name!r} needs {profile.min_gpus} GPU(s) with at least "
        f"{profile.min_gpu_memory_gib} GB each (tensor parallel {profile.tensor_parallel_size}); "
        f"found: {found}. Run it on such a host, or run `nox -s repro-tiny` here."
    )
