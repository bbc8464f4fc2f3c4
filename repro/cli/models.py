"""`python -m repro` commands for the models a run reads (added to `repro.cli`'s parser).

tiny-model      build (or find) the tiny model and print its directory
train-tiny      check the committed trained needle model (--retrain: train it again)
fetch-weights   download a profile's model at a pinned commit, write its sha256 manifest
verify-weights  re-hash a fetched snapshot against its manifest (offline)

Also a run's weights pin (`check_weights_pin`, `pinned_snapshot`), which `repro.cli.run` uses.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from repro import weights
from repro.core.errors import ReproError
from repro.models import tiny_needle, tinymodel
from repro.profiles import get_profile


def add_parsers(sub: argparse._SubParsersAction) -> None:
    model = sub.add_parser("tiny-model", help="build the tiny model, print its directory")
    model.add_argument("--cache", type=Path, default=None)
    model.add_argument("--family", default="qwen3-next", choices=tinymodel.FAMILIES)

    train = sub.add_parser(
        "train-tiny", help="check the trained needle model's checkpoint, or --retrain it"
    )
    train.add_argument(
        "--retrain",
        action="store_true",
        help="train it again from repro/models/needle_train.py's recipe (minutes on a GPU) and "
        "replace the checkpoint (or write to --out)",
    )
    train.add_argument(
        "--family",
        default="nemotron-h-needle",
        choices=sorted(tiny_needle.CHECKPOINTS),
        help="which trained model (default: nemotron-h-needle)",
    )
    train.add_argument("--out", type=Path, default=None, help="with --retrain: write here")
    train.add_argument("--device", default=None, help="with --retrain: torch device")

    for name, text in (
        ("fetch-weights", "fetch a profile's model at a pinned commit, write its manifest"),
        ("verify-weights", "re-hash a fetched snapshot against its manifest (offline)"),
    ):
        weights = sub.add_parser(name, help=text)
        which = weights.add_mutually_exclusive_group(required=True)
        which.add_argument("--profile", help="a GPU profile (its model repo)")
        which.add_argument("--repo", help="a model repo id instead of a profile's")
        weights.add_argument("--revision", help="full 40-hex commit (default: profile, lock)")
        weights.add_argument(
            "--cache", type=Path, help="cache folder (default: $REPRO_WEIGHTS_CACHE or HF's)"
        )
        weights.add_argument(
            "--lock", type=Path, help="lock file (default: containers/weights.lock.json)"
        )


def cmd_tiny_model(args: argparse.Namespace) -> int:
    print(tinymodel.ensure_tiny_model(args.cache, recipe=tinymodel.recipe_for(args.family)))
    return 0


def cmd_train_tiny(args: argparse.Namespace) -> int:
    if not args.retrain:
        if args.out or args.device:
            raise ReproError("--out and --device go with --retrain")
        record = tiny_needle.verify(family=args.family)
        checkpoint = tiny_needle.CHECKPOINTS[args.family]
        print(json.dumps({"checkpoint": str(checkpoint), **record["metrics"]}))
        return 0
    print(tiny_needle.retrain(args.out, device=args.device, family=args.family))
    return 0


def _weights_target(args: argparse.Namespace) -> dict:
    if args.repo:
        repo_id, profile_revision = args.repo, None
    else:
        profile = get_profile(args.profile)
        if profile.tiny_model is not None:
            raise ReproError(f"profile {profile.name!r} builds its model; it has no weights")
        repo_id, profile_revision = profile.model, profile.revision
    return {
        "repo_id": repo_id,
        "revision": args.revision,
        "profile_revision": profile_revision,
        "cache": args.cache,
        "lock_path": args.lock or weights.DEFAULT_LOCK,
    }


def cmd_fetch_weights(args: argparse.Namespace) -> int:
    target = _weights_target(args)
    result = weights.fetch(target.pop("repo_id"), **target)
    print(result.snapshot)
    return 0


def cmd_verify_weights(args: argparse.Namespace) -> int:
    target = _weights_target(args)
    repo_id = target.pop("repo_id")
    snapshot, problems = weights.verify(repo_id, **target)
    if problems:
        print(f"{snapshot}: {len(problems)} problem(s) against {weights.MANIFEST_NAME}")
        for line in problems:
            print(f"  {line}")
        return 1
    print(f"{snapshot}: every file matches {weights.MANIFEST_NAME}")
    return 0


def check_weights_pin(profile, model_path, *, allow_unpinned: bool) -> dict:
    """Refuse an unpinned model (unless --allow-unpinned); the answer goes into every arm's
    `RunContext`, so every artifact records it. Inside a container the host has checked what
    it mounted and passes its answer down (REPRO_WEIGHTS_PIN, the container's one channel)."""
    if os.environ.get("REPRO_IN_CONTAINER") == "1" and os.environ.get(weights.PIN_ENV):
        return json.loads(os.environ[weights.PIN_ENV])
    pin = weights.model_pin(
        profile.model,
        model_path,
        profile_revision=profile.revision,
        allow_unpinned=allow_unpinned,
    )
    if not pin["pinned"]:
        print(f"[repro] WARNING: {profile.model} is not at a pinned commit (--allow-unpinned)")
    return pin


def pinned_snapshot(profile) -> tuple[Path, str]:
    """A GPU profile's weights at their pinned commit in the weights cache: the repo folder
    (mounted whole, since a snapshot's files link into its blobs/) and the snapshot in it."""
    revision, _source = weights.pinned_revision(
        profile.model, profile_revision=profile.revision, lock_path=weights.DEFAULT_LOCK
    )
    cache = weights.default_cache_dir()
    snapshot = weights.snapshot_dir(cache, profile.model, revision) if revision else None
    if snapshot is None or not snapshot.is_dir():
        raise ReproError(
            f"the weights of {profile.model} at the pinned commit are not in {cache}; fetch "
            f"them (`python -m repro fetch-weights --profile {profile.name}`) or give "
            f"--model-path SNAPSHOT"
        )
    return weights.repo_folder(cache, profile.model), f"snapshots/{snapshot.name}"


COMMANDS = {
    "tiny-model": cmd_tiny_model,
    "train-tiny": cmd_train_tiny,
    "fetch-weights": cmd_fetch_weights,
    "verify-weights": cmd_verify_weights,
}
