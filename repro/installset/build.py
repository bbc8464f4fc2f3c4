"""``build``: resolve (or read a lock), download the exact wheels, cut them into parts.

pip downloads each chosen file by URL with ``--require-hashes``; the files are joined in the
manifest's order and cut into parts, so the same wheels give the same parts, byte for byte.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.progress import track

from repro.artifact import schema_violations
from repro.core.atomicio import sha256_file, write_json_atomic, write_text_atomic
from repro.core.clock import utc_text
from repro.installset import BadInstallInput, InstallSetError, install
from repro.installset.host import Target
from repro.installset.install import Steps, human_bytes, unpacked_bytes
from repro.installset.lock import locked_packages, make_lock, read_lock
from repro.installset.resolve import Locked, choose_wheel

DEFAULT_PART_SIZE = 55 * 1024 * 1024
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "KI": 2**10, "MI": 2**20, "GI": 2**30}


def parse_size(text: str) -> int:
    """``55MiB`` → 57671680; ``1000`` → 1000; ``2GB`` → 2×10⁹ (SI and IEC units)."""
    m = re.fullmatch(r"(\d+(?:\.\d*)?)\s*([KMG]I?)?B?", text.strip().upper())
    if not m or (size := int(float(m[1]) * _UNITS[m[2] or ""])) < 1:
        raise BadInstallInput(
            f"--part-size {text!r}: expected a size of at least one byte, e.g. 55MiB, 50MB or "
            "1048576"
        )
    return size


@dataclasses.dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    filename: str
    bytes: int
    sha256: str
    url: str | None
    path: Path


def download(packages: Sequence[Locked], dest: Path, target: Target, *, log=print) -> list[Wheel]:
    """pip downloads each package's wheel for ``target`` by URL, checking its sha256; a file
    already in ``dest`` with that hash is kept. Records in ``packages``' order."""
    dest.mkdir(parents=True, exist_ok=True)
    chosen = [(pkg, choose_wheel(pkg, target)) for pkg in packages]
    size = sum(w.size or 0 for _, w in chosen)
    log(f"downloading {len(chosen)} wheel(s), {human_bytes(size)} (pip, --require-hashes)")
    lines = "".join(f"{p.name} @ {w.url} --hash=sha256:{w.sha256}\n" for p, w in chosen)
    with tempfile.TemporaryDirectory(prefix="installset-") as tmp:
        (requirements := Path(tmp) / "requirements.txt").write_text(lines, encoding="utf-8")
        install.run_pip(
            ["download", "--no-deps", "--require-hashes", "--progress-bar", "off"]
            + ["--dest", str(dest), *target.pip_args(), "-r", str(requirements)],
            what=f"downloading {len(chosen)} wheel(s)",
        )
    paths = [dest / w.filename for _, w in chosen]
    return [
        Wheel(p.name, p.version, w.filename, path.stat().st_size, w.sha256, w.url, path)
        for (p, w), path in zip(chosen, paths, strict=True)
    ]


