"""``build``: resolve, download, check, stage, pack, and write the manifest.

Two halves, so that the second runs without a network (and is what the tests exercise):

``build_vllm``   needs PyPI (uv resolves, pip downloads) and then calls
``pack_set``     wheel files → staging install → tar + xz → parts → manifest.json,
                 validated against ``schemas/install-set.v1.schema.json``, then verified
                 from disk exactly as the host's ``verify`` will.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from repro.atomicio import write_json_atomic
from repro.installset import InstallSetError
from repro.installset.fetch import WheelRecord, download_wheels
from repro.installset.graph import read_wheel_metadata, target_walk
from repro.installset.hostenv import HostEnv, canonical_name, read_freeze
from repro.installset.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    validate_schema,
)
from repro.installset.pack import DEFAULT_PART_SIZE, pack_directory, stage_wheels
from repro.installset.pipcmd import PipCommand
from repro.installset.progress import Steps, human_bytes
from repro.installset.resolve import VLLM_OPTIONAL, UvCompiler, find_uv, resolve
from repro.installset.target import Target
from repro.installset.unpack import verify

__all__ = ["build_from_lock", "build_vllm", "pack_set"]


# 1980-01-01T00:00:00Z: the earliest time a zip (so a wheel) can record.
ARCHIVE_MTIME = 315532800


def _utc_now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def _version_of(cmd: Sequence[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else None


def pack_set(
    wheels: Sequence[WheelRecord],
    out_dir: Path,
    target: Target,
    *,
    root: Mapping[str, str],
    part_size: int = DEFAULT_PART_SIZE,
    xz_preset: int = 6,
    host: Mapping[str, Any] | None = None,
    resolution: Mapping[str, Any] | None = None,
    index_url: str | None = None,
    required_by: Mapping[str, Sequence[str]] | None = None,
    steps: Steps | None = None,
    pip: PipCommand | None = None,
    keep_staging: bool = False,
    tools: Mapping[str, str | None] | None = None,
    lock: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], str]:
    """Stage ``wheels``, pack them into parts in ``out_dir``, write and check the manifest.

    Returns the manifest and its sha256. ``root`` is ``{"requirement", "name", "version"}``.
    """
    steps = steps or Steps()
    out_dir.mkdir(parents=True, exist_ok=True)
    created = _utc_now()
    # File times in the archive: SOURCE_DATE_EPOCH, else a fixed date, never the clock, so
    # the same wheels give the same archive bytes on any day (a rebuilt set hashes the same).
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", ARCHIVE_MTIME))
    staging = out_dir / ".staging"
    with steps.step(f"staging install of {len(wheels)} wheel(s)"):
        stage_wheels([w.path for w in wheels], staging, target, pip)
    archive_name = f"{root['name']}-{root['version']}-{target.python_tag}.tar.xz"
    try:
        packed = pack_directory(
            staging, out_dir, archive_name, part_size, preset=xz_preset, mtime=mtime, steps=steps
        )
    finally:
        if not keep_staging:
            shutil.rmtree(staging, ignore_errors=True)
    wheel_docs = []
    for w in wheels:
        doc = w.as_dict()
        if required_by is not None:
            doc["required_by"] = list(required_by.get(canonical_name(w.name), []))
        wheel_docs.append(doc)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "root": dict(root),
        "vllm_version": root["version"] if root["name"] == "vllm" else None,
        "python": {"version": target.python, "tag": target.python_tag},
        "platforms": list(target.platforms),
        "index_url": index_url,
        "host": dict(host) if host is not None else None,
        "wheels": wheel_docs,
        "wheel_bytes": sum(w.bytes for w in wheels),
        "archive": packed.archive_dict(),
        "part_size": part_size,
        "parts": [p.as_dict() for p in packed.parts],
        "install": {
            "layout": "pip --target: put the folder on PYTHONPATH",
            "command": "python3 -m repro.installset install --parts DIR --target TARGET",
        },
    }
    if resolution is not None:
        manifest["resolution"] = dict(resolution)
    if lock is not None:
        manifest["lock"] = dict(lock)
    manifest["build"] = {
        "seconds": dict(steps.timings),  # every step up to here; verifying follows
        "tools": dict(tools or {}),
        "xz_preset": xz_preset,
    }
    with steps.step("validate and write manifest"):
        validate_schema(manifest)
        write_json_atomic(out_dir / MANIFEST_NAME, manifest)
    with steps.step("verify the written set as the host will"):
        checked = verify(out_dir, steps=steps)
    return checked.manifest, checked.manifest_sha256


def build_vllm(
    vllm_version: str,
    freeze_file: Path,
    out_dir: Path,
    target: Target,
    *,
    part_size: int = DEFAULT_PART_SIZE,
    xz_preset: int = 6,
    exclude: Mapping[str, str] | None = None,
    index_url: str | None = None,
    uv: str | None = None,
    exclude_newer: str | None = None,
    keep_staging: bool = False,
    steps: Steps | None = None,
) -> tuple[dict[str, Any], str]:
    """The whole build for ``vllm==VERSION`` on the host described by ``freeze_file``."""
    steps = steps or Steps()
    started = time.monotonic()
    root = f"vllm=={vllm_version}"
    exclude = dict(VLLM_OPTIONAL if exclude is None else exclude)
    host: HostEnv = read_freeze(freeze_file)
    steps.say(f"host: {len(host)} packages from {freeze_file} (sha256 {host.sha256[:12]}…)")
    pip = PipCommand(index_url=index_url) if index_url else PipCommand()
    uv_bin = find_uv(uv)
    compiler = UvCompiler(target, uv=uv_bin, index_url=pip.index_url, exclude_newer=exclude_newer)

    with steps.step("resolve"):
        res = resolve(root, host, compiler, exclude=exclude, log=steps.say)
    steps.say(
        f"  {len(res.packages)} wheel(s) to ship, {human_bytes(res.wheel_bytes)}; host "
        f"packages kept against the closure's pins: {', '.join(res.overrides) or 'none'}"
    )
    if res.excluded_closure:
        saved = sum(p.size for p in res.excluded_closure)
        steps.say(
            f"  left out (optional, see --include-optional): {len(res.excluded_closure)} "
            f"wheel(s), {human_bytes(saved)}"
        )

    wheels_dir = out_dir / "wheels"
    with steps.step("download"):
        records = download_wheels(res.packages, wheels_dir, target, pip, log=steps.say)

    with steps.step("check the dependency graph"):
        metas = {r.name: read_wheel_metadata(r.path) for r in records}
        shipped = {m.key: m for m in metas.values()}
        root_meta = metas[res.root.name]
        walk = target_walk(
            root_meta, (), shipped, host, target.marker_environment(), exclude=res.excluded
        )
        if walk.missing or walk.unmet:
            lines = [f"{req} (for {by}): not in the set or on the host" for req, by in walk.missing]
            lines += [f"{by} wants {req}, the set has {v}" for req, by, v in walk.unmet]
            raise InstallSetError("the set is incomplete:\n  " + "\n  ".join(lines))
        for key in sorted(walk.unreachable):
            steps.say(f"  note: {key} is in uv's lock but no requirement reaches it on the host")
        for h in walk.host_conflicts:
            steps.say(
                f"  host keeps {h.name} {h.host_version}; {h.required_by} wants {h.specifier}"
            )

    tools = {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "pip": _version_of([pip.python, "-m", "pip", "--version"]),
        "uv": _version_of([uv_bin, "--version"]),
        "xz": _version_of(["xz", "--version"]),
    }
    host_used = sorted({(h.name, h.host_version) for h in walk.host})
    resolution = {
        "resolver": tools["uv"],
        "host_overrides": res.overrides,
        "host_packages_used": [{"name": n, "version": v} for n, v in host_used],
        "host_requirements_unmet": [
            {
                "name": h.name,
                "specifier": h.specifier,
                "required_by": h.required_by,
                "host_version": h.host_version,
            }
            for h in walk.host_conflicts
        ],
        "excluded": [{"name": n, "reason": why} for n, why in res.excluded.items()],
        "excluded_closure": [
            {"name": p.name, "version": p.version, "bytes": p.size} for p in res.excluded_closure
        ],
        "exclude_newer": exclude_newer,
    }
    host_doc = {
        "freeze_file": str(freeze_file),
        "freeze_sha256": host.sha256,
        "packages": len(host),
    }
    manifest, sha = pack_set(
        records,
        out_dir,
        target,
        root={"requirement": root, "name": "vllm", "version": vllm_version},
        part_size=part_size,
        xz_preset=xz_preset,
        host=host_doc,
        resolution=resolution,
        index_url=pip.index_url,
        required_by={k: sorted(v) for k, v in walk.required_by.items()},
        steps=steps,
        pip=pip,
        keep_staging=keep_staging,
        tools=tools,
    )
    steps.say(
        f"built {out_dir}: {len(manifest['parts'])} part(s), "
        f"{human_bytes(manifest['archive']['bytes'])} from {human_bytes(manifest['wheel_bytes'])}"
        f" of wheels, in {time.monotonic() - started:.0f} s; manifest sha256 {sha}"
    )
    return manifest, sha


def build_from_lock(
    lock_path: Path,
    out_dir: Path,
    *,
    part_size: int = DEFAULT_PART_SIZE,
    xz_preset: int = 6,
    wheels_from: Path | None = None,
    keep_staging: bool = False,
    steps: Steps | None = None,
) -> tuple[dict[str, Any], str]:
    """The set of a wheel lock's ``install-set`` wheels (repro/installset/lock.py): the same
    files, by sha256, that the CUDA image made from that lock installs.

    ``wheels_from``: a folder already holding some of them (a CUDA wheelhouse); matching
    files are linked from there instead of downloaded.
    """
    from repro.installset.lock import lock_sha256, locked_packages, read_lock

    steps = steps or Steps()
    lock = read_lock(lock_path)
    target = Target(lock["python"]["version"], tuple(lock["platforms"]))
    packages = locked_packages(lock, ("install-set",))
    wheels_dir = out_dir / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    if wheels_from is not None:
        for pkg in packages:
            src = Path(wheels_from) / pkg.wheels[0].filename
            dst = wheels_dir / src.name
            if src.is_file() and not dst.exists():
                try:
                    os.link(src, dst)
                except OSError:
                    shutil.copy2(src, dst)
    pip = PipCommand(
        index_url=lock["index_url"], extra_index_urls=tuple(lock.get("extra_index_urls", []))
    )
    with steps.step("download"):
        records = download_wheels(packages, wheels_dir, target, pip, log=steps.say)
    root = records[0]
    tools = {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "xz": _version_of(["xz", "--version"]),
    }
    return pack_set(
        records,
        out_dir,
        target,
        root={"requirement": lock["root"], "name": root.name, "version": root.version},
        part_size=part_size,
        xz_preset=xz_preset,
        host=lock["host"],
        index_url=lock["index_url"],
        steps=steps,
        pip=pip,
        keep_staging=keep_staging,
        tools=tools,
        lock={"path": str(lock_path), "sha256": lock_sha256(lock_path)},
    )
