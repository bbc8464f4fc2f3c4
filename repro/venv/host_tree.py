"""Engine trees on a bare GPU host: one installed folder per (install set, patch set).

The bare-host twin of `engine_venvs` (virtualenvs made from a package index): a host without
network gets vLLM as an install set's checked parts (`repro.installset`), installed with the
host's own python and pip into a folder that runs with ``PYTHONPATH=TREE``.

    python -m repro host-install --parts DIR [--patch FILE ...] [--extra-wheels DIR]

A tree is ``ROOT/vllm-<version>-<key>``, its key the sha256 of what it holds: the set's
manifest, the patches' bytes in order and the extra wheels' bytes. The unpatched tree is made
once; a patched one is its hard-link clone with the patches applied (`patching`). Each is
made under a temporary name and renamed into place with its marker (`repro-host-tree.json`)
inside, so a tree is whole or absent: when the machine goes away mid-install (a lent GPU
does), the next call removes the leftover and makes the tree again. The root defaults to
``REPRO_CACHE/host-trees`` (``~/.cache/repro-kit``).

The kit itself needs jsonschema (with its format-nongpl extra) to validate what it writes;
a host without it gets those wheels through ``--extra-wheels``, and the tree is refused
before it is used when the kit cannot validate an artifact with it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro import KIT_SOURCE

from repro.venv import engine_venvs, patching
from repro.core.atomicio import sha256_file, write_json_atomic
from repro.core.clock import utc_text
from repro.core.errors import ReproError
from repro.installset.install import install, run_pip
from repro.installset.steps import Steps
from repro.core.jsonread import JSONUnreadable, read_json

MARKER = "repro-host-tree.json"
MARKER_FORMAT = "repro-host-tree"
_PARTIAL = ".partial-"


class HostTreeError(ReproError):
    """A host tree cannot be made from what was given."""


@dataclass(frozen=True)
class TreeSpec:
    """What one tree holds: an install set, patches on it, and the kit's own extra wheels."""

    parts: Path
    patches: tuple[Path, ...] = ()
    extra_wheels: tuple[Path, ...] = ()

    @property
    def manifest(self) -> Path:
        return self.parts / "manifest.json"

    def root_requirement(self) -> dict[str, Any]:
        """The set's root (vLLM): its name and version, read from its manifest."""
        try:
            doc = read_json(self.manifest)
        except JSONUnreadable as exc:
            raise HostTreeError(
                f"--parts {self.parts}: {exc}; give a folder made by "
                f"`python -m repro.installset build` (manifest.json and its parts)"
            ) from None
        root = doc.get("root") if isinstance(doc, dict) else None
        if not isinstance(root, dict) or not isinstance(root.get("version"), str):
            raise HostTreeError(
                f"{self.manifest} names no root package and version; it is not an install "
                f"set's manifest (python -m repro.installset verify --parts {self.parts})"
            )
        return root

    def key(self) -> str:
        digest = hashlib.sha256()
        for label, files in (
            ("manifest", [self.manifest]),
            ("patch", self.patches),
            ("wheel", self.extra_wheels),
        ):
            for path in files:
                digest.update(f"{label} {path.name} {sha256_file(path)}\n".encode())
        return digest.hexdigest()

    def unpatched(self) -> TreeSpec:
        return TreeSpec(self.parts, (), self.extra_wheels)


def default_root() -> Path:
    return engine_venvs.cache_root() / "host-trees"


def extra_wheels_in(folder: Path | None) -> tuple[Path, ...]:
    """The wheels of ``--extra-wheels DIR``, sorted (so the tree's key does not depend on the
    order a file system lists them in)."""
    if folder is None:
        return ()
    if not folder.is_dir():
        raise HostTreeError(
            f"--extra-wheels {folder} is not a folder; give the folder `pip download` wrote "
            f"the wheels into"
        )
    wheels = tuple(sorted(folder.glob("*.whl")))
    if not wheels:
        raise HostTreeError(f"--extra-wheels {folder} holds no .whl files")
    return wheels


def tree_path(spec: TreeSpec, root: Path) -> Path:
    version = spec.root_requirement()["version"]
    return root / f"vllm-{version}-{spec.key()[:12]}"


def read_marker(tree: Path) -> dict[str, Any] | None:
    try:
        doc = read_json(tree / MARKER)
    except JSONUnreadable:
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == MARKER_FORMAT else None