def write_parts(
    wheels: Sequence[Wheel], out_dir: Path, stem: str, part_size: int
) -> tuple[list[dict[str, Any]], str, int]:
    """The wheels joined in order and cut into ``STEM.part001``…; (parts, sha256, bytes).
    Each wheel is checked by its sha256 first; earlier parts of the stem are removed."""
    total = sum(w.bytes for w in wheels)
    if (count := -(-total // part_size)) > 999:
        raise InstallSetError("more than 999 parts: choose a larger --part-size")
    for wheel in track(wheels, description="checking the wheels' sha256", transient=True):
        if (found := sha256_file(wheel.path)) != wheel.sha256:
            raise InstallSetError(f"{wheel.path}: sha256 {found}, not {wheel.sha256}")
    for old in out_dir.glob(f"{stem}.part*"):
        old.unlink()
    paths = [out_dir / f"{stem}.part{i:03d}" for i in range(1, count + 1)]
    sizes = [min(part_size, total - i * part_size) for i in range(count)]
    install.recut([w.path for w in wheels], list(zip(paths, sizes, strict=True)))
    hashing = track(paths, description=f"hashing the parts of {stem}", transient=True)
    parts = [{"name": p.name, "bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in hashing]
    return parts, install.stream_sha256(paths), total


def pack_set(
    wheels: Sequence[Wheel],
    out_dir: Path,
    target: Target,
    *,
    root: Mapping[str, str],
    part_size: int = DEFAULT_PART_SIZE,
    host: Mapping[str, Any] | None = None,
    resolution: Mapping[str, Any] | None = None,
    lock: Mapping[str, str] | None = None,
    steps: Steps | None = None,
) -> tuple[dict[str, Any], str]:
    """Cut ``wheels`` into parts in ``out_dir``, write and check the manifest, then verify the
    set from disk as the host will. Returns the manifest and its sha256."""
    steps = steps or Steps()
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{root['name']}-{root['version']}-{target.python_tag}.wheels"
    with steps.step(f"cut {len(wheels)} wheel(s) into parts"):
        parts, sha, size = write_parts(wheels, out_dir, stem, part_size)
    unpacked = unpacked_bytes([w.path for w in wheels])
    manifest: dict[str, Any] = {
        "format": install.FORMAT,
        "format_version": install.FORMAT_VERSION,
        "created": utc_text(),
        "root": dict(root),
        "python": {"version": target.python, "tag": target.python_tag},
        "platforms": list(target.platforms),
        "host": dict(host) if host is not None else None,
        "wheels": [{k: v for k, v in dataclasses.asdict(w).items() if k != "path"} for w in wheels],
        "stream": {"name": stem, "bytes": size, "sha256": sha, "unpacked_bytes": unpacked},
        "part_size": part_size,
        "parts": parts,
        "install": {"command": "python3 -m repro.installset install --parts DIR --target TARGET"},
        "resolution": dict(resolution) if resolution is not None else None,
        "lock": dict(lock) if lock is not None else None,
        "build": {
            "seconds": dict(steps.timings),
            "tools": {"python": platform.python_version(), "pip": metadata.version("pip")},
        },
    }
    if problems := schema_violations(manifest, "install-set", install.FORMAT_VERSION):
        raise install.ManifestInvalid("the manifest the build made", problems)
    write_json_atomic(out_dir / install.MANIFEST_NAME, manifest)
    # `sha256sum -c SHA256SUMS` checks the parts where the kit is not at hand.
    write_text_atomic(
        out_dir / "SHA256SUMS", "".join(f"{p['sha256']}  {p['name']}\n" for p in parts)
    )
    with steps.step("verify the written set as the host will"):
        checked = install.verify(out_dir, steps=steps)
    return checked.manifest, checked.manifest_sha256


def build_vllm(
    vllm_version: str,
    freeze_file: Path,
    out_dir: Path,
    target: Target,
    *,
    part_size: int = DEFAULT_PART_SIZE,
    steps: Steps | None = None,
    **resolving: Any,
) -> tuple[dict[str, Any], str]:
    """The set for ``vllm==VERSION`` on the host described by ``freeze_file``: its wheel lock
    (the install set alone, ``OUT/wheel-lock.json``), then `build_from_lock`. ``resolving``:
    `lock.make_lock`'s ``exclude``, ``index_url``, ``uv`` and ``exclude_newer``."""
    steps = steps or Steps()
    with steps.step("resolve"):
        lock = make_lock(
            f"vllm=={vllm_version}",
            target=target,
            freeze_file=freeze_file,
            vllm={"ref": vllm_version, "kind": "release"},
            image=False,
            log=steps.say,
            **resolving,
        )
    steps.say(f"  host packages kept against the closure: {lock['resolution']['host_overrides']}")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "wheel-lock.json", lock)
    return build_from_lock(out_dir / "wheel-lock.json", out_dir, part_size=part_size, steps=steps)


def build_from_lock(
    lock_path: Path,
    out_dir: Path,
    *,
    part_size: int = DEFAULT_PART_SIZE,
    wheels_from: Path | None = None,
    steps: Steps | None = None,
) -> tuple[dict[str, Any], str]:
    """The set of a wheel lock's ``install-set`` wheels (repro/installset/lock.py): the same
    files, by sha256, that the CUDA image made from that lock installs. ``wheels_from``: a
    folder already holding some of them (a CUDA wheelhouse), linked instead of downloaded
    (pip checks a file already in its destination by sha256 and fetches it again if wrong)."""
    steps, started = steps or Steps(), time.monotonic()
    lock = read_lock(lock_path)
    target = Target(lock["python"]["version"], tuple(lock["platforms"]))
    packages = locked_packages(lock, ("install-set",))
    wheels_dir = out_dir / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    for wheel in (pkg.wheels[0] for pkg in packages if wheels_from):
        src, dst = Path(wheels_from) / wheel.filename, wheels_dir / wheel.filename
        if src.is_file() and not dst.exists():
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
    with steps.step("download"):
        wheels = download(packages, wheels_dir, target, log=steps.say)
    manifest, sha = pack_set(
        wheels,
        out_dir,
        target,
        root={"requirement": lock["root"], "name": wheels[0].name, "version": wheels[0].version},
        part_size=part_size,
        host=lock["host"],
        resolution=lock.get("resolution"),
        lock={"path": str(lock_path), "sha256": sha256_file(lock_path)},
        steps=steps,
    )
    steps.say(
        f"built {out_dir}: {len(wheels)} wheels, {human_bytes(manifest['stream']['bytes'])} in "
        f"{len(manifest['parts'])} part(s) ({time.monotonic() - started:.0f} s from the lock); "
        f"manifest sha256 {sha}"
    )
    return manifest, sha
