"""`matrix`, `matrix-cell` and `bisect`: the parsers of repro.fanout's commands.

The commands themselves (what runs the cells, the Slurm array, the search) live in
repro.fanout; this module only says which flags they take.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from repro.cli.arg_values import positive_int_type
from repro.core.vocabulary import ARMS
from repro.fanout import bisect, cell, matrix
from repro.profiles import PROFILES

COMMANDS = {
    "matrix": matrix.cmd_matrix,
    "matrix-cell": cell.cmd_matrix_cell,
    "bisect": bisect.cmd_bisect,
}


def add_parsers(sub: argparse._SubParsersAction) -> None:
    _add_matrix(sub)
    _add_bisect(sub)


def _add_matrix(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("matrix", help="every condition × arm; matrix.json and MATRIX.md")
    m.add_argument("--conditions", type=Path, help="TOML file of [[condition]] tables")
    m.add_argument("--out", type=Path, required=True, help="matrix directory")
    m.add_argument("--vllm", action="append", default=[], help="a release, one row each (flags)")
    m.add_argument("--patch", action="append", type=Path, default=[], help="with --vllm")
    m.add_argument(
        "--override", action="append", default=[], metavar="KEY=JSON", help="with --vllm"
    )
    m.add_argument("--profile", default="tiny", choices=sorted(PROFILES), help="with --vllm")
    m.add_argument("--inject-fault", action="store_true", help="with --vllm: positive control")
    m.add_argument("--arm-timeout", type=float, default=None, help="seconds per arm")
    m.add_argument(
        "--executor",
        choices=["local", "slurm", "bare"],
        default="local",
        help="local: here, --cells-at-once at a time; slurm: one job array; bare: here, on "
        "carried install sets (--parts), for a GPU host with no network",
    )
    m.add_argument(
        "--cells-at-once",
        type=positive_int_type("expected a whole number of cells, 1 or more; got {text!r}"),
        default=None,
        metavar="N",
        help="--executor local: cells run at the same time, the free cores split among their "
        "engines (default: one per free core, as many as memory holds)",
    )
    m.add_argument(
        "--parts",
        action="append",
        type=Path,
        default=[],
        metavar="SET_DIR",
        help="--executor bare: an install set's folder, one per vLLM release",
    )
    m.add_argument(
        "--extra-wheels",
        type=Path,
        metavar="DIR",
        help="--executor bare: wheels the kit needs and the host lacks",
    )
    m.add_argument("--trees", type=Path, help="--executor bare: where the installed trees live")
    m.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="--executor bare: run the profiles on this device (a bare GPU host: cuda)",
    )
    m.add_argument(
        "--gpus-per-cell",
        type=positive_int_type("expected a whole number of GPUs per cell, 1 or more; got {text!r}"),
        default=None,
        metavar="N",
        help="--executor bare: run floor(GPUs / N) cells at once, each on its own N of the "
        "host's GPUs (those CUDA_VISIBLE_DEVICES names, else nvidia-smi's); default: one cell "
        "at a time with every GPU (N is not read from the profile)",
    )
    m.add_argument(
        "--dry-run",
        action="store_true",
        help="check every condition as the matrix would and print what it would do (with "
        "--executor slurm: the sbatch script and array); make and submit nothing; exit 2 "
        "listing each condition that cannot run",
    )
    _add_slurm_options(m)
    c = sub.add_parser("matrix-cell", help="(internal) one matrix cell, as a Slurm task runs it")
    c.add_argument("--cell", type=Path, required=True)


def _add_slurm_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("slurm executor")
    g.add_argument("--partition", default=None, help="default: the profile's (gpu for GPU ones)")
    g.add_argument(
        "--time-limit",
        type=int,
        default=None,
        metavar="MINUTES",
        help="per task (default: arms × arm timeout + 10 min)",
    )
    g.add_argument("--gpus-per-task", type=int, default=None, help="default: the profile's GPUs")
    g.add_argument("--cpus-per-task", type=int, default=None)
    g.add_argument(
        "--container-image",
        default=None,
        help="run every task in this image through pyxis (srun --container-image); default: "
        "each CUDA condition's own image",
    )
    g.add_argument(
        "--weights-cache",
        type=Path,
        default=None,
        help="GPU profiles: the weights cache to mount (default: the kit's)",
    )
    g.add_argument("--max-parallel", type=int, default=None, help="array throttle (%%N)")
    g.add_argument("--poll", type=float, default=5.0, help="seconds between squeue polls")
    g.add_argument("--slurm-task-standin", default=None, help=argparse.SUPPRESS)


def _add_bisect(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bisect", help="the first ref whose verdict differs from the bad end's")
    b.add_argument("--arm", required=True, choices=list(ARMS))
    b.add_argument("--bad", required=True, help="the ref with the verdict to search away from")
    b.add_argument("--good", required=True, help="the ref known to differ")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    b.add_argument("--patch", action="append", type=Path, default=[], help="on every probe")
    b.add_argument("--override", action="append", default=[], metavar="KEY=JSON")
    b.add_argument("--arm-timeout", type=float, default=None)
    b.add_argument("--commits", type=Path, help="main commits, one sha a line, history order")
    b.add_argument("--wheel-index", help="per-commit wheel index: URL/<sha>/ lists its wheels")
    b.add_argument(
        "--patch-series",
        type=Path,
        metavar="FILE",
        help="refs are the steps of a patch series on --base: one diff a line, in order; "
        "step i is the release with the first i diffs, named by the i-th diff's file stem",
    )
    b.add_argument("--base", metavar="RELEASE", help="with --patch-series: the release")
    b.add_argument(
        "--executor",
        choices=["local", "slurm"],
        default="local",
        help="local: here, one probe at a time; slurm: each round one job array",
    )
    b.add_argument(
        "--probes-at-once",
        type=positive_int_type(
            "expected a whole number of probes per round, 1 or more; got {text!r}"
        ),
        default=1,
        metavar="K",
        help="--executor slurm: probes per round (K free GPUs or nodes); a round splits the "
        "range left into K+1 parts (default 1: binary search)",
    )
    b.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="cuda: each probe in its own CUDA image, as a Slurm array task (default: the "
        "profile's device)",
    )
    b.add_argument(
        "--dry-run",
        action="store_true",
        help="each candidate probe's engine (a CUDA image with its pins, or the commands that "
        "build it) and the first round's sbatch script; nothing made or submitted",
    )
    _add_slurm_options(b)
