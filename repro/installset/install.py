"""``install``: a verified set into a folder, with the host's own pip.

It refuses a target it may not use before anything else (repro/installset/target.py),
verifies the set (repro/installset/verify.py), cuts the parts back into the wheels and checks
them again, runs pip's hash-checking install into a folder beside the target, writes a marker
listing every file and only then renames it into place: a target holds a whole install or
nothing. The standard library and the host's pip only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections import namedtuple
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repro.core.atomicio import sha256_file, write_json_atomic, write_text_atomic
from repro.core.clock import utc_text
from repro.installset import BadInstallInput, InstallSetError
from repro.installset.manifest import (
    _SHA256,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    ManifestInvalid,
    check_structure,
    load_manifest,
)
from repro.installset.steps import Steps, human_bytes
from repro.installset.target import (
    MARKER_FORMAT,
    MARKER_NAME,
    check_writable,
    damage,
    discard,
    listing,
    read_marker,
    swap,
)
from repro.installset.verify import (
    PartsInvalid,
    UnsafeArchive,
    Verified,
    stream_sha256,
    unpacked_bytes,
    verify,
)

# The names the build and the tests reach through this module.
__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "MARKER_NAME",
    "ManifestInvalid",
    "PartsInvalid",
    "Steps",
    "UnsafeArchive",
    "Verified",
    "_SHA256",
    "check_structure",
    "human_bytes",
    "install",
    "load_manifest",
    "recut",
    "run_pip",
    "stream_sha256",
    "unpacked_bytes",
    "verify",
]

# pip settings kept from the environment: how to reach the network, not what to install (this
# machine's constraints, find-links and indexes are not the host's).
_PIP_KEEP = {f"PIP_{k}" for k in "CACHE_DIR CERT CLIENT_CERT DEFAULT_TIMEOUT NO_CACHE_DIR".split()}
_PIP_KEEP |= {"PIP_PROXY", "PIP_RETRIES", "PIP_TRUSTED_HOST"}
Installed = namedtuple(
    "Installed", "target manifest_sha256 wheels timings already kept", defaults=[False, ()]
)


class AlreadyInstalled(Exception):
    """The target holds this set, every listed file as installed: nothing to do."""


def run_pip(args: Sequence[str], *, what: str) -> None:
    """``python -m pip ARGS`` with none of this machine's pip settings but the network's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in _PIP_KEEP}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env |= {"PIP_NO_INPUT": "1", "PYTHONUTF8": "1"}
    cmd = [sys.executable, "-m", "pip", *args]
    if (proc := subprocess.run(cmd, env=env, capture_output=True, text=True)).returncode:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise InstallSetError(f"pip failed while {what} (exit {proc.returncode}):\n{tail}")


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


def _old_install(target: Path, manifest_sha: str, replace: bool) -> dict[str, Any] | None:
    """The marker of the install ``--replace`` swaps out (None: ``target`` is new or empty).
    Raise where ``target`` may not be used, or where it already holds this set, intact
    (`AlreadyInstalled`) or damaged."""
    if not target.is_dir() or not any(target.iterdir()):
        return None
    marker = read_marker(target)
    if marker is None:
        raise BadInstallInput(
            f"--target {target} is not empty and has no {MARKER_NAME}: this kit did not "
            "install it, so it will not delete it (--replace) nor write into it; give an "
            "empty or new folder"
        )
    files = marker.get("files")
    older = (
        f"its {MARKER_NAME} was written by an older kit, which did not list the files it installed"
    )
    if replace:
        if files is None:
            raise BadInstallInput(
                f"--target {target}: {older}, so --replace cannot tell them from files you "
                f"added. Move your own files out of {target}, delete it, and install again"
            )
        return marker
    if marker.get("manifest_sha256") != manifest_sha:
        raise BadInstallInput(
            f"--target {target} holds another install set (manifest sha256 "
            f"{marker.get('manifest_sha256')}): give an empty or new folder, or --replace to "
            "swap it for this set (files you added are kept)"
        )
    if files is None:
        raise InstallSetError(
            f"{target} holds this install set, but {older}, so whether they are all there "
            f"cannot be checked. Move your own files out of {target}, delete it, and install "
            "again"
        )
    if broken := damage(target, files):
        shown = ", ".join(broken[:10]) + (
            f" and {len(broken) - 10} more" if len(broken) > 10 else ""
        )
        raise InstallSetError(
            f"{target} holds this install set's marker, but {len(broken)} of its "
            f"{len(files)} file(s) are missing or changed: {shown}. Install it again with "
            "--replace (files you added are kept)"
        )
    raise AlreadyInstalled(
        f"{target} already holds this install set, all {len(files)} file(s) as installed"
    )


