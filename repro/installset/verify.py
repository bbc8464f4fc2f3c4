"""``verify``: an install set checked in full, on the host, writing nothing.

The manifest (repro/installset/manifest.py), ``SHA256SUMS``, every part by size and sha256,
the parts joined, and every wheel where it lies inside them: its sha256, the project and
version its METADATA names, its members (none may leave the install folder) and what they
unpack to. Every bad or missing part is named at once.
"""

from __future__ import annotations

import contextlib
import email.parser
import hashlib
import io
import re
import zipfile
import zlib
from collections import namedtuple
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from repro.core.atomicio import sha256_file
from repro.installset import InstallSetError
from repro.installset.manifest import (
    MANIFEST_NAME,
    ManifestInvalid,
    canonical_name,
    load_manifest,
    same_version,
    sums_problems,
)
from repro.installset.steps import Steps, human_bytes

_CHUNK = 1 << 20
_METADATA = re.compile(r"[^/]+\.dist-info/METADATA")
_METADATA_LIMIT = 16 * 1024 * 1024
# What zipfile raises on a damaged or unsupported zip (the fuzzer found NotImplementedError).
_ZIP_ERRORS = (zipfile.BadZipFile, NotImplementedError, ValueError, EOFError, zlib.error)
Verified = namedtuple("Verified", "manifest manifest_sha256 parts")


class UnsafeArchive(InstallSetError):
    """A wheel holds a member the installer will not let pip write."""


class PartsInvalid(InstallSetError):
    """One or more parts (or the wheels cut from them) do not match the manifest."""

    def __init__(self, problems: list[str], parts_dir: Path) -> None:
        self.problems = problems
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        lines = "".join(f"  - {p}\n" for p in problems[1:])
        super().__init__(
            f"refusing the install set in {parts_dir}: {problems[0]}{more}\n{lines}"
            "Copy the named file(s) again from the build's output folder; nothing was installed."
        )


def stream_sha256(paths: Sequence[Path]) -> str:
    """The sha256 of the files joined in order."""
    whole = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            hashlib.file_digest(f, lambda: whole)  # the one digest, fed file after file
    return whole.hexdigest()


def _members_bytes(source: Path | IO[bytes], label: str, check_members: bool) -> int:
    """What one wheel's members claim to unpack to (see `unpacked_bytes`)."""
    total = 0
    try:
        with zipfile.ZipFile(source) as zf:
            for info in zf.infolist():
                parts = info.filename.replace("\\", "/").split("/")
                if check_members and (parts[0] == "" or ":" in parts[0] or ".." in parts):
                    raise UnsafeArchive(
                        f"{label}: member {info.filename!r} leaves the install "
                        "folder; refusing to install (the kit's builds ship index wheels)"
                    )
                total += info.file_size
    except _ZIP_ERRORS as exc:
        raise UnsafeArchive(f"{label} is not a readable wheel ({exc})") from exc
    return total


def unpacked_bytes(paths: Sequence[Path], *, check_members: bool = False) -> int:
    """What the wheels' members claim to unpack to; ``check_members``: refuse a member that
    is not a plain relative path."""
    return sum(_members_bytes(path, path.name, check_members) for path in paths)


class _Window(io.RawIOBase):
    """Bytes ``start`` to ``start + size`` of the parts joined in order, as a seekable file:
    a wheel inside the parts, read by zipfile where it lies (``verify`` writes nothing)."""

    def __init__(self, parts: Sequence[tuple[IO[bytes], int]], start: int, size: int) -> None:
        self._parts, self._start, self._size, self._pos = parts, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        want = min(len(buffer), self._size - self._pos)
        done, at = 0, self._start + self._pos
        for handle, size in self._parts:
            if want <= done:
                break
            if at >= size:
                at -= size
                continue
            handle.seek(at)
            chunk = handle.read(min(size - at, want - done))
            buffer[done : done + len(chunk)] = chunk
            done, at = done + len(chunk), 0
        self._pos += done
        return done


def stream_digests(paths: Sequence[Path], sizes: Sequence[int]) -> tuple[str, list[str]]:
    """One read of the parts: the sha256 of them joined, and of each piece of ``sizes``
    bytes cut from that stream in order (the wheels)."""
    whole, piece, pieces = hashlib.sha256(), hashlib.sha256(), []
    left = list(sizes)
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                whole.update(chunk)
                view = memoryview(chunk)
                while view and len(pieces) < len(left):
                    take = min(len(view), left[len(pieces)])
                    piece.update(view[:take])
                    view, left[len(pieces)] = view[take:], left[len(pieces)] - take
                    if not left[len(pieces)]:
                        pieces.append(piece.hexdigest())
                        piece = hashlib.sha256()
    return whole.hexdigest(), pieces


