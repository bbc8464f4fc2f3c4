"""The sensitivity sweep: the injected fault's scale, validated, recorded, swept by decades.

The engine test runs `python -m repro sensitivity` for real on the cold-race arm over two
decades (8 and 0.8): each step is an ordinary `tiny --inject-fault` run whose artifact records
its scale; sensitivity.json matches its schema. The full table in docs/sensitivity.md comes
from the same command over five decades.
"""

from __future__ import annotations

import json

import pytest

from repro import sensitivity
from repro.artifact import schema_violations, validate_artifact
from repro.vllm_plugin import fault_injection


def test_the_scales_go_down_by_decades():
    assert sensitivity.scales(8.0, 4) == [8.0, 0.8, 0.08, 0.008]


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "lots"])
def test_a_fault_scale_that_is_not_one_is_refused_by_name(monkeypatch, text):
    monkeypatch.setenv(fault_injection.SCALE_ENV, text)
    with pytest.raises(ValueError, match="REPRO_FAULT_SCALE=.* is not a noise scale"):
        fault_injection.fault_scale()


def test_the_default_scale_is_the_control_s(monkeypatch):
    monkeypatch.delenv(fault_injection.SCALE_ENV, raising=False)
    assert fault_injection.fault_scale() == fault_injection.NOISE_SCALE == 8.0


@pytest.mark.engine
def test_a_real_sweep_of_two_decades_records_each_scale(run_kit, tmp_path):
    out = tmp_path / "sweep"
    proc = run_kit(
        "sensitivity", "--arms", "cold-race", "--steps", "2", "--out", str(out), timeout=1800
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / sensitivity.FILE_NAME).read_text())
    assert schema_violations(doc, "sensitivity") == []
    rows = doc["arms"]["cold-race"]["rows"]
    assert [r["scale"] for r in rows][:1] == [8.0]
    for r in rows:
        artifact = json.loads((out / r["run"] / "cold-race.json").read_text())
        validate_artifact(artifact)
        assert artifact["fault_injection"]["scale"] == r["scale"]
        assert artifact["fault_injection"]["applied"] > 0
    # At full strength the arm detects the fault (the kit's positive control).
    assert rows[0]["verdict"] == "corrupted"
    assert "smallest fault scale detected" in proc.stdout


def test_sensitivity_refuses_a_folder_that_holds_files(run_kit, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    proc = run_kit("sensitivity", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert "is not an empty folder" in proc.stderr
    assert (tmp_path / "keep.txt").read_text() == "mine"
