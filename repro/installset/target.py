"""The folder a set is installed into: checked before anything is made, its marker, replacing it.

The marker (``.repro-installset.json``) names the set (its manifest's sha256) and lists every
file the install wrote, with its size and sha256. It tells an intact install of this set
(nothing to do) from a damaged one (said by name), and ``--replace`` removes only the files it
lists: a file the user added survives, moved into the new install and named. A file listed
in the marker is only ever looked up inside the target, by a path of plain names.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from repro.core.atomicio import sha256_file
from repro.core.jsonread import JSONUnreadable, read_json
from repro.installset import BadInstallInput, InstallSetError

MARKER_NAME, MARKER_FORMAT = ".repro-installset.json", "repro-install-set-marker"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHOWN = 10  # files named in a message; the rest are counted


def _names(paths: list[str]) -> str:
    shown = ", ".join(paths[:_SHOWN])
    return shown + (f" and {len(paths) - _SHOWN} more" if len(paths) > _SHOWN else "")


def check_writable(target: Path) -> None:
    """Raise `BadInstallInput` unless ``target`` can become (or be replaced by) a folder of
    its own: it is a folder or nothing, and the folder that will hold it can be written."""
    if target.is_symlink():
        raise BadInstallInput(
            f"--target {target} is a symbolic link; name the folder itself (the install "
            "replaces the target by renaming, which would replace the link)"
        )
    if target.exists() and not target.is_dir():
        raise BadInstallInput(f"--target {target} exists and is not a folder; name a folder")
    holder = target.parent
    while not holder.exists() and holder != holder.parent:
        holder = holder.parent
    if not holder.is_dir():
        raise BadInstallInput(f"--target {target}: {holder} is a file, not a folder")
    try:  # the only sure test of writing there (permissions, read-only mounts, /proc)
        os.rmdir(tempfile.mkdtemp(prefix=".repro-installset-probe-", dir=holder))
    except OSError as exc:
        raise BadInstallInput(
            f"--target {target}: cannot create folders in {holder} ({exc.strerror or exc}); "
            "name a target in a folder you can write"
        ) from None


def read_marker(target: Path) -> dict[str, Any] | None:
    """The marker in ``target``; None where there is none. A marker that is not one the kit
    wrote is refused: nothing it says can be trusted to decide what to delete."""
    path = target / MARKER_NAME
    if not path.exists() and not path.is_symlink():
        return None
    try:
        marker = read_json(path)
    except JSONUnreadable as exc:
        raise BadInstallInput(f"--target {target}: its marker cannot be read ({exc})") from None
    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        raise BadInstallInput(
            f"--target {target}: {MARKER_NAME} is not a marker the kit wrote; give an empty "
            "or new folder"
        )
    files = marker.get("files")
    if files is not None and not _listing_ok(files):
        raise BadInstallInput(
            f"--target {target}: {MARKER_NAME} lists files that are not plain paths inside "
            "it; it was not written by the kit: give an empty or new folder"
        )
    return marker


def _listing_ok(files: Any) -> bool:
    if not isinstance(files, dict):
        return False
    for rel, entry in files.items():
        parts = PurePosixPath(rel).parts
        plain = rel and not rel.startswith("/") and "\\" not in rel
        if not plain or any(p in ("", ".", "..") for p in parts) or "/".join(parts) != rel:
            return False
        if not isinstance(entry, dict):
            return False
        link, size, sha = entry.get("symlink"), entry.get("bytes"), entry.get("sha256")
        if not (isinstance(link, str) or (type(size) is int and _SHA256.fullmatch(str(sha)))):
            return False
    return True


def _walk(folder: Path) -> dict[str, Path]:
    """Every file, symbolic link and empty folder under ``folder`` by its relative path,
    never through a link."""
    found: dict[str, Path] = {}
    for here, dirs, files in os.walk(folder):
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(here, d)))]:
            path = Path(here, name)
            found[path.relative_to(folder).as_posix()] = path
        if not dirs and not files and Path(here) != folder:
            found[Path(here).relative_to(folder).as_posix()] = Path(here)
    return found


def listing(folder: Path) -> dict[str, dict[str, Any]]:
    """What the marker records of ``folder``: each file's size and sha256, each link's text."""
    files: dict[str, dict[str, Any]] = {}
    for rel, path in sorted(_walk(folder).items()):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            files[rel] = {"symlink": os.readlink(path)}
        elif stat.S_ISREG(info.st_mode) and rel != MARKER_NAME:
            files[rel] = {"bytes": info.st_size, "sha256": sha256_file(path)}
    return files


def damage(target: Path, files: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The listed files that are missing or changed in ``target``, each with what is wrong."""
    problems = []
    for rel, want in files.items():
        path = target / rel
        if any(p.is_symlink() for p in path.parents if target in p.parents):
            problems.append(f"{rel} (changed: a folder above it is now a link)")
            continue
        try:
            info = path.lstat()
        except FileNotFoundError:
            problems.append(f"{rel} (missing)")
            continue
        except OSError as exc:
            problems.append(f"{rel} (unreadable: {exc.strerror})")
            continue
        if "symlink" in want:
            same = stat.S_ISLNK(info.st_mode) and os.readlink(path) == want["symlink"]
        else:
            same = stat.S_ISREG(info.st_mode) and info.st_size == want["bytes"]
            same = same and sha256_file(path) == want["sha256"]
        if not same:
            problems.append(f"{rel} (changed)")
    return problems


