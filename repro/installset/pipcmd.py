"""Running pip apart from the machine's own pip settings (standard library only).

This machine's pip configuration (constraints, find-links, extra indexes) is not the host's;
every pip configuration file and ``PIP_*`` variable is dropped except those about reaching
the network, and the index (or ``--no-index``) is always passed explicitly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

from repro.installset import InstallSetError

DEFAULT_INDEX = "https://pypi.org/simple"

# Settings kept from the environment: how to reach the network, not what to install.
_KEEP = set("PIP_CACHE_DIR PIP_CERT PIP_CLIENT_CERT PIP_DEFAULT_TIMEOUT PIP_NO_CACHE_DIR".split())
_KEEP |= {"PIP_PROXY", "PIP_RETRIES", "PIP_TRUSTED_HOST"}


def pip_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) made neutral for pip."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not k.startswith("PIP_") or k in _KEEP}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env["PYTHONUTF8"] = "1"
    return env


def run_pip(args: Sequence[str], *, what: str, python: str = sys.executable) -> str:
    """``PYTHON -m pip ARGS`` in the neutral environment; on failure raise with pip's last lines."""
    proc = subprocess.run(
        [python, "-m", "pip", *args],
        env=pip_environment(),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise InstallSetError(f"pip failed while {what} (exit {proc.returncode}):\n{tail}")
    return proc.stdout
