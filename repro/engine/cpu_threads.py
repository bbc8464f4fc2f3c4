"""How many OpenMP threads a CPU engine gets: the cores that are really free when it starts.

The kit's CPU engines run in one process (no vLLM worker process), so vLLM's own
`VLLM_CPU_OMP_THREADS_BIND` / `VLLM_CPU_NUM_OF_RESERVED_CPU` are never read; torch's OpenMP
runtime sizes its pool from `OMP_NUM_THREADS` when it loads, one thread per allowed core by
default. Each forward pass ends at a barrier where the threads spin: with one core taken by
another process, the thread on that core is late at every barrier and the others spin
waiting for it (docs/measured.md, §A busy core). So the engine process is given one thread
per core that is idle over a short sample, and nothing is set where every core is idle (a
solo run keeps OpenMP's defaults). An OpenMP variable the user set is kept as it is.

The choice is recorded in each artifact (`engine.cpu_threads`) with the sample behind it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# A core busier than this over the sample is counted as taken by another process.
BUSY_SHARE = 0.5
SAMPLE_S = 0.25
# Set by the user, these decide the pool themselves; the kit then chooses nothing.
USER_OPENMP_VARIABLES = ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "OMP_PLACES")

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuThreads:
    """The engine process's OpenMP pool and why."""

    allowed_cpus: list[int]
    busy_cpus: list[int]
    # Busy share of each allowed core over the sample (None: no sample was taken).
    busy_share: dict[str, float] | None
    threads: int | None
    # "kit": the kit set OMP_NUM_THREADS; "default": every core was free, OpenMP's own default;
    # "user": the user's OpenMP variables decide; "unread": no per-core figures here.
    chosen_by: str
    variables: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _per_cpu_ticks(stat_text: str) -> dict[int, tuple[int, int]]:
    """(busy, total) jiffies per core from /proc/stat's `cpuN` lines."""
    ticks: dict[int, tuple[int, int]] = {}
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            cpu = int(name[3:])
            values = [int(v) for v in rest.split()]
        except ValueError:
            continue
        # user nice system idle iowait irq softirq steal ...; idle and iowait are not busy.
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        total = sum(values[:8])
        ticks[cpu] = (total - idle, total)
    return ticks


def sample_busy_share(
    cpus: list[int], sample_s: float = SAMPLE_S, stat: Path = PROC_STAT
) -> dict[int, float] | None:
    """Each core's busy share over `sample_s` seconds (None where /proc/stat cannot be read)."""
    try:
        before = _per_cpu_ticks(stat.read_text())
        time.sleep(sample_s)
        after = _per_cpu_ticks(stat.read_text())
    except OSError:
        return None
    shares: dict[int, float] = {}
    for cpu in cpus:
        if cpu not in before or cpu not in after:
            return None
        busy = after[cpu][0] - before[cpu][0]
        total = after[cpu][1] - before[cpu][1]
        shares[cpu] = busy / total if total > 0 else 0.0
    return shares


def choose(
    user_env: Mapping[str, str],
    *,
    allowed: list[int] | None = None,
    shares: dict[int, float] | None | str = "sample",
) -> CpuThreads:
    """The pool for an engine process started now with the user's environment `user_env`
    (`allowed`: the cores it may run on; `shares`: a sample already taken, for tests)."""
    allowed = sorted(os.sched_getaffinity(0)) if allowed is None else sorted(allowed)
    user_set = {k: user_env[k] for k in USER_OPENMP_VARIABLES if k in user_env}
    if user_set:
        return CpuThreads(allowed, [], None, None, "user", user_set)
    if shares == "sample":
        shares = sample_busy_share(allowed)
    if shares is None:
        return CpuThreads(allowed, [], None, None, "unread", {})
    busy = [cpu for cpu in allowed if shares.get(cpu, 0.0) >= BUSY_SHARE]
    rounded = {str(cpu): round(shares.get(cpu, 0.0), 3) for cpu in allowed}
    if not busy:
        return CpuThreads(allowed, [], rounded, len(allowed), "default", {})
    threads = max(1, len(allowed) - len(busy))
    return CpuThreads(allowed, busy, rounded, threads, "kit", {"OMP_NUM_THREADS": str(threads)})


def apply(choice: CpuThreads, env: MutableMapping[str, str]) -> None:
    """Put the kit's choice into the engine process's environment `env`."""
    if choice.chosen_by == "kit":
        env.update(choice.variables)
