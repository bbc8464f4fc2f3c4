"""One wheel lock for the CUDA image and the bare-host install set.

The lent GPU host has no Docker: there the kit runs on the host's own torch plus an install
set; elsewhere it runs in the CUDA image. For the two to be one Python environment, both are
made from one lock file (``containers/locks/<name>.lock.json``) that names every wheel by file
name and sha256, each with its *origin*:

``install-set``  what the host lacks: shipped in the install set, and installed in the image;
``host``         what the host already has, at the host's version (torch, its ``nvidia-*``
                 CUDA libraries, numpy …): the image installs that version's wheel;
``image-only``   what neither the closure nor the host needs but the image does (the kit's
                 own dependencies where vLLM does not bring them).

Making a lock takes two uv resolutions. The first is the install set's own (``resolve``: the
host's packages as stubs, overridden where they conflict). The second resolves the same
requirements with no stubs at all, every package fixed to what the first chose or to the
host's version, so that it adds only what the host's packages themselves need (torch's
CUDA wheels). One wheel per package is chosen the way pip chooses: the best tag for the target.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from repro.installset import InstallSetError
from repro.installset.hostenv import HostEnv, canonical_name, read_freeze
from repro.installset.resolve import (
    VLLM_OPTIONAL,
    Locked,
    LockedWheel,
    UvCompiler,
    find_uv,
    resolve,
)
from repro.installset.target import Target

__all__ = [
    "FORMAT",
    "LOCKS_DIR",
    "ORIGINS",
    "choose_wheel",
    "compare_records",
    "default_lock_path",
    "lock_sha256",
    "locked_packages",
    "make_lock",
    "read_lock",
    "requirements_text",
]

FORMAT = "repro-kit/wheel-lock"
FORMAT_VERSION = 1
ORIGINS = ("install-set", "host", "image-only")
LOCKS_DIR = Path(__file__).resolve().parent.parent.parent / "containers" / "locks"


def default_lock_path(vllm_ref: str, cuda_variant: str, python_tag: str) -> Path:
    return LOCKS_DIR / f"vllm-{vllm_ref}-{cuda_variant}-{python_tag}.lock.json"


# --- choosing one wheel, as pip does ----------------------------------------------------------


def _tag_priority(target: Target) -> dict[Any, int]:
    from packaging import tags

    version = tuple(int(x) for x in target.python_minor.split("."))
    ordered = list(tags.cpython_tags(version, platforms=list(target.platforms)))
    ordered += list(tags.compatible_tags(version, f"cp{version[0]}{version[1]}", target.platforms))
    priority: dict[Any, int] = {}
    for rank, tag in enumerate(ordered):
        priority.setdefault(tag, rank)
    return priority


def choose_wheel(pkg: Locked, target: Target, priority: Mapping[Any, int] | None = None):
    """The wheel of ``pkg`` pip would install on ``target`` (its best-ranked tag)."""
    from packaging.utils import parse_wheel_filename

    priority = priority if priority is not None else _tag_priority(target)
    best, best_rank = None, None
    for wheel in pkg.wheels:
        _name, _version, _build, wheel_tags = parse_wheel_filename(wheel.filename)
        ranks = [priority[t] for t in wheel_tags if t in priority]
        if ranks and (best_rank is None or min(ranks) < best_rank):
            best, best_rank = wheel, min(ranks)
    if best is None:
        listed = ", ".join(w.filename for w in pkg.wheels)
        raise InstallSetError(
            f"{pkg.name} {pkg.version}: no wheel fits Python {target.python} on "
            f"{target.platforms[0]} (the index lists {listed})"
        )
    return best


# --- making a lock -----------------------------------------------------------------------------


def make_lock(
    root: str,
    *,
    vllm: Mapping[str, str],
    target: Target,
    cuda_variant: str,
    freeze_file: Path | None,
    extra_requirements: Sequence[str] = (),
    exclude: Mapping[str, str] | None = None,
    index_url: str | None = None,
    extra_index_urls: Sequence[str] = (),
    uv: str | None = None,
    exclude_newer: str | None = None,
    log=None,
) -> dict[str, Any]:
    """The lock document for ``root`` (``vllm==0.26.0`` or ``vllm @ URL``) on ``target``.

    ``freeze_file`` is the bare host's ``pip list --format=freeze``; None locks for a host
    with nothing (every wheel is then ``install-set``). ``extra_requirements`` (the kit's
    dependencies) go into the image only, where vLLM's closure does not already hold them.
    """
    say = log or (lambda _msg: None)
    host = read_freeze(freeze_file) if freeze_file else HostEnv({}, source="none")
    exclude = dict(VLLM_OPTIONAL if exclude is None else exclude)
    compiler = UvCompiler(
        target,
        uv=find_uv(uv),
        index_url=index_url or "https://pypi.org/simple",
        extra_index_urls=tuple(extra_index_urls),
        exclude_newer=exclude_newer,
    )
    res = resolve(root, host, compiler, exclude=exclude, measure_excluded=False, log=say)
    shipped = {p.key: p for p in res.packages}

    say("resolving the image's whole closure (the host's packages as real wheels)")
    fixed = [f"{p.name}=={p.version}" for p in res.packages]
    host_pins = [
        f"{pkg.name}=={pkg.version}"
        for key, pkg in sorted(host.packages.items())
        if pkg.version and key not in shipped
    ]
    overridden = [pin for pin in host_pins if canonical_name(pin.split("==")[0]) in res.overrides]
    constrained = [pin for pin in host_pins if pin not in overridden]
    full = compiler.compile(
        [root, *extra_requirements],
        HostEnv({}, source="none"),
        excludes=set(res.excluded),
        constraints=[*fixed, *constrained],
        override_pins=overridden,
    )
    priority = _tag_priority(target)
    packages, problems = [], []
    for pkg in sorted(full, key=lambda p: (p.key != res.root.key, p.key)):
        host_pkg = host.get(pkg.name)
        if pkg.key in shipped:
            origin = "install-set"
            if pkg.version != shipped[pkg.key].version:
                theirs = shipped[pkg.key].version
                problems.append(f"{pkg.name}: {pkg.version} here, {theirs} shipped")
        elif host_pkg is not None:
            origin = "host"
            if host_pkg.version != pkg.version:
                problems.append(f"{pkg.name}: {pkg.version} here, the host has {host_pkg.version}")
        else:
            origin = "image-only"
        wheel = choose_wheel(pkg, target, priority)
        packages.append(
            {
                "name": pkg.name,
                "version": pkg.version,
                "origin": origin,
                "filename": wheel.filename,
                "url": wheel.url,
                "sha256": wheel.sha256,
                "bytes": wheel.size,
            }
        )
    missing = sorted(set(shipped) - {canonical_name(p["name"]) for p in packages})
    problems += [f"{name}: in the install set but not in the image's closure" for name in missing]
    if problems:
        raise InstallSetError(
            "the image's closure and the install set disagree:\n  " + "\n  ".join(problems)
        )
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "vllm": dict(vllm),
        "root": root,
        "extra_requirements": list(extra_requirements),
        "cuda_variant": cuda_variant,
        "python": {"version": target.python, "tag": target.python_tag},
        "platforms": list(target.platforms),
        "index_url": compiler.index_url,
        "extra_index_urls": list(extra_index_urls),
        "host": None
        if freeze_file is None
        else {"freeze_file": str(freeze_file), "freeze_sha256": host.sha256, "packages": len(host)},
        "resolution": {
            "resolver": "uv pip compile",
            "host_overrides": res.overrides,
            "excluded": [{"name": n, "reason": why} for n, why in res.excluded.items()],
            "exclude_newer": exclude_newer,
        },
        "packages": packages,
    }


# --- reading and using a lock ------------------------------------------------------------------

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def read_lock(path: Path) -> dict[str, Any]:
    """The lock at ``path``, checked for the fields the builds use."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InstallSetError(
            f"no wheel lock at {path}; make it with `python -m repro.installset lock …` "
            f"(see `nox -s cuda-lock`)"
        ) from exc
    except json.JSONDecodeError as exc:
        raise InstallSetError(f"wheel lock {path} is not JSON: {exc}") from exc
    if doc.get("format") != FORMAT or doc.get("format_version") != FORMAT_VERSION:
        raise InstallSetError(
            f"{path} is not a {FORMAT} v{FORMAT_VERSION} file (format {doc.get('format')!r})"
        )
    for pkg in doc.get("packages", []):
        if pkg.get("origin") not in ORIGINS or not _SHA256.match(pkg.get("sha256", "")):
            raise InstallSetError(f"{path}: malformed package entry {pkg!r}")
    if not doc.get("packages"):
        raise InstallSetError(f"{path} locks no packages")
    return doc


