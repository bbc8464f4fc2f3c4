"""The shipped wheels' dependency graph as the host sees it: complete, and what it asks of the host.

After download, each wheel's own METADATA is read and the requirements are walked from the
root with the host's marker values (``Target.marker_environment``) and the extras actually
requested. Each requirement must be met by a shipped wheel, a host package (recorded with
whether the host's version meets it: that is how vLLM's ``numba==0.65.0`` against the host's
0.68.0 shows up in the manifest) or an excluded name. Anything else is a hole in the set and
the build stops. Pure functions over ``Candidate`` values: tested without a network.
"""

from __future__ import annotations

import email.parser
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from repro.installset import InstallSetError
from repro.installset.hostenv import HostEnv, canonical_name

try:  # the kit's environment usually has packaging; pip always vendors it
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover
    from pip._vendor.packaging.requirements import (  # type: ignore[no-redef]
        InvalidRequirement,
        Requirement,
    )
    from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[no-redef]
    from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef]

__all__ = [
    "Candidate",
    "HostRequirement",
    "Walk",
    "applicable",
    "read_wheel_metadata",
    "target_walk",
]


@dataclass(frozen=True)
class Candidate:
    """A distribution's name, version and ``Requires-Dist`` lines."""

    name: str
    version: str
    requires_dist: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return canonical_name(self.name)


def read_wheel_metadata(path: str | Path) -> Candidate:
    """Name, version and requirements from a wheel's ``*.dist-info/METADATA``."""
    with zipfile.ZipFile(path) as zf:
        names = [
            n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
        ]
        if len(names) != 1:
            raise InstallSetError(f"{path}: expected one .dist-info/METADATA, found {names}")
        text = zf.read(names[0]).decode("utf-8")
    msg = email.parser.HeaderParser().parsestr(text)
    return Candidate(msg["Name"], msg["Version"], tuple(msg.get_all("Requires-Dist") or ()))


@dataclass(frozen=True)
class HostRequirement:
    """A requirement the host's own package meets (never shipped), and whether it is met."""

    name: str
    specifier: str
    extras: tuple[str, ...]
    required_by: str
    host_version: str | None
    satisfied: bool | None  # None: the host's version is unknown (a direct reference)


@dataclass
class Walk:
    """``target_walk``'s answer."""

    reached: dict[str, set[str]]  # canonical name -> extras requested on the host
    required_by: dict[str, set[str]] = field(default_factory=dict)
    host: list[HostRequirement] = field(default_factory=list)
    excluded: list[tuple[str, str]] = field(default_factory=list)  # (requirement, by)
    missing: list[tuple[str, str]] = field(default_factory=list)  # (requirement, by)
    unmet: list[tuple[str, str, str]] = field(default_factory=list)  # (requirement, by, picked)
    unreachable: set[str] = field(default_factory=set)

    @property
    def host_conflicts(self) -> list[HostRequirement]:
        return [h for h in self.host if h.satisfied is False]


def applicable(
    requires_dist: Iterable[str], extras: Iterable[str], env: Mapping[str, str]
) -> Iterator[Requirement]:
    """The requirements that apply on the host with these extras requested."""
    wanted = [""] + sorted(canonical_name(e) for e in extras)
    for text in requires_dist:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise InstallSetError(f"cannot read requirement {text!r}: {exc}") from exc
        if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in wanted):
            yield req


def target_walk(
    root: Candidate,
    root_extras: Iterable[str],
    shipped: Mapping[str, Candidate],
    host: HostEnv,
    env: Mapping[str, str],
    exclude: Iterable[str] = (),
) -> Walk:
    """Walk from ``root`` through ``shipped`` (by canonical name) as the host would.

    Requirements naming a host package stop there and are recorded; ``exclude``d names are
    cut; a requirement met by nothing is ``missing``; a shipped wheel whose version the
    requirement refuses is ``unmet``; shipped wheels the walk never reaches are
    ``unreachable``.
    """
    excluded = {canonical_name(n) for n in exclude}
    nodes = {**shipped, root.key: root}
    walk = Walk({root.key: {canonical_name(e) for e in root_extras}})
    seen_host: set[tuple[str, str, str]] = set()
    stack = [root.key]
    while stack:
        cand = nodes[stack.pop()]
        by = f"{cand.name} {cand.version}"
        for req in applicable(cand.requires_dist, walk.reached[cand.key], env):
            key = canonical_name(req.name)
            spec = str(req.specifier)
            if key in excluded:
                walk.excluded.append((_text(req), by))
                continue
            pkg = host.get(req.name)
            if pkg is not None:
                if (key, spec, by) not in seen_host:
                    seen_host.add((key, spec, by))
                    met = None if pkg.version is None else _contains(req.specifier, pkg.version)
                    extras = tuple(sorted(req.extras))
                    walk.host.append(HostRequirement(pkg.name, spec, extras, by, pkg.version, met))
                continue
            if key not in nodes:
                walk.missing.append((_text(req), by))
                continue
            if req.url is None and not _contains(req.specifier, nodes[key].version):
                walk.unmet.append((_text(req), by, nodes[key].version))
            walk.required_by.setdefault(key, set()).add(f"{by} ({spec})" if spec else by)
            extras = {canonical_name(e) for e in req.extras}
            if key not in walk.reached:
                walk.reached[key] = extras
                stack.append(key)
            elif not extras <= walk.reached[key]:
                walk.reached[key] |= extras
                stack.append(key)
    walk.unreachable = set(shipped) - set(walk.reached)
    walk.host.sort(key=lambda h: (canonical_name(h.name), h.required_by))
    return walk


def _contains(spec: SpecifierSet, version: str) -> bool:
    try:
        return spec.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _text(req: Requirement) -> str:
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    if req.url:
        return f"{req.name}{extras} @ {req.url}"
    return f"{req.name}{extras}{req.specifier}"
