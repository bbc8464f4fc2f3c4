"""Build side of the transfer: install wheels into a staging folder, tar + xz it, split it.

Why a staging install and not the wheels themselves: the host then needs no pip and no
wheel logic, only tar and xz (both in Python's standard library), and xz compresses the
unpacked vLLM libraries far better than the wheel's zip does (docs/measured.md, §GPU hosts:
212 MiB for the whole set, against 304 MB for the vLLM wheel alone).

``pip install --target --no-deps --no-compile`` with the host's ``--python-version`` and
``--platform`` works from any build Python: it unpacks the wheels, writes their
``.dist-info`` (so ``importlib.metadata`` sees every package on the host), and byte-compiles
nothing (this Python's ``.pyc`` would not serve the host's). Console scripts in ``bin/``
get a ``#!/usr/bin/env python3`` line instead of this machine's interpreter path.

The archive is a plain POSIX tar of the staging folder in sorted order, owners and times
normalised (``mtime`` is a parameter), so the same staging content gives the same tar bytes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from repro.installset import InstallSetError
from repro.installset.pipcmd import PipCommand
from repro.installset.progress import Steps
from repro.installset.target import Target

__all__ = [
    "DEFAULT_PART_SIZE",
    "Packed",
    "pack_directory",
    "parse_size",
    "split_file",
    "stage_wheels",
    "write_tar_xz",
]

DEFAULT_PART_SIZE = 55 * 1024 * 1024
_CHUNK = 1 << 20
_UNITS = {
    "": 1,
    "B": 1,
    "K": 1000,
    "KB": 1000,
    "KIB": 1024,
    "M": 1000**2,
    "MB": 1000**2,
    "MIB": 1024**2,
    "G": 1000**3,
    "GB": 1000**3,
    "GIB": 1024**3,
}


def parse_size(text: str) -> int:
    """``55MiB`` → 57671680; ``1000`` → 1000; ``2GB`` → 2×10⁹ (SI and IEC units)."""
    raw = text.strip().replace(" ", "")
    number = raw.rstrip("BbIiKkMmGg")
    unit = raw[len(number) :].upper()
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or value <= 0:
        raise InstallSetError(f"cannot read the size {text!r}; write e.g. 55MiB, 50MB or 1048576")
    return int(value * _UNITS[unit])


# --- staging ---------------------------------------------------------------------------------


def stage_wheels(
    wheels: Sequence[Path], staging: Path, target: Target, pip: PipCommand | None = None
) -> None:
    """``pip install --no-deps --no-compile --target STAGING`` of exactly these wheel files."""
    pip = pip or PipCommand()
    if staging.exists():
        shutil.rmtree(staging)
    args = ["install", "--no-deps", "--no-compile", "--no-index", "--disable-pip-version-check"]
    args += ["--no-warn-script-location", "--target", str(staging), *target.pip_args()]
    args += [str(w) for w in wheels]
    pip.run(args, what=f"installing {len(wheels)} wheel(s) into the staging folder")
    _portable_scripts(staging / "bin")
    _drop_direct_urls(staging)


def _drop_direct_urls(staging: Path) -> None:
    """Remove pip's ``direct_url.json`` (and its RECORD line) from every staged dist-info.

    pip records the absolute path of each wheel file it installed from, so the archive
    depended on where the wheels folder was (two builds of the vLLM 0.26.0 set from the same
    86 wheels in different checkouts differed by 13 kB) and carried this machine's paths.
    """
    for direct_url in sorted(staging.glob("*.dist-info/direct_url.json")):
        direct_url.unlink()
        record = direct_url.parent / "RECORD"
        if record.is_file():
            lines = record.read_text().splitlines(keepends=True)
            kept = [
                line
                for line in lines
                if not line.startswith(f"{direct_url.parent.name}/direct_url.json,")
            ]
            record.write_text("".join(kept))


def _portable_scripts(bin_dir: Path) -> None:
    """Point console scripts at ``/usr/bin/env python3`` instead of this machine's Python."""
    if not bin_dir.is_dir():
        return
    for script in bin_dir.iterdir():
        if not script.is_file() or script.is_symlink():
            continue
        data = script.read_bytes()
        if not data.startswith(b"#!"):
            continue
        first, sep, rest = data.partition(b"\n")
        if b"python" in first:
            script.write_bytes(b"#!/usr/bin/env python3" + sep + rest)


# --- tar + xz --------------------------------------------------------------------------------


