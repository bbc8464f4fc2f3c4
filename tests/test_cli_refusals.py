"""Bad arguments to the run commands are refused by name, before anything is made."""

from __future__ import annotations

import pytest

from repro.cli import main


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["run", "--arm-timeout", "-5"], "expected a number above 0, found '-5'"),
        (["run", "--arm-timeout", "nan"], "expected a number above 0, found 'nan'"),
        (["run", "--out", ""], "expected the folder to write the run into"),
        (["tiny", "--repeat", "0"], "expected 1 to 50 repeats, found 0"),
        (["sensitivity", "--start", "0", "--out", "x"], "expected a number above 0"),
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
