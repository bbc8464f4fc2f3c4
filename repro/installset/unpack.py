"""Verify and install an install set on the host: the Python standard library only.

This module runs on a bare GPU host with nothing but ``python3`` and the kit's source tree on
PYTHONPATH: it imports nothing outside the standard library (and, from the kit, only modules
that do the same). Keep it that way.

``verify`` checks every part's size and sha256, and the sha256 of the parts joined, against
the manifest, and names each bad or missing part with what was expected and what was found.
``install`` verifies, then streams the joined parts through xz and tar into a temporary
folder beside the target (members with absolute paths, ``..``, links that leave the folder,
resolved against what is already extracted, sparse files, devices and FIFOs are refused; the
manifest's file count and unpacked size bound it; tarfile's data filter is required),
checks the file count and the archive's sha256 once more, writes a marker recording the
manifest's sha256, and only then renames the folder into place: a target either holds a
whole install or does not exist.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from repro.atomicio import write_json_atomic
from repro.installset import InstallSetError
from repro.installset.manifest import load_manifest
from repro.installset.progress import Steps, human_bytes

__all__ = ["MARKER_NAME", "PartsInvalid", "UnsafeArchive", "install", "unsafe_reason", "verify"]

MARKER_NAME = ".repro-installset.json"
try:
    from lzma import LZMAError

    _LZMA_ERRORS: tuple[type[Exception], ...] = (LZMAError,)
except ImportError:  # a Python built without liblzma decodes with the xz program
    _LZMA_ERRORS = ()
_CHUNK = 1 << 20


class PartsInvalid(InstallSetError):
    """One or more parts (or the joined archive) do not match the manifest."""

    def __init__(self, problems: list[str], parts_dir: Path) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"refusing the install set in {parts_dir}: {len(problems)} problem(s)\n{lines}\n"
            "Copy the named part(s) again from the build's output folder; nothing was installed."
        )


class UnsafeArchive(InstallSetError):
    """The archive holds a member the installer will not write."""


@dataclass
class Verified:
    manifest: dict[str, Any]
    manifest_sha256: str
    parts: list[Path]
    timings: dict[str, float] = field(default_factory=dict)


def verify(parts_dir: str | Path, *, steps: Steps | None = None) -> Verified:
    """Check every part and the joined archive against the manifest; raise ``PartsInvalid``."""
    steps = steps or Steps()
    parts_dir = Path(parts_dir)
    with steps.step("read manifest"):
        manifest, manifest_sha = load_manifest(parts_dir)
    parts = manifest["parts"]
    archive = manifest["archive"]
    problems: list[str] = []
    paths = [parts_dir / p["name"] for p in parts]
    total = archive["bytes"]
    with steps.step(f"verify {len(parts)} part(s), {human_bytes(total)}"):
        whole = hashlib.sha256()
        whole_ok = True
        for i, (part, path) in enumerate(zip(parts, paths, strict=True), start=1):
            label = f"part {i}/{len(parts)} {part['name']}"
            if not path.is_file():
                problems.append(
                    f"{label}: missing (expected {part['bytes']} bytes, sha256 {part['sha256']})"
                )
                whole_ok = False
                continue
            digest = hashlib.sha256()
            size = 0
            with open(path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
                    if whole_ok:
                        whole.update(chunk)
                    size += len(chunk)
            found = digest.hexdigest()
            if size != part["bytes"]:
                how = "truncated" if size < part["bytes"] else "longer than built"
                problems.append(
                    f"{label}: {how}: expected {part['bytes']} bytes, found {size} "
                    f"(sha256 expected {part['sha256']}, found {found})"
                )
                whole_ok = False
            elif found != part["sha256"]:
                problems.append(
                    f"{label}: corrupted: sha256 expected {part['sha256']}, found {found} "
                    f"(size {size} bytes as expected)"
                )
                whole_ok = False
            else:
                steps.say(f"  {label}: ok ({human_bytes(size)})")
        if whole_ok:
            found = whole.hexdigest()
            if found != archive["sha256"]:
                problems.append(
                    f"archive {archive['name']} (the parts joined in order): sha256 expected "
                    f"{archive['sha256']}, found {found}"
                )
            else:
                steps.say(f"  archive {archive['name']}: sha256 ok")
    extra = sorted(
        p.name
        for p in parts_dir.glob(f"{archive['name']}.*")
        if p.name not in {q["name"] for q in parts}
    )
    if extra:
        steps.say(f"  note: files not in the manifest, ignored: {', '.join(extra)}")
    if problems:
        raise PartsInvalid(problems, parts_dir)
    return Verified(manifest, manifest_sha, paths, dict(steps.timings))


# --- reading the parts as one stream ----------------------------------------------------------


class _JoinedParts(io.RawIOBase):
    """The parts read as one file, hashed as they are read."""

    def __init__(self, paths: list[Path], on_read: Callable[[int], None] | None = None) -> None:
        self._paths = list(paths)
        self._file: io.BufferedReader | None = None
        self.digest = hashlib.sha256()
        self.count = 0
        self._on_read = on_read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        while True:
            if self._file is None:
                if not self._paths:
                    return 0
                self._file = open(self._paths.pop(0), "rb")  # noqa: SIM115
            n = self._file.readinto(buffer)
            if n:
                self.digest.update(memoryview(buffer)[:n])
                self.count += n
                if self._on_read:
                    self._on_read(n)
                return n
            self._file.close()
            self._file = None

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


@dataclass
class _Decompressed:
    stream: Any
    finish: Callable[[], None]


def _decompress(raw: _JoinedParts) -> _Decompressed:
    """xz-decode ``raw``: the lzma module where Python has it, else the ``xz`` program."""
    try:
        import lzma
    except ImportError:  # a Python built without liblzma
        lzma = None  # type: ignore[assignment]
    if lzma is not None:
        stream = lzma.LZMAFile(io.BufferedReader(raw, _CHUNK))
        return _Decompressed(stream, stream.close)
    xz = shutil.which("xz")
    if xz is None:
        raise InstallSetError(
            "this Python has no lzma module and there is no `xz` program: install xz-utils, "
            "or run the installer with a Python that has lzma"
        )
    proc = subprocess.Popen([xz, "-dc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    errors: list[BaseException] = []

    def feed() -> None:
        try:
            while chunk := raw.read(_CHUNK):
                proc.stdin.write(chunk)  # type: ignore[union-attr]
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            errors.append(exc)
        finally:
            proc.stdin.close()  # type: ignore[union-attr]

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()

    def finish() -> None:
        proc.stdout.close()  # type: ignore[union-attr]
        feeder.join()
        if proc.wait() != 0 or errors:
            raise InstallSetError(f"xz -dc failed (exit {proc.returncode}) {errors or ''}")

    return _Decompressed(proc.stdout, finish)


# --- members --------------------------------------------------------------------------------


def unsafe_reason(member: tarfile.TarInfo) -> str | None:
    """Why ``member`` may not be written into the target, or None if it may."""
    name = member.name
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "has an absolute path"
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        return "contains '..'"
    if any(part in ("", ".") for part in parts):
        return "is not a plain relative path (a '.' or empty component)"
    if member.issparse():
        return "is a sparse file (it would expand past its stored size)"
    if member.isreg() or member.isdir():
        return None
    if member.issym():
        link = member.linkname
        if not link or link.startswith("/"):
            return f"is a symbolic link to the absolute path {link!r}"
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), link))
        if resolved == ".." or resolved.startswith("../"):
            return f"is a symbolic link leaving the target ({link!r})"
        return None
    if member.islnk():
        link = member.linkname
        if not link or link.startswith("/") or ".." in link.split("/"):
            return f"is a hard link to {link!r}"
        return None
    return "is a device, FIFO or other special file"


def _members(
    tar: tarfile.TarFile, staging: Path, archive: dict[str, Any]
) -> Iterator[tarfile.TarInfo]:
    """The archive's members, each checked before it is written.

    Besides `unsafe_reason` (the member alone), each member is resolved against what is
    already extracted: a link chain (``l1 -> .``, ``l1/l2 -> ..``, ``l2/FILE``) passes every
    lexical check and still leaves the folder. The manifest's file count and unpacked size
    bound the extraction while it runs, not only afterwards."""
    root = os.path.realpath(staging)
    files = size = 0
    limit_files, limit_bytes = archive["files"], archive["unpacked_bytes"]
    for member in tar:
        reason = unsafe_reason(member) or _resolves_outside(member, root)
        if reason:
            raise UnsafeArchive(
                f"archive member {member.name!r} {reason}: refusing to install (the kit's "
                "builds never write such members; this archive was not made by it)"
            )
        if member.isreg():
            files += 1
            size += member.size
            if files > limit_files or size > limit_bytes:
                raise UnsafeArchive(
                    f"the archive holds more than the manifest's {limit_files} files / "
                    f"{limit_bytes} unpacked bytes (at member {member.name!r}: {files} files, "
                    f"{size} bytes); refusing to install"
                )
        member.mode &= 0o777  # no setuid/setgid/sticky
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        yield member


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _resolves_outside(member: tarfile.TarInfo, root: str) -> str | None:
    """Why ``member`` would land outside ``root`` given what is on disk there now, or None."""
    dest = os.path.join(root, member.name)
    if not _inside(os.path.realpath(os.path.dirname(dest)), root):
        return "lies below a link that leaves the target"
    if os.path.islink(dest) and not member.issym():
        return "would be written through a link extracted before it"
    if member.issym():
        target = os.path.realpath(os.path.join(os.path.dirname(dest), member.linkname))
        if not _inside(target, root):
            return f"is a symbolic link resolving outside the target ({member.linkname!r})"
    if member.islnk() and not _inside(os.path.realpath(os.path.join(root, member.linkname)), root):
        return f"is a hard link resolving outside the target ({member.linkname!r})"
    return None


def _data_filter() -> Callable[..., Any]:
    """tarfile's data filter, or a refusal: without it `extract` trusts every member."""
    found = getattr(tarfile, "data_filter", None)
    if found is None:
        raise InstallSetError(
            f"this Python ({sys.version.split()[0]}) has no tarfile data filter (added in "
            "3.10.12, 3.11.4 and 3.12); the installer will not extract without it. Run it "
            "with a newer Python 3 (any python3 will do: it needs only the standard library)"
        )
    return found