def ensure_tree(spec: TreeSpec, *, root: Path | None = None, log=print) -> tuple[Path, str]:
    """The tree for ``spec`` and whether it was 'made' or 'reused'.

    Before anything is made, every patch is checked to be a Python-only diff and the parts
    are verified against their manifest (the installer does that first)."""
    root = Path(root or default_root())
    for patch in spec.patches:
        patching.check_python_only(patch)
    path = tree_path(spec, root)
    marker = read_marker(path)
    if marker is not None and marker.get("key") == spec.key():
        return path, "reused"
    root.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(root, path.name, log)
    if path.exists():
        # A folder under the tree's name without its marker is no tree the kit finished.
        log(f"[host-install] {path} has no {MARKER}: removing it and making it again")
        shutil.rmtree(path)
    staging = root / f"{path.name}{_PARTIAL}{os.getpid()}"
    try:
        record = _make(spec, staging, root, log)
        write_json_atomic(staging / MARKER, record)
        os.replace(staging, path)
    except BaseException:
        # A refused or failed tree leaves nothing under its name (a killed process leaves
        # the partial folder, which the next call removes).
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path, "made"


def _make(spec: TreeSpec, staging: Path, root: Path, log) -> dict[str, Any]:
    """Fill ``staging`` with the tree; return its marker."""
    if spec.patches:
        base, _ = ensure_tree(spec.unpatched(), root=root, log=log)
        log(f"[host-install] {staging.name}: a hard-link copy of {base.name}, then the patches")
        engine_venvs.clone_tree(base, staging)
        (staging / MARKER).unlink(missing_ok=True)
        for patch in spec.patches:
            engine_venvs.unshare(staging, patching.targets(patch))
        applied = patching.apply_patches(list(spec.patches), staging)
        return {**_base_record(spec), "patches": applied, "cloned_from": base.name}
    _install(spec, staging, log)
    return {**_base_record(spec), "patches": []}


def _base_record(spec: TreeSpec) -> dict[str, Any]:
    return {
        "format": MARKER_FORMAT,
        "key": spec.key(),
        "root": spec.root_requirement(),
        "manifest_sha256": sha256_file(spec.manifest),
        "extra_wheels": [{"name": w.name, "sha256": sha256_file(w)} for w in spec.extra_wheels],
        "made": utc_text(),
        "python": sys.version.split()[0],
    }


def _remove_leftovers(root: Path, name: str, log) -> None:
    """Partial folders of this tree from an earlier call that did not finish."""
    for leftover in root.glob(f"{name}{_PARTIAL}*"):
        log(f"[host-install] removing {leftover.name} (an install that did not finish)")
        shutil.rmtree(leftover, ignore_errors=True)


def _install(spec: TreeSpec, staging: Path, log) -> None:
    class TreeSteps(Steps):
        def say(self, text: str) -> None:
            # The folder is renamed once whole; host-install prints the tree to use.
            if not text.startswith("use it with:"):
                super().say(text)

    log(f"[host-install] installing {spec.parts} into {staging.name}")
    install(spec.parts, staging, steps=TreeSteps())
    for wheel in spec.extra_wheels:
        run_pip(
            ["install", "-q", "--no-deps", "--no-index", "--target", str(staging), str(wheel)],
            what=f"installing the extra wheel {wheel.name}",
        )
    check_kit_runs(staging)


def check_kit_runs(tree: Path) -> None:
    """Refuse a tree in which the kit could not validate an artifact (no jsonschema)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(KIT_SOURCE)])}
    code = "from repro.artifact import require_validation; require_validation()"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode:
        said = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise HostTreeError(
            f"the kit cannot validate artifacts with this host's python and the install set "
            f"({said}); give --extra-wheels DIR with the wheels of jsonschema[format-nongpl], "
            f"downloaded where pip works: pip download --only-binary=:all: --python-version "
            f"{sys.version_info.major}.{sys.version_info.minor} --platform "
            f"manylinux_2_17_x86_64 -d DIR 'jsonschema[format-nongpl]'"
        )


def describe(tree: Path) -> str:
    marker = read_marker(tree) or {}
    patches = ", ".join(p["path"] for p in marker.get("patches", []))
    version = marker.get("root", {}).get("version", "?")
    return f"vLLM {version} install set" + (f" with {patches}" if patches else "")


def pythonpath(tree: Path, kit_source: Path = KIT_SOURCE) -> str:
    """``PYTHONPATH`` for a run on the tree: its packages, then the kit."""
    return os.pathsep.join([str(tree), str(kit_source)])
