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
import subprocess
import sys
import time
import zipfile
from collections import namedtuple
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repro.atomicio import sha256_file, write_json_atomic, write_text_atomic
from repro.clock import utc_text
from repro.installset import InstallSetError

FORMAT, FORMAT_VERSION = "repro-install-set", 2
MANIFEST_NAME, MARKER_NAME = "manifest.json", ".repro-installset.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")
# A part or wheel is a plain file name: no directory, no "..", nothing hidden.
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
# What goes into pip's requirements file: a name and a version, never an option.
_NAME, _VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*"), re.compile(r"[A-Za-z0-9.!+_-]+")
# pip settings kept from the environment: how to reach the network, not what to install (this
# machine's constraints, find-links and indexes are not the host's).
_PIP_KEEP = {f"PIP_{k}" for k in "CACHE_DIR CERT CLIENT_CERT DEFAULT_TIMEOUT NO_CACHE_DIR".split()}
_PIP_KEEP |= {"PIP_PROXY", "PIP_RETRIES", "PIP_TRUSTED_HOST"}
Verified = namedtuple("Verified", "manifest manifest_sha256 parts")
Installed = namedtuple(
    "Installed", "target manifest_sha256 wheels timings already", defaults=[False]
)


class ManifestInvalid(InstallSetError):
    """The manifest is not one the kit wrote (or not of a version this installer knows)."""


class UnsafeArchive(InstallSetError):
    """A wheel holds a member the installer will not let pip write."""


class PartsInvalid(InstallSetError):
    """One or more parts (or the wheels cut from them) do not match the manifest."""

    def __init__(self, problems: list[str], parts_dir: Path) -> None:
        self.problems = problems
        lines = "".join(f"  - {p}\n" for p in problems)
        super().__init__(
            f"refusing the install set in {parts_dir}: {len(problems)} problem(s)\n{lines}"
            "Copy the named part(s) again from the build's output folder; nothing was installed."
        )


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Steps:
    """``name …`` when a step starts, ``name: N.N s`` when it ends; keeps the timings (the
    host has no rich, so both sides print with this)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    def say(self, text: str) -> None:
        print(f"[installset] {text}", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def step(self, name: str):
        self.say(f"{name} …")
        start = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = round(time.monotonic() - start, 2)
            self.say(f"{name}: {self.timings[name]:.1f} s")


def run_pip(args: Sequence[str], *, what: str) -> None:
    """``python -m pip ARGS`` with none of this machine's pip settings but the network's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in _PIP_KEEP}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env |= {"PIP_NO_INPUT": "1", "PYTHONUTF8": "1"}
    cmd = [sys.executable, "-m", "pip", *args]
    if (proc := subprocess.run(cmd, env=env, capture_output=True, text=True)).returncode:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise InstallSetError(f"pip failed while {what} (exit {proc.returncode}):\n{tail}")


def stream_sha256(paths: Sequence[Path]) -> str:
    """The sha256 of the files joined in order."""
    whole = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            hashlib.file_digest(f, lambda: whole)  # the one digest, fed file after file
    return whole.hexdigest()


def recut(sources: Sequence[Path], outputs: Sequence[tuple[Path, int]]) -> None:
    """Copy the sources' bytes, joined in order, into new files of the given sizes (the
    kernel copies: ``os.sendfile``). Sources that end early leave the last files short; the
    callers check every file's sha256."""
    with contextlib.ExitStack() as stack:
        files = iter([stack.enter_context(open(p, "rb")) for p in sources])
        src = next(files, None)
        for path, size in outputs:
            with open(path, "xb") as out:
                while size and src:
                    if sent := os.sendfile(out.fileno(), src.fileno(), None, size):
                        size -= sent
                    else:
                        src = next(files, None)


def unpacked_bytes(paths: Sequence[Path], *, check_members: bool = False) -> int:
    """What the wheels' members claim to unpack to; ``check_members``: refuse a member that
    is not a plain relative path."""
    total = 0
    for path in paths:
        try:
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    parts = info.filename.replace("\\", "/").split("/")
                    if check_members and (parts[0] == "" or ":" in parts[0] or ".." in parts):
                        raise UnsafeArchive(
                            f"{path.name}: member {info.filename!r} leaves the install "
                            "folder; refusing to install (the kit's builds ship index wheels)"
                        )
                    total += info.file_size
        # What zipfile raises on a damaged or unsupported zip (the fuzzer found the second).
        except (zipfile.BadZipFile, NotImplementedError, ValueError, EOFError) as exc:
            raise UnsafeArchive(f"{path.name} is not a readable wheel ({exc})") from exc
    return total


def _require(ok: object, problem: str) -> None:
    if not ok:
        raise ManifestInvalid(f"manifest: {problem}")


def _files(doc: dict[str, Any], key: str, name_key: str) -> list[dict[str, Any]]:
    """``doc[key]``: a list of plain-named files, each with a positive size and a sha256."""
    entries = doc.get(key)
    _require(isinstance(entries, list) and entries, f"$.{key} is missing or empty")
    for i, entry in enumerate(entries):
        _require(isinstance(entry, dict), f"$.{key}[{i}] is not an object")
        name, size = entry.get(name_key), entry.get("bytes")
        plain = isinstance(name, str) and _FILE_NAME.fullmatch(name) and ".." not in name
        _require(plain, f"$.{key}[{i}].{name_key} {name!r} is not a plain file name")
        _require(type(size) is int and size > 0, f"$.{key}[{i}].bytes is not a positive integer")
        sha = _SHA256.fullmatch(str(entry.get("sha256")))
        _require(sha, f"$.{key}[{i}].sha256 is not 64 lower-case hex digits")
    return entries


