"""The target host's installed packages, and taking them out of a dependency closure.

The host is described by its ``pip list --format=freeze`` (or ``pip freeze``) output. Names
are compared in PEP 503 canonical form: ``Typing_Extensions``, ``typing.extensions`` and
``typing-extensions`` are one package. Standard library only: ``verify``/``install`` on the
bare host never need this module, but nothing here would stop them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from repro.installset import InstallSetError

__all__ = [
    "HostEnv",
    "HostPackage",
    "Pin",
    "Subtraction",
    "canonical_name",
    "parse_freeze",
    "read_freeze",
    "subtract_host",
]

_SEPARATORS = re.compile(r"[-_.]+")
# A distribution name (PEP 508): letters and digits, inner runs of - _ . allowed.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PINNED = re.compile(rf"^(?P<name>{_NAME})\s*(?:\[[^\]]*\])?\s*===?\s*(?P<version>[^\s;#]+)")
_DIRECT = re.compile(rf"^(?P<name>{_NAME})\s*(?:\[[^\]]*\])?\s*@\s*\S+")
_EGG = re.compile(rf"[#&]egg=(?P<name>{_NAME})")


def canonical_name(name: str) -> str:
    """PEP 503 normalised form: lower case, each run of ``-``, ``_``, ``.`` one ``-``."""
    return _SEPARATORS.sub("-", name.strip()).lower()


@dataclass(frozen=True)
class HostPackage:
    """One installed distribution. ``version`` is None for a direct reference (``@ url``)."""

    name: str
    version: str | None
    line: str


@dataclass(frozen=True)
class HostEnv:
    """The host's packages by canonical name, and where that list came from."""

    packages: Mapping[str, HostPackage]
    source: str = "<memory>"
    sha256: str = ""
    skipped_lines: tuple[str, ...] = ()

    def get(self, name: str) -> HostPackage | None:
        return self.packages.get(canonical_name(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and canonical_name(name) in self.packages

    def __len__(self) -> int:
        return len(self.packages)


def parse_freeze(text: str, *, source: str = "<memory>") -> HostEnv:
    """Parse ``pip freeze`` / ``pip list --format=freeze`` output.

    Understood: ``name==version`` (and ``===``), ``name @ url``, ``-e …#egg=name``. Blank
    lines, comments and pip options are skipped; a line naming no package is kept in
    ``skipped_lines`` so the caller can show it. A name listed twice must agree on its version.
    """
    packages: dict[str, HostPackage] = {}
    skipped: list[str] = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if match := _PINNED.match(line):
            pkg = HostPackage(match["name"], match["version"], line)
        elif match := _DIRECT.match(line):
            pkg = HostPackage(match["name"], None, line)
        elif line.startswith(("-e ", "--editable")) and (match := _EGG.search(line)):
            pkg = HostPackage(match["name"], None, line)
        else:
            skipped.append(line)
            continue
        key = canonical_name(pkg.name)
        old = packages.get(key)
        if old is not None and old.version != pkg.version:
            raise InstallSetError(
                f"{source}: {pkg.name} is listed twice with different versions "
                f"({old.line!r} and {pkg.line!r}); give the host's real freeze output"
            )
        packages[key] = pkg
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return HostEnv(packages, source=source, sha256=digest, skipped_lines=tuple(skipped))


def read_freeze(path: str | Path) -> HostEnv:
    """Read and parse a freeze file; its sha256 is of the file's bytes as stored."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InstallSetError(f"cannot read the host's freeze file {path}: {exc}") from exc
    env = parse_freeze(data.decode("utf-8"), source=str(path))
    if not env.packages:
        raise InstallSetError(
            f"{path} names no packages; expected the output of `pip list --format=freeze` "
            "run with the host's python"
        )
    return HostEnv(
        env.packages,
        source=str(path),
        sha256=hashlib.sha256(data).hexdigest(),
        skipped_lines=env.skipped_lines,
    )


@dataclass(frozen=True)
class Pin:
    """A distribution at an exact version."""

    name: str
    version: str

    @property
    def key(self) -> str:
        return canonical_name(self.name)


@dataclass(frozen=True)
class HostProvided:
    """A closure member the host already has: shipped not at all, used at the host's version."""

    name: str
    wanted: str
    host_version: str | None

    @property
    def same_version(self) -> bool:
        return self.host_version is not None and _same(self.wanted, self.host_version)


@dataclass(frozen=True)
class Subtraction:
    """A closure split into what the set must carry and what the host already provides."""

    ship: list[Pin] = field(default_factory=list)
    on_host: list[HostProvided] = field(default_factory=list)


def subtract_host(closure: Iterable[Pin], host: HostEnv | Mapping[str, str | None]) -> Subtraction:
    """Split ``closure`` into the pins the host lacks and those it has (by canonical name).

    ``host`` is a ``HostEnv`` or a plain mapping of name to version (any spelling of the
    name). A package the host has is never shipped, whatever version the closure asked for:
    the set must not shadow the host's torch, numba or transformers. A version mismatch is
    reported through ``HostProvided.same_version`` for the caller to show.
    """
    if isinstance(host, HostEnv):
        versions = {key: pkg.version for key, pkg in host.packages.items()}
    else:
        versions = {canonical_name(name): version for name, version in host.items()}
    result = Subtraction()
    seen: set[str] = set()
    for pin in closure:
        key = pin.key
        if key in seen:
            raise InstallSetError(f"the closure names {pin.name} twice")
        seen.add(key)
        if key in versions:
            result.on_host.append(HostProvided(pin.name, pin.version, versions[key]))
        else:
            result.ship.append(pin)
    return result


def _same(a: str, b: str) -> bool:
    """Versions equal up to a local label (``2.11.0`` is the host's ``2.11.0+cu130``)."""
    return a.split("+", 1)[0] == b.split("+", 1)[0]