def _walk_sorted(root: Path) -> Iterator[Path]:
    """Every entry under ``root``, parents before children, names in byte order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(dirnames + filenames):
            yield base / name


def count_files(root: Path) -> tuple[int, int]:
    """(regular files, their bytes) under ``root``; symbolic links are not followed."""
    files = size = 0
    for path in _walk_sorted(root):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode):
            files += 1
            size += st.st_size
    return files, size


def write_tar_xz(
    root: Path,
    dest: Path,
    *,
    preset: int = 6,
    mtime: int = 0,
    steps: Steps | None = None,
) -> tuple[int, int]:
    """Write ``root``'s content as ``dest`` (tar, xz); return (regular files, unpacked bytes).

    Uses the ``xz`` program (all cores) where there is one, else Python's lzma.
    """
    steps = steps or Steps()
    files, total = count_files(root)
    xz = shutil.which("xz")
    with open(dest, "wb") as out:
        if xz:
            proc = subprocess.Popen(
                [xz, f"-{preset}", "-T0", "-c"], stdin=subprocess.PIPE, stdout=out
            )
            sink = proc.stdin
        else:  # pragma: no cover - every machine the kit builds on has xz
            import lzma

            proc = None
            sink = lzma.LZMAFile(out, "wb", preset=preset)
        try:
            with steps.bar(total, "tar + xz") as bar:
                _write_tar(root, sink, mtime, bar)
        finally:
            sink.close()  # type: ignore[union-attr]
            if proc is not None and proc.wait() != 0:
                raise InstallSetError(f"xz failed (exit {proc.returncode})")
    return files, total


def _write_tar(root: Path, sink, mtime: int, bar) -> None:
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in _walk_sorted(root):
            arcname = path.relative_to(root).as_posix()
            info = tar.gettarinfo(str(path), arcname)
            if info.islnk():  # a second name of one file: store it as a file of its own
                info.type = tarfile.REGTYPE
                info.linkname = ""
                info.size = path.stat().st_size
            if not (info.isreg() or info.isdir() or info.issym()):
                raise InstallSetError(f"{path}: not a file, folder or link; cannot pack it")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = mtime
            info.mode &= 0o755 if (info.mode & 0o111) else 0o644
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
                bar.advance(info.size)
            else:
                tar.addfile(info)


# --- parts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    name: str
    bytes: int
    sha256: str

    def as_dict(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "sha256": self.sha256}


def split_file(archive: Path, out_dir: Path, part_size: int) -> tuple[list[Part], str, int]:
    """Cut ``archive`` into ``NAME.part001``…; return the parts, its sha256 and size.

    Old parts of the same name in ``out_dir`` are removed first, so a smaller rebuild
    leaves no stale part behind.
    """
    if part_size <= 0:
        raise InstallSetError("the part size must be positive")
    for old in out_dir.glob(f"{archive.name}.part*"):
        old.unlink()
    whole = hashlib.sha256()
    parts: list[Part] = []
    total = 0
    with open(archive, "rb") as src:
        index = 1
        while True:
            name = f"{archive.name}.part{index:03d}"
            digest = hashlib.sha256()
            written = 0
            tmp = out_dir / f".{name}.tmp"
            with open(tmp, "wb") as dst:
                while written < part_size:
                    chunk = src.read(min(_CHUNK, part_size - written))
                    if not chunk:
                        break
                    dst.write(chunk)
                    digest.update(chunk)
                    whole.update(chunk)
                    written += len(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            if written == 0:
                tmp.unlink()
                break
            os.replace(tmp, out_dir / name)
            parts.append(Part(name, written, digest.hexdigest()))
            total += written
            index += 1
            if index > 999:
                raise InstallSetError("more than 999 parts: choose a larger --part-size")
    if not parts:
        raise InstallSetError(f"{archive} is empty")
    return parts, whole.hexdigest(), total


@dataclass(frozen=True)
class Packed:
    archive_name: str
    archive_bytes: int
    archive_sha256: str
    files: int
    unpacked_bytes: int
    parts: list[Part]

    def archive_dict(self) -> dict:
        return {
            "name": self.archive_name,
            "compression": "xz",
            "bytes": self.archive_bytes,
            "sha256": self.archive_sha256,
            "files": self.files,
            "unpacked_bytes": self.unpacked_bytes,
        }


def pack_directory(
    root: Path,
    out_dir: Path,
    archive_name: str,
    part_size: int = DEFAULT_PART_SIZE,
    *,
    preset: int = 6,
    mtime: int = 0,
    steps: Steps | None = None,
) -> Packed:
    """tar + xz ``root`` into ``out_dir/archive_name.partNNN``; the whole archive is not kept."""
    steps = steps or Steps()
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / archive_name
    tmp = out_dir / f".{archive_name}.tmp"
    try:
        with steps.step("tar + xz"):
            files, unpacked = write_tar_xz(root, tmp, preset=preset, mtime=mtime, steps=steps)
        with steps.step("split into parts"):
            os.replace(tmp, archive)
            parts, sha, size = split_file(archive, out_dir, part_size)
    finally:
        for leftover in (tmp, archive):
            if leftover.exists():
                leftover.unlink()
    return Packed(archive_name, size, sha, files, unpacked, parts)
