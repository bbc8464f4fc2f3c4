"""Verify an evidence bundle without extracting it.

`python -m repro verify FILE.tar.gz` reads the archive into memory (never onto disk; the tar
once and the member contents once, nothing else of that size) and checks, in order:

1. the archive's sha256 against ``FILE.tar.gz.sha256`` when that file is next to it;
2. the gzip stream: complete (a truncated archive is named as such), CRC and length intact,
   one member, nothing after it, the kit's fixed header, at most MAX_UNCOMPRESSED_BYTES
   decompressed (checked every MiB of output, so a gzip bomb stops there);
3. every tar member: a regular file with a relative path, no ``..`` or ``.`` component, no
   absolute path, no link (a link pointing outside the bundle is named as such), no device,
   no directory, no sparse file, no duplicate. Such members are refused and their contents
   never read;
4. ``MANIFEST.json`` against ``schemas/bundle-manifest.v1.schema.json``; every file it lists
   is present with its size and sha256, and no file is present that it does not list;
5. every JSON file against the schema of its kind (run artifact, image record, image import
   record, weights manifest);
6. every run artifact's verdict re-derived from its recorded figures with the kit's grading
   code (`repro.verdict_check`); a verdict that does not follow is named;
7. each log an artifact records is present with the sha256 the artifact recorded; each log
   excerpt is the excerpt of its log; the run list matches the artifacts, one artifact per
   arm and run; no member holds what `repro.redaction` takes for a credential;
8. the uncompressed tar is byte for byte what `repro.bundle` writes for these contents (so a
   changed byte anywhere, even in padding or a header field, is found), and ``SUMMARY.md`` is
   this kit's rendering of the artifacts (a warning, not a failure, where it is not: another
   checkout of the kit may word the report differently; the artifacts are the evidence).
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro import __version__
from repro.artifact import schema_violations
from repro.bundle import (
    GZIP_HEADER,
    MANIFEST_NAME,
    SUMMARY_NAME,
    log_excerpt,
    parse_timestamp,
    sidecar,
    tar_chunks,
)
from repro.runset import SCHEMA_OF_KIND, runs_from_files

# A bundle is artifacts and logs: far below this. Larger is refused before it fills memory.
MAX_UNCOMPRESSED_BYTES = 2 * 1024**3
_CHUNK = 1 << 20


@dataclass
class VerifyResult:
    path: Path
    # (status, text); status is "ok", "FAIL" (a problem), "WARN" (look, but not a fault) or
    # "note" (information).
    lines: list[tuple[str, str]] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    contents: dict[str, bytes] = field(default_factory=dict)

    def ok_(self, text: str) -> None:
        self.lines.append(("ok", text))

    def fail(self, text: str) -> None:
        self.lines.append(("FAIL", text))

    def note(self, text: str) -> None:
        self.lines.append(("note", text))

    def warn(self, text: str) -> None:
        self.lines.append(("WARN", text))

    @property
    def problems(self) -> list[str]:
        return [text for status, text in self.lines if status == "FAIL"]

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        out = [f"verify {self.path}"]
        out += [f"  {status:<4}  {text}" for status, text in self.lines]
        checks = sum(1 for status, _ in self.lines if status == "ok")
        warnings = sum(1 for status, _ in self.lines if status == "WARN")
        if self.ok:
            warned = f", {warnings} warning(s) above" if warnings else ""
            out.append(f"PASS: {checks} checks passed, nothing refused{warned}")
        else:
            out.append(
                f"FAIL: {len(self.problems)} problem(s), {checks} checks passed; "
                "do not use this bundle as evidence"
            )
        return "\n".join(out)


def verify_bundle(path: Path) -> VerifyResult:
    result = VerifyResult(path)
    tar = _read_and_gunzip(path, result)
    if tar is None:
        return result
    members = _read_members(tar, result)
    if members is None:
        return result
    result.contents = members
    manifest = _check_manifest(members, result)
    if manifest is None:
        return result
    result.manifest = manifest
    _check_files(manifest, members, result)
    documents = _check_json(manifest, members, result)
    _check_verdicts(documents, result)
    _check_logs(manifest, members, documents, result)
    _check_secrets(members, result)
    if result.ok:
        _check_canonical(manifest, members, tar, result)
        _check_summary(manifest, members, result)
    return result


# --- 1, 2: the archive and its gzip stream -------------------------------------------------


def _check_sidecar(path: Path, digest: str, result: VerifyResult) -> None:
    side = sidecar(path)
    if not side.is_file():
        result.note(f"no {side.name} next to the archive: its own sha256 is not checked")
        return
    expected = side.read_text(encoding="utf-8", errors="replace").split()
    if not expected or expected[0] != digest:
        result.fail(
            f"archive sha256 {digest} differs from the {expected[0] if expected else '(empty)'} "
            f"in {side.name}: the archive changed after it was written"
        )
    else:
        result.ok_(f"archive sha256 matches {side.name}")


def _read_and_gunzip(path: Path, result: VerifyResult) -> bytearray | None:
    """Hash and decompress ``path`` in one streaming pass; the tar, or None (named)."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below, whatever happens
    except OSError as exc:
        result.fail(f"cannot read {path}: {exc.strerror or exc}")
        return None
    with handle:
        digest = hashlib.sha256()
        head = handle.read(len(GZIP_HEADER))
        if head[:2] != b"\x1f\x8b":
            result.fail(f"not a gzip file (starts with {head[:4]!r}); a bundle is a .tar.gz")
            return None
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = bytearray()
        size = 0
        error = None
        end = None  # where the gzip stream ended in the file
        chunk = head
        while chunk:
            digest.update(chunk)
            size += len(chunk)
            if error is None and end is None:
                error = _inflate(decompressor, chunk, out)
                if decompressor.eof:
                    end = size - len(decompressor.unused_data)
            chunk = handle.read(_CHUNK)
    result.note(f"archive: {size} bytes, sha256 {digest.hexdigest()}")
    _check_sidecar(path, digest.hexdigest(), result)
    if error == "too big":
        result.fail(
            f"more than {MAX_UNCOMPRESSED_BYTES} bytes uncompressed; refused "
            "(a bundle of artifacts and logs is far smaller)"
        )
        return None
    if error is not None:
        result.fail(
            f"archive is corrupt: the gzip stream does not decode ({error}); a changed or "
            "lost byte. Ask for the bundle again"
        )
        return None
    if not decompressor.eof:
        result.fail(
            f"archive is truncated: the gzip stream ends after {size} bytes without its "
            "end marker. Ask for the bundle again (an interrupted download or copy)"
        )
        return None
    if end is not None and end < size:
        result.fail(
            f"{size - end} unexpected bytes after the gzip stream (a bundle is one gzip member)"
        )
        return None
    result.ok_(f"gzip stream complete, CRC and length intact ({len(out)} bytes of tar)")
    if head != GZIP_HEADER:
        result.fail(
            f"gzip header {head.hex()} differs from the kit's fixed header "
            f"{GZIP_HEADER.hex()} (a changed byte, or not written by `python -m repro bundle`)"
        )
    return out