def _is_cache_of(rel: str, listed: Mapping[str, Any]) -> bool:
    """``rel`` is Python's byte code of a listed module (``pkg/__pycache__/m.cpython-312.pyc``
    of ``pkg/m.py``): written when the install was used, it goes with its module."""
    path = PurePosixPath(rel)
    if path.suffix != ".pyc" or path.parent.name != "__pycache__":
        return False
    return str(path.parent.parent / f"{path.name.split('.')[0]}.py") in listed


def users_files(target: Path, marker: Mapping[str, Any]) -> list[str]:
    """What in ``target`` the marker does not list: files the user added, kept by --replace."""
    listed = marker["files"]
    # An empty folder that held listed files (since deleted) is the install's, not the user's.
    holders = {str(parent) for rel in listed for parent in PurePosixPath(rel).parents}
    return sorted(
        rel
        for rel in _walk(target)
        if rel != MARKER_NAME
        and rel not in listed
        and rel not in holders
        and not _is_cache_of(rel, listed)
    )


def swap(staging: Path, target: Path, marker: Mapping[str, Any] | None, say) -> list[str]:
    """Put the finished install ``staging`` at ``target``. An old install there (its
    ``marker``) goes, but for what the user added to it, which moves into the new install.
    Returns those files. A file of the user's is never deleted: where one cannot be moved,
    the old folder stays, named."""
    if marker is None:  # a new or empty target
        if target.exists():
            target.rmdir()
        os.rename(staging, target)
        return []
    kept = users_files(target, marker)
    clash = [rel for rel in kept if os.path.lexists(staging / rel) and not (staging / rel).is_dir()]
    clash += [rel for rel in kept if any((staging / p).is_file() for p in Path(rel).parents)]
    if clash:
        raise BadInstallInput(
            f"--target {target}: file(s) you added sit where the new install writes: "
            f"{_names(sorted(set(clash)))}; move them out of {target} and run again. Nothing "
            "was changed"
        )
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    os.rename(target, old)
    try:
        os.rename(staging, target)
    except OSError:
        os.rename(old, target)
        raise
    try:
        for rel in kept:
            if (old / rel).is_dir() and not (old / rel).is_symlink() and (target / rel).is_dir():
                continue  # an empty folder of the user's that the new install also has
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            os.rename(old / rel, target / rel)
    except OSError as exc:
        raise InstallSetError(
            f"installed into {target}, but could not move back the files you added "
            f"({exc.strerror or exc}): they are in {old}; move them by hand"
        ) from None
    _remove_old(old, marker["files"], say)
    return kept


def _remove_old(old: Path, listed: Mapping[str, Any], say) -> None:
    """Delete the old install's listed files (and their byte code), then the folders left
    empty. Anything else stays in ``old``, which is then named."""
    for rel, path in _walk(old).items():
        if rel == MARKER_NAME or rel in listed or _is_cache_of(rel, listed):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    for here, _dirs, _files in sorted(os.walk(old, topdown=False), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):
            os.rmdir(here)
    if old.exists():
        say(
            f"  {old} still holds something the old marker did not list; look at it, then delete it"
        )


def discard(folder: Path) -> None:
    """Remove a staging or wheel folder of this installer's own."""
    shutil.rmtree(folder, ignore_errors=True)
