"""`--out` of report, compare and bundle never replaces or damages the user's files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from repro.cli import main
from repro.core.output_paths import UnsafeOutput, check_output

EXAMPLE = (
    Path(__file__).resolve().parent.parent / "artifacts" / "examples" / "cpu-vllm-0.26.0-red-green"
)


@pytest.fixture()
def run(tmp_path) -> Path:
    """A copy of a recorded run directory (a real artifact with its logs)."""
    source = EXAMPLE / "stock"
    return Path(shutil.copytree(source, tmp_path / "run"))


def test_a_new_file_in_an_existing_folder_is_fine(tmp_path):
    assert check_output(tmp_path / "r.md") == (tmp_path / "r.md").resolve()
    assert list(tmp_path.iterdir()) == []  # the check that the folder takes a file leaves none


@pytest.mark.parametrize(
    "name, expected",
    [
        ("missing/r.md", "does not exist; create it"),
        (".", "is a directory"),
        ("", "is a directory"),  # argparse makes --out "" the current folder
    ],
)
def test_paths_that_cannot_be_a_new_file_are_refused(tmp_path, monkeypatch, name, expected):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsafeOutput, match=expected):
        check_output(Path(name) if name else Path(""))


def test_an_existing_file_is_replaced_only_with_force(tmp_path):
    mine = tmp_path / "notes.md"
    mine.write_text("mine")
    with pytest.raises(UnsafeOutput, match="exists; the command would replace it"):
        check_output(mine)
    assert check_output(mine, force=True) == mine.resolve()


def test_report_refuses_to_write_over_the_artifact_it_reads(run, capsys):
    artifact = run / "cold-race.json"
    before = artifact.read_bytes()
    assert main(["report", str(run), "--out", str(artifact), "--force"]) == 2
    assert "inside the evidence this command reads" in capsys.readouterr().err
    assert artifact.read_bytes() == before


def test_compare_refuses_a_file_inside_either_run(run, capsys):
    target = run / "multi-turn.json"
    assert main(["compare", str(run), str(run), "--out", str(target)]) == 2
    assert "inside the evidence" in capsys.readouterr().err


def test_report_leaves_an_unrelated_file_unless_forced(run, tmp_path, capsys):
    mine = tmp_path / "mine.txt"
    mine.write_text("keep me")
    assert main(["report", str(run), "--out", str(mine)]) == 2
    assert mine.read_text() == "keep me"
    assert "pass --force" in capsys.readouterr().err
    assert main(["report", str(run), "--out", str(mine), "--force"]) == 0
    assert mine.read_text().startswith("## ")


def test_bundle_refuses_to_replace_a_bundle_and_its_sha256(run, tmp_path, capsys):
    out = tmp_path / "b.tar.gz"
    assert main(["bundle", str(run), "--out", str(out)]) == 0
    first = out.read_bytes(), Path(f"{out}.sha256").read_bytes()
    assert main(["bundle", str(run), "--out", str(out)]) == 2
    assert "exists; the command would replace it" in capsys.readouterr().err
    assert (out.read_bytes(), Path(f"{out}.sha256").read_bytes()) == first
    assert main(["bundle", str(run), "--out", str(out), "--force"]) == 0


def test_a_report_that_cannot_be_written_says_so(run, capsys):
    assert main(["report", str(run), "--out", "/proc/self/report.md"]) == 2
    out, err = capsys.readouterr()
    assert "no file can be written in its folder" in err
    assert out == ""  # refused before the report was made, not after


def test_report_and_compare_refuse_a_verdict_the_figures_do_not_give(run, capsys):
    """A corrupted record relabelled clean (as `bundle` already refuses) is never shown."""
    import json

    artifact = run / "cold-race.json"
    doc = json.loads(artifact.read_text())
    assert doc["verdict"]["status"] == "corrupted"  # the stock 0.26.0 example
    doc["verdict"] = {
        "status": "clean",
        "gate": None,
        "reason": "forged",
        "outcome": "clean-engaged",
    }
    artifact.write_text(json.dumps(doc))
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "verdict does not follow from its figures" in err and "✅" not in err
    assert main(["compare", str(run), str(run)]) == 2
    assert "verdict does not follow from its figures" in capsys.readouterr().err
