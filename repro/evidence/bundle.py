"""Evidence bundles: one deterministic .tar.gz per set of runs, ready to attach to an issue.

`python -m repro bundle RUN_DIR… --out FILE.tar.gz` writes::

    MANIFEST.json                     every other file: path, kind, bytes, sha256 (schema:
                                      schemas/bundle-manifest.v1.schema.json), creation time,
                                      kit version, the runs
    SUMMARY.md                        the report (`repro.evidence.report`) of the runs, as pasted
    runs/<label>/<arm>.json           the run artifacts, byte for byte as the run wrote them
    runs/<label>/logs/<name>          the full logs
    runs/<label>/log-excerpts/<name>  a short view of each log: its first and last 4 KiB
    runs/<label>/image-record.json    the image's build record, where the run was in an image
    runs/<label>/image-import.json    the image's import record, where it was imported
    runs/<label>/repro-weights-manifest.json   the weights manifest, where there is one

and `FILE.tar.gz.sha256` next to it. `<label>` is the run directory's name (made unique).

Determinism: the same inputs give a byte-identical archive. Members are sorted by path and
carry fixed metadata (mode 0644, uid/gid 0, empty user and group names, no directory
entries); the gzip header has mtime 0 and no file name. The one time in the bundle, the
manifest's `created` (also every member's mtime), never comes from the clock: by default it is
the newest artifact's `run.finished_at`; `SOURCE_DATE_EPOCH` (the reproducible-builds
convention) overrides that, and `--created` overrides both. The manifest says which one was
used. Byte identity assumes the same deflate implementation (zlib); `verify` compares the
uncompressed tar, which does not depend on it.

Inputs are checked before anything is written: every artifact must be schema-valid, every log
an artifact records must be present with the sha256 it recorded, and every recorded verdict
must follow from its figures (`repro.evidence.verdicts`). Output files are written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from repro import __version__
from repro.artifact import schema_violations
from repro.containers.handoff import DEFAULT_IMAGES_DIR, find_image_record
from repro.core import redaction
from repro.core.atomicio import write_bytes_atomic, write_text_atomic
from repro.core.clock import utc_text
from repro.evidence.archive import gzip_bytes, tar_bytes
from repro.evidence.report import render
from repro.evidence.runs import (
    IMAGE_IMPORT_NAME,
    IMAGE_RECORD_NAME,
    WEIGHTS_MANIFEST_NAME,
    EvidenceError,
    Run,
    load_run_dir,
    parse_json,
)
from repro.evidence.verdicts import require_verdict_follows

MANIFEST_NAME = "MANIFEST.json"
SUMMARY_NAME = "SUMMARY.md"
# The short view of a log: enough for the engine banner and the verdict lines at the end.
EXCERPT_HEAD_BYTES = 4096
EXCERPT_TAIL_BYTES = 4096
# Members must be plain names the manifest schema accepts (no spaces, no '..').
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class Member:
    path: str
    kind: str
    data: bytes


@dataclass
class BundleResult:
    path: Path
    sha256: str
    bytes: int
    manifest: dict[str, Any]


def log_excerpt(data: bytes) -> bytes:
    """The first and last few KiB of a log, cut at line ends, with what was left out said."""
    if len(data) <= EXCERPT_HEAD_BYTES + EXCERPT_TAIL_BYTES:
        return data
    head = data[:EXCERPT_HEAD_BYTES]
    head = head[: head.rfind(b"\n") + 1] or head
    tail = data[-EXCERPT_TAIL_BYTES:]
    cut = tail.find(b"\n")
    tail = tail[cut + 1 :] if 0 <= cut < len(tail) - 1 else tail
    omitted = len(data) - len(head) - len(tail)
    marker = f"\n[... {omitted} bytes omitted; the full log is in logs/ ...]\n\n".encode()
    return head + marker + tail


# --- creation time -------------------------------------------------------------------------


def parse_timestamp(text: str) -> datetime:
    """An RFC 3339 date-time with an offset (``Z`` or ``+HH:MM``), as an aware datetime."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise EvidenceError(
            f"expected an RFC 3339 date-time such as 2026-11-30T05:00:00Z, found {text!r}"
        ) from exc
    if value.tzinfo is None:
        raise EvidenceError(f"date-time {text!r} has no offset; add Z (UTC) or +HH:MM")
    return value