def _make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and the folders above it that are missing; return those made."""
    made = [p for p in [*reversed(folder.parents), folder] if not p.exists()]
    for path in made:
        path.mkdir()
    return made


def install(
    parts_dir: str | Path, target: str | Path, *, replace: bool = False, steps: Steps | None = None
) -> Installed:
    """Check the target, verify the parts, then install the wheels into ``target`` (see the
    module docstring)."""
    steps, start, target = steps or Steps(), time.monotonic(), Path(target).absolute()
    manifest, manifest_sha = load_manifest(parts_dir)
    wanted = ".".join(manifest["python"]["version"].split(".")[:2])
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if wanted != here:
        raise BadInstallInput(
            f"the set was built for Python {wanted}; this installer runs on {here}, whose pip "
            f"would take none of its wheels. Run it with python{wanted}"
        )
    check_writable(target)
    try:
        old = _old_install(target, manifest_sha, replace)
    except AlreadyInstalled as done:
        steps.say(f"{done}; done")
        return Installed(target, manifest_sha, 0, dict(steps.timings), already=True)
    checked = verify(parts_dir, steps=steps)
    if checked.manifest_sha256 != manifest_sha:
        raise InstallSetError(f"{parts_dir}/{MANIFEST_NAME} changed while it was read; run again")
    try:
        made = _make_folders(target.parent)
    except OSError as exc:
        raise BadInstallInput(f"--target {target}: cannot create {target.parent} ({exc})") from None
    staging = target.parent / f".{target.name}.installing-{os.getpid()}"
    wheels = target.parent / f".{target.name}.wheels-{os.getpid()}"
    for folder in (staging, wheels):
        discard(folder)
    installed = False
    try:
        wheels.mkdir()
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
        with steps.step("list the installed files in the marker"):
            marker = {"format": MARKER_FORMAT, "manifest_sha256": manifest_sha}
            marker |= {"stream_sha256": manifest["stream"]["sha256"], "root": manifest["root"]}
            marker |= {"installed": utc_text(), "installer_python": sys.version.split()[0]}
            marker |= {"parts_dir": str(Path(parts_dir).absolute()), "files": listing(staging)}
            write_json_atomic(staging / MARKER_NAME, marker)
        kept = swap(staging, target, old, steps.say)
        installed = True
    except OSError as exc:
        raise InstallSetError(
            f"installing into {target} failed ({exc}); the target is as it was"
        ) from None
    finally:
        discard(wheels)
        discard(staging)
        if not installed:
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    folder.rmdir()
    if kept:
        shown = ", ".join(kept[:10]) + (f" and {len(kept) - 10} more" if len(kept) > 10 else "")
        steps.say(f"kept {len(kept)} file(s) you added in {target}: {shown}")
    steps.say(f"installed into {target} in {time.monotonic() - start:.1f} s")
    steps.say(f"use it with: export PYTHONPATH={target}${{PYTHONPATH:+:$PYTHONPATH}}")
    return Installed(target, manifest_sha, len(lines), dict(steps.timings), kept=tuple(kept))
