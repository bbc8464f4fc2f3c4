"""The environment every process the kit starts on a GPU host carries.

The GPU hosts the kit is run on here need NVLink multicast (NVLS) off, and each library that
can use it has its own switch: NCCL's collectives, torch's symmetric memory and NVSHMEM
(docs/tp4.md, §NVLink multicast). With tensor parallelism every worker process opens NCCL
communicators, so the settings must reach each of them; vLLM's workers inherit the engine
process's environment. One constant, read by every place that builds such an environment:
`Profile.engine_variables`, the runner's engine process, the container run and
containers/bare-host/red-green.sh (pinned to this constant by tests/test_process_vars.py).

A value the user set for one of these wins: they are defaults, never overrides.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

GPU_HOST_VARIABLES: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


# On the CPU the kit sets nothing: OpenMP's default wait policy spins at barriers, which an
# engine alone needs (passive waiting made raw vLLM's tiny arms take 64 s instead of 45 s).
# Where CPU engines share cores they spin at each other's barriers; OMP_WAIT_POLICY=PASSIVE,
# which the kit passes on where the user sets it, is one cure
# (docs/measured.md, §Engines on two cores). The kit's own is a share of the cores per engine:
# a matrix's cells and the test suite's workers get one (repro.engine.cpu_threads,
# repro.engine.suite_workers).
CPU_HOST_VARIABLES: dict[str, str] = {}
SHARED_CORES_VARIABLES = {"OMP_WAIT_POLICY": "PASSIVE"}


def gpu_host_variables(user_env: Mapping[str, str]) -> dict[str, str]:
    """`GPU_HOST_VARIABLES`, with each value the user set in `user_env` kept instead."""
    return {key: user_env.get(key, default) for key, default in GPU_HOST_VARIABLES.items()}


# The engine variables a user may choose for a run: the GPU host's switches and where the
# engine core runs (figures are then read from the workers: repro.engine.llm). Every other
# profile variable is part of what is measured (VLLM_USE_FLASHINFER_SAMPLER=0, say) and is set
# whatever the shell holds.
USER_MAY_SET = frozenset(
    {*GPU_HOST_VARIABLES, *SHARED_CORES_VARIABLES, "VLLM_ENABLE_V1_MULTIPROCESSING"}
)


def apply_defaults(
    env: Mapping[str, str], target: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Set each of `env` in `target` (os.environ by default): a variable of `USER_MAY_SET`
    only where it is not set there already, every other one always; return what the
    variables now hold."""
    target = os.environ if target is None else target
    for key, value in env.items():
        if key in USER_MAY_SET:
            target.setdefault(key, value)
        else:
            target[key] = value
    return {key: target[key] for key in env}
