"""The test suite's wall time on the old fixed workers against the package's choice (a
benchmark, not a test).

Runs one subset of the suite's engine tests with an engine environment's python, once per way,
each run holding an exclusive lock (`--lock`, flock(2): the same lock `flock(1)` takes) so
that no other engine run on the machine overlaps it; the time spent waiting for the lock is
not timed. Ways:

- `before`: a kit checkout from before the choice (`--before DIR`), with its fixed
  `-n 3 --dist loadfile` (its conftest sets OMP_WAIT_POLICY=PASSIVE; no share per worker);
- `after`: this checkout, the workers and engine threads `repro.engine.suite_workers` chooses
  from the cores free and the memory when the lock is taken (its sample, then pytest);
- `after:N`: this checkout with `-n N --dist loadfile` (each worker's share set for N).

Reports per way: the pytest arguments and the choice's line, `wall_s`, pytest's counts
(passed, failed, skipped, errors), `idle_share` (the cores' idle share over the run, from
/proc/stat) and the largest resident set of any process it waited for.

Usage: python benchmarks/bench_suite_workers.py --python ENGINE_PY [--before DIR]
           [--ways before,after] [--lock /tmp/engine.lock] [FILE…]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from repro.engine import suite_workers  # noqa: E402

# Files that boot the vLLM CPU engine (0.32.0's environment only: nothing else is made).
SUBSET = [
    "tests/test_repro_tiny.py",
    "tests/test_repro_tiny_faults.py",
    "tests/test_tiny_needle_cpu.py",
    "tests/test_tiny_nemotron_h.py",
    "tests/test_matrix_at_once.py",
    "tests/test_repeats.py",
    "tests/test_sensitivity.py",
    "tests/test_vllm_plugin.py",
]
OLD_FIXED = ["-n", "3", "--dist", "loadfile"]
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")


def cores_idle_and_total() -> tuple[int, int]:
    """The machine's idle (idle + iowait) and total jiffies so far (/proc/stat's `cpu` line)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return values[3] + values[4], sum(values)


def run_way(way: str, args: argparse.Namespace) -> dict:
    checkout = args.before if way == "before" else REPO
    if way == "before" and checkout is None:
        raise SystemExit("the way 'before' needs --before DIR")
    env = {
        **os.environ,
        "PYTHONPATH": f"{checkout}{os.pathsep}{checkout / 'tests'}",
        "REPRO_KIT_CHECKOUT": str(checkout),
        "REPRO_ENGINE_PYTHON": args.python,
        "REPRO_REQUIRE_ENGINE": "1",
    }
    with open(args.lock, "a") as lock:
        waited = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        waited = time.monotonic() - waited
        if way == "before":
            xdist, line = OLD_FIXED, "fixed -n 3 --dist loadfile"
        else:
            named = ["-n", way.partition(":")[2]] if ":" in way else []
            choice = suite_workers.choose(named)
            xdist = [*named, *suite_workers.DISTRIBUTION] if named else choice.xdist_args
            line = choice.line()
            env.update(choice.env)
        command = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist]
        command += ["-ra", *args.files]
        idle0, total0 = cores_idle_and_total()
        started = time.monotonic()
        done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        idle1, total1 = cores_idle_and_total()
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = {kind.rstrip("s"): int(n) for n, kind in COUNT.findall(summary)}
    return {
        "way": way,
        "choice": line,
        "pytest_args": command[3:],
        "returncode": done.returncode,
        "wall_s": round(wall, 1),
        "counts": counts,
        "summary": summary,
        "idle_share": round((idle1 - idle0) / max(1, total1 - total0), 3),
        "lock_wait_s": round(waited, 1),
        # ru_maxrss is in KiB on Linux; the largest of all children waited for so far.
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        "failures": [ln for ln in done.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="an engine environment's python")
    parser.add_argument("--before", type=Path, default=None, help="a checkout before the choice")
    parser.add_argument("--ways", default="before,after", help="before, after, after:N")
    parser.add_argument("--lock", default="/tmp/engine.lock", help="held during each run")
    parser.add_argument("files", nargs="*", default=SUBSET)
    args = parser.parse_args()
    args.before = args.before.resolve() if args.before else None
    results = []
    for way in args.ways.split(","):
        result = run_way(way, args)
        print(json.dumps(result), flush=True)
        results.append(result)
    for r in results:
        print(f"{r['way']:>8}: {r['wall_s']:7.1f} s  {r['summary']}  [{r['choice']}]")
    return 0 if all(r["returncode"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
