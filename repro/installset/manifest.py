"""The install set's ``manifest.json``: its constants, a stdlib check, and schema validation.

The full shape is ``schemas/install-set.v1.schema.json`` (Draft 2020-12), checked with
jsonschema when a set is built. The host has no jsonschema, so ``check_structure`` checks,
with the standard library only, every field the installer relies on: the parts (plain file
names, sizes, sha256s, no duplicates) and the archive (name, size, sha256, file count), and
that the parts add up to the archive.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from repro.installset import InstallSetError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "ManifestInvalid",
    "check_structure",
    "load_manifest",
    "validate_schema",
]

FORMAT = "repro-install-set"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SCHEMA_NAME = "install-set"

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# A part or archive is a plain file name: no directory, no "..", nothing hidden.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")


class ManifestInvalid(InstallSetError):
    """The manifest is not one the kit wrote (or not of a version this installer knows)."""


def _need(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise ManifestInvalid(f"manifest: {where}.{key} is missing")
    value = doc[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ManifestInvalid(f"manifest: {where}.{key} has the wrong type ({value!r})")
    return value


def _check_file(entry: Any, where: str) -> None:
    if not isinstance(entry, Mapping):
        raise ManifestInvalid(f"manifest: {where} is not an object")
    name = _need(entry, "name", str, where)
    if not SAFE_NAME.match(name) or ".." in name:
        raise ManifestInvalid(f"manifest: {where}.name {name!r} is not a plain file name")
    if _need(entry, "bytes", int, where) < 0:
        raise ManifestInvalid(f"manifest: {where}.bytes is negative")
    if not _SHA256.match(_need(entry, "sha256", str, where)):
        raise ManifestInvalid(f"manifest: {where}.sha256 is not 64 lower-case hex digits")


def check_structure(doc: Any) -> None:
    """Raise ``ManifestInvalid`` unless ``doc`` has what ``verify``/``install`` rely on."""
    if not isinstance(doc, Mapping):
        raise ManifestInvalid("manifest: not a JSON object")
    if doc.get("format") != FORMAT:
        raise ManifestInvalid(f"manifest: format is {doc.get('format')!r}, expected {FORMAT!r}")
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise ManifestInvalid(
            f"manifest: format_version {version!r}; this installer reads version "
            f"{FORMAT_VERSION} only (use the kit checkout the set was built with)"
        )
    archive = _need(doc, "archive", Mapping, "$")
    _check_file(archive, "$.archive")
    if _need(archive, "files", int, "$.archive") < 0:
        raise ManifestInvalid("manifest: $.archive.files is negative")
    # The installer stops extracting past this: a small archive cannot fill the disk.
    if _need(archive, "unpacked_bytes", int, "$.archive") < 0:
        raise ManifestInvalid("manifest: $.archive.unpacked_bytes is negative")
    parts = _need(doc, "parts", list, "$")
    if not parts:
        raise ManifestInvalid("manifest: $.parts is empty")
    for i, part in enumerate(parts):
        _check_file(part, f"$.parts[{i}]")
        if part["bytes"] == 0:
            raise ManifestInvalid(f"manifest: $.parts[{i}] is empty")
    names = [p["name"] for p in parts]
    if len(set(names)) != len(names) or archive["name"] in names:
        raise ManifestInvalid("manifest: part names repeat (or repeat the archive's name)")
    total = sum(p["bytes"] for p in parts)
    if total != archive["bytes"]:
        raise ManifestInvalid(
            f"manifest: the parts add up to {total} bytes, the archive has {archive['bytes']}"
        )


def load_manifest(parts_dir: str | Path) -> tuple[dict[str, Any], str]:
    """Read ``DIR/manifest.json``; return the document and the sha256 of its bytes."""
    path = Path(parts_dir) / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise InstallSetError(
            f"{path} does not exist: --parts must name the folder holding manifest.json and "
            "the parts, as the build wrote them"
        ) from exc
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestInvalid(f"{path} is not valid JSON ({exc}); copy it again") from exc
    check_structure(doc)
    return doc, hashlib.sha256(data).hexdigest()


def validate_schema(doc: Any) -> None:
    """Validate against the JSON Schema (build side: needs jsonschema, imported here only)."""
    from jsonschema import Draft202012Validator

    from repro.artifact import load_schema

    schema = load_schema(SCHEMA_NAME, FORMAT_VERSION)
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(doc), key=lambda e: (e.json_path, e.message))
    if errors:
        lines = "\n".join(f"  - {e.json_path}: {e.message}" for e in errors[:20])
        raise ManifestInvalid(
            f"the install-set manifest does not satisfy its schema ({len(errors)} error(s)):\n"
            f"{lines}"
        )
    check_structure(doc)
