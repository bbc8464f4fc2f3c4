"""Runs as the evidence commands see them: a run directory or a run inside a bundle.

A run directory is what `python -m repro run` (or `repro-tiny`) writes: one artifact per arm
(`cold-race.json`, `multi-turn.json`), `logs/`, and, where there is one, the image's records
(`image-record.json` from a build, `image-import.json` from `import-image`) and the weights
manifest (`repro-weights-manifest.json`). A bundle holds the same files under
`runs/<label>/`; it is verified in full (`repro.evidence.verify.load_runs`) before anything in
it is read.

Every artifact is validated against its schema on the way in: reports and comparisons are
made from valid evidence only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.artifact import schema_violations
from repro.core.errors import ReproError
from repro.core.jsonread import JSONUnreadable, parse_json_bytes, read_json, read_json_bytes
from repro.core.vocabulary import ARMS

IMAGE_RECORD_NAME = "image-record.json"
IMAGE_IMPORT_NAME = "image-import.json"
WEIGHTS_MANIFEST_NAME = "repro-weights-manifest.json"  # as repro.weights.MANIFEST_NAME
# The kinds of JSON file a run holds; each is checked against the schema of its name.
JSON_KINDS = frozenset({"run-artifact", "image-record", "image-import", "weights-manifest"})
BUNDLE_SUFFIXES = (".tar.gz", ".tgz")


class EvidenceError(ReproError):
    """Input that cannot serve as evidence (missing, unreadable, invalid, unverified)."""


@dataclass
class Run:
    """One run: its artifacts by arm (in `repro.core.vocabulary.ARMS` order) and the records that
    travel with it."""

    label: str
    source: str  # what the user named (a directory, or BUNDLE#runs/LABEL), for messages
    documents: dict[str, dict[str, Any]]
    image_record: dict[str, Any] | None = None
    image_import: dict[str, Any] | None = None
    weights_manifest: dict[str, Any] | None = None
    # arm -> the artifact's file name (run directories only).
    artifact_names: dict[str, str] = field(default_factory=dict)

    @property
    def first(self) -> dict[str, Any]:
        return next(iter(self.documents.values()))


def load_run_dir(path: Path) -> Run:
    documents: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}
    records: dict[str, dict[str, Any] | None] = {}
    for file in sorted(path.glob("*.json")):
        if file.name.startswith("."):
            continue  # a partial record of an arm still running
        if file.is_symlink():  # evidence is the files the run wrote, not what a link points at
            raise EvidenceError(
                f"{file}: a link (to {os.readlink(file)}); a run directory's records are "
                "regular files only: copy the file in its place"
            )
        if file.name in (IMAGE_RECORD_NAME, IMAGE_IMPORT_NAME, WEIGHTS_MANIFEST_NAME):
            kind = _kind_of_name(file.name)
            records[kind] = parse_json(_read_bytes(file), str(file), kind)
            continue
        doc = _read_json(file)
        if not (isinstance(doc, dict) and "arm" in doc and "schema_version" in doc):
            continue  # not a run artifact (e.g. a plan); the evidence commands ignore it
        _require_valid(doc, "run-artifact", str(file))
        if doc["arm"] in documents:
            raise EvidenceError(
                f"{path}: two artifacts of the {doc['arm']} arm ({names[doc['arm']]} and "
                f"{file.name}); a run directory holds one run, keep one of them"
            )
        documents[doc["arm"]] = doc
        names[doc["arm"]] = file.name
    if not documents:
        raise EvidenceError(
            f"{path}: no run artifacts (a *.json per arm, as `python -m repro run` writes); "
            "give the directory a run wrote with --out"
        )
    return Run(
        label=path.resolve().name,
        source=str(path),
        documents=order_arms(documents),
        image_record=records.get("image-record"),
        image_import=records.get("image-import"),
        weights_manifest=records.get("weights-manifest"),
        artifact_names=names,
    )


def runs_from_files(
    manifest: dict[str, Any], contents: dict[str, bytes], *, source: str
) -> list[Run]:
    """Runs from a bundle's verified files (path -> bytes), in the manifest's order."""
    runs = []
    kinds = {f["path"]: f["kind"] for f in manifest["files"]}
    for entry in manifest["runs"]:
        prefix = f"runs/{entry['label']}/"
        documents: dict[str, dict[str, Any]] = {}
        records: dict[str, dict[str, Any]] = {}
        for name, kind in kinds.items():
            if not name.startswith(prefix) or kind not in JSON_KINDS:
                continue
            doc = parse_json(contents[name], f"{source}#{name}", kind)  # verified: valid
            key = doc["arm"] if kind == "run-artifact" else kind
            if key in (documents if kind == "run-artifact" else records):
                raise EvidenceError(  # verify refuses this too; never keep only the last one
                    f"{source}: run {entry['label']} holds two {key} files; one would be hidden"
                )
            if kind == "run-artifact":
                documents[doc["arm"]] = doc
            else:
                records[kind] = doc
        runs.append(
            Run(
                label=entry["label"],
                source=f"{source}#{prefix.rstrip('/')}",
                documents=order_arms(documents),
                image_record=records.get("image-record"),
                image_import=records.get("image-import"),
                weights_manifest=records.get("weights-manifest"),
            )
        )
    return runs


def order_arms(documents: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {arm: documents[arm] for arm in sorted(documents, key=_arm_rank)}


def _arm_rank(arm: str) -> tuple[int, str]:
    return (ARMS.index(arm) if arm in ARMS else len(ARMS), arm)


def parse_json(data: bytes, where: str, kind: str) -> dict[str, Any]:
    """Parse ``data`` and validate it against the schema of ``kind``; raise naming ``where``."""
    try:
        doc = parse_json_bytes(data, where)
    except JSONUnreadable as exc:
        raise EvidenceError(str(exc)) from None
    _require_valid(doc, kind, where)
    return doc


def _read_bytes(file: Path) -> bytes:
    try:
        return read_json_bytes(file)
    except JSONUnreadable as exc:
        raise EvidenceError(str(exc)) from None


def _read_json(file: Path) -> Any:
    try:
        return read_json(file)
    except JSONUnreadable as exc:
        raise EvidenceError(str(exc)) from None


def _require_valid(doc: Any, schema: str, where: str) -> None:
    try:
        violations = schema_violations(doc, schema)
    except RecursionError:
        raise EvidenceError(
            f"{where}: nested deeper than the schema check can follow; not a record of the "
            "kit's shape"
        ) from None
    if violations:
        lines = "\n".join(f"  - {v}" for v in violations)
        raise EvidenceError(
            f"{where}: does not match schemas/{schema}.v1.schema.json "
            f"({len(violations)} violation(s)):\n{lines}"
        )


def _kind_of_name(name: str) -> str:
    return {
        IMAGE_RECORD_NAME: "image-record",
        IMAGE_IMPORT_NAME: "image-import",
        WEIGHTS_MANIFEST_NAME: "weights-manifest",
    }[name]


__all__ = [
    "EvidenceError",
    "Run",
    "load_run_dir",
    "order_arms",
    "parse_json",
    "runs_from_files",
]
