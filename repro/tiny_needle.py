"""The trained tiny NemotronH needle model: its committed checkpoint, checked before use.

`repro.needle_train` trains it on a GPU in about five minutes; CI's two cores cannot, so the
checkpoint it wrote is committed under `repro/checkpoints/tiny_needle/` (5.5 MB, bf16, the one
exception to "no weights in git") with the recipe it was trained from (`recipe.json`: recipe,
trainer version, digest, held-out recall) and a `SHA256SUMS` of every other file.

Before a run uses it, `verify` re-hashes every file and checks that the recipe in the
checkpoint is the trainer's current one: a checkpoint left behind by a changed recipe, trainer
or data is refused, with the command that rebuilds it (`python -m repro train-tiny
--retrain`, on a machine with a GPU).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from repro.atomicio import publish_folder, sha256_file
from repro.errors import ReproError

CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "tiny_needle"
SUMS = "SHA256SUMS"
FAMILY = "nemotron-h-needle"


def _sums(folder: Path) -> dict[str, str]:
    lines = (folder / SUMS).read_text().splitlines()
    return {name: digest for digest, name in (line.split("  ", 1) for line in lines if line)}


def verify(folder: Path = CHECKPOINT) -> dict:
    """The checkpoint's recipe record, after checking its files and its recipe."""
    from repro import needle_train

    folder = Path(folder)
    if not (folder / SUMS).is_file() or not (folder / "recipe.json").is_file():
        raise ReproError(
            f"no trained needle checkpoint in {folder} (expected {SUMS} and recipe.json); "
            f"train it with `python -m repro train-tiny --retrain` on a machine with a GPU"
        )
    for name, want in _sums(folder).items():
        path = folder / name
        got = sha256_file(path) if path.is_file() else "missing"
        if got != want:
            raise ReproError(
                f"needle checkpoint file {path}: sha256 {got}, expected {want} ({SUMS}); "
                f"restore it from git or retrain (`python -m repro train-tiny --retrain`)"
            )
    record = json.loads((folder / "recipe.json").read_text())
    want_digest = needle_train.recipe_digest(needle_train.RECIPE)
    if record.get("digest") != want_digest:
        raise ReproError(
            f"needle checkpoint in {folder} was trained from recipe {record.get('digest')}, "
            f"but the trainer's recipe is now {want_digest} (repro/needle_train.py changed); "
            f"retrain it with `python -m repro train-tiny --retrain` on a machine with a GPU"
        )
    return record


def is_trained_recipe(recipe: dict) -> bool:
    from repro import needle_train

    return recipe is needle_train.RECIPE


def install(target: Path, folder: Path = CHECKPOINT) -> Path:
    """Copy the verified checkpoint to `target` (the model cache), atomically."""
    verify(folder)
    target = Path(target)
    with publish_folder(target, prefix=".copying-", complete="config.json") as staging:
        for name in [*_sums(folder), "recipe.json", SUMS]:
            shutil.copyfile(folder / name, staging / name)
    return target


def retrain(out: Path | None = None, *, device: str | None = None) -> Path:
    """Train from the current recipe into `out`, or replace the committed checkpoint."""
    from repro import needle_train

    target = Path(out) if out else CHECKPOINT
    target.parent.mkdir(parents=True, exist_ok=True)
    # Train beside the target and swap it in whole: a crashed run never leaves a checkpoint
    # whose files disagree with each other.
    staging = Path(tempfile.mkdtemp(prefix=".training-", dir=target.parent))
    try:
        needle_train.train(
            needle_train.RECIPE,
            staging,
            log_path=staging / "train_log.jsonl",
            max_seconds=None,
            device=device or needle_train.default_device(),
        )
        # train() wrote recipe.json and SHA256SUMS beside the weights.
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    verify(target)
    return target
