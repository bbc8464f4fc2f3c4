"""The GPU host's NVLink switches reach every process the kit starts there, and a value the
user set is never overridden (repro.engine.process_vars)."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from repro import runner
from repro.artifact import redact_env
from repro.core.vocabulary import FAULT_ENV
from repro.engine import process_vars
from repro.engine.process_vars import GPU_HOST_VARIABLES
from repro.profiles import NEMOTRON, PROFILES, TINY, get_profile

REPO = Path(__file__).resolve().parents[1]


def test_the_switches_are_the_three_this_workplace_needs():
    assert GPU_HOST_VARIABLES == {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }


def test_every_gpu_profile_carries_them_and_cpu_profiles_do_not():
    for profile in PROFILES.values():
        env = profile.engine_variables()
        if profile.device == "cuda":
            assert {k: env[k] for k in GPU_HOST_VARIABLES} == GPU_HOST_VARIABLES, profile.name
        else:
            assert not set(GPU_HOST_VARIABLES) & set(env), profile.name
    # A tiny profile moved to a GPU carries them too.
    assert set(GPU_HOST_VARIABLES) <= set(TINY.for_device("cuda").engine_variables())
    assert set(GPU_HOST_VARIABLES) <= set(get_profile("tiny-nemotron-h-tp4").engine_variables())


def test_a_value_the_user_set_is_kept():
    target = {"NCCL_NVLS_ENABLE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    now = process_vars.apply_defaults(NEMOTRON.engine_variables(), target)
    assert now["NCCL_NVLS_ENABLE"] == "1"
    assert now["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert now["NVSHMEM_DISABLE_NVLS"] == "1"
    # What the profile measures with is not the shell's to change.
    measured = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    target = {"VLLM_USE_FLASHINFER_SAMPLER": "1"}
    assert process_vars.apply_defaults(measured, target) == measured == target
    assert process_vars.gpu_host_variables({"NVSHMEM_DISABLE_NVLS": "0"}) == {
        **GPU_HOST_VARIABLES,
        "NVSHMEM_DISABLE_NVLS": "0",
    }


def test_the_engine_process_gets_them_on_a_gpu_only():
    base = {"PATH": "/usr/bin", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"}
    gpu = runner.engine_process_env(base, device="cuda", fault_kind="restored-state-noise")
    assert gpu["NCCL_NVLS_ENABLE"] == "0" and gpu["NVSHMEM_DISABLE_NVLS"] == "1"
    assert gpu["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "0"  # the user's
    assert gpu[FAULT_ENV] == "restored-state-noise"
    cpu = runner.engine_process_env({**base, FAULT_ENV: "stale"}, device="cpu", fault_kind=None)
    assert "NCCL_NVLS_ENABLE" not in cpu and FAULT_ENV not in cpu


def test_a_cpu_engine_waits_as_openmp_does_unless_the_user_says_passive():
    alone = runner.engine_process_env({"PATH": "/usr/bin"}, device="cpu", fault_kind=None)
    assert "OMP_WAIT_POLICY" not in alone  # spinning: an engine alone needs it
    shared = runner.engine_process_env(
        {"PATH": "/usr/bin", **process_vars.SHARED_CORES_VARIABLES}, device="cpu", fault_kind=None
    )
    assert shared["OMP_WAIT_POLICY"] == "PASSIVE"
    assert redact_env(dict(shared))["OMP_WAIT_POLICY"] == "PASSIVE"  # and recorded


def test_the_artifact_records_them():
    assert redact_env({**GPU_HOST_VARIABLES, "NCCL_SOMETHING_ELSE": "1"}) == dict(
        sorted(GPU_HOST_VARIABLES.items())
    )


@pytest.mark.skipif(not Path("/bin/bash").exists(), reason="needs bash")
def test_red_green_exports_them_to_the_run(tmp_path):
    """The bare-host script, with a stand-in `python3` on PATH (the GPU host's Python with
    vLLM cannot run here) that records the environment and arguments it got."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\nenv > "{tmp_path}/env.txt"\necho "$@" > "{tmp_path}/args.txt"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {
        "PATH": f"{fake.parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "NCCL_NVLS_ENABLE": "7",  # set by the user: kept
    }
    proc = subprocess.run(
        ["bash", str(REPO / "containers/bare-host/red-green.sh"), "parts", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = dict(
        line.split("=", 1)
        for line in (tmp_path / "env.txt").read_text().splitlines()
        if "=" in line
    )
    assert got["NCCL_NVLS_ENABLE"] == "7"
    for key in set(GPU_HOST_VARIABLES) - {"NCCL_NVLS_ENABLE"}:
        assert got[key] == GPU_HOST_VARIABLES[key], key
    args = (tmp_path / "args.txt").read_text().split()
    assert args[:7] == ["-m", "repro", "matrix", "--executor", "bare", "--device", "cuda"]
    assert args[args.index("--parts") + 1] == "parts"
    assert args[args.index("--conditions") + 1].endswith("containers/bare-host/red-green.toml")
