"""`python -m repro`'s one error boundary: a refusal is one line and exit 2 (bad input) or 1 (a
failed check), with its log where it has one; what the kit did not foresee is one line naming
it and exit 1; Ctrl-C is exit 130; a traceback only with --debug or REPRO_DEBUG=1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import repro.cli
from repro.cli import main
from repro.core.errors import ReproError

REPO = Path(__file__).resolve().parent.parent


class _FailedCheck(ReproError):
    exit_code = 1


def _raising(exc: BaseException):
    def command(args):
        raise exc

    return command


@pytest.fixture
def command(monkeypatch):
    """`kit-digest` made to raise what the test gives it (the boundary is what is tested)."""
    monkeypatch.delenv("REPRO_DEBUG", raising=False)

    def install(exc: BaseException) -> None:
        monkeypatch.setitem(repro.cli.COMMANDS, "kit-digest", _raising(exc))

    return install


def test_a_refusal_is_one_line_and_exit_2(command, capsys):
    command(ReproError("--out x: expected a file, found a folder; name a file"))
    assert main(["kit-digest"]) == 2
    assert (
        capsys.readouterr().err == "error: --out x: expected a file, found a folder; name a file\n"
    )


def test_a_failed_check_keeps_its_exit_code_and_names_its_log(command, capsys, tmp_path):
    command(_FailedCheck("the image's Python stack is not the lock's", log_path=tmp_path / "b.log"))
    assert main(["kit-digest"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: the image's Python stack is not the lock's",
        f"full log: {tmp_path / 'b.log'}",
    ]


def test_a_log_the_message_names_already_is_not_named_twice(command, capsys, tmp_path):
    log = tmp_path / "b.log"
    command(ReproError(f"docker build failed; full log: {log}", log_path=log))
    assert main(["kit-digest"]) == 2
    assert capsys.readouterr().err == f"error: docker build failed; full log: {log}\n"


def test_context_added_to_a_refusal_keeps_its_exit_code_and_log(tmp_path):
    more = _FailedCheck("no image", log_path=tmp_path / "c.log").with_context("(records in out/)")
    assert (str(more), more.exit_code, more.log_path) == (
        "no image\n(records in out/)",
        1,
        tmp_path / "c.log",
    )


def test_an_unforeseen_exception_is_one_line_naming_it_and_exit_1(command, capsys):
    command(RecursionError("maximum recursion depth exceeded\nwhile decoding"))
    assert main(["kit-digest"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: unexpected RecursionError: maximum recursion depth exceeded (")
    assert "run it again with --debug (or REPRO_DEBUG=1) for the traceback" in err


@pytest.mark.parametrize("how", ["--debug before", "--debug after", "REPRO_DEBUG=1"])
def test_debug_adds_the_traceback(command, capsys, monkeypatch, how):
    command(KeyError("arms"))
    argv = {"--debug before": ["--debug", "kit-digest"], "--debug after": ["kit-digest", "--debug"]}
    if how == "REPRO_DEBUG=1":
        monkeypatch.setenv("REPRO_DEBUG", "1")
    else:
        monkeypatch.setenv("REPRO_DEBUG", "0")  # what main sets for its children is undone
    assert main(argv.get(how, ["kit-digest"])) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.splitlines()[-1].startswith("error: unexpected KeyError: 'arms'")


def test_ctrl_c_is_exit_130_without_a_traceback():
    """A real SIGINT to a command that is waiting."""
    code = (
        "import sys, time, repro.cli\n"
        "repro.cli.COMMANDS['kit-digest'] = lambda args: (print('waiting', flush=True), "
        "time.sleep(60))\n"
        "sys.exit(repro.cli.main(['kit-digest']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "REPRO_DEBUG"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "waiting\n"
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err == "interrupted (Ctrl-C)\n"


def test_argparse_refusals_stay_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--arm-timeout", "nan"])
    assert exit_.value.code == 2
    assert "Traceback" not in capsys.readouterr().err
