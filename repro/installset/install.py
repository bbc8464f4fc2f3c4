"""Verify and install a set on the host: the standard library and the host's own pip only.

``verify`` names each bad or missing part. ``install`` verifies, cuts the parts back into
the wheels, refuses members leaving the folder or unpacking past the manifest's
``unpacked_bytes``, runs pip's hash-checking install into a folder beside the target, writes
a marker and only then renames it into place: a target holds a whole install or nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.atomicio import write_json_atomic, write_text_atomic
from repro.clock import utc_text
from repro.installset import InstallSetError
from repro.installset.pipcmd import run_pip

FORMAT, FORMAT_VERSION = "repro-install-set", 2
MANIFEST_NAME, MARKER_NAME = "manifest.json", ".repro-installset.json"
_CHUNK = 1 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# A part or wheel is a plain file name: no directory, no "..", nothing hidden.
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")
# What goes into pip's requirements file: a name and a version, never an option.
_NAME, _VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$"), re.compile(r"^[A-Za-z0-9.!+_-]+$")


class ManifestInvalid(InstallSetError):
    """The manifest is not one the kit wrote (or not of a version this installer knows)."""


class PartsInvalid(InstallSetError):
    """One or more parts (or the wheels cut from them) do not match the manifest."""

    def __init__(self, problems: list[str], parts_dir: Path) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"refusing the install set in {parts_dir}: {len(problems)} problem(s)\n{lines}\n"
            "Copy the named part(s) again from the build's output folder; nothing was installed."
        )


class UnsafeArchive(InstallSetError):
    """A wheel holds a member the installer will not let pip write."""


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Steps:
    """Prints ``name …`` when a step starts and ``name: N.N s`` when it ends; keeps timings.
    The host has no rich, so this plain printer serves both sides."""

    def __init__(self, stream=None) -> None:
        self.stream, self.timings = stream or sys.stderr, {}

    def say(self, text: str) -> None:
        print(f"[installset] {text}", file=self.stream, flush=True)

    @contextlib.contextmanager
    def step(self, name: str):
        self.say(f"{name} …")
        start = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = round(time.monotonic() - start, 2)
            self.say(f"{name}: {self.timings[name]:.1f} s")


def _files(doc: dict[str, Any], key: str, name_key: str) -> list[dict[str, Any]]:
    """``doc[key]``: a list of plain-named files, each with a positive size and a sha256."""
    entries = doc.get(key)
    if not isinstance(entries, list) or not entries:
        raise ManifestInvalid(f"manifest: $.{key} is missing or empty")
    for i, entry in enumerate(entries):
        where = f"manifest: $.{key}[{i}]"
        if not isinstance(entry, dict):
            raise ManifestInvalid(f"{where} is not an object")
        name, size = entry.get(name_key), entry.get("bytes")
        if not (isinstance(name, str) and _FILE_NAME.match(name) and ".." not in name):
            raise ManifestInvalid(f"{where}.{name_key} {name!r} is not a plain file name")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ManifestInvalid(f"{where}.bytes is not a positive whole number")
        if not _SHA256.match(str(entry.get("sha256"))):
            raise ManifestInvalid(f"{where}.sha256 is not 64 lower-case hex digits")
    return entries


def check_structure(doc: Any) -> None:
    """Raise ``ManifestInvalid`` unless ``doc`` has what ``verify``/``install`` rely on (the
    host has no jsonschema; the build validated against schemas/install-set.v2.schema.json)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestInvalid(f"manifest: not a {FORMAT} manifest")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ManifestInvalid(
            f"manifest: format_version {doc.get('format_version')!r}; this installer reads "
            f"version {FORMAT_VERSION} only (use the kit checkout the set was built with)"
        )
    parts, wheels = _files(doc, "parts", "name"), _files(doc, "wheels", "filename")
    stream = doc.get("stream")
    if not isinstance(stream, dict) or not _SHA256.match(str(stream.get("sha256"))):
        raise ManifestInvalid("manifest: $.stream has no sha256")
    for key in ("bytes", "unpacked_bytes"):
        if not isinstance(stream.get(key), int) or stream[key] < 0:
            raise ManifestInvalid(f"manifest: $.stream.{key} is not a whole number")
    for name, files in (("parts", parts), ("wheels", wheels)):
        if (total := sum(e["bytes"] for e in files)) != stream["bytes"]:
            raise ManifestInvalid(
                f"manifest: the {name} add up to {total} bytes, the stream has {stream['bytes']}"
            )
    names = [p["name"] for p in parts] + [w["filename"] for w in wheels]
    if len(set(names)) != len(names):
        raise ManifestInvalid("manifest: part or wheel names repeat")
    for wheel in wheels:
        if not (_NAME.match(str(wheel.get("name"))) and _VERSION.match(str(wheel.get("version")))):
            raise ManifestInvalid(f"manifest: wheel {wheel['filename']}: bad name or version")