# --- install --------------------------------------------------------------------------------


@dataclass
class Installed:
    target: Path
    manifest_sha256: str
    files: int
    timings: dict[str, float]
    already: bool = False


def install(
    parts_dir: str | Path,
    target: str | Path,
    *,
    replace: bool = False,
    steps: Steps | None = None,
) -> Installed:
    """Verify the parts, then extract the archive into ``target`` (see the module docstring)."""
    steps = steps or Steps()
    start = time.monotonic()
    target = Path(target).absolute()
    checked = verify(parts_dir, steps=steps)
    manifest, manifest_sha = checked.manifest, checked.manifest_sha256
    _warn_python(manifest, steps)

    marker = target / MARKER_NAME
    if target.exists():
        if not target.is_dir():
            raise InstallSetError(f"target {target} exists and is not a folder")
        if _marker_sha(marker) == manifest_sha and not replace:
            steps.say(f"{target} already holds this install set (marker {MARKER_NAME}); done")
            return Installed(target, manifest_sha, -1, dict(steps.timings), already=True)
        if any(target.iterdir()) and not replace:
            raise InstallSetError(
                f"target {target} is not empty and holds no install of this set: give an "
                "empty or new folder, or --replace to swap it for this set"
            )
        if any(target.iterdir()) and _marker_sha(marker) is None:
            # --replace deletes the old folder: only ever one this installer wrote.
            raise InstallSetError(
                f"target {target} is not empty and has no {MARKER_NAME}: it is not an install "
                "set this kit installed, so --replace will not delete it. Give an empty or new "
                "folder (or remove that one yourself if it is yours to remove)"
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.installing-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        files = _extract(checked, staging, steps)
        with steps.step("write marker and move into place"):
            write_json_atomic(
                staging / MARKER_NAME,
                {
                    "format": "repro-install-set-marker",
                    "manifest_sha256": manifest_sha,
                    "archive_sha256": manifest["archive"]["sha256"],
                    "root": manifest.get("root"),
                    "files": files,
                    "installed": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "installer_python": sys.version.split()[0],
                    "parts_dir": str(Path(parts_dir).absolute()),
                },
            )
            _place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    steps.say(f"installed {files} files into {target} in {time.monotonic() - start:.1f} s")
    steps.say(f"use it with: export PYTHONPATH={target}${{PYTHONPATH:+:$PYTHONPATH}}")
    return Installed(target, manifest_sha, files, dict(steps.timings))


def _extract(checked: Verified, staging: Path, steps: Steps) -> int:
    archive = checked.manifest["archive"]
    data_filter = _data_filter()
    raw = _JoinedParts(checked.parts)
    files = 0
    with steps.step(f"extract {archive['name']} ({archive['files']} files)"):
        decoded = _decompress(raw)
        try:
            with tarfile.open(fileobj=decoded.stream, mode="r|") as tar:
                for member in _members(tar, staging, archive):
                    try:
                        tar.extract(member, staging, filter=data_filter)
                    except tarfile.FilterError as exc:
                        raise UnsafeArchive(
                            f"archive member {member.name!r} refused by tarfile's data filter "
                            f"({exc}); refusing to install"
                        ) from exc
                    except KeyError as exc:  # tarfile: a hard link to no earlier member
                        raise UnsafeArchive(
                            f"archive member {member.name!r} links to {member.linkname!r}, "
                            "which the archive does not hold before it; refusing to install"
                        ) from exc
                    except OSError as exc:  # e.g. a file where the archive made a folder
                        raise InstallSetError(
                            f"could not write archive member {member.name!r} ({exc}); "
                            "nothing was installed"
                        ) from exc
                    files += member.isreg()
        except (tarfile.TarError, EOFError, *_LZMA_ERRORS) as exc:
            # The manifest travels with the parts: matching hashes do not make a tar whole.
            raise UnsafeArchive(
                f"the archive is not a readable tar.xz ({type(exc).__name__}: {exc}); "
                "refusing to install (the kit's builds write whole archives)"
            ) from exc
        finally:
            decoded.finish()
        raw.drain()  # xz's index and padding: the hash covers every byte
        raw.close()
    with steps.step("check extraction"):
        if raw.digest.hexdigest() != archive["sha256"] or raw.count != archive["bytes"]:
            raise PartsInvalid(
                [
                    f"the parts changed while installing: archive sha256 expected "
                    f"{archive['sha256']}, read {raw.digest.hexdigest()} ({raw.count} bytes)"
                ],
                checked.parts[0].parent,
            )
        if files != archive["files"]:
            raise InstallSetError(
                f"the archive held {files} files, the manifest says {archive['files']}; "
                "refusing a partial install"
            )
    return files


def _place(staging: Path, target: Path) -> None:
    if target.exists() and not any(target.iterdir()):
        target.rmdir()
    if not target.exists():
        os.rename(staging, target)
        return
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    os.rename(target, old)
    os.rename(staging, target)
    shutil.rmtree(old, ignore_errors=True)


def _marker_sha(marker: Path) -> str | None:
    import json

    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("manifest_sha256")
    except (OSError, ValueError, AttributeError):
        return None


def _warn_python(manifest: dict[str, Any], steps: Steps) -> None:
    wanted = (manifest.get("python") or {}).get("version")
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if isinstance(wanted, str) and ".".join(wanted.split(".")[:2]) != here:
        steps.say(
            f"note: the set was built for Python {wanted}; this installer runs on {here}. "
            f"Use it with a Python {wanted} interpreter."
        )
