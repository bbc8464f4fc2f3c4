"""What `verify` checks in a bundle's files once they are read (steps 4 to 7 of
`repro.evidence.verify`, and the summary of step 8), and the result it collects them in.

Each check takes the members (path -> bytes) and the manifest and adds named lines to a
`VerifyResult`; none of them reads the archive or the disk.
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro import __version__
from repro.artifact import schema_violations
from repro.core import redaction
from repro.core.jsonread import JSONUnreadable, parse_json_bytes
from repro.evidence.bundle import MANIFEST_NAME, SUMMARY_NAME, log_excerpt
from repro.evidence.report import render
from repro.evidence.runs import JSON_KINDS, runs_from_files
from repro.evidence.verdicts import check_verdict


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


# --- 4, 5: manifest, files, schemas --------------------------------------------------------


def check_manifest(members: dict[str, bytes], result: VerifyResult) -> dict[str, Any] | None:
    raw = members.get(MANIFEST_NAME)
    if raw is None:
        result.fail(f"no {MANIFEST_NAME}: without it no file can be checked")
        return None
    try:
        manifest = parse_json_bytes(raw, MANIFEST_NAME)
    except JSONUnreadable as exc:
        result.fail(str(exc))
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


def check_files(manifest: dict[str, Any], members: dict[str, bytes], result: VerifyResult):
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


def check_json(
    manifest: dict[str, Any], members: dict[str, bytes], result: VerifyResult
) -> dict[str, dict[str, Any]]:
    """Validate every JSON file; return the valid run artifacts by path."""
    documents: dict[str, dict[str, Any]] = {}
    for entry in manifest["files"]:
        kind, name = entry["kind"], entry["path"]
        if kind not in JSON_KINDS or name not in members:
            continue
        try:
            doc = parse_json_bytes(members[name], name)
        except JSONUnreadable as exc:
            result.fail(str(exc))
            continue
        violations = schema_violations(doc, kind)
        for line in violations:
            result.fail(f"{name}: does not match schemas/{kind}.v1.schema.json: {line}")
        if not violations:
            result.ok_(f"{name}: valid against schemas/{kind}.v1.schema.json")
            if kind == "run-artifact":
                documents[name] = doc
    return documents


# --- 6, 7: verdicts, logs, runs ------------------------------------------------------------


def check_verdicts(documents: dict[str, dict[str, Any]], result: VerifyResult) -> None:
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


def check_logs(
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
            arm = parse_json_bytes(members[name], name).get("arm")
        except (JSONUnreadable, AttributeError):
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


def check_secrets(members: dict[str, bytes], result: VerifyResult) -> None:
    """No member (log, excerpt, record, summary) holds what looks like a credential."""
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


def check_summary(manifest: dict[str, Any], members: dict[str, bytes], result: VerifyResult):
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