def load_manifest(parts_dir: str | Path) -> tuple[dict[str, Any], str]:
    """Read ``DIR/manifest.json``; return the document and the sha256 of its bytes."""
    path = Path(parts_dir) / MANIFEST_NAME
    try:
        data = path.read_bytes()
        doc = json.loads(data.decode("utf-8"))
    except FileNotFoundError as exc:
        raise InstallSetError(
            f"{path} does not exist: --parts must name the folder holding manifest.json and "
            "the parts, as the build wrote them"
        ) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestInvalid(f"{path} is not valid JSON ({exc}); copy it again") from exc
    check_structure(doc)
    return doc, hashlib.sha256(data).hexdigest()


@dataclass
class Verified:
    manifest: dict[str, Any]
    manifest_sha256: str
    parts: list[Path]


def _chunks(paths: list[Path], *digests: Any):
    """The files' bytes in order, each chunk also fed to ``digests``."""
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                for digest in digests:
                    digest.update(chunk)
                yield chunk


def verify(parts_dir: str | Path, *, steps: Steps | None = None) -> Verified:
    """Check every part and the parts joined against the manifest; raise ``PartsInvalid``."""
    steps, parts_dir = steps or Steps(), Path(parts_dir)
    with steps.step("read manifest"):
        manifest, manifest_sha = load_manifest(parts_dir)
    parts, stream = manifest["parts"], manifest["stream"]
    paths = [parts_dir / p["name"] for p in parts]
    problems: list[str] = []
    whole = hashlib.sha256()
    with steps.step(f"verify {len(parts)} part(s), {human_bytes(stream['bytes'])}"):
        for i, (part, path) in enumerate(zip(parts, paths, strict=True), start=1):
            label = f"part {i}/{len(parts)} {part['name']}"
            want, want_sha = part["bytes"], part["sha256"]
            if not path.is_file():
                problems.append(f"{label}: missing (expected {want} bytes, sha256 {want_sha})")
                continue
            digest = hashlib.sha256()
            size = sum(len(chunk) for chunk in _chunks([path], digest, whole))
            if size != want:
                how = "truncated" if size < want else "longer than built"
                problems.append(
                    f"{label}: {how}: expected {want} bytes, found {size} "
                    f"(sha256 expected {want_sha}, found {digest.hexdigest()})"
                )
            elif digest.hexdigest() != want_sha:
                problems.append(
                    f"{label}: corrupted: sha256 expected {want_sha}, found "
                    f"{digest.hexdigest()} (size {size} bytes as expected)"
                )
            else:
                steps.say(f"  {label}: ok ({human_bytes(size)})")
        if not problems and whole.hexdigest() != stream["sha256"]:
            problems.append(
                f"the parts joined in order: sha256 expected {stream['sha256']}, "
                f"found {whole.hexdigest()}"
            )
    if problems:
        raise PartsInvalid(problems, parts_dir)
    return Verified(manifest, manifest_sha, paths)


@dataclass
class Installed:
    target: Path
    manifest_sha256: str
    wheels: int
    timings: dict[str, float]
    already: bool = False


class Joined:
    """Files read as one stream (each chunk also fed to ``digests``), cut into new files."""

    def __init__(self, paths: list[Path], *digests: Any) -> None:
        self._chunks, self._rest = _chunks(paths, *digests), b""

    def take(self, size: int, path: Path) -> tuple[int, str]:
        """The next ``size`` bytes (fewer at the end) written to ``path``; (bytes, sha256)."""
        digest, written = hashlib.sha256(), 0
        with open(path, "xb") as out:
            while written < size and (rest := self._rest or next(self._chunks, b"")):
                piece, self._rest = rest[: size - written], rest[size - written :]
                out.write(piece)
                digest.update(piece)
                written += len(piece)
        return written, digest.hexdigest()

    def at_end(self) -> bool:
        return not self._rest and next(self._chunks, None) is None


def _cut_wheels(checked: Verified, folder: Path) -> None:
    """The joined parts written back as the wheel files, each checked by its sha256 (pip would
    check too, but could not name the wheel against the manifest)."""
    stream, problems = Joined(checked.parts), []
    for wheel in checked.manifest["wheels"]:
        size, found = stream.take(wheel["bytes"], folder / wheel["filename"])
        if size < wheel["bytes"]:
            problems.append("the parts changed while installing: they end before the last wheel")
            break
        if found != wheel["sha256"]:
            problems.append(
                f"{wheel['filename']}: sha256 expected {wheel['sha256']}, found {found}"
            )
    if not stream.at_end():
        problems.append("the parts hold more bytes than the manifest's wheels")
    if problems:
        raise PartsInvalid(problems, checked.parts[0].parent)


