"""The host an install set is for: its Python and the wheel platform tags it runs.

pip's cross-install options (``--python-version``, ``--platform``, ``--implementation``)
choose wheels by tag, but pip evaluates environment markers with the interpreter it runs on:
``--python-version 3.12`` under Python 3.11 still drops ``foo; python_version >= "3.12"``.
So ``marker_environment`` gives the host's marker values for the kit's own evaluation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from repro.installset import InstallSetError

__all__ = ["DEFAULT_PLATFORM", "Target", "expand_platforms"]

# Conservative: llguidance's manylinux_2_31 wheel is the newest tag the vLLM 0.26.0 set
# needs, and it loads on the kit's H200 host (Ubuntu glibc 2.39, read 2026-11-30). A host
# with an older glibc must pass its own tag; a newer tag only widens the choice of wheels.
DEFAULT_PLATFORM = "manylinux_2_31_x86_64"

_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_LINUX_PREFIXES = ("manylinux1_", "manylinux2010_", "manylinux2014_", "linux_")


def expand_platforms(platforms: Iterable[str]) -> list[str]:
    """Each ``manylinux_X_Y_arch`` also admits every older glibc tag of that machine.

    pip's ``--platform`` takes tags literally; a host with glibc 2.31 also runs wheels
    tagged ``manylinux_2_28``, ``manylinux2014`` … so they are listed too. Order (pip's
    preference): other tags as given (``linux_x86_64``), then the manylinux tags newest
    glibc first, each legacy alias right after its ``manylinux_2_Y`` twin; no duplicates.
    """
    given = list(dict.fromkeys(platforms))
    others = [t for t in given if _glibc(t) == (0, 0)]
    many: set[str] = {t for t in given if _glibc(t) != (0, 0)}
    for tag in given:
        if _glibc(tag) == (0, 0):
            continue
        (major, minor), arch = _glibc(tag), machine_of(tag)
        many.update(f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1))
        many.update(f"{alias}_{arch}" for alias, lib in _LEGACY.items() if lib <= (major, minor))
    ordered = sorted(many, key=lambda t: (_glibc(t), t.startswith("manylinux_")), reverse=True)
    return others + ordered


def _glibc(tag: str) -> tuple[int, int]:
    match = _MANYLINUX.match(tag)
    if match:
        return int(match[1]), int(match[2])
    legacy = tag.split("_", 1)[0]
    return _LEGACY.get(legacy, (0, 0))


def machine_of(platform: str) -> str | None:
    """``x86_64`` for ``manylinux_2_31_x86_64`` or ``linux_x86_64``; None if not Linux."""
    match = _MANYLINUX.match(platform)
    if match:
        return match[3]
    for prefix in _LINUX_PREFIXES:
        if platform.startswith(prefix):
            return platform[len(prefix) :] or None
    return None


@dataclass(frozen=True)
class Target:
    """The host's CPython version (``3.12`` or ``3.12.3``) and its platform tags."""

    python: str
    platforms: tuple[str, ...]
    implementation: str = "cp"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d+(\.\d+)?", self.python):
            raise InstallSetError(f"--python takes X.Y or X.Y.Z (e.g. 3.12), not {self.python!r}")
        machines = {machine_of(p) for p in self.platforms}
        if not self.platforms or len(machines) != 1 or None in machines:
            raise InstallSetError(
                f"platforms {list(self.platforms)} must be Linux tags of one machine "
                "(manylinux_2_31_x86_64, linux_x86_64, …)"
            )

    @classmethod
    def create(cls, python: str, platforms: Iterable[str] = (DEFAULT_PLATFORM,)) -> Target:
        return cls(python, tuple(expand_platforms(platforms)))

    @property
    def python_minor(self) -> str:
        return ".".join(self.python.split(".")[:2])

    @property
    def python_tag(self) -> str:
        return f"{self.implementation}{self.python_minor.replace('.', '')}"

    @property
    def machine(self) -> str:
        return machine_of(self.platforms[0]) or ""

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker values on the host."""
        full = self.python if self.python.count(".") == 2 else f"{self.python}.0"
        return {
            "implementation_name": "cpython",
            "implementation_version": full,
            "os_name": "posix",
            "platform_machine": self.machine,
            "platform_python_implementation": "CPython",
            "platform_release": "",
            "platform_system": "Linux",
            "platform_version": "",
            "python_full_version": full,
            "python_version": self.python_minor,
            "sys_platform": "linux",
        }

    def pip_args(self) -> list[str]:
        """Options that make pip choose wheels for this host (binary wheels only)."""
        args = ["--only-binary=:all:", "--python-version", self.python_minor]
        args += ["--implementation", self.implementation]
        for platform in self.platforms:
            args += ["--platform", platform]
        return args