def lock_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def locked_packages(lock: Mapping[str, Any], origins: Sequence[str] = ORIGINS) -> list[Locked]:
    """The lock's packages of ``origins``, each with its one wheel (for ``download_wheels``)."""
    return [
        Locked(p["name"], p["version"], (LockedWheel(p["url"], p["sha256"], p["bytes"]),))
        for p in lock["packages"]
        if p["origin"] in origins
    ]


def requirements_text(lock: Mapping[str, Any], origins: Sequence[str] = ORIGINS) -> str:
    """A pip requirements file in hash-checking mode: exactly these files, nothing else."""
    lines = [f"# from {FORMAT} (vllm {lock['vllm'].get('ref')}); pip install --require-hashes"]
    for p in lock["packages"]:
        if p["origin"] in origins:
            lines.append(f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}")
    return "\n".join(lines) + "\n"


def compare_records(image_record: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict:
    """How an image record's wheels and an install set manifest's wheels relate.

    Equal means: both name the same lock (by sha256), every wheel of the set is in the image
    with the same file name and sha256, and the image's other wheels are the lock's ``host``
    and ``image-only`` ones.
    """
    image_lock = (image_record.get("lock") or {}).get("sha256")
    set_lock = (manifest.get("lock") or {}).get("sha256")
    image_wheels = {w["filename"]: w for w in (image_record.get("lock") or {}).get("wheels", [])}
    set_wheels = {w["filename"]: w for w in manifest["wheels"]}
    differing = [
        f"{name}: image {image_wheels[name]['sha256'][:12]}, set {w['sha256'][:12]}"
        for name, w in set_wheels.items()
        if name in image_wheels and image_wheels[name]["sha256"] != w["sha256"]
    ]
    only_set = sorted(set(set_wheels) - set(image_wheels))
    only_image = sorted(set(image_wheels) - set(set_wheels))
    unexpected = [n for n in only_image if image_wheels[n].get("origin") == "install-set"]
    same = bool(image_lock) and image_lock == set_lock and not (differing or only_set or unexpected)
    return {
        "same_lock": bool(image_lock) and image_lock == set_lock,
        "image_lock_sha256": image_lock,
        "set_lock_sha256": set_lock,
        "wheels_in_both": len(set(set_wheels) & set(image_wheels)),
        "sha256_differs": differing,
        "only_in_set": only_set,
        "only_in_image": {
            origin: sorted(n for n in only_image if image_wheels[n].get("origin") == origin)
            for origin in ORIGINS
        },
        "equal": same,
    }
