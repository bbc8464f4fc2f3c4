"""Which GPUs each cell of a bare-host matrix gets: `matrix --executor bare --gpus-per-cell N`.

The host's GPUs are the ones CUDA_VISIBLE_DEVICES names where it is set (a scheduler's or the
user's choice, kept), else every GPU `nvidia-smi` lists, by its index. They are cut in order
into floor(GPUs / N) disjoint slices of N; the matrix runs that many cells at once, each cell's
process with CUDA_VISIBLE_DEVICES set to its own slice, which its run records keep among their
environment variables (`repro.artifact.redact_env`) and matrix.json's `gpus` names per cell.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from repro import machine_facts
from repro.core.errors import ReproError

VISIBLE = "CUDA_VISIBLE_DEVICES"
# nvidia-smi numbers GPUs in PCI bus order; CUDA by default puts the fastest first. A slice
# read from nvidia-smi means its indices only where CUDA numbers them the same way.
ORDER = "CUDA_DEVICE_ORDER"
SMI_ORDER = "PCI_BUS_ID"


class GpuSliceError(ReproError):
    """More GPUs per cell than the host has."""


@dataclass(frozen=True)
class HostGpus:
    """The GPUs a matrix may hand out, as CUDA_VISIBLE_DEVICES entries, and where they came
    from ("CUDA_VISIBLE_DEVICES" or "nvidia-smi")."""

    ids: tuple[str, ...]
    source: str

    def describe(self) -> str:
        if self.source == VISIBLE:
            return f"{VISIBLE}={','.join(self.ids)}"
        return f"{VISIBLE} unset; nvidia-smi lists {len(self.ids)}"


def host_gpus(
    env: Mapping[str, str] | None = None, *, listed: Sequence[Any] | None = None
) -> HostGpus:
    """This host's GPUs (``listed``: nvidia-smi's GPUs already read, for tests)."""
    env = os.environ if env is None else env
    if VISIBLE in env:
        return HostGpus(tuple(g.strip() for g in env[VISIBLE].split(",") if g.strip()), VISIBLE)
    gpus = machine_facts.list_gpus() if listed is None else listed
    return HostGpus(tuple(str(index) for index in range(len(gpus))), "nvidia-smi")


def cut(ids: Sequence[str], per_cell: int) -> list[tuple[str, ...]]:
    """floor(len(ids) / per_cell) disjoint slices of ``per_cell`` GPUs, in order; the GPUs
    left over are not used."""
    if per_cell < 1:
        raise ValueError(f"per_cell must be 1 or more, got {per_cell}")
    whole = len(ids) - len(ids) % per_cell
    return [tuple(ids[i : i + per_cell]) for i in range(0, whole, per_cell)]


@dataclass(frozen=True)
class Slicing:
    """The host's GPUs cut for a matrix: ``slices``, one per cell running at a time."""

    host: HostGpus
    per_cell: int
    slices: tuple[tuple[str, ...], ...]

    def describe(self) -> str:
        cut_text = " | ".join(",".join(s) for s in self.slices)
        return (
            f"{len(self.slices)} cell(s) at once, {self.per_cell} GPU(s) each ({cut_text}; "
            f"{self.host.describe()})"
        )

    def record(self, cells: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        """matrix.json's `gpus`: the cut, and the slice each cell that ran got."""
        return {
            "source": self.host.source,
            "visible": list(self.host.ids),
            "per_cell": self.per_cell,
            "at_once": len(self.slices),
            "cells": {name: ",".join(gpus) for name, gpus in cells.items()},
        }


def plan(per_cell: int, host: HostGpus | None = None) -> Slicing:
    """The slices the cells run on; refused before anything runs when the host has fewer
    GPUs than one cell needs."""
    host = host_gpus() if host is None else host
    found = cut(host.ids, per_cell)
    if not found:
        have = len(host.ids)
        raise GpuSliceError(
            f"--gpus-per-cell {per_cell}: expected at least {per_cell} GPU(s) on this host, "
            f"found {have} ({host.describe()}); give --gpus-per-cell {have} or fewer"
            if have
            else f"--gpus-per-cell {per_cell}: expected at least {per_cell} GPU(s) on this "
            f"host, found none ({host.describe()}); run on a GPU host or name its GPUs in "
            f"{VISIBLE}, or leave --gpus-per-cell out"
        )
    return Slicing(host, per_cell, tuple(found))


def cell_variables(
    gpus: Sequence[str], host: HostGpus, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables a cell's process gets for its slice: CUDA_VISIBLE_DEVICES, and CUDA's
    numbering set to nvidia-smi's where the slice is made of its indices (unless the user
    chose one)."""
    env = os.environ if env is None else env
    variables = {VISIBLE: ",".join(gpus)}
    if host.source != VISIBLE and ORDER not in env:
        variables[ORDER] = SMI_ORDER
    return variables
