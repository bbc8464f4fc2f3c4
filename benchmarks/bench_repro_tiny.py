"""Where the time of `repro-tiny` goes (a benchmark, not a test).

Runs `python -m repro tiny --out DIR` the way `nox -s repro-tiny` does, with the engine
environment already made (the first call makes it and is not timed), and reports:

- wall time of the whole command and of each arm's process;
- per arm, the phases the arm records (`run.phases_s`): engine boot (both runs), prompt
  preparation, `generate()`, counter settling;
- the share spent in engine boot and in `generate()`, and the kit's own overhead: everything
  else (process start-up and imports, environment and model checks, counter settling,
  grading, artifact validation and writing).

Usage: python benchmarks/bench_repro_tiny.py [--repeat N] [--vllm VERSION]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_once(vllm: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-repro-") as tmp:
        cmd = [sys.executable, "-m", "repro", "tiny", "--out", tmp]
        if vllm:
            cmd += ["--vllm", vllm]
        started = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        total = time.perf_counter() - started
        arms = {}
        for path in sorted(Path(tmp).glob("*.json")):
            doc = json.loads(path.read_text())
            arms[doc["arm"]] = {
                "status": doc["verdict"]["status"],
                "duration_s": doc["run"]["duration_s"],
                "phases_s": doc["run"].get("phases_s", {}),
            }
        return {"total_s": total, "arms": arms}


def summarize(runs: list[dict]) -> dict:
    def med(values):
        return round(statistics.median(values), 2)

    total = med([r["total_s"] for r in runs])
    report = {"runs": len(runs), "total_s": total, "arms": {}}
    boot = generate = 0.0
    for arm in runs[0]["arms"]:
        phases = {}
        for name in runs[0]["arms"][arm]["phases_s"]:
            phases[name] = med([r["arms"][arm]["phases_s"].get(name, 0.0) for r in runs])
        duration = med([r["arms"][arm]["duration_s"] for r in runs])
        report["arms"][arm] = {
            "status": [r["arms"][arm]["status"] for r in runs],
            "process_s": duration,
            "phases_s": phases,
        }
        boot += phases.get("boot", 0.0)
        generate += phases.get("generate", 0.0)
    report["share_boot"] = round(boot / total, 3)
    report["share_generate"] = round(generate / total, 3)
    report["kit_overhead_s"] = round(total - boot - generate, 2)
    report["share_kit_overhead"] = round((total - boot - generate) / total, 3)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--vllm", default=None)
    args = parser.parse_args()
    # Make (or find) the engine environment and the tiny model first: not part of the figures.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "repro",
            "engine-env",
            *(["--vllm", args.vllm] if args.vllm else []),
        ],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    runs = [run_once(args.vllm) for _ in range(args.repeat)]
    print(json.dumps(summarize(runs), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
