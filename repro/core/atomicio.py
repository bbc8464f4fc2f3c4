"""Atomic file writes, and the kit's one sha256 of a file (`sha256_file`, `sha256_stream`).

A reader of a path written here sees either the old file or the complete new one, never a
half-written file: the text goes to a temporary file in the same directory (so the rename
cannot cross file systems), is flushed and fsync'd, and then replaces the target with
``os.replace``, which is atomic on POSIX. On any failure the temporary file is removed and
the old file, if there was one, is left as it was. A folder is published the same way
(`publish_folder`): filled beside its target, then renamed onto it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

__all__ = [
    "open_atomic",
    "sha256_file",
    "sha256_stream",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]

# Mode for a file that did not exist before. A rewritten file keeps its old mode instead.
# mkstemp creates 0600 files; artifacts are meant to be read by others (bundles, reviewers).
_NEW_FILE_MODE = 0o644
_HASH_CHUNK = 1 << 20


def write_text_atomic(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, ``os.replace``).

    The text is encoded before any file is created, so an unencodable string leaves no trace.
    """
    write_bytes_atomic(path, text.encode(encoding))


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, ``os.replace``)."""
    with open_atomic(path) as out:
        out.write(data)


@contextlib.contextmanager
def open_atomic(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file that becomes ``path`` only when the ``with`` block ends without error.

    For output too large to hold in memory (image archives): write in chunks, and readers of
    ``path`` still see the old file or the complete new one. On an exception the temporary
    file is removed and ``path`` is left as it was.
    """
    target = Path(path)
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = _NEW_FILE_MODE
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            os.fchmod(tmp.fileno(), mode)
            yield tmp
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(target.parent)


@contextlib.contextmanager
def publish_folder(target: Path, *, prefix: str, complete: str) -> Iterator[Path]:
    """A fresh folder beside ``target`` for the caller to fill; when the block ends without an
    error it is renamed onto ``target``, its files readable by any user (containers mount it
    read-only, maybe as another uid). A crashed fill never looks like a finished folder. When
    the rename fails because another process published ``target`` first (its ``complete``
    file is there), theirs is equivalent and stands. The staging folder never remains."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    try:
        yield staging
        staging.chmod(0o755)
        for item in staging.iterdir():
            item.chmod(0o644)
        try:
            os.replace(staging, target)
        except OSError:
            if not (target / complete).is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def write_json_atomic(
    path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2, sort_keys: bool = False
) -> None:
    """Serialize ``obj`` as JSON and write it to ``path`` atomically.

    Serialization happens first: an object that cannot be serialized (a set, NaN, infinity,
    which are not JSON) raises before the target is touched. The file ends with a newline.
    """
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=False, allow_nan=False)
    write_text_atomic(path, text + "\n")


def sha256_file(
    path: str | os.PathLike[str], *, progress: Callable[[int], None] | None = None
) -> str:
    """The hex sha256 of the file at ``path``, read in chunks (``progress(bytes)`` after each)."""
    with open(path, "rb") as f:
        return sha256_stream(f, progress=progress)[0]


def sha256_stream(
    handle: BinaryIO, *, progress: Callable[[int], None] | None = None
) -> tuple[str, int]:
    """The hex sha256 and the length of what is left to read in ``handle``."""
    digest = hashlib.sha256()
    size = 0
    while chunk := handle.read(_HASH_CHUNK):
        digest.update(chunk)
        size += len(chunk)
        if progress is not None:
            progress(len(chunk))
    return digest.hexdigest(), size


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable. Best effort: some file systems refuse to fsync a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
