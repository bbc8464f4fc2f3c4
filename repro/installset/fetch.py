"""Download the exact wheels a resolution chose, and record each one.

pip downloads (``--no-deps``, the host's tags, one index, none of this machine's pip
settings): it picks the best wheel of each exact version for the host, as the staging install
will. Every file must then hash to one of the sha256s the index listed for that version
(uv's lock); a file already in the folder with a matching hash is reused, so a build
resumes where it stopped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from repro.installset import InstallSetError
from repro.installset.hostenv import canonical_name
from repro.installset.pipcmd import PipCommand
from repro.installset.resolve import Locked
from repro.installset.target import Target

__all__ = ["WheelRecord", "download_wheels", "parse_wheel_filename", "record_wheel"]

_CHUNK = 1 << 20


@dataclass(frozen=True)
class WheelRecord:
    name: str
    version: str
    filename: str
    bytes: int
    sha256: str
    path: Path

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "version": self.version,
            "filename": self.filename,
            "bytes": self.bytes,
            "sha256": self.sha256,
        }


def parse_wheel_filename(filename: str) -> tuple[str, str]:
    """(canonical name, version) from ``name-version(-build)?-py-abi-platform.whl``."""
    if not filename.endswith(".whl"):
        raise InstallSetError(f"{filename} is not a wheel")
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6):
        raise InstallSetError(f"{filename}: not a valid wheel file name")
    return canonical_name(parts[0]), parts[1]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def record_wheel(path: Path, name: str | None = None, version: str | None = None) -> WheelRecord:
    """A wheel file's record; name and version from its file name unless given."""
    key, file_version = parse_wheel_filename(path.name)
    return WheelRecord(
        name or key, version or file_version, path.name, path.stat().st_size, _sha256(path), path
    )


def _same_version(a: str, b: str) -> bool:
    try:
        from packaging.version import Version
    except ImportError:  # pragma: no cover
        from pip._vendor.packaging.version import Version  # type: ignore[no-redef]
    try:
        return Version(a) == Version(b)
    except Exception:
        return a == b


def _match(dest: Path, pkg: Locked) -> WheelRecord | None:
    """The file in ``dest`` that is this package's wheel with a hash the index listed."""
    for path in sorted(dest.glob("*.whl")):
        try:
            key, version = parse_wheel_filename(path.name)
        except InstallSetError:
            continue
        if key != pkg.key or not _same_version(version, pkg.version):
            continue
        record = record_wheel(path, pkg.name, pkg.version)
        if record.sha256 in pkg.sha256s:
            return record
    return None


def download_wheels(
    packages: Sequence[Locked],
    dest: Path,
    target: Target,
    pip: PipCommand | None = None,
    *,
    log=None,
) -> list[WheelRecord]:
    """Download each package's wheel into ``dest``; return records in ``packages``' order."""
    pip = pip or PipCommand()
    say = log or (lambda _msg: None)
    dest.mkdir(parents=True, exist_ok=True)
    records: dict[str, WheelRecord] = {}
    todo = []
    for pkg in packages:
        found = _match(dest, pkg)
        if found:
            records[pkg.key] = found
        else:
            todo.append(pkg)
    if todo:
        size = sum(p.size for p in todo) / 2**20
        say(f"downloading {len(todo)} wheel(s), about {size:.1f} MiB ({len(records)} reused)")
        args = ["download", "--no-deps", "--dest", str(dest), "--progress-bar", "off"]
        args += [*target.pip_args(), *pip.index_args()]
        args += [f"{p.name}=={p.version}" for p in todo]
        pip.run(args, what=f"downloading {len(todo)} wheel(s)")
    else:
        say(f"all {len(records)} wheel(s) already downloaded")
    problems = []
    for pkg in todo:
        found = _match(dest, pkg)
        if found is None:
            listed = ", ".join(w.filename for w in pkg.wheels)
            problems.append(
                f"{pkg.name} {pkg.version}: no downloaded file hashes to what the index listed "
                f"({listed})"
            )
        else:
            records[pkg.key] = found
    if problems:
        lines = "\n  ".join(problems)
        raise InstallSetError(f"downloaded wheels do not match the resolution:\n  {lines}")
    return [records[p.key] for p in packages]