def resolve_created(
    runs: list[Run], created: str | None = None, environ: dict[str, str] | None = None
) -> tuple[str, str]:
    """(created, where it came from): --created, else SOURCE_DATE_EPOCH, else the inputs."""
    environ = os.environ if environ is None else environ
    if created:
        return utc_text(parse_timestamp(created)), "--created"
    epoch = environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        if not epoch.isdigit():
            raise EvidenceError(f"SOURCE_DATE_EPOCH must be whole seconds, found {epoch!r}")
        return utc_text(int(epoch)), "SOURCE_DATE_EPOCH"
    newest = max(
        parse_timestamp(doc["run"]["finished_at"]) for run in runs for doc in run.documents.values()
    )
    return utc_text(newest), "newest-artifact"


# --- collecting a run's files --------------------------------------------------------------


def _regular_file(path: Path) -> bytes:
    if path.is_symlink() or not path.is_file():
        raise EvidenceError(
            f"{path}: a bundle holds regular files only, found "
            f"{'a link' if path.is_symlink() else 'something else'}; copy the file in its place"
        )
    return path.read_bytes()


def _safe_name(name: str, where: Path) -> str:
    if not _SAFE_NAME.match(name):
        raise EvidenceError(
            f"{where}: file name {name!r} cannot go into a bundle (letters, digits and ._+- "
            "only); rename it"
        )
    return name


def collect_run(run_dir: Path, label: str, images_dir: Path | None) -> tuple[Run, list[Member]]:
    """Everything of one run directory that goes into the bundle, checked."""
    run = load_run_dir(run_dir)
    run.label = label
    prefix = f"runs/{label}/"
    members: list[Member] = []
    for arm, doc in run.documents.items():
        require_verdict_follows(
            doc,
            f"{run_dir}/{arm}.json",
            "Bundles carry evidence as the run graded it; re-run the arm rather than edit it.",
        )
    for arm in run.documents:
        name = _safe_name(run.artifact_names[arm], run_dir / run.artifact_names[arm])
        members.append(Member(prefix + name, "run-artifact", _regular_file(run_dir / name)))

    logs: dict[str, bytes] = {}
    log_dir = run_dir / "logs"
    if log_dir.is_dir():
        for file in sorted(log_dir.iterdir()):
            if file.name.startswith("."):
                continue
            logs[f"logs/{_safe_name(file.name, file)}"] = _regular_file(file)
    for arm, doc in run.documents.items():
        for entry in doc["logs"]:
            data = logs.get(entry["path"])
            if data is None:
                raise EvidenceError(
                    f"{run_dir}/{arm}.json records the log {entry['path']}, which is not in "
                    f"{log_dir}; bundle the directory the run wrote, logs and all"
                )
            found = hashlib.sha256(data).hexdigest()
            if found != entry["sha256"]:
                raise EvidenceError(
                    f"{run_dir}/{entry['path']}: sha256 {found} differs from the "
                    f"{entry['sha256']} that {arm}.json recorded; the log changed after the run"
                )
    for rel, data in logs.items():
        findings = redaction.scan(data.decode("utf-8", errors="replace"))
        if findings:  # the kit masks its logs as it writes them: this one was changed since
            raise EvidenceError(
                f"{run_dir}/{rel} holds what looks like a secret ({'; '.join(findings[:3])}); "
                "a bundle is handed to others, so it is not bundled. Remove the secret from "
                "the log (the artifact's log sha256 then changes: re-run the arm)"
            )
        name = rel.split("/", 1)[1]
        members.append(Member(prefix + rel, "log", data))
        members.append(Member(f"{prefix}log-excerpts/{name}", "log-excerpt", log_excerpt(data)))

    image_ids = {
        doc["run"]["location"]["image"]["id"]
        for doc in run.documents.values()
        if doc["run"]["location"].get("image")
    }
    for name, kind, attr, schema_tag in (
        (IMAGE_RECORD_NAME, "image-record", "image_record", "repro-kit/image-record"),
        (IMAGE_IMPORT_NAME, "image-import", "image_import", "repro-kit/image-import"),
    ):
        present = (run_dir / name).is_file() or (run_dir / name).is_symlink()
        data = _regular_file(run_dir / name) if present else None  # never through a link
        if data is None and image_ids:
            data = find_image_record(images_dir, schema_tag, image_ids)
        if data is not None:
            setattr(run, attr, parse_json(data, f"{run_dir}/{name}", kind))
            members.append(Member(prefix + name, kind, data))

    weights = run_dir / WEIGHTS_MANIFEST_NAME
    if not weights.is_file():
        model_path = run.first["profile"].get("model_path")
        weights = Path(model_path) / WEIGHTS_MANIFEST_NAME if model_path else weights
    if weights.is_file():
        data = _regular_file(weights)
        run.weights_manifest = parse_json(data, str(weights), "weights-manifest")
        members.append(Member(prefix + WEIGHTS_MANIFEST_NAME, "weights-manifest", data))
    return run, members