def _inflate(decompressor, chunk: bytes, out: bytearray) -> str | None:
    """Decompress ``chunk`` onto ``out`` a slice at a time, so the cap holds to within one
    slice (a gzip bomb inflates 1 MiB of input to about 1 GiB); None, "too big" or the error."""
    pending = chunk
    try:
        while pending and not decompressor.eof:
            out += decompressor.decompress(pending, _CHUNK)
            if len(out) > MAX_UNCOMPRESSED_BYTES:
                return "too big"
            pending = decompressor.unconsumed_tail
    except zlib.error as exc:
        return str(exc)
    return None


# --- 3: members, without extracting --------------------------------------------------------


def unsafe_reason(member: tarfile.TarInfo) -> str | None:
    """Why ``member`` may not be in a bundle, or None. Reads nothing but the header."""
    name = member.name
    if not name:
        return "member with an empty name"
    if name.startswith("/"):
        return f"{name!r}: absolute path"
    parts = name.split("/")
    if ".." in parts:
        return f"{name!r}: path goes up with '..'"
    if "\\" in name or any(part in ("", ".") for part in parts):
        return f"{name!r}: not a plain relative path ('.', '//' or '\\')"
    if not name.isprintable():
        return f"{name!r}: control characters in the name"
    if member.issparse():  # tarfile counts it regular; read, it expands past its size
        return f"{name!r}: a sparse file ({member.size} bytes once expanded); a bundle holds none"
    if member.issym() or member.islnk():
        kind = "symbolic link" if member.issym() else "hard link"
        target = member.linkname
        base = posixpath.dirname(name) if member.issym() else ""
        resolved = posixpath.normpath(posixpath.join(base, target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            return f"{name!r}: {kind} to {target!r} points outside the bundle"
        return f"{name!r}: {kind} to {target!r}; a bundle holds regular files only"
    if not member.isreg():
        what = "directory" if member.isdir() else "special file (device, fifo)"
        return f"{name!r}: a {what}; a bundle holds regular files only"
    return None


class _View(io.RawIOBase):
    """A read-only file over the tar in memory: tarfile reads it without a copy of it."""

    def __init__(self, data: bytearray) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        piece = self._view[self._pos : self._pos + len(buffer)]
        buffer[: len(piece)] = piece
        self._pos += len(piece)
        return len(piece)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


def _read_members(tar: bytearray, result: VerifyResult) -> dict[str, bytes] | None:
    contents: dict[str, bytes] = {}
    refused = 0
    try:
        with tarfile.open(fileobj=_View(tar), mode="r:") as archive:
            for member in archive:
                reason = unsafe_reason(member)
                if reason:
                    refused += 1
                    result.fail(f"refused member {reason} (not read, nothing extracted)")
                    continue
                if member.name in contents:
                    result.fail(f"duplicate member {member.name!r}; refused")
                    continue
                handle = archive.extractfile(member)
                data = handle.read() if handle else b""
                if len(data) != member.size:
                    raise tarfile.ReadError(f"{member.name}: data ends early")
                contents[member.name] = data
    except (tarfile.TarError, EOFError) as exc:
        result.fail(f"the tar inside the gzip stream is damaged ({exc})")
        return None
    if not contents and not refused:
        result.fail("the archive holds no files")
        return None
    if not refused:
        result.ok_(
            f"{len(contents)} members: regular files, relative paths, no '..', no links "
            "(read in memory, nothing extracted)"
        )
    return contents


# --- 4, 5: manifest, files, schemas --------------------------------------------------------


def _check_manifest(members: dict[str, bytes], result: VerifyResult) -> dict[str, Any] | None:
    raw = members.get(MANIFEST_NAME)
    if raw is None:
        result.fail(f"no {MANIFEST_NAME}: without it no file can be checked")
        return None
    try:
        manifest = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        result.fail(f"{MANIFEST_NAME}: not JSON ({exc})")
        return None
    violations = schema_violations(manifest, "bundle-manifest")
    if violations:
        for line in violations:
            result.fail(f"{MANIFEST_NAME}: does not match bundle-manifest.v1: {line}")
        return None
    result.ok_(
        f"{MANIFEST_NAME} matches schemas/bundle-manifest.v1.schema.json (kit "
        f"{manifest['kit']['version']}, created {manifest['created']} from "
        f"{manifest['created_from']}, {len(manifest['runs'])} run(s))"
    )
    return manifest


def _check_files(manifest: dict[str, Any], members: dict[str, bytes], result: VerifyResult):
    listed = {entry["path"]: entry for entry in manifest["files"]}
    bad = 0
    for name in sorted(members):
        if name != MANIFEST_NAME and name not in listed:
            bad += 1
            result.fail(f"extra file {name!r} is not in {MANIFEST_NAME}")
    total = 0
    for name, entry in listed.items():
        if name == MANIFEST_NAME:
            bad += 1
            result.fail(f"{MANIFEST_NAME} lists itself")
            continue
        data = members.get(name)
        if data is None:
            bad += 1
            result.fail(f"missing file {name!r} ({entry['bytes']} bytes, listed in the manifest)")
            continue
        total += len(data)
        found = hashlib.sha256(data).hexdigest()
        if len(data) != entry["bytes"] or found != entry["sha256"]:
            bad += 1
            result.fail(
                f"{name}: content changed: {len(data)} bytes, sha256 {found}; the manifest "
                f"says {entry['bytes']} bytes, sha256 {entry['sha256']}"
            )
    if sum(e["bytes"] for e in manifest["files"]) != manifest["total_bytes"]:
        bad += 1
        result.fail(f"{MANIFEST_NAME}: total_bytes is not the sum of the files' bytes")
    if not bad:
        result.ok_(
            f"{len(listed)} files: size and sha256 as listed ({total} bytes); "
            "none missing, none extra"
        )


def _check_json(
    manifest: dict[str, Any], members: dict[str, bytes], result: VerifyResult
) -> dict[str, dict[str, Any]]:
    """Validate every JSON file; return the valid run artifacts by path."""
    documents: dict[str, dict[str, Any]] = {}
    for entry in manifest["files"]:
        kind, name = entry["kind"], entry["path"]
        schema = SCHEMA_OF_KIND.get(kind)
        if schema is None or name not in members:
            continue
        try:
            doc = json.loads(members[name])
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            result.fail(f"{name}: not JSON ({exc})")
            continue
        violations = schema_violations(doc, schema)
        for line in violations:
            result.fail(f"{name}: does not match schemas/{schema}.v1.schema.json: {line}")
        if not violations:
            result.ok_(f"{name}: valid against schemas/{schema}.v1.schema.json")
            if kind == "run-artifact":
                documents[name] = doc
    return documents


# --- 6, 7: verdicts, logs, runs ------------------------------------------------------------


def _check_verdicts(documents: dict[str, dict[str, Any]], result: VerifyResult) -> None:
    from repro.verdict_check import check_verdict

    for name, doc in documents.items():
        check = check_verdict(doc)
        recorded = doc["verdict"]
        shown = recorded["status"] + (f" ({recorded['gate']})" if recorded["gate"] else "")
        for problem in check.problems:
            result.fail(f"{name}: {problem}")
        if not check.rederived:
            result.note(f"{name}: verdict {shown} not re-derivable ({check.note})")
        elif not check.problems:
            result.ok_(f"{name}: verdict {shown} re-derived from its figures: agrees")
            if check.note:
                result.note(f"{name}: {check.note}")


def _check_logs(
    manifest: dict[str, Any],
    members: dict[str, bytes],
    documents: dict[str, dict[str, Any]],
    result: VerifyResult,
) -> None:
    kinds = {entry["path"]: entry["kind"] for entry in manifest["files"]}
    for name, doc in documents.items():
        base = posixpath.dirname(name)
        for log in doc["logs"]:
            where = posixpath.join(base, log["path"])
            data = members.get(where)
            if data is None or kinds.get(where) != "log":
                result.fail(f"{name} records the log {log['path']}, which the bundle lacks")
            elif hashlib.sha256(data).hexdigest() != log["sha256"]:
                result.fail(f"{where}: sha256 differs from the one {name} recorded")
            else:
                result.ok_(f"{where}: sha256 as {posixpath.basename(name)} recorded")
    for path, kind in kinds.items():
        if kind != "log-excerpt" or path not in members:
            continue
        full = path.replace("/log-excerpts/", "/logs/", 1)
        if full not in members:
            result.fail(f"{path}: excerpt of a log the bundle lacks ({full})")
        elif log_excerpt(members[full]) != members[path]:
            result.fail(f"{path}: not the excerpt of {full}")
    arms_by_label: dict[str, set[str]] = {}
    files_by_arm: dict[tuple[str, Any], list[str]] = {}
    for name, kind in kinds.items():
        if kind != "run-artifact" or name not in members:
            continue
        parts = name.split("/")
        if len(parts) != 3 or parts[0] != "runs":
            result.fail(f"{name}: a run artifact outside runs/<label>/")
            continue
        try:  # invalid artifacts are named above; here only which arm each file is
            arm = json.loads(members[name]).get("arm")
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            continue
        arms_by_label.setdefault(parts[1], set()).add(arm)
        files_by_arm.setdefault((parts[1], arm), []).append(name)
    for (label, arm), names in files_by_arm.items():
        if len(names) > 1:  # report and compare show one artifact per arm and run
            result.fail(
                f"run {label} holds {len(names)} artifacts of the {arm} arm "
                f"({', '.join(names)}); a run has one per arm, so all but one would be hidden"
            )
    for run in manifest["runs"]:
        found = arms_by_label.get(run["label"], set())
        if found != set(run["arms"]):
            result.fail(
                f"{MANIFEST_NAME}: run {run['label']} lists arms {sorted(run['arms'])}, the "
                f"bundle holds artifacts of {sorted(found, key=str)}"
            )


def _check_secrets(members: dict[str, bytes], result: VerifyResult) -> None:
    """No member (log, excerpt, record, summary) holds what looks like a credential."""
    from repro import redaction

    found = 0
    for name, data in members.items():
        findings = redaction.scan(data.decode("utf-8", errors="replace"))
        if findings:
            found += 1
            result.fail(
                f"{name} holds what looks like a secret ({'; '.join(findings[:3])}); do not "
                "pass this bundle on"
            )
    if not found:
        result.ok_("no member holds anything that looks like a credential")


# --- 8: canonical bytes and summary --------------------------------------------------------


def _check_canonical(
    manifest: dict[str, Any], members: dict[str, bytes], tar: bytearray, result: VerifyResult
) -> None:
    mtime = int(parse_timestamp(manifest["created"]).timestamp())
    view = memoryview(tar)
    offset = 0
    for piece in tar_chunks(members, mtime):  # compared piece by piece: no second copy
        if view[offset : offset + len(piece)] != piece:
            got = view[offset : offset + len(piece)]
            offset += next(
                (i for i, (a, b) in enumerate(zip(piece, got, strict=False)) if a != b),
                min(len(piece), len(got)),
            )
            break
        offset += len(piece)
    else:
        if offset == len(tar):
            result.ok_("archive bytes are the kit's canonical tar of these contents")
            return
    result.fail(
        f"tar differs from the canonical archive of its own contents at byte {offset} "
        f"(in {_member_at(tar, offset)}): altered after `python -m repro bundle` wrote it"
    )


def _member_at(tar: bytearray, offset: int) -> str:
    try:
        with tarfile.open(fileobj=_View(tar), mode="r:") as archive:
            for member in archive:
                end = member.offset_data + ((member.size + 511) // 512) * 512
                if member.offset <= offset < member.offset_data:
                    return f"the header of {member.name}"
                if member.offset_data <= offset < end:
                    return f"the data of {member.name}"
    except tarfile.TarError:
        pass
    return "the end-of-archive blocks"


def _check_summary(manifest: dict[str, Any], members: dict[str, bytes], result: VerifyResult):
    from repro.report import render

    runs = runs_from_files(manifest, members, source=str(result.path))
    expected = render(runs).encode("utf-8")
    if members.get(SUMMARY_NAME) == expected:
        result.ok_(f"{SUMMARY_NAME} is this kit's report of the bundled artifacts")
    else:
        # Not a failure: the kit's version does not change with every commit, so another
        # checkout may word the report differently. The artifacts, not the summary, are the
        # evidence; say so loudly and show how to re-render.
        result.warn(
            f"{SUMMARY_NAME} differs from this kit's report of the bundled artifacts (made by "
            f"kit {manifest['kit']['version']}, this is {__version__}); trust the artifacts "
            f"and re-render with `python -m repro report {result.path}`"
        )


__all__ = ["MAX_UNCOMPRESSED_BYTES", "VerifyResult", "unsafe_reason", "verify_bundle"]
