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
   code (`repro.evidence.verdicts`); a verdict that does not follow is named;
7. each log an artifact records is present with the sha256 the artifact recorded; each log
   excerpt is the excerpt of its log; the run list matches the artifacts, one artifact per
   arm and run; no member holds what `repro.core.redaction` takes for a credential;
8. the uncompressed tar is byte for byte what `repro.evidence.bundle` writes for these
   contents (so a changed byte anywhere, even in padding or a header field, is found), and
   ``SUMMARY.md`` is this kit's rendering of the artifacts (a warning, not a failure, where
   it is not: another checkout of the kit may word the report differently; the artifacts are
   the evidence).

Steps 4 to 7 and the summary are `repro.evidence.contents`. `load_runs` is how the other
evidence commands read their inputs: run directories as they are, bundles only once verified.
"""

from __future__ import annotations

import hashlib
import tarfile
import zlib
from pathlib import Path
from typing import Any

from repro.evidence import archive, contents
from repro.evidence.archive import (
    CHUNK,
    GZIP_HEADER,
    TarView,
    inflate_capped,
    member_at,
    tar_chunks,
    unsafe_reason,
)
from repro.evidence.bundle import parse_timestamp, sidecar
from repro.evidence.contents import VerifyResult
from repro.evidence.runs import BUNDLE_SUFFIXES, EvidenceError, Run, load_run_dir, runs_from_files
from repro.evidence.verdicts import require_verdict_follows


def verify_bundle(path: Path) -> VerifyResult:
    result = VerifyResult(path)
    tar = _read_and_gunzip(path, result)
    if tar is None:
        return result
    members = _read_members(tar, result)
    if members is None:
        return result
    result.contents = members
    manifest = contents.check_manifest(members, result)
    if manifest is None:
        return result
    result.manifest = manifest
    contents.check_files(manifest, members, result)
    documents = contents.check_json(manifest, members, result)
    contents.check_verdicts(documents, result)
    contents.check_logs(manifest, members, documents, result)
    contents.check_secrets(members, result)
    if result.ok:
        _check_canonical(manifest, members, tar, result)
        contents.check_summary(manifest, members, result)
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
                error = inflate_capped(decompressor, chunk, out)
                if decompressor.eof:
                    end = size - len(decompressor.unused_data)
            chunk = handle.read(CHUNK)
    result.note(f"archive: {size} bytes, sha256 {digest.hexdigest()}")
    _check_sidecar(path, digest.hexdigest(), result)
    if error == "too big":
        result.fail(
            f"more than {archive.MAX_UNCOMPRESSED_BYTES} bytes uncompressed; refused "
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


# --- 3: members, without extracting --------------------------------------------------------


def _read_members(tar: bytearray, result: VerifyResult) -> dict[str, bytes] | None:
    contents: dict[str, bytes] = {}
    refused = 0
    try:
        with tarfile.open(fileobj=TarView(tar), mode="r:") as archive:
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
        f"(in {member_at(tar, offset)}): altered after `python -m repro bundle` wrote it"
    )


# --- the runs of received evidence -----------------------------------------------------------


def is_bundle(path: Path) -> bool:
    return path.is_file() and path.name.endswith(BUNDLE_SUFFIXES)


def load_runs(paths: list[Path]) -> list[Run]:
    """Runs from run directories and bundles, in the order given; a bundle is verified in
    full first, and nothing in one that does not verify is used."""
    runs: list[Run] = []
    for path in paths:
        if path.is_dir():
            runs.append(_graded_as_recorded(load_run_dir(path)))
        elif is_bundle(path):
            runs.extend(load_bundle(path))
        elif path.exists():
            raise EvidenceError(
                f"{path}: expected a run directory or a bundle (*.tar.gz), found a file of "
                "another kind"
            )
        else:
            raise EvidenceError(f"{path}: no such run directory or bundle")
    labels = [r.label for r in runs]
    for run in runs:  # several inputs may carry the same label: tell them apart in tables
        if labels.count(run.label) > 1:
            run.label = f"{run.label} ({run.source})"
    return runs


def _graded_as_recorded(run: Run) -> Run:
    """`run`, once each recorded verdict follows from its figures: a reader must never show
    a verdict the figures do not give."""
    for arm, doc in run.documents.items():
        require_verdict_follows(
            doc,
            f"{run.source}/{run.artifact_names.get(arm, arm)}",
            "It is not shown; re-run the arm rather than edit its record.",
        )
    return run


def load_bundle(path: Path) -> list[Run]:
    result = verify_bundle(path)
    if not result.ok:
        problems = "\n".join(f"  - {p}" for p in result.problems)
        raise EvidenceError(
            f"{path}: the bundle does not verify, so nothing in it is used:\n{problems}\n"
            f"Ask its sender for an intact copy (`python -m repro verify {path}` shows the checks)."
        )
    return runs_from_files(result.manifest, result.contents, source=str(path))


__all__ = [
    "VerifyResult",
    "load_runs",
    "unsafe_reason",
    "verify_bundle",
]
