"""Running pip for another host, apart from this machine's own pip settings.

This machine's pip configuration (a constraint file capping torch, find-links folders,
extra local indexes) describes this machine, not the host the set is for. Every pip
configuration file is skipped (``PIP_CONFIG_FILE`` set to the null device, pip's documented
switch) and every ``PIP_*`` variable is dropped except those about reaching the network. The
index is passed explicitly instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from repro.installset import InstallSetError

__all__ = ["DEFAULT_INDEX", "PipCommand", "pip_environment"]

DEFAULT_INDEX = "https://pypi.org/simple"

# Settings kept from the environment: how to reach the network, not what to install.
_KEEP = {
    "PIP_CACHE_DIR",
    "PIP_CERT",
    "PIP_CLIENT_CERT",
    "PIP_DEFAULT_TIMEOUT",
    "PIP_NO_CACHE_DIR",
    "PIP_PROXY",
    "PIP_RETRIES",
    "PIP_TRUSTED_HOST",
}


def pip_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) made neutral for pip."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not k.startswith("PIP_") or k in _KEEP}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env["PYTHONUTF8"] = "1"
    return env


@dataclass(frozen=True)
class PipCommand:
    """``PYTHON -m pip`` with an explicit index; ``python`` defaults to this interpreter."""

    python: str = sys.executable
    index_url: str = DEFAULT_INDEX
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()

    def index_args(self) -> list[str]:
        args = ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        return args

    def run(self, args: Sequence[str], *, what: str, cwd: Path | None = None) -> str:
        """Run pip; on failure raise with pip's last lines."""
        cmd = [self.python, "-m", "pip", *args]
        proc = subprocess.run(
            cmd, env=pip_environment(), cwd=cwd, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            lines = (proc.stdout + proc.stderr).strip().splitlines()
            tail = "\n".join(lines[-30:])
            raise InstallSetError(f"pip failed while {what} (exit {proc.returncode}):\n{tail}")
        return proc.stdout
