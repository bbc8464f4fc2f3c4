"""How many OpenMP threads a CPU engine gets: the cores that are really free when it starts.

The kit's CPU engines run in one process (no vLLM worker process), so vLLM's own
`VLLM_CPU_OMP_THREADS_BIND` / `VLLM_CPU_NUM_OF_RESERVED_CPU` are never read; torch's OpenMP
runtime sizes its pool from `OMP_NUM_THREADS` when it loads, one thread per allowed core by
default. Each forward pass ends at a barrier where the threads spin: with one core taken by
another process, the thread on that core is late at every barrier and the others spin
waiting for it (docs/measured.md, §A busy core). So the engine process is given one thread
per core that is idle over a short sample, and nothing is set where every core is idle (a
solo run keeps OpenMP's defaults). An OpenMP variable the user set is kept as it is. Where
the engine is one of several started side by side by a process that split the cores among
them (a test-suite worker: `repro.engine.suite_workers`), its pool is at most that share.

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
# Set by a matrix that runs several cells at once on the CPU (`repro.fanout.matrix`): this
# engine's share of the cores, in threads. Engines started together would each see the
# cores free and each take them all.
SHARE_ENV = "REPRO_ENGINE_CPU_SHARE"
# Set by the test suite for each pytest worker (`repro.engine.suite_workers`): the most threads
# an engine of that worker may take. The engine still samples the cores (it may get fewer),
# and a matrix started in that worker splits this share, not the machine.
CAP_ENV = "REPRO_ENGINE_CPU_CAP"


@dataclass(frozen=True)
class CpuThreads:
    """The engine process's OpenMP pool and why."""

    allowed_cpus: list[int]
    busy_cpus: list[int]
    # Busy share of each allowed core over the sample (None: no sample was taken).
    busy_share: dict[str, float] | None
    threads: int | None
    # "kit": the kit set OMP_NUM_THREADS; "default": every core was free, OpenMP's own default;
    # "matrix": the share a matrix running cells at once gave it; "user": the user's OpenMP
    # variables decide; "unread": no per-core figures here.
    chosen_by: str
    variables: dict[str, str]
    # The most threads this process's share allowed (`CAP_ENV`); None: no such share.
    share_cap: int | None = None

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


def share_cap(user_env: Mapping[str, str]) -> int | None:
    """The share `CAP_ENV` gives this process, in threads (None: not set)."""
    value = user_env.get(CAP_ENV, "").strip()
    return max(1, int(value)) if value else None


def free_cores(allowed: list[int], shares: dict[int, float] | None) -> int:
    """The allowed cores not busy over the sample (at least one; all where none was taken)."""
    busy = sum(1 for cpu in allowed if (shares or {}).get(cpu, 0.0) >= BUSY_SHARE)
    return max(1, len(allowed) - busy)


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
    if user_env.get(SHARE_ENV):
        share = int(user_env[SHARE_ENV])
        return CpuThreads(allowed, [], None, share, "matrix", {"OMP_NUM_THREADS": str(share)})
    cap = share_cap(user_env)
    if shares == "sample":
        shares = sample_busy_share(allowed)
    if shares is None:
        if cap is not None and cap < len(allowed):
            # No per-core figures, but a share: the share alone bounds the pool.
            variables = {"OMP_NUM_THREADS": str(cap)}
            return CpuThreads(allowed, [], None, cap, "kit", variables, cap)
        return CpuThreads(allowed, [], None, None, "unread", {}, cap)
    busy = [cpu for cpu in allowed if shares.get(cpu, 0.0) >= BUSY_SHARE]
    rounded = {str(cpu): round(shares.get(cpu, 0.0), 3) for cpu in allowed}
    threads = min(free_cores(allowed, shares), cap or len(allowed))
    if threads == len(allowed):
        return CpuThreads(allowed, [], rounded, threads, "default", {}, cap)
    variables = {"OMP_NUM_THREADS": str(threads)}
    return CpuThreads(allowed, busy, rounded, threads, "kit", variables, cap)


def apply(choice: CpuThreads, env: MutableMapping[str, str]) -> None:
    """Put the kit's choice into the engine process's environment `env`."""
    if choice.chosen_by in ("kit", "matrix"):
        env.update(choice.variables)


# What one CPU engine of a tiny profile may hold, with room: a bound on how many run at
# once (docs/measured.md, §A busy core, has the measured peak).
ENGINE_MEMORY_BYTES = 4 * 1024**3


def memory_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable in bytes (None where it cannot be read)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class EnginesAtOnce:
    """How many CPU engines a matrix runs at the same time, and each one's threads."""

    at_once: int
    threads_each: int | None
    why: str


def engines_at_once(
    cells: int,
    *,
    requested: int | None = None,
    allowed: list[int] | None = None,
    shares: dict[int, float] | None | str = "sample",
    memory: int | None | str = "read",
    cap: int | None = None,
) -> EnginesAtOnce:
    """One engine per free core (each with one thread), as many as memory holds; `requested`
    (the user's --cells-at-once) overrides the count, and the free cores are split among them.
    `cap`, the share this process was given (`share_cap`), bounds the free cores."""
    allowed = sorted(os.sched_getaffinity(0)) if allowed is None else sorted(allowed)
    if shares == "sample":
        shares = sample_busy_share(allowed)
    free = min(free_cores(allowed, shares), cap or len(allowed))
    if requested is not None:
        at_once = max(1, min(requested, cells))
        why = f"--cells-at-once {requested}"
    else:
        memory = memory_available() if memory == "read" else memory
        # Memory that cannot be read allows one engine: a guess could exhaust it.
        by_memory = max(1, memory // ENGINE_MEMORY_BYTES) if memory else 1
        at_once = max(1, min(free, by_memory, cells))
        room = f"memory for {by_memory}" if memory else "memory unread"
        shared = f" (its share: {CAP_ENV}={cap})" if cap else ""
        why = f"{free} free core(s){shared}, {room}, {cells} cell(s)"
    threads_each = max(1, free // at_once) if at_once > 1 else None
    return EnginesAtOnce(at_once, threads_each, why)
