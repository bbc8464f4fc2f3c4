"""The trained tiny needle models: their committed checkpoints, checked before use.

Two families (`needle_train.RECIPES`): a NemotronH (`repro/checkpoints/tiny_needle/`) and a
Qwen3-Next (`repro/checkpoints/tiny_needle_qwen3_next/`). `repro.models.needle_train` trains each on
a GPU in minutes; CI's two cores cannot, so the checkpoint it wrote is committed (the one
exception to "no weights in git") with the recipe it was trained from (`recipe.json`: recipe,
trainer version, digest, held-out recall) and a `SHA256SUMS` of every other file. The weights
(bf16) are committed xz-compressed (the repository tracks no file over 5 MiB); `SHA256SUMS`
names the file as trained, and `install` unpacks it into the model cache.

Before a run uses it, `verify` re-hashes every file and checks that the recipe in the
checkpoint is the trainer's current one: a checkpoint left behind by a changed recipe, trainer
or data is refused, with the command that rebuilds it (`python -m repro train-tiny --family
FAMILY --retrain`, on a machine with a GPU).
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

from repro.core.atomicio import publish_folder, sha256_stream
from repro.core.errors import ReproError
from repro.models import needle_train

_CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"
FAMILY = "nemotron-h-needle"  # the first one, and the default of every function here
CHECKPOINTS = {
    "nemotron-h-needle": _CHECKPOINTS / "tiny_needle",
    "qwen3-next-needle": _CHECKPOINTS / "tiny_needle_qwen3_next",
}
CHECKPOINT = CHECKPOINTS[FAMILY]
SUMS = "SHA256SUMS"
# Committed compressed (the repository's 5 MiB limit per file); named as trained elsewhere.
PACKED = ("model.safetensors",)
PACKED_SUFFIX = ".xz"


def open_file(folder: Path, name: str) -> BinaryIO:
    """A checkpoint file, as trained, whether it is kept packed (`PACKED`) or plain."""
    plain = Path(folder) / name
    packed = plain.with_name(name + PACKED_SUFFIX)
    if not plain.is_file() and packed.is_file():
        return lzma.open(packed, "rb")
    return open(plain, "rb")


def read_bytes(name: str, folder: Path = CHECKPOINT) -> bytes:
    with open_file(folder, name) as handle:
        return handle.read()


def _sums(folder: Path) -> dict[str, str]:
    lines = (folder / SUMS).read_text().splitlines()
    return {name: digest for digest, name in (line.split("  ", 1) for line in lines if line)}


def family_of(recipe: dict) -> str | None:
    """The needle family whose trained recipe `recipe` is (None for a built model's)."""
    return next((f for f, r in needle_train.RECIPES.items() if r is recipe), None)


def verify(folder: Path | None = None, family: str = FAMILY) -> dict:
    """The checkpoint's recipe record, after checking its files and its recipe."""
    folder = Path(folder) if folder is not None else CHECKPOINTS[family]
    if not (folder / SUMS).is_file() or not (folder / "recipe.json").is_file():
        raise ReproError(
            f"no trained needle checkpoint in {folder} (expected {SUMS} and recipe.json); "
            f"train it with `{_retrain_command(family)}` on a machine with a GPU"
        )
    for name, want in _sums(folder).items():
        path = folder / name
        try:
            with open_file(folder, name) as handle:
                got = sha256_stream(handle)[0]
        except FileNotFoundError:
            got = "missing"
        except (lzma.LZMAError, EOFError) as exc:  # corrupt or cut short
            got = f"unreadable ({exc})"
        if got != want:
            raise ReproError(
                f"needle checkpoint file {path}: sha256 {got}, expected {want} ({SUMS}); "
                f"restore it from git or retrain (`{_retrain_command(family)}`)"
            )
    record = json.loads((folder / "recipe.json").read_text())
    want_digest = needle_train.recipe_digest(needle_train.RECIPES[family])
    if record.get("digest") != want_digest:
        raise ReproError(
            f"needle checkpoint in {folder} was trained from recipe {record.get('digest')}, "
            f"but the trainer's recipe is now {want_digest} (repro/models/needle_train.py "
            f"changed); retrain it with `{_retrain_command(family)}` on a machine with a GPU"
        )
    return record


def _retrain_command(family: str) -> str:
    return f"python -m repro train-tiny --family {family} --retrain"


def install(target: Path, folder: Path | None = None, family: str = FAMILY) -> Path:
    """Copy the verified checkpoint to `target` (the model cache), atomically."""
    folder = Path(folder) if folder is not None else CHECKPOINTS[family]
    verify(folder, family)
    target = Path(target)
    with publish_folder(target, prefix=".copying-", complete="config.json") as staging:
        for name in _sums(folder):
            with open_file(folder, name) as src, open(staging / name, "wb") as dst:
                shutil.copyfileobj(src, dst)
        for name in ("recipe.json", SUMS):
            shutil.copyfile(folder / name, staging / name)
    return target


def _pack(folder: Path) -> None:
    """Compress the `PACKED` files in place, for the checkpoint kept in git."""
    for name in PACKED:
        plain = folder / name
        with (
            open(plain, "rb") as src,
            lzma.open(
                plain.with_name(name + PACKED_SUFFIX), "wb", preset=9 | lzma.PRESET_EXTREME
            ) as dst,
        ):
            shutil.copyfileobj(src, dst)
        plain.unlink()


def retrain(out: Path | None = None, *, device: str | None = None, family: str = FAMILY) -> Path:
    """Train from the family's current recipe into `out`, or replace its committed checkpoint."""
    committed = CHECKPOINTS[family]
    target = Path(out) if out else committed
    target.parent.mkdir(parents=True, exist_ok=True)
    # Train beside the target and swap it in whole: a crashed run never leaves a checkpoint
    # whose files disagree with each other.
    staging = Path(tempfile.mkdtemp(prefix=".training-", dir=target.parent))
    try:
        needle_train.train(
            needle_train.RECIPES[family],
            staging,
            log_path=staging / "train_log.jsonl",
            max_seconds=None,
            device=device or needle_train.default_device(),
        )
        # train() wrote recipe.json and SHA256SUMS beside the weights.
        if target == committed:
            _pack(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    verify(target, family)
    return target
