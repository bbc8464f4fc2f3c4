"""How many pytest workers the test suite runs, and how many engine threads each one's gets.

`nox -s tests` asks this module just before pytest starts (`python -m
repro.engine.suite_workers [PYTEST_ARGS…]`, one JSON line): one worker per core free over
a 2 s /proc/stat sample and one more, as many as MemAvailable holds, and the free
cores split among them. The extra worker is there because much of the suite waits rather than
computes (process starts, image builds, Slurm's sweeps): on the 2-core machine the fixed three
workers ran an engine-heavy subset faster than the one worker per free core chose, which left
a fifth of the cores idle (docs/measured.md, §The test suite). Each worker's engines get
their share through `cpu_threads.CAP_ENV`, so engines of parallel workers do not
oversubscribe the cores.

A worker count the user gave wins: `-n`/`--numprocesses` in the pytest arguments, else
`REPRO_TEST_WORKERS` for the default run; so does a share the user set in `CAP_ENV`.
Arguments without a count run as given, in one process.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from repro.engine import cpu_threads

WORKERS_ENV = "REPRO_TEST_WORKERS"
# The most one worker holds at once: one test's engines (two cells of a matrix side by side
# at most, 1.27 GB each at their peak) beside a vLLM the worker imported for an in-process
# test; one engine's bound with room (docs/measured.md, §A busy core) covers them.
WORKER_MEMORY_BYTES = cpu_threads.ENGINE_MEMORY_BYTES
# The suite decides once for a run of many minutes, so it samples longer than an engine start
# does (cpu_threads.SAMPLE_S, 0.25 s): 200 ticks a core at Linux's 100 Hz instead of 25, so a
# burst of nox's own pip or the daemons starting does not take a core from the whole run.
SAMPLE_S = 2.0
# Whole files to a worker: a file's module-scoped engine runs are made once. In the order the
# conftest gives them (the longest first, `repro.engine.suite_order`), not xdist's own (the
# files of most tests first).
DISTRIBUTION = ["--dist", "loadfile", "--no-loadscope-reorder"]


@dataclass(frozen=True)
class SuiteWorkers:
    """pytest's workers and each one's engine threads (None: one process, no share set)."""

    workers: int
    threads_each: int | None
    why: str
    # What pytest gets in front of the arguments (empty where the user's arguments decide).
    xdist_args: list[str]

    @property
    def env(self) -> dict[str, str]:
        """The variables pytest runs with: each worker's share of the cores."""
        if self.threads_each is None:
            return {}
        return {cpu_threads.CAP_ENV: str(self.threads_each)}

    def line(self) -> str:
        each = f", {self.threads_each} engine thread(s) each" if self.threads_each else ""
        return f"{self.workers} pytest worker(s){each} ({self.why})"


def requested_workers(pytest_args: Sequence[str], cores: int) -> int | None:
    """The worker count named in pytest's arguments (`-n N`, `-nN`, `--numprocesses[=]N`;
    `auto`/`logical` count the cores), or None."""
    value = None
    for i, arg in enumerate(pytest_args):
        if arg in ("-n", "--numprocesses") and i + 1 < len(pytest_args):
            value = pytest_args[i + 1]
        elif arg.startswith("--numprocesses="):
            value = arg.partition("=")[2]
        elif arg.startswith("-n") and not arg.startswith("--") and len(arg) > 2:
            value = arg[2:]
    if value is None:
        return None
    return int(value) if value.isdigit() else cores


def threads_each(workers: int, free: int, user_env: Mapping[str, str]) -> int | None:
    """Each worker's engine threads: the free cores split among them (None for one worker),
    or the share the user set (`cpu_threads.CAP_ENV`)."""
    user_cap = cpu_threads.share_cap(user_env)
    if user_cap is not None:
        return user_cap
    return max(1, free // workers) if workers > 1 else None


def choose(
    pytest_args: Sequence[str] = (),
    user_env: Mapping[str, str] | None = None,
    *,
    allowed: list[int] | None = None,
    shares: dict[int, float] | None | str = "sample",
    memory: int | None | str = "read",
) -> SuiteWorkers:
    """The suite's workers for a run with `pytest_args` (empty: the default run) started now
    (`allowed`, `shares`, `memory`: the cores, a sample and MemAvailable, for tests)."""
    user_env = os.environ if user_env is None else user_env
    allowed = sorted(os.sched_getaffinity(0)) if allowed is None else sorted(allowed)
    if shares == "sample":
        shares = cpu_threads.sample_busy_share(allowed, SAMPLE_S)
    free = cpu_threads.free_cores(allowed, shares)
    cores = f"{free} of {len(allowed)} core(s) free" if shares is not None else "cores unread"
    named = requested_workers(pytest_args, len(allowed))
    if named is not None:
        workers = max(1, named)
        each = threads_each(workers, free, user_env)
        return SuiteWorkers(workers, each, f"-n in ARGS; {cores}", [])
    if pytest_args:
        each = threads_each(1, free, user_env)
        return SuiteWorkers(1, each, "ARGS name no -n: pytest runs them in one process", [])
    if user_env.get(WORKERS_ENV, "").strip():
        workers = max(1, int(user_env[WORKERS_ENV]))
        why = f"{WORKERS_ENV}={workers}; {cores}"
    else:
        memory = cpu_threads.memory_available() if memory == "read" else memory
        # Memory that cannot be read allows one worker: a guess could exhaust it.
        by_memory = max(1, memory // WORKER_MEMORY_BYTES) if memory else 1
        # One worker more than the free cores: its waits are filled by the others' compute.
        workers = min(free + 1, by_memory)
        room = f"memory for {by_memory}" if memory else "memory unread"
        why = f"{cores}, {room}"
    xdist = ["-n", str(workers), *DISTRIBUTION] if workers > 1 else []
    return SuiteWorkers(workers, threads_each(workers, free, user_env), why, xdist)


def main(argv: list[str]) -> int:
    """Print the choice for pytest arguments `argv` as one JSON line (for the noxfile)."""
    choice = choose(argv)
    print(json.dumps({"xdist_args": choice.xdist_args, "env": choice.env, "line": choice.line()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