def check_structure(doc: Any) -> None:
    """Raise ``ManifestInvalid`` unless ``doc`` has what ``verify``/``install`` rely on (the
    host has no jsonschema; the build validated against schemas/install-set.v2.schema.json)."""
    _require(isinstance(doc, dict) and doc.get("format") == FORMAT, f"not a {FORMAT} manifest")
    version = doc.get("format_version")
    readable = f"this installer reads {FORMAT_VERSION} only (use the kit the set was built with)"
    _require(version == FORMAT_VERSION, f"format_version {version!r}; {readable}")
    parts, wheels = _files(doc, "parts", "name"), _files(doc, "wheels", "filename")
    stream = doc.get("stream")
    ok = isinstance(stream, dict) and _SHA256.fullmatch(str(stream.get("sha256")))
    _require(ok, "$.stream has no sha256")
    for key in ("bytes", "unpacked_bytes"):
        whole = type(stream.get(key)) is int and stream[key] >= 0
        _require(whole, f"$.stream.{key} is not a whole number")
    for name, files in (("parts", parts), ("wheels", wheels)):
        total, want = sum(e["bytes"] for e in files), stream["bytes"]
        _require(total == want, f"the {name} add up to {total} bytes, the stream has {want}")
    names = [p["name"] for p in parts] + [w["filename"] for w in wheels]
    _require(len(set(names)) == len(names), "part or wheel names repeat")
    for w in wheels:
        ok = _NAME.fullmatch(str(w.get("name"))) and _VERSION.fullmatch(str(w.get("version")))
        _require(ok, f"wheel {w['filename']}: bad name or version")


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


def verify(parts_dir: str | Path, *, steps: Steps | None = None) -> Verified:
    """Check every part and the parts joined against the manifest; raise ``PartsInvalid``."""
    steps, parts_dir = steps or Steps(), Path(parts_dir)
    with steps.step("read manifest"):
        manifest, manifest_sha = load_manifest(parts_dir)
    parts, stream = manifest["parts"], manifest["stream"]
    paths = [parts_dir / p["name"] for p in parts]
    problems: list[str] = []
    with steps.step(f"verify {len(parts)} part(s), {human_bytes(stream['bytes'])}"):
        for i, (part, path) in enumerate(zip(parts, paths, strict=True), start=1):
            label = f"part {i}/{len(parts)} {part['name']}"
            want, want_sha = part["bytes"], part["sha256"]
            if not path.is_file():
                problems.append(f"{label}: missing (expected {want} bytes, sha256 {want_sha})")
                continue
            size, found = path.stat().st_size, sha256_file(path)
            shas = f"sha256 expected {want_sha}, found {found}"
            if size != want:
                how = "truncated" if size < want else "longer than built"
                problems.append(f"{label}: {how}: expected {want} bytes, found {size} ({shas})")
            elif found != want_sha:
                problems.append(f"{label}: corrupted: {shas} (size {size} bytes as expected)")
            else:
                steps.say(f"  {label}: ok ({human_bytes(size)})")
        if not problems and (found := stream_sha256(paths)) != stream["sha256"]:
            shas = f"sha256 expected {stream['sha256']}, found {found}"
            problems.append(f"the parts joined in order: {shas}")
    if problems:
        raise PartsInvalid(problems, parts_dir)
    return Verified(manifest, manifest_sha, paths)


def _cut_wheels(checked: Verified, folder: Path) -> list[Path]:
    """The parts cut back into the wheel files, each checked by its sha256 (pip checks too,
    but would not name the wheel against the manifest; a part changed since ``verify`` shows
    here), then their members."""
    wheels = checked.manifest["wheels"]
    paths = [folder / w["filename"] for w in wheels]
    recut(checked.parts, [(p, w["bytes"]) for p, w in zip(paths, wheels, strict=True)])
    problems = [
        f"{w['filename']}: sha256 expected {w['sha256']}, found {found}"
        for w, path in zip(wheels, paths, strict=True)
        if (found := sha256_file(path)) != w["sha256"]
    ]
    if problems:
        raise PartsInvalid(problems, checked.parts[0].parent)
    claimed = unpacked_bytes(paths, check_members=True)
    if claimed > (limit := checked.manifest["stream"]["unpacked_bytes"]):
        raise UnsafeArchive(
            f"the wheels unpack to {claimed} bytes, more than the manifest's {limit}; "
            "refusing to install"
        )
    return paths


def _check_target(target: Path, manifest_sha: str, replace: bool) -> bool:
    """True when ``target`` already holds this set; raise where it may not be (re)placed."""
    if not target.exists():
        return False
    if not target.is_dir():
        raise InstallSetError(f"target {target} exists and is not a folder")
    try:
        marker_sha = json.loads((target / MARKER_NAME).read_bytes()).get("manifest_sha256")
    except (OSError, ValueError, AttributeError):
        marker_sha = None
    if marker_sha == manifest_sha and not replace:
        return True
    if any(target.iterdir()) and not replace:
        raise InstallSetError(
            f"target {target} is not empty and holds no install of this set: give an "
            "empty or new folder, or --replace to swap it for this set"
        )
    if any(target.iterdir()) and marker_sha is None:  # --replace deletes only what it wrote
        raise InstallSetError(
            f"target {target} is not empty and has no {MARKER_NAME}: this kit did not install "
            "it, so --replace will not delete it; give an empty or new folder"
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
