"""What `repro-tiny` costs beyond the engine (a benchmark, not a test).

In one invocation, per repeat and in rotating order:

- the kit: `python -m repro tiny --out DIR` the way `nox -s repro-tiny` runs it, with the
  engine environment and the tiny model already made (made first, not timed);
- the same with another checkout of the kit (`--before DIR`, e.g. an older commit), so two
  versions are timed side by side on one machine under the same load;
- the raw-vLLM baseline (`raw_vllm_baseline.py`): the same prompts, settings and waves
  straight through `LLM.generate` in one process, without the kit.

Reported per kit (medians over the repeats), as one JSON object:

- `kit_s`: wall time of the command; `baseline_s`: the baseline's wall time; `ratio`: the
  median of kit_s / baseline_s over the repeats (each kit run against the baseline run of
  the same repeat);
- `boot_s`, `generate_s`: engine boots (`LLM(...)`) and `generate()` calls, from the arms'
  `run.phases_s`; `share_kit_overhead`: everything else, as a share of `kit_s` (process
  start-up and imports, vLLM's import included, geometry, prompt preparation, counter
  settling, grading, artifact validation and writing);
- `import_s`: the vLLM import the kit's engine process records (`run.phases_s.import`; the
  baseline pays one too), and `share_kit_overhead_beyond_import`: the overhead without it;
  `share_kit_overhead_beyond_baseline`: the overhead less what the baseline of the same
  repeat spends outside boot and `generate()` (vLLM's import, engine shutdowns, exit);
- `boots`: engine boots of the run, counted in its logs (vLLM logs one "init engine" line
  per boot); the baseline's are counted by the baseline itself (4);
- `ratio_at_equal_engine_time`: (E + kit overhead) / (E + baseline overhead), E the median
  boot + generate() seconds of all runs: the same engine work on both sides, so what other
  load moves in it cancels out; `baseline_overhead_s`: the baseline's own time outside boot
  and generate();
- `kit_cpu_s`, `baseline_cpu_s`, `ratio_cpu`: the same comparison in CPU seconds (user +
  system, the command and all its processes);
- `witness_s`: the restore witness's own time in the APC engines (the artifacts'
  `witness.seconds`), and `share_witness`: that as a share of `kit_s`.

Each of these is measured under each `--beside` load, in one invocation (default `quiet`):

- `quiet`: nothing else runs;
- `stress`: one CPU-bound process beside it (a Python busy loop, as `stress --cpu 1` is);
- `repro-tiny`: a second `python -m repro tiny` of the same kit beside it (20 s ahead),
  started again whenever it ends.

With more than one load the JSON has one section per load (`loads`) and `slowdown`: each
load's `kit_s` (and `baseline_s`, and the before kit's) over the quiet one's.

Usage: python benchmarks/bench_repro_tiny.py [--repeat N] [--vllm VERSION] [--before DIR]
       [--beside quiet,stress,repro-tiny]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BOOT_LINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took")


def run_kit(checkout: Path, vllm: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-repro-") as tmp:
        cmd = [sys.executable, "-m", "repro", "tiny", "--out", tmp]
        if vllm:
            cmd += ["--vllm", vllm]
        started, cpu = time.perf_counter(), _children_cpu()
        subprocess.run(cmd, cwd=checkout, check=True, stdout=subprocess.DEVNULL)
        wall, cpu = time.perf_counter() - started, _children_cpu() - cpu
        phases: dict[str, float] = {}
        verdicts = {}
        witness_s = 0.0
        for path in sorted(Path(tmp).glob("*.json")):
            doc = json.loads(path.read_text())
            verdicts[doc["arm"]] = doc["verdict"]["status"]
            witness_s += float((doc.get("witness") or {}).get("seconds") or 0.0)
            for name, seconds in doc["run"].get("phases_s", {}).items():
                phases[name] = phases.get(name, 0.0) + seconds
        boots = sum(
            len(BOOT_LINE.findall(log.read_text(errors="replace")))
            for log in Path(tmp, "logs").glob("*.log")
        )
        return {
            "wall_s": wall,
            "cpu_s": cpu,
            "phases_s": phases,
            "boots": boots,
            "verdicts": verdicts,
            "witness_s": witness_s,
        }


def run_baseline(python: str, model: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(
        [python, str(REPO / "benchmarks" / "raw_vllm_baseline.py"), model],
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    wall, cpu = time.perf_counter() - started, _children_cpu() - cpu
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("BASELINE ")]
    inner = json.loads(line.removeprefix("BASELINE "))
    return {**inner, "wall_s": wall, "cpu_s": cpu}


def _children_cpu() -> float:
    """CPU seconds (user + system) of every finished child process and its descendants."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def med(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def summarize(kit_runs: list[dict], baselines: list[dict]) -> dict:
    """Medians over the repeats; each kit run is paired with the baseline of its repeat."""
    each = []
    for run, base in zip(kit_runs, baselines, strict=True):
        phases, wall = run["phases_s"], run["wall_s"]
        overhead = wall - phases.get("boot", 0.0) - phases.get("generate", 0.0)
        # What raw vLLM itself spends outside boot and generate(): import, shutdowns, exit.
        engine_own = base["wall_s"] - base["boot_s"] - base["generate_s"]
        each.append(
            {
                "ratio": wall / base["wall_s"],
                "ratio_cpu": run["cpu_s"] / base["cpu_s"],
                "kit_overhead_s": overhead,
                "share_kit_overhead": overhead / wall,
                "share_kit_overhead_beyond_import": (overhead - phases.get("import", 0.0)) / wall,
                "share_kit_overhead_beyond_baseline": (overhead - engine_own) / wall,
                # The restore witness's own time (the APC engines'), against the run's wall.
                "share_witness": run["witness_s"] / wall,
            }
        )
    phase_names = sorted({name for r in kit_runs for name in r["phases_s"]})
    # Boot and generate() are the same work on both sides, and the part of wall time that
    # other load on a shared machine moves most (the same generate() took 33 to 51 s in
    # back-to-back runs): compared at the median engine time of all runs, the ratio keeps
    # only what differs, the time outside boot and generate().
    engine = statistics.median(
        [r["phases_s"].get("boot", 0.0) + r["phases_s"].get("generate", 0.0) for r in kit_runs]
        + [b["boot_s"] + b["generate_s"] for b in baselines]
    )
    kit_rest = statistics.median(e["kit_overhead_s"] for e in each)
    base_rest = statistics.median(b["wall_s"] - b["boot_s"] - b["generate_s"] for b in baselines)
    return {
        "kit_s": med([r["wall_s"] for r in kit_runs]),
        "baseline_s": med([b["wall_s"] for b in baselines]),
        "kit_cpu_s": med([r["cpu_s"] for r in kit_runs]),
        "baseline_cpu_s": med([b["cpu_s"] for b in baselines]),
        **{key: med([e[key] for e in each]) for key in each[0]},
        "ratio_at_equal_engine_time": round((engine + kit_rest) / (engine + base_rest), 3),
        "baseline_overhead_s": round(base_rest, 3),
        "boot_s": med([r["phases_s"].get("boot", 0.0) for r in kit_runs]),
        "generate_s": med([r["phases_s"].get("generate", 0.0) for r in kit_runs]),
        "import_s": med([r["phases_s"].get("import", 0.0) for r in kit_runs]),
        "boots": sorted({r["boots"] for r in kit_runs}),
        "phases_s": {n: med([r["phases_s"].get(n, 0.0) for r in kit_runs]) for n in phase_names},
        "verdicts": [r["verdicts"] for r in kit_runs],
        "witness_s": med([r["witness_s"] for r in kit_runs]),
        "kit_s_each": [round(r["wall_s"], 2) for r in kit_runs],
        "kit_cpu_s_each": [round(r["cpu_s"], 2) for r in kit_runs],
        # Per repeat, so that an outlier can be taken apart: the medians above mix repeats.
        "phases_s_each": [{n: round(v, 2) for n, v in r["phases_s"].items()} for r in kit_runs],
        "kit_overhead_s_each": [round(e["kit_overhead_s"], 2) for e in each],
    }


