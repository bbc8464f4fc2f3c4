"""Bad arguments to the run commands are refused by name, before anything is made."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import repro.cli
from repro.cli import main


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["run", "--arm-timeout", "-5"], "expected a number above 0, found '-5'"),
        (["run", "--arm-timeout", "nan"], "expected a number above 0, found 'nan'"),
        (["run", "--out", ""], "expected the folder to write the run into"),
        (["tiny", "--repeat", "0"], "expected 1 to 50 repeats, found 0"),
        (["sensitivity", "--start", "0", "--out", "x"], "expected a number above 0"),
        (["sensitivity", "--steps", "0", "--out", "x"], "expected 1 to 10 decades, found '0'"),
    ],
)
def test_argument_values_that_are_not_values_are_refused(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["plan", "--profile", "nope"], "unknown profile 'nope'; expected one of"),
        (["plan", "--profile", ""], "unknown profile ''"),
        (["run", "--profile", "nemotron-super", "--device", "cpu"], "no cpu variant"),
        (["run", "--model-path", "/nonexistent"], "found no such directory"),
    ],
)
def test_names_the_kit_does_not_know_are_refused_without_a_traceback(
    argv, expected, capsys, tmp_path
):
    assert main([*argv, "--out", str(tmp_path / "out")] if argv[0] == "run" else argv) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_validate_names_each_unreadable_file_and_checks_the_rest(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    latin = tmp_path / "latin1.json"
    latin.write_bytes('{"a": "caf\u00e9"}'.encode("latin-1"))
    utf16 = tmp_path / "utf16.json"  # JSON's own encoding detection reads it: schema-checked
    utf16.write_bytes('{"a": 1}'.encode("utf-16"))
    folder = tmp_path / "folder.json"
    folder.mkdir()
    loop = tmp_path / "loop.json"
    loop.symlink_to(tmp_path / "loop2.json")
    (tmp_path / "loop2.json").symlink_to(loop)
    good = next((Path(__file__).parent.parent / "artifacts" / "examples").rglob("cold-race.json"))
    files = [deep, latin, utf16, folder, loop, tmp_path / "missing.json", good]
    assert main(["validate", *map(str, files)]) == 1
    out = capsys.readouterr().out
    assert "nested deeper than can be read" in out
    assert "not UTF-8 text" in out
    assert f"{utf16}: INVALID" in out
    assert "a directory; expected a JSON file" in out
    assert "cannot be read" in out and "no such file" in out
    assert f"{good}: valid" in out
    assert "Traceback" not in out


def test_a_run_directory_with_a_bottomless_record_is_refused_by_name(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "cold-race.json").write_text("[" * 100_000)
    assert main(["report", str(run)]) == 2
    assert "nested deeper than can be read" in capsys.readouterr().err


@pytest.mark.parametrize(
    "item, expected",
    [
        ("x", "expects KEY=JSON"),
        ("max_num_seqs={bad", "expected a JSON value"),
        ('model="/etc"', "the kit sets 'model' itself"),
    ],
)
def test_overrides_that_are_not_settings_are_refused_before_anything_is_made(
    item, expected, tmp_path, capsys
):
    for command in ("run", "tiny"):
        assert main([command, "--override", item, "--out", str(tmp_path / "out")]) == 2
        assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_tiny_refuses_an_out_that_is_a_file_before_making_an_environment(tmp_path, capsys):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    assert main(["tiny", "--vllm", "0.99.0", "--out", str(mine)]) == 2
    assert "is a file; name the folder" in capsys.readouterr().err
    assert mine.read_text() == "mine"


@pytest.mark.engine
def test_an_override_this_vllm_does_not_know_is_refused_with_the_nearest_name(run_kit, tmp_path):
    proc = run_kit(
        "run", "--override", "enable_prefix_cachng=false", "--out", str(tmp_path / "o"), timeout=300
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "did you mean enable_prefix_caching?" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_each_command_loads_its_own_group_and_the_table_says_which(capsys):
    owners = {}
    for name in repro.cli.GROUP_NAMES:
        for command in importlib.import_module(f"repro.cli.{name}").COMMANDS:
            owners[command] = name
    assert repro.cli.COMMAND_GROUPS == owners

    # A command imports its own group, not the others (nor their dependencies).
    code = (
        "import sys\n"
        "from repro.cli import main\n"
        "try:\n    main(['report', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('repro.cli.')))\n"
    )
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip().splitlines()[-1] == "['repro.cli.evidence']"
    # Without a command the help lists every group's.
    with pytest.raises(SystemExit):
        repro.cli.main(["--help"])
    listed = capsys.readouterr().out
    assert all(command in listed for command in owners)