def unique_labels(run_dirs: list[Path]) -> list[str]:
    """Run directory names, made safe and unique (a second `out` becomes `out-2`)."""
    labels: list[str] = []
    for path in run_dirs:
        base = re.sub(r"[^A-Za-z0-9._-]", "-", path.resolve().name).lstrip("._-")[:90] or "run"
        label, n = base, 2
        while label in labels:
            label, n = f"{base}-{n}", n + 1
        labels.append(label)
    return labels


# --- the bundle ----------------------------------------------------------------------------


def build_bundle(
    run_dirs: list[Path],
    out: Path,
    *,
    created: str | None = None,
    images_dir: Path | None = DEFAULT_IMAGES_DIR,
    environ: dict[str, str] | None = None,
) -> BundleResult:
    """Write the bundle of ``run_dirs`` to ``out`` (and ``out``.sha256), atomically."""
    if not run_dirs:
        raise EvidenceError("no run directories given; name at least one")
    if not out.name.endswith((".tar.gz", ".tgz")):
        raise EvidenceError(f"--out {out}: a bundle is a .tar.gz; name it FILE.tar.gz")
    if not out.parent.is_dir():
        raise EvidenceError(f"--out {out}: folder {out.parent} does not exist; create it first")
    for path in run_dirs:
        if not path.is_dir():
            raise EvidenceError(f"{path}: not a run directory")
    runs: list[Run] = []
    members: list[Member] = []
    for path, label in zip(run_dirs, unique_labels(run_dirs), strict=True):
        run, files = collect_run(path, label, images_dir)
        runs.append(run)
        members.extend(files)
    created_at, created_from = resolve_created(runs, created, environ)
    members.append(Member(SUMMARY_NAME, "summary", render(runs).encode("utf-8")))
    members.sort(key=lambda m: m.path)
    manifest = {
        "schema": "repro-kit/bundle-manifest",
        "schema_version": 1,
        "kit": {"name": "repro-kit", "version": __version__},
        "created": created_at,
        "created_from": created_from,
        "runs": [
            {
                "label": run.label,
                "arms": list(run.documents),
                "run_ids": [doc["run"]["id"] for doc in run.documents.values()],
            }
            for run in runs
        ],
        "files": [
            {
                "path": m.path,
                "kind": m.kind,
                "bytes": len(m.data),
                "sha256": hashlib.sha256(m.data).hexdigest(),
            }
            for m in members
        ],
        "total_bytes": sum(len(m.data) for m in members),
    }
    violations = schema_violations(manifest, "bundle-manifest")
    if violations:  # a bug in this module, not in the inputs
        raise AssertionError("bundle manifest is invalid:\n" + "\n".join(violations))
    files = {m.path: m.data for m in members}
    files[MANIFEST_NAME] = (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode()
    mtime = int(parse_timestamp(created_at).timestamp())
    archive = gzip_bytes(tar_bytes(files, mtime))
    digest = hashlib.sha256(archive).hexdigest()
    write_bytes_atomic(out, archive)
    write_text_atomic(sidecar(out), f"{digest}  {out.name}\n")
    return BundleResult(out, digest, len(archive), manifest)


def sidecar(out: Path) -> Path:
    return out.with_name(out.name + ".sha256")


__all__ = [
    "MANIFEST_NAME",
    "SUMMARY_NAME",
    "BundleResult",
    "build_bundle",
    "collect_run",
    "log_excerpt",
    "resolve_created",
    "unique_labels",
]
