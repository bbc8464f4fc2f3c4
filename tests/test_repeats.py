"""`--repeat K` on the real vLLM CPU engine: K run directories and one pooled line.

Runs `python -m repro tiny --arms cold-race --repeat 2` as a user types it. Each repeat is a
run of its own (fresh engines, its own records); repeats.json pools their flips.
"""

from __future__ import annotations

import json

import pytest

from repro.artifact import schema_violations, validate_artifact

pytestmark = pytest.mark.engine


def test_two_repeats_give_two_runs_and_a_pooled_p_value(run_kit, tmp_path):
    proc = run_kit(
        "tiny", "--arms", "cold-race", "--repeat", "2", "--out", str(tmp_path), timeout=1800
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    docs = []
    for index in (1, 2):
        doc = json.loads((tmp_path / f"repeat-{index}" / "cold-race.json").read_text())
        validate_artifact(doc)
        assert f"-r{index}-" in doc["run"]["id"]
        assert 0.0 <= doc["verdict"]["confidence"]["p_value"] <= 1.0
        docs.append(doc)
    assert docs[0]["run"]["id"] != docs[1]["run"]["id"]
    summary = json.loads((tmp_path / "repeats.json").read_text())
    assert schema_violations(summary, "repeats") == []
    arm = summary["arms"]["cold-race"]
    assert arm["verdicts"] == [d["verdict"]["status"] for d in docs]
    assert arm["pooled"]["forward_flips"] == sum(
        w["forward_flips"] for d in docs for w in d["figures"]["waves"]
    )
    assert "cold-race:" in proc.stdout and "p = " in proc.stdout


def test_a_repeat_count_out_of_range_is_refused_before_any_engine(run_kit, tmp_path):
    proc = run_kit("run", "--repeat", "0", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert "expected 1 to 50 repeats, found 0" in proc.stderr
    assert not any(tmp_path.iterdir())