def _check_wheels(manifest: dict[str, Any], folder: Path) -> None:
    """Every member a plain relative path, and all of them within the manifest's size."""
    claimed = 0
    for wheel in manifest["wheels"]:
        try:
            with zipfile.ZipFile(folder / wheel["filename"]) as zf:
                for info in zf.infolist():
                    parts = info.filename.replace("\\", "/").split("/")
                    if info.filename.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
                        raise UnsafeArchive(
                            f"{wheel['filename']}: member {info.filename!r} leaves the install "
                            "folder; refusing to install (the kit's builds ship index wheels)"
                        )
                    claimed += info.file_size
        # What zipfile raises on a damaged or unsupported zip (the fuzzer found the second).
        except (zipfile.BadZipFile, NotImplementedError, ValueError, EOFError) as exc:
            raise UnsafeArchive(f"{wheel['filename']} is not a readable wheel ({exc})") from exc
    if claimed > (limit := manifest["stream"]["unpacked_bytes"]):
        raise UnsafeArchive(
            f"the wheels unpack to {claimed} bytes, more than the manifest's {limit}; "
            "refusing to install"
        )


def _marker_sha(marker: Path) -> str | None:
    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("manifest_sha256")
    except (OSError, ValueError, AttributeError):
        return None


def _check_target(target: Path, manifest_sha: str, replace: bool) -> bool:
    """True when ``target`` already holds this set; raise where it may not be (re)placed."""
    if not target.exists():
        return False
    if not target.is_dir():
        raise InstallSetError(f"target {target} exists and is not a folder")
    marker_sha = _marker_sha(target / MARKER_NAME)
    if marker_sha == manifest_sha and not replace:
        return True
    if any(target.iterdir()) and not replace:
        raise InstallSetError(
            f"target {target} is not empty and holds no install of this set: give an "
            "empty or new folder, or --replace to swap it for this set"
        )
    if any(target.iterdir()) and marker_sha is None:
        # --replace deletes the old folder: only ever one this installer wrote.
        raise InstallSetError(
            f"target {target} is not empty and has no {MARKER_NAME}: it is not an install "
            "set this kit installed, so --replace will not delete it. Give an empty or new "
            "folder (or remove that one yourself if it is yours to remove)"
        )
    return False


def install(
    parts_dir: str | Path, target: str | Path, *, replace: bool = False, steps: Steps | None = None
) -> Installed:
    """Verify the parts, then install the wheels into ``target`` (see the module docstring)."""
    steps, start, target = steps or Steps(), time.monotonic(), Path(target).absolute()
    checked = verify(parts_dir, steps=steps)
    manifest, manifest_sha = checked.manifest, checked.manifest_sha256
    wanted = ".".join(str((manifest.get("python") or {}).get("version", "")).split(".")[:2])
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if wanted != here:
        raise InstallSetError(
            f"the set was built for Python {wanted}; this installer runs on {here}, whose pip "
            f"would take none of its wheels. Run it with python{wanted}"
        )
    if _check_target(target, manifest_sha, replace):
        steps.say(f"{target} already holds this install set (marker {MARKER_NAME}); done")
        return Installed(target, manifest_sha, 0, dict(steps.timings), already=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.installing-{os.getpid()}"
    wheels = target.parent / f".{target.name}.wheels-{os.getpid()}"
    for folder in (staging, wheels):
        shutil.rmtree(folder, ignore_errors=True)
    wheels.mkdir()
    try:
        with steps.step(f"cut the parts into {len(manifest['wheels'])} wheel(s)"):
            _cut_wheels(checked, wheels)
            _check_wheels(manifest, wheels)
        lines = [
            f"{w['name']}=={w['version']} --hash=sha256:{w['sha256']}\n" for w in manifest["wheels"]
        ]
        write_text_atomic(wheels / "requirements.txt", "".join(lines))
        with steps.step("pip install --require-hashes"):
            run_pip(
                ["install", "--no-index", "--find-links", str(wheels), "--require-hashes"]
                + ["--no-deps", "--no-compile", "--target", str(staging)]
                + ["--no-warn-script-location", "-r", str(wheels / "requirements.txt")],
                what=f"installing {len(lines)} wheel(s) into {staging}",
            )
        marker = {"format": "repro-install-set-marker", "manifest_sha256": manifest_sha}
        marker |= {"stream_sha256": manifest["stream"]["sha256"], "root": manifest.get("root")}
        marker |= {"installed": utc_text(), "installer_python": sys.version.split()[0]}
        marker["parts_dir"] = str(Path(parts_dir).absolute())
        write_json_atomic(staging / MARKER_NAME, marker)
        if target.exists():
            old = target.parent / f".{target.name}.old-{os.getpid()}"
            os.rename(target, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(staging, target)
    finally:
        shutil.rmtree(wheels, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
    steps.say(f"installed into {target} in {time.monotonic() - start:.1f} s")
    steps.say(f"use it with: export PYTHONPATH={target}${{PYTHONPATH:+:$PYTHONPATH}}")
    return Installed(target, manifest_sha, len(lines), dict(steps.timings))
