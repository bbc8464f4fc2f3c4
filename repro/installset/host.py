"""The host a set is for: its Python, the wheel tags it runs, and the packages it already has
(from its ``pip list --format=freeze``, names in PEP 503 form). Build side only."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from repro.installset import InstallSetError

# Conservative: llguidance's manylinux_2_31 wheel is the newest tag the vLLM 0.26.0 set
# needs, and it loads on the kit's H200 host (Ubuntu glibc 2.39, read 2026-11-30). A host
# with an older glibc must pass its own tag; a newer tag only widens the choice of wheels.
DEFAULT_PLATFORM = "manylinux_2_31_x86_64"
_MANYLINUX = re.compile(r"manylinux_2_(\d+)_(\w+)")
# The legacy manylinux names and the glibc each stands for (PEP 600).
_LEGACY = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
_EGG = re.compile(r"[#&]egg=([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class HostPackage:
    """One installed distribution. ``version`` is None for a direct reference (``@ url``)."""

    name: str
    version: str | None
    line: str


@dataclass(frozen=True)
class HostEnv:
    """The host's packages by canonical name, and the sha256 of the list they came from."""

    packages: Mapping[str, HostPackage]
    sha256: str = ""
    skipped_lines: tuple[str, ...] = ()

    def get(self, name: str) -> HostPackage | None:
        return self.packages.get(canonicalize_name(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and canonicalize_name(name) in self.packages

    def __len__(self) -> int:
        return len(self.packages)


def _package(line: str) -> HostPackage | None:
    if line.startswith(("-e ", "--editable")):
        egg = _EGG.search(line)
        return HostPackage(egg[1], None, line) if egg else None
    try:
        req = Requirement(line)
    except InvalidRequirement:
        return None  # a pip option or something else that names no package
    pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
    if req.url is None and len(pins) != 1:
        return None
    return HostPackage(req.name, None if req.url else pins[0], line)


def parse_freeze(text: str, *, source: str = "<memory>") -> HostEnv:
    """``pip freeze`` output: ``name==version``, ``name @ url`` and ``-e …#egg=name`` lines.
    Comments and pip options are skipped (the latter kept in ``skipped_lines``); a name listed
    twice must agree on its version."""
    packages: dict[str, HostPackage] = {}
    skipped: list[str] = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if (pkg := _package(line)) is None:
            skipped.append(line)
            continue
        old = packages.setdefault(canonicalize_name(pkg.name), pkg)
        if old.version != pkg.version:
            raise InstallSetError(
                f"{source}: {pkg.name} is listed twice with different versions "
                f"({old.line!r} and {pkg.line!r}); give the host's real freeze output"
            )
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return HostEnv(packages, sha256=digest, skipped_lines=tuple(skipped))


def read_freeze(path: str | Path) -> HostEnv:
    """Read and parse a freeze file; its sha256 is of the file's bytes as stored (strict
    UTF-8 decodes and encodes back to the same bytes)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InstallSetError(f"cannot read the host's freeze file {path}: {exc}") from exc
    env = parse_freeze(data.decode(), source=str(path))
    if not env.packages:
        raise InstallSetError(
            f"{path} names no packages; expected the output of `pip list --format=freeze` "
            "run with the host's python"
        )
    return env


def _glibc(tag: str) -> tuple[int, str] | None:
    """(glibc minor, machine) of a manylinux tag, legacy names included."""
    if m := _MANYLINUX.fullmatch(tag):
        return int(m[1]), m[2]
    alias, _, machine = tag.partition("_")
    return (_LEGACY[alias], machine) if alias in _LEGACY and machine else None


def expand_platforms(platforms: Iterable[str]) -> list[str]:
    """Each ``manylinux_2_Y_arch`` with every older glibc tag of that machine, newest first,
    each legacy alias right after its ``manylinux_2_Y`` twin (pip's ``--platform`` takes tags
    literally, and a glibc 2.31 host also runs ``manylinux_2_28`` and ``manylinux2014``
    wheels); other tags (``linux_x86_64``) first, as given."""
    given = list(dict.fromkeys(platforms))
    out = [t for t in given if _glibc(t) is None]
    newest: dict[str, int] = {}
    for minor, machine in filter(None, map(_glibc, given)):
        newest[machine] = max(newest.get(machine, 0), minor)
    for machine, top in newest.items():
        for minor in range(top, 4, -1):
            out.append(f"manylinux_2_{minor}_{machine}")
            out += [f"{a}_{machine}" for a, lib in _LEGACY.items() if lib == minor]
    return out


def machine_of(platform: str) -> str | None:
    """``x86_64`` for ``manylinux_2_31_x86_64`` or ``linux_x86_64``; None if not Linux."""
    if glibc := _glibc(platform):
        return glibc[1]
    prefix, _, machine = platform.partition("_")
    return (machine or None) if prefix == "linux" else None


def python_tag(python: str) -> str:
    """CPython's wheel tag for ``3.12`` or ``3.12.3``: ``cp312``."""
    return "cp" + "".join(python.split(".")[:2])


@dataclass(frozen=True)
class Target:
    """The host's CPython version (``3.12`` or ``3.12.3``) and its platform tags."""

    python: str
    platforms: tuple[str, ...]

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
        return python_tag(self.python)

    @property
    def machine(self) -> str:
        return machine_of(self.platforms[0]) or ""

    def pip_args(self) -> list[str]:
        """Options that make pip take wheels for this host (binary wheels only)."""
        args = ["--only-binary=:all:", "--python-version", self.python_minor, "--implementation"]
        return [*args, "cp", *(arg for p in self.platforms for arg in ("--platform", p))]
