"""One wheel lock (``containers/locks/<name>.lock.json``) for the CUDA image and the install set.

Every wheel is named by file name and sha256, with its origin: ``install-set`` (what the host
lacks: shipped, and installed in the image), ``host`` (what the host has, at its version: the
image installs that wheel) or ``image-only`` (the kit's own dependencies vLLM does not bring).
A second uv run resolves the same requirements with no stubs, every package fixed to what the
first chose or to the host's version, so it adds only what the host's packages need.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from repro.core.clock import utc_text
from repro.installset import InstallSetError, resolve
from repro.installset.host import HostEnv, Target, read_freeze
from repro.installset.install import _SHA256
from repro.installset.resolve import Locked, LockedWheel

FORMAT = "repro-kit/wheel-lock"
FORMAT_VERSION = 1
ORIGINS = ("install-set", "host", "image-only")
# Resolution facts a lock of format v1 gained after its first locks were made.
RECORDED_SINCE_V1 = ("uv_runs", "host_packages_used", "excluded_closure")


def make_lock(
    root: str,
    *,
    target: Target,
    freeze_file: Path | None,
    vllm: Mapping[str, str] | None = None,
    cuda_variant: str | None = None,
    extra_requirements: Sequence[str] = (),
    exclude: Mapping[str, str] | None = None,
    index_url: str | None = None,
    extra_index_urls: Sequence[str] = (),
    uv: str | None = None,
    exclude_newer: str | None = None,
    image: bool = True,
    log: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """The lock for ``root`` (``vllm==0.26.0`` or ``vllm @ URL``) on ``target``. No
    ``freeze_file``: a host with nothing. ``extra_requirements`` go into the image only; with
    ``image`` off the lock holds the install set alone (one resolution)."""
    host = read_freeze(freeze_file) if freeze_file else HostEnv({})
    uv = resolve.find_uv(uv)
    compiler = resolve.UvCompiler(
        target, uv, index_url or resolve.DEFAULT_INDEX, tuple(extra_index_urls), exclude_newer
    )
    exclude = dict(resolve.VLLM_OPTIONAL if exclude is None else exclude)
    res = resolve.resolve(
        root, host, compiler, exclude=exclude, measure_excluded=not image, log=log
    )
    shipped, full = {p.key: p for p in res.packages}, res.packages
    if image:
        log("resolving the image's whole closure (the host's packages as real wheels)")
        fixed = [f"{p.name}=={p.version}" for p in res.packages]
        host_pins = {
            key: f"{pkg.name}=={pkg.version}"
            for key, pkg in sorted(host.packages.items())
            if pkg.version and key not in shipped
        }
        full = compiler.compile(
            [root, *extra_requirements],
            constraints=[*fixed, *(p for k, p in host_pins.items() if k not in res.overrides)],
            overrides=[host_pins[key] for key in res.overrides],
            excludes=sorted(res.excluded),
        )
    packages, problems = [], []
    for pkg in sorted(full, key=lambda p: (p.key != res.root.key, p.key)):
        host_pkg = host.get(pkg.name)
        origin = "install-set" if pkg.key in shipped else "host" if host_pkg else "image-only"
        if origin == "install-set" and pkg.version != (theirs := shipped[pkg.key].version):
            problems.append(f"{pkg.name}: {pkg.version} here, {theirs} shipped")
        if origin == "host" and pkg.version != host_pkg.version:
            problems.append(f"{pkg.name}: {pkg.version} here, the host has {host_pkg.version}")
        wheel = resolve.choose_wheel(pkg, target)
        packages.append(
            {"name": pkg.name, "version": pkg.version, "origin": origin}
            | {"filename": wheel.filename, "url": wheel.url, "sha256": wheel.sha256}
            | {"bytes": wheel.size}
        )
    missing = sorted(set(shipped) - {p.key for p in full})
    problems += [f"{name}: in the install set but not in the image's closure" for name in missing]
    if problems:
        raise InstallSetError(
            "the image's closure and the install set disagree:\n  " + "\n  ".join(problems)
        )
    resolver = subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.strip()
    host_doc = {
        "freeze_file": str(freeze_file),
        "freeze_sha256": host.sha256,
        "packages": len(host),
    }
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": utc_text(),
        "vllm": dict(vllm or {}),
        "root": root,
        "extra_requirements": list(extra_requirements),
        "cuda_variant": cuda_variant,
        "python": {"version": target.python, "tag": target.python_tag},
        "platforms": list(target.platforms),
        "index_url": compiler.index_url,
        "extra_index_urls": list(extra_index_urls),
        "host": host_doc if freeze_file else None,
        "resolution": {
            "resolver": resolver or "uv pip compile",
            "uv_runs": res.rounds,
            "host_overrides": res.overrides,
            "host_packages_used": [{"name": n, "version": v} for n, v in res.host_used],
            "excluded": [{"name": n, "reason": why} for n, why in res.excluded.items()],
            "excluded_closure": [
                {"name": p.name, "version": p.version, "bytes": p.size}
                for p in res.excluded_closure
            ],
            "exclude_newer": exclude_newer,
        },
        "packages": packages,
    }


def read_lock(path: Path) -> dict[str, Any]:
    """The lock at ``path``, checked for the fields the builds use."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InstallSetError(
            f"no wheel lock at {path}; make it with `repro cuda-lock …` (or `nox -s cuda-lock`)"
        ) from exc
    except json.JSONDecodeError as exc:
        raise InstallSetError(f"wheel lock {path} is not JSON: {exc}") from exc
    if doc.get("format") != FORMAT or doc.get("format_version") != FORMAT_VERSION:
        raise InstallSetError(
            f"{path} is not a {FORMAT} v{FORMAT_VERSION} file (format {doc.get('format')!r})"
        )
    for pkg in doc.get("packages") or []:
        if pkg.get("origin") not in ORIGINS or not _SHA256.fullmatch(pkg.get("sha256", "")):
            raise InstallSetError(f"{path}: malformed package entry {pkg!r}")
    if not doc.get("packages"):
        raise InstallSetError(f"{path} locks no packages")
    if doc.get("resolution") is not None:
        # Locks made before 2026-12-02 (containers/locks/vllm-0.26.0-…) did not record these:
        # None, "not recorded", rather than a figure the lock does not hold.
        for key in RECORDED_SINCE_V1:
            doc["resolution"].setdefault(key, None)
    return doc


def locked_packages(lock: Mapping[str, Any], origins: Sequence[str] = ORIGINS) -> list[Locked]:
    """The lock's packages of ``origins``, each with its one wheel (for ``download_wheels``)."""
    return [
        Locked(p["name"], p["version"], (LockedWheel(p["url"], p["sha256"], p["bytes"]),))
        for p in lock["packages"]
        if p["origin"] in origins
    ]
