"""The install-set round trip, timed: build, verify, install (a benchmark, not a test).

Builds the set for ``vllm==VERSION`` on the H200 host's freeze (default 0.26.0, Python 3.12:
the set the kit carried to the H200), then verifies and installs it the way the host does:
``python3 -S -m repro.installset verify`` and ``… install`` with ``--host-python`` (a Python
of the set's version, whose pip installs the wheels). Prints each phase's wall time, the
build's own step timings from the manifest, the set's size and parts, and what was installed.

Needs the index (PyPI) and uv; the download is about 340 MiB (pip's cache serves a rerun).

Usage: python benchmarks/bench_installset.py --host-python python3.12 [--vllm 0.26.0]
       [--out DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FREEZE = REPO / "containers" / "hosts" / "h200-pip-freeze.txt"


def timed(label: str, cmd: list[str], log: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"{label} failed (exit {done.returncode}); see {log}")
    print(f"{label:<8} {seconds:7.1f} s")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", default="0.26.0")
    parser.add_argument("--python", default="3.12", help="the host's Python version")
    parser.add_argument("--host-python", required=True, help="an interpreter of that version")
    parser.add_argument("--out", type=Path, help="work folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the set and the install")
    args = parser.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="bench-installset-"))
    work.mkdir(parents=True, exist_ok=True)
    parts, site = work / "set", work / "site"
    shutil.rmtree(site, ignore_errors=True)
    build = [sys.executable, "-m", "repro.installset", "build", "--vllm", args.vllm]
    build += ["--python", args.python, "--for-host", str(FREEZE), "--out", str(parts)]
    host = [args.host_python, "-S", "-m", "repro.installset"]
    timed("build", build, work / "build.log")
    timed("verify", [*host, "verify", "--parts", str(parts)], work / "verify.log")
    install = [args.host_python, "-m", "repro.installset", "install", "--parts", str(parts)]
    timed("install", [*install, "--target", str(site)], work / "install.log")
    manifest = json.loads((parts / "manifest.json").read_text())
    print("build steps:", json.dumps(manifest["build"]["seconds"]))
    resolution = manifest.get("resolution") or {}
    print(
        f"set: {len(manifest['wheels'])} wheels, {manifest['stream']['bytes']:,} B in "
        f"{len(manifest['parts'])} part(s); uv runs {resolution.get('uv_runs')}, host "
        f"packages kept against the closure: {resolution.get('host_overrides')}"
    )
    files = sum(len(names) for _, _, names in os.walk(site))
    print(f"installed: {files:,} files in {site}")
    if not args.keep and not args.out:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