def _check_parts(parts_dir: Path, manifest: dict[str, Any], steps: Steps) -> list[str]:
    """Every part against its size and sha256, ``SHA256SUMS`` against the manifest; when the
    parts are right, the parts joined and each wheel cut from them."""
    parts, stream, wheels = manifest["parts"], manifest["stream"], manifest["wheels"]
    problems: list[str] = []
    on_disk: dict[str, str] = {}
    for i, part in enumerate(parts, start=1):
        path, label = parts_dir / part["name"], f"part {i}/{len(parts)} {part['name']}"
        want, want_sha = part["bytes"], part["sha256"]
        if not path.is_file():
            what = "not a file" if path.exists() else "missing"
            problems.append(f"{label}: {what} (expected {want} bytes, sha256 {want_sha})")
            continue
        try:
            size, found = path.stat().st_size, sha256_file(path)
        except OSError as exc:
            problems.append(f"{label}: cannot be read ({exc.strerror or exc})")
            continue
        on_disk[part["name"]] = found
        shas = f"sha256 expected {want_sha}, found {found}"
        if size != want:
            how = "truncated" if size < want else "longer than built"
            problems.append(f"{label}: {how}: expected {want} bytes, found {size} ({shas})")
        elif found != want_sha:
            problems.append(f"{label}: corrupted: {shas} (size {size} bytes as expected)")
        else:
            steps.say(f"  {label}: ok ({human_bytes(size)})")
    problems += sums_problems(parts_dir, parts, on_disk)
    if len(on_disk) < len(parts) or any(p.startswith("part ") for p in problems):
        return problems
    paths = [parts_dir / p["name"] for p in parts]
    joined, each = stream_digests(paths, [w["bytes"] for w in wheels])
    if joined != stream["sha256"]:
        problems.append(
            f"the parts joined in order: sha256 expected {stream['sha256']}, found {joined}"
        )
        return problems
    problems += [
        f"{w['filename']}: sha256 expected {w['sha256']}, found {found}"
        for w, found in zip(wheels, each, strict=True)
        if found != w["sha256"]
    ]
    return problems


def _metadata(zf: zipfile.ZipFile, label: str) -> tuple[str, str]:
    """The Name and Version in a wheel's ``*.dist-info/METADATA``."""
    found = [i for i in zf.infolist() if _METADATA.fullmatch(i.filename)]
    if len(found) != 1 or found[0].file_size > _METADATA_LIMIT:
        raise UnsafeArchive(f"{label}: expected one *.dist-info/METADATA, found {len(found)}")
    with zf.open(found[0]) as f:
        headers = email.parser.BytesHeaderParser().parsebytes(f.read(_METADATA_LIMIT))
    return str(headers.get("Name", "")), str(headers.get("Version", ""))


def _check_wheels(parts_dir: Path, manifest: dict[str, Any]) -> None:
    """Each wheel, read inside the parts: its METADATA names the entry's project and version,
    no member leaves the install folder, and together they unpack to no more than the
    manifest says."""
    problems, total, start = [], 0, 0
    with contextlib.ExitStack() as stack:
        parts = [
            (stack.enter_context(open(parts_dir / p["name"], "rb")), p["bytes"])
            for p in manifest["parts"]
        ]
        for i, wheel in enumerate(manifest["wheels"]):
            label = wheel["filename"]
            window = _Window(parts, start, wheel["bytes"])
            start += wheel["bytes"]
            total += _members_bytes(window, label, check_members=True)
            try:
                with zipfile.ZipFile(window) as zf:
                    name, version = _metadata(zf, label)
            except _ZIP_ERRORS as exc:
                raise UnsafeArchive(f"{label} is not a readable wheel ({exc})") from exc
            if canonical_name(name) != canonical_name(wheel["name"]) or not same_version(
                version, wheel["version"]
            ):
                problems.append(
                    f"$.wheels[{i}]: {wheel['name']} {wheel['version']}, but the METADATA "
                    f"of {label} says {name or '(no name)'} {version or '(no version)'}"
                )
    if problems:
        raise ManifestInvalid(parts_dir / MANIFEST_NAME, problems)
    if total > (limit := manifest["stream"]["unpacked_bytes"]):
        raise UnsafeArchive(
            f"the wheels unpack to {total} bytes, more than the manifest's {limit}; "
            "refusing to install"
        )


def verify(parts_dir: str | Path, *, steps: Steps | None = None) -> Verified:
    """Check the manifest, every part, the parts joined and every wheel in them; raise
    ``ManifestInvalid``, ``PartsInvalid`` or ``UnsafeArchive``."""
    steps = steps or Steps()
    with steps.step("read manifest"):
        manifest, manifest_sha = load_manifest(parts_dir)
    parts_dir = Path(parts_dir)
    parts, stream = manifest["parts"], manifest["stream"]
    with steps.step(f"verify {len(parts)} part(s), {human_bytes(stream['bytes'])}"):
        problems = _check_parts(parts_dir, manifest, steps)
    if problems:
        raise PartsInvalid(problems, parts_dir)
    with steps.step(f"check the {len(manifest['wheels'])} wheel(s) inside the parts"):
        _check_wheels(parts_dir, manifest)
    return Verified(manifest, manifest_sha, [parts_dir / p["name"] for p in parts])