LOADS = ("quiet", "stress", "repro-tiny")


@contextlib.contextmanager
def beside(load: str, vllm: str | None, checkout: Path):
    """Run `load` beside what the block measures, and stop it after (`checkout`: the kit a
    second repro-tiny runs, the one measured, so a before kit is timed beside itself)."""
    if load == "quiet":
        yield
        return
    stop = threading.Event()
    procs: list[subprocess.Popen] = []

    def keep_running() -> None:
        # A second repro-tiny, started again whenever it ends, as a second user's would be.
        with tempfile.TemporaryDirectory(prefix="bench-beside-") as tmp:
            cmd = [sys.executable, "-m", "repro", "tiny", "--out", tmp]
            cmd += ["--vllm", vllm] if vllm else []
            while not stop.is_set():
                proc = subprocess.Popen(
                    cmd,
                    cwd=checkout,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                procs.append(proc)
                proc.wait()
                shutil.rmtree(tmp, ignore_errors=True)
                Path(tmp).mkdir(exist_ok=True)

    if load == "stress":
        busy = [sys.executable, "-c", "while True: pass"]
        procs.append(subprocess.Popen(busy, start_new_session=True))
        worker = None
    else:
        worker = threading.Thread(target=keep_running, daemon=True)
        worker.start()
        time.sleep(20)  # into its engine work, not its start-up
    try:
        yield
    finally:
        stop.set()
        for proc in list(procs):
            # The whole session: `tiny` starts the engine environment's run, which starts
            # the engine process.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in list(procs):
            proc.wait()
        if worker is not None:
            worker.join()


def measure(args, load: str, kits: dict[str, Path], python: str, model: str) -> dict:
    """The kit(s) and the baseline under `load`, `args.repeat` times in rotating order,
    summarized."""
    runs: dict[str, list[dict]] = {name: [] for name in kits}
    baselines: list[dict] = []
    loads = []
    for repeat in range(args.repeat):
        # Rotate the order so that neither side always runs first after a quiet spell.
        jobs = ["baseline", *kits]
        jobs = jobs[repeat % len(jobs) :] + jobs[: repeat % len(jobs)]
        for job in jobs:
            with beside(load, args.vllm, kits.get(job, REPO)):
                loads.append(os.getloadavg()[0])
                if job == "baseline":
                    baselines.append(run_baseline(python, model))
                else:
                    runs[job].append(run_kit(kits[job], args.vllm))
    report = summarize(runs["after"], baselines)
    report["load_average_at_start"] = [round(x, 2) for x in loads]
    report["baseline"] = {
        "wall_s_each": [round(b["wall_s"], 2) for b in baselines],
        "cpu_s_each": [round(b["cpu_s"], 2) for b in baselines],
        "import_s": med([b["import_s"] for b in baselines]),
        "boot_s": med([b["boot_s"] for b in baselines]),
        "generate_s": med([b["generate_s"] for b in baselines]),
        "boots": sorted({b["boots"] for b in baselines}),
    }
    if "before" in runs:
        report["before"] = summarize(runs["before"], baselines)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--vllm", default=None)
    parser.add_argument("--before", type=Path, default=None, help="another kit checkout")
    parser.add_argument(
        "--beside",
        type=lambda text: text.split(","),
        default=["quiet"],
        help=f"comma-separated loads to measure under, of {', '.join(LOADS)}",
    )
    args = parser.parse_args()
    unknown = [load for load in args.beside if load not in LOADS]
    if unknown:
        parser.error(f"--beside takes {', '.join(LOADS)}; got {', '.join(unknown)}")
    vllm_args = ["--vllm", args.vllm] if args.vllm else []
    # The engine environment and the tiny model first: not part of the figures.
    python = subprocess.run(
        [sys.executable, "-m", "repro", "engine-env", *vllm_args],
        cwd=REPO,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout.splitlines()[-1]
    model = subprocess.run(
        [python, "-m", "repro", "tiny-model"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout.splitlines()[-1]
    # One vLLM cache for every run, filled first: vLLM's per-model-class cache is shared by
    # all releases by default, so other work on the machine could empty it mid-benchmark.
    os.environ["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="bench-vllm-cache-")
    subprocess.run(
        [python, str(REPO / "benchmarks" / "raw_vllm_baseline.py"), model, "--warm-only"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    kits = {"after": REPO} | ({"before": args.before.resolve()} if args.before else {})
    by_load = {}
    for load in args.beside:
        by_load[load] = measure(args, load, kits, python, model)
    if len(by_load) == 1:
        (report,) = by_load.values()
    else:
        report = {"loads": by_load}
        if "quiet" in by_load:
            quiet = by_load["quiet"]
            report["slowdown"] = {
                load: {
                    "kit": round(r["kit_s"] / quiet["kit_s"], 3),
                    "baseline": round(r["baseline_s"] / quiet["baseline_s"], 3),
                    **(
                        {"before": round(r["before"]["kit_s"] / quiet["before"]["kit_s"], 3)}
                        if "before" in r
                        else {}
                    ),
                }
                for load, r in by_load.items()
                if load != "quiet"
            }
    report["repeats"] = args.repeat
    report["cpus"] = os.cpu_count()
    print(json.dumps(report, indent=2))
    shutil.rmtree(os.environ["VLLM_CACHE_ROOT"], ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
