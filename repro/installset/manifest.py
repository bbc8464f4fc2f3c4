"""An install set's ``manifest.json`` and ``SHA256SUMS``: read, then checked in full.

The manifest is read through the kit's one JSON loader (repro/core/jsonread.py) and held to its
schema (`schemacheck`: the host has no jsonschema), then to what a schema cannot say: the parts
and the wheels add up to the stream, every part but the last is ``part_size`` long, each
wheel's file name carries its entry's name and version, the root is the first wheel, no name
repeats, and names and versions are safe to write into pip's requirements file. ``SHA256SUMS``
(for ``sha256sum -c`` where the kit is not at hand) must list exactly the manifest's parts.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from repro.core.jsonread import JSONUnreadable, parse_json_bytes
from repro.installset import BadInstallInput, InstallSetError
from repro.installset.schemacheck import found, violations

FORMAT, FORMAT_VERSION = "repro-install-set", 2
MANIFEST_NAME, SUMS_NAME = "manifest.json", "SHA256SUMS"
# A built manifest of 90 wheels is 40 KB; a file far past that is not one.
_MANIFEST_LIMIT = SUMS_LIMIT = 16 * 1024 * 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")
# A part or wheel is a plain file name: no directory, no "..", nothing hidden.
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
# What goes into pip's requirements file: a name and a version, never an option.
_NAME, _VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*"), re.compile(r"[A-Za-z0-9.!+_-]+")
_SUMS_LINE = re.compile(r"([0-9a-f]{64}) [ *](.+)")
_AGAIN = "copy it again from the build's output folder, or build the set again"


class ManifestInvalid(InstallSetError):
    """The manifest is not one the kit wrote (or not of a version this installer knows)."""

    def __init__(self, where: object, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        count = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        more = "".join(f"\n  - {p}" for p in problems[1:])
        super().__init__(
            f"{where} is not a manifest the kit wrote: {problems[0]}{count}{more}\n"
            f"Nothing was installed; {_AGAIN}."
        )


class Unreadable(Exception):
    """A file of the set that cannot be read; ``reason`` says why in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def read_small_file(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at ``path`` (at most ``limit``); raise `Unreadable`."""
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise Unreadable("a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable("not a regular file")
        with open(path, "rb") as f:  # in chunks: read(limit) would hold limit bytes at once
            data = b""
            while len(data) <= limit and (chunk := f.read(1 << 20)):
                data += chunk
    except FileNotFoundError:
        raise Unreadable("missing") from None
    except OSError as exc:
        raise Unreadable(f"cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise Unreadable(f"larger than {limit} bytes")
    return data


def parts_folder(parts_dir: str | Path) -> Path:
    """``--parts``, once it is a folder; raise `BadInstallInput` otherwise."""
    folder = Path(parts_dir)
    expected = "--parts must name the folder holding manifest.json and the parts"
    if not folder.exists():
        raise BadInstallInput(f"--parts {folder}: no such folder; {expected}")
    if not folder.is_dir():
        raise BadInstallInput(f"--parts {folder} is a file, not a folder; {expected}")
    return folder


@functools.cache
def _schema() -> dict[str, Any]:
    from repro.artifact import SchemaNotFound, load_schema

    try:
        return load_schema("install-set", FORMAT_VERSION)
    except SchemaNotFound as exc:
        raise BadInstallInput(str(exc)) from None


def canonical_name(name: str) -> str:
    """A project name as the index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def same_version(a: str, b: str) -> bool:
    """``a`` and ``b`` name one release. With packaging (the build machine) or pip's copy of
    it (the host), as PEP 440 compares them; on a bare ``python -S``, as text: a wheel's file
    name writes ``-`` as ``_``, and the index's names are normalized (so are the 361 wheels of
    containers/locks/)."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        try:
            from pip._vendor.packaging.version import InvalidVersion, Version
        except ImportError:
            return a.replace("_", "-").lower() == b.replace("_", "-").lower()
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a.replace("_", "-").lower() == b.replace("_", "-").lower()


def wheel_file_name(filename: str) -> tuple[str, str] | None:
    """The name and version a wheel's file name carries; None if it is not one."""
    pieces = filename.removesuffix(".whl").split("-")
    if not filename.endswith(".whl") or len(pieces) not in (5, 6) or not all(pieces):
        return None
    return pieces[0], pieces[1]


def check_structure(doc: Any, where: object = "manifest") -> None:
    """Raise `ManifestInvalid` unless ``doc`` is a manifest as the build writes it."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        what = f"format {found(doc.get('format'))}" if isinstance(doc, dict) else found(doc)
        raise ManifestInvalid(where, [f"expected a {FORMAT} manifest, found {what}"])
    if (version := doc.get("format_version")) != FORMAT_VERSION:
        raise ManifestInvalid(
            where,
            [
                f"$.format_version: this installer reads {FORMAT_VERSION}, found "
                f"{found(version)} (use the kit the set was built with)"
            ],
        )
    if problems := violations(doc, _schema()):
        raise ManifestInvalid(where, problems)
    if problems := _consistency(doc):
        raise ManifestInvalid(where, problems)


def _consistency(doc: Mapping[str, Any]) -> list[str]:
    """What the schema cannot say (its types already hold)."""
    problems: list[str] = []
    parts, wheels, stream = doc["parts"], doc["wheels"], doc["stream"]
    for key, files in (("parts", parts), ("wheels", wheels)):
        total = sum(e["bytes"] for e in files)
        if total != stream["bytes"]:
            problems.append(
                f"$.{key}: add up to {total} bytes, $.stream.bytes is {stream['bytes']}"
            )
    for i, part in enumerate(parts[:-1]):
        if part["bytes"] != doc["part_size"]:
            problems.append(
                f"$.parts[{i}].bytes: {part['bytes']}, expected $.part_size ({doc['part_size']}) "
                "for every part but the last"
            )
    if parts[-1]["bytes"] > doc["part_size"]:
        problems.append(f"$.parts[{len(parts) - 1}].bytes: longer than $.part_size")
    names = [p["name"] for p in parts] + [w["filename"] for w in wheels]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"the name {found(name)} is given to more than one part or wheel")
    for i, part in enumerate(parts):
        if part["name"] in (MANIFEST_NAME, SUMS_NAME):
            problems.append(f"$.parts[{i}].name: {part['name']} is the set's own file")
    for i, wheel in enumerate(wheels):
        problems += _wheel_entry(f"$.wheels[{i}]", wheel)
    root, first = doc["root"], wheels[0]
    if canonical_name(root["name"]) != canonical_name(first["name"]) or not same_version(
        root["version"], first["version"]
    ):
        problems.append(
            f"$.root: {root['name']} {root['version']}, but the first wheel is "
            f"{first['name']} {first['version']} (the root is always first)"
        )
    python = doc["python"]
    tag = "cp" + "".join(python["version"].split(".")[:2])
    if python["tag"] != tag:
        problems.append(f"$.python.tag: {python['tag']}, but Python {python['version']} is {tag}")
    return problems


def _wheel_entry(path: str, wheel: Mapping[str, Any]) -> list[str]:
    name, version, filename = wheel["name"], wheel["version"], wheel["filename"]
    if not (_FILE_NAME.fullmatch(filename) and ".." not in filename):
        return [f"{path}.filename: {found(filename)} is not a plain file name"]
    if not (_NAME.fullmatch(name) and _VERSION.fullmatch(version)):
        return [f"{path}: name {found(name)} or version {found(version)} is not one pip reads"]
    if (carried := wheel_file_name(filename)) is None:
        return [f"{path}.filename: {found(filename)} is not NAME-VERSION-PY-ABI-PLATFORM.whl"]
    if canonical_name(carried[0]) != canonical_name(name):
        return [f"{path}.name: {found(name)}, but its file {filename} is {carried[0]}"]
    if not same_version(carried[1], version):
        return [f"{path}.version: {found(version)}, but its file {filename} is {carried[1]}"]
    return []


def load_manifest(parts_dir: str | Path) -> tuple[dict[str, Any], str]:
    """Read ``DIR/manifest.json``; return the document and the sha256 of its bytes."""
    path = parts_folder(parts_dir) / MANIFEST_NAME
    try:
        data = read_small_file(path, _MANIFEST_LIMIT)
    except Unreadable as exc:
        if exc.reason.startswith("larger"):
            raise ManifestInvalid(path, [exc.reason]) from None
        raise BadInstallInput(
            f"{path}: {exc.reason}; expected the manifest.json the build wrote: --parts must "
            "name the folder holding it and the parts, as the build wrote them"
        ) from None
    try:
        doc = parse_json_bytes(data, str(path))
    except JSONUnreadable as exc:
        raise ManifestInvalid(path, [str(exc).removeprefix(f"{path}: ")]) from None
    check_structure(doc, path)
    return doc, hashlib.sha256(data).hexdigest()


def sums_problems(folder: Path, parts: Sequence[Mapping[str, Any]], on_disk: Mapping) -> list:
    """How ``folder/SHA256SUMS`` disagrees with the manifest's ``parts``; ``on_disk``: the
    sha256 found for each part file that could be read (named where SHA256SUMS agrees with
    the file, not the manifest)."""
    try:
        text = read_small_file(folder / SUMS_NAME, SUMS_LIMIT).decode("utf-8")
    except Unreadable as exc:
        return [f"{SUMS_NAME}: {exc.reason} (the build writes it beside manifest.json)"]
    except UnicodeDecodeError:
        return [f"{SUMS_NAME}: not UTF-8 text; expected lines of SHA256  NAME"]
    listed: dict[str, str] = {}
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not (m := _SUMS_LINE.fullmatch(line)):
            problems.append(f"{SUMS_NAME} line {number}: {found(line)} is not SHA256  NAME")
        elif m[2] in listed:
            problems.append(f"{SUMS_NAME} line {number}: {found(m[2])} is listed twice")
        else:
            listed[m[2]] = m[1]
    for part in parts:
        name, want = part["name"], part["sha256"]
        if (theirs := listed.pop(name, None)) is None:
            problems.append(f"{SUMS_NAME} does not list the part {name}")
        elif theirs != want:
            agrees = " (as the file is)" if on_disk.get(name) == theirs else ""
            problems.append(
                f"{SUMS_NAME}: {name} has sha256 {theirs}{agrees}; the manifest says {want}"
            )
    problems += [f"{SUMS_NAME} lists {found(name)}, not a part of the manifest" for name in listed]
    return problems
