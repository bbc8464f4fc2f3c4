"""The closure of a requirement for another host, the host's own packages kept, by uv.

uv resolves (``uv pip compile --python-platform``: the host's markers, and a PEP 751 lock
with every wheel's URL, size and sha256); pip cannot, it evaluates markers on the machine it
runs on. Each host package is an empty *stub* wheel at the host's version (``+installset.host``)
so uv never resolves the host's own trees; a stub is a *constraint*, or an *override* where
the closure pins another version (vLLM 0.26.0: ``numba==0.65.0``, the H200 has 0.68.0). The
fewest overrides are found from uv's exit status and lock alone, never from its messages.
``VLLM_OPTIONAL``: what ``from vllm import LLM`` does not import (docs/measured.md, §GPU hosts).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from packaging import tags
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from repro.installset import InstallSetError
from repro.installset.host import HostEnv, Target
from repro.venv import installer

DEFAULT_INDEX = "https://pypi.org/simple"
STUB_LABEL = "installset.host"
_KERNEL = "optional GPU kernel library: `from vllm import LLM` does not import it"
_CODEC = "optional video decoding for multimodal inputs"
VLLM_OPTIONAL: Mapping[str, str] = {
    "flashinfer-python": _KERNEL + "; when present vLLM picks FlashInfer backends (sampler, "
    "GDN prefill on sm_90), which the kit's measured H200 runs did not use",
    "humming-kernels": _KERNEL + " (brings the CUDA compiler packages)",
    "nvidia-cudnn-frontend": _KERNEL,
    "nvidia-cutlass-dsl": _KERNEL + " (CUTLASS DSL libraries for CUDA 12 and 13)",
    "quack-kernels": _KERNEL,
    "tilelang": _KERNEL + " (brings z3-solver)",
    "tokenspeed-mla": _KERNEL + " (brings its own Triton build)",
    "fastsafetensors": "optional weight loader (load_format=fastsafetensors)",
    "pynvvideocodec": _CODEC,
    "torchcodec": _CODEC,
}
# Host packages a wheel's compiled code is built against: keeping the host's version against
# the closure would ship a vLLM whose kernels cannot load there (vLLM 0.32.0 pins
# torch==2.13.0; the lent GPU hosts have 2.11.0), so such an override is refused.
ABI_BOUND: Mapping[str, str] = {
    "torch": "vLLM's compiled kernels are built against exactly the torch it pins",
}
# uv settings kept from the environment: how to reach the network, where to cache.
_UV_KEEP = {"UV_CACHE_DIR", "UV_HTTP_TIMEOUT", "UV_NATIVE_TLS", "UV_CONCURRENT_DOWNLOADS"}


@dataclass(frozen=True)
class LockedWheel:
    url: str
    sha256: str
    size: int | None

    @property
    def filename(self) -> str:
        return unquote(urlsplit(self.url).path.rsplit("/", 1)[-1])


@dataclass(frozen=True)
class Locked:
    """A package at the version uv chose, with the wheels of that version the host can run."""

    name: str
    version: str
    wheels: tuple[LockedWheel, ...]

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)

    @property
    def size(self) -> int:
        """The largest of its wheels (the one installed is one of them)."""
        return max((w.size or 0 for w in self.wheels), default=0)

    @property
    def is_stub(self) -> bool:
        return self.version.endswith(STUB_LABEL)


def stub_version(version: str | None) -> str | None:
    """The stub's version: the host's, with the local label ``+installset.host`` added."""
    if not version:
        return None
    return f"{version}{'.' if '+' in version else '+'}{STUB_LABEL}"


def write_stub_wheel(
    directory: Path,
    name: str,
    version: str,
    *,
    tag: str = "py3-none-any",
    requires: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
) -> Path:
    """A valid wheel of metadata (and ``files``) only; by default one standing for a package
    the host has: no files, no dependencies, any platform."""
    dist = canonicalize_name(name).replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: repro.installset\n"
        f"Root-Is-Purelib: {str(tag.endswith('-none-any')).lower()}\nTag: {tag}\n",
        **(files or {}),
    }
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"])
    path = directory / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
    return path


def parse_pylock(text: str) -> list[Locked]:
    """The packages of a PEP 751 lock file (host stubs included: their version says so)."""
    out = []
    for pkg in tomllib.loads(text).get("packages", []):
        wheels = tuple(
            LockedWheel(w["url"], w.get("hashes", {}).get("sha256", ""), w.get("size"))
            for w in pkg.get("wheels", [])
        )
        if not wheels:
            raise InstallSetError(f"uv locked {pkg['name']} {pkg.get('version')} with no wheel")
        out.append(Locked(pkg["name"], pkg["version"], wheels))
    return out


@functools.cache
def tag_priority(target: Target) -> dict[tags.Tag, int]:
    """Every tag the target runs, best first (packaging's order, as pip's)."""
    version = tuple(int(x) for x in target.python_minor.split("."))
    ordered = [*tags.cpython_tags(version, platforms=list(target.platforms))]
    ordered += tags.compatible_tags(version, target.python_tag, target.platforms)
    return {tag: rank for rank, tag in reversed(list(enumerate(ordered)))}  # a tag's best rank


def choose_wheel(pkg: Locked, target: Target) -> LockedWheel:
    """The wheel of ``pkg`` pip would install on ``target`` (its best-ranked tag)."""
    priority, ranked = tag_priority(target), []
    for wheel in pkg.wheels:
        ranks = [priority[t] for t in parse_wheel_filename(wheel.filename)[3] if t in priority]
        if ranks:
            ranked.append((min(ranks), wheel.filename, wheel))
    if not ranked:
        listed = ", ".join(w.filename for w in pkg.wheels)
        raise InstallSetError(
            f"{pkg.name} {pkg.version}: no wheel fits Python {target.python} on "
            f"{target.platforms[0]} (the index lists {listed})"
        )
    return min(ranked)[2]


class UvFailed(InstallSetError):
    """uv gave no lock; the message is uv's own explanation."""


def find_uv(explicit: str | None = None) -> str:
    """``--uv PATH``, else ``uv`` on PATH, else the ``uv`` Python package's binary."""
    if explicit or (explicit := shutil.which("uv")) or (explicit := installer.find_uv()):
        return explicit
    raise InstallSetError(
        "the build resolves with uv, which is not installed here: "
        f"`{sys.executable} -m pip install uv` (or pass --uv PATH)"
    )


def uv_platform(target: Target) -> str:
    """uv's ``--python-platform`` for the target's first (newest) tag."""
    tag, machine = target.platforms[0], target.machine
    if tag.startswith("manylinux_"):
        return f"{machine}-{tag[: -len(machine) - 1]}"
    legacy = tag.startswith("manylinux")
    return f"{machine}-manylinux2014" if legacy else f"{machine}-unknown-linux-gnu"


@dataclass
class UvCompiler:
    """``uv pip compile`` for the target, into a PEP 751 lock."""

    target: Target
    uv: str = ""
    index_url: str = DEFAULT_INDEX
    extra_index_urls: tuple[str, ...] = ()
    exclude_newer: str | None = None

    def compile(
        self,
        requirements: Sequence[str],
        *,
        constraints: Sequence[str] = (),
        overrides: Sequence[str] = (),
        excludes: Sequence[str] = (),
        find_links: Sequence[str] = (),
    ) -> list[Locked]:
        with tempfile.TemporaryDirectory(prefix="installset-uv-") as tmp:
            cmd = [self.uv or find_uv(), "pip", "compile", "--no-config", "--quiet"]
            cmd += ["--no-python-downloads", "--python-version", self.target.python]
            cmd += ["--python-platform", uv_platform(self.target), "--only-binary", ":all:"]
            cmd += ["--index-url", self.index_url, "--format", "pylock.toml"]
            cmd += [f"--extra-index-url={url}" for url in self.extra_index_urls]
            cmd += [f"--find-links={link}" for link in find_links]
            cmd += ["--exclude-newer", self.exclude_newer] if self.exclude_newer else []
            files = {"constraint": constraints, "overrides": overrides, "excludes": excludes}
            for option, lines in [*files.items(), ("", requirements)]:
                path = Path(tmp) / f"{option or 'requirements'}.txt"
                path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
                cmd += [f"--{option}", str(path)] if option else [str(path)]
            cmd += ["--output-file", str(Path(tmp) / "pylock.toml")]
            env = {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in _UV_KEEP}
            proc = subprocess.run(cmd, env=env | {"NO_COLOR": "1"}, capture_output=True, text=True)
            if proc.returncode != 0:
                raise UvFailed((proc.stderr or proc.stdout).strip())
            return parse_pylock((Path(tmp) / "pylock.toml").read_text(encoding="utf-8"))


@dataclass
class Resolution:
    """uv's answer, and what it took to get it."""

    root: Locked
    packages: list[Locked]  # the root first, then by name; no host package
    host_used: list[tuple[str, str]] = field(default_factory=list)  # (name, host version)
    overrides: list[str] = field(default_factory=list)  # host packages kept against the closure
    excluded: dict[str, str] = field(default_factory=dict)  # name -> reason
    excluded_closure: list[Locked] = field(default_factory=list)  # what the exclusions saved
    rounds: int = 0  # uv runs

    @property
    def wheel_bytes(self) -> int:
        return sum(p.size for p in self.packages)


def fewest(candidates: Sequence[str], solves: Callable[[list[str]], bool]) -> list[str]:
    """A subset of ``candidates`` that ``solves`` and from which no single member can be left
    out (delta debugging: leave out whole chunks first, halve the chunks when none can go)."""
    keep, chunks = list(candidates), 2
    while keep:
        size = -(-len(keep) // chunks)
        for start in range(0, len(keep), size):
            trial = keep[:start] + keep[start + size :]
            if solves(trial):
                keep, chunks = trial, max(chunks - 1, 2)
                break
        else:
            if size == 1:
                break
            chunks = min(len(keep), chunks * 2)
    return keep


def resolve(
    root: str,
    host: HostEnv,
    compiler: UvCompiler,
    *,
    exclude: Mapping[str, str] | None = None,
    measure_excluded: bool = True,
    log: Callable[[str], None] = lambda _msg: None,
) -> Resolution:
    """Resolve ``root`` for the compiler's target; see the module docstring."""
    root_key = canonicalize_name(Requirement(root).name)
    if root_key in host.packages:
        raise InstallSetError(f"the host already has {root_key}; there is nothing to ship")
    excludes = {canonicalize_name(n): why for n, why in (exclude or {}).items()}
    answers: dict[tuple[frozenset[str], bool], list[Locked] | None] = {}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="installset-stubs-") as stubs:
        pins = {}
        for key, pkg in sorted(host.packages.items()):
            if version := stub_version(pkg.version):  # a direct reference: uv sees the real one
                write_stub_wheel(Path(stubs), pkg.name, version)
                pins[key] = f"{pkg.name}=={version}"

        def attempt(overridden: Sequence[str], excluding: bool = True) -> list[Locked] | None:
            key = (frozenset(overridden), excluding)
            if key not in answers:
                try:
                    answers[key] = compiler.compile(
                        [root],
                        constraints=[pin for k, pin in pins.items() if k not in key[0]],
                        overrides=[pins[k] for k in sorted(key[0])],
                        excludes=sorted(excludes) if excluding else (),
                        find_links=[stubs],
                    )
                except UvFailed as exc:
                    answers[key], failures[:] = None, [str(exc)]
            return answers[key]

        log(f"resolving {root} with uv, the host's {len(pins)} packages kept")
        overrides: list[str] = []
        if (locked := attempt(())) is None:
            if (everything := attempt(list(pins))) is None:
                raise InstallSetError(
                    f"no solution for {root} on this host, even with every host package kept "
                    f"at the host's version; uv says:\n{failures[0]}"
                )
            used = sorted(p.key for p in everything if p.is_stub)
            log(f"the host's versions conflict with the closure; finding which of {len(used)}")
            overrides = fewest(used, lambda trial: attempt(trial) is not None)
            log(f"kept at the host's version against the closure: {', '.join(overrides)}")
            if bound := [k for k in overrides if k in ABI_BOUND]:
                held = ", ".join(f"{k} {host.packages[k].version}" for k in bound)
                raise InstallSetError(
                    f"{root} needs another {', '.join(bound)} than the host's {held}: uv "
                    f"solves it only by keeping the host's version, and {ABI_BOUND[bound[0]]}, "
                    "so the set would install a vLLM that cannot run on this host. Build a set "
                    "for a release that pins the host's version (its wheel's Requires-Dist), "
                    "or put the pinned version on the host first"
                )
            locked = attempt(overrides)
        assert locked is not None  # `fewest` returns only answers uv solved
        full = []
        if excludes and measure_excluded:
            log("measuring the full closure (what the exclusions leave out)")
            full = attempt(overrides, excluding=False) or []
    by_key = {p.key: p for p in locked if not p.is_stub}  # uv's lock holds the root it solved
    packages = [by_key.pop(root_key)] + [by_key[k] for k in sorted(by_key)]
    kept = {p.key for p in locked}
    return Resolution(
        root=packages[0],
        packages=packages,
        host_used=sorted(
            (p.key, host.packages[p.key].version or "") for p in locked if p.key in pins
        ),
        overrides=sorted(overrides),
        excluded=dict(sorted(excludes.items())),
        excluded_closure=sorted(
            (p for p in full if p.key not in kept and not p.is_stub), key=lambda p: p.key
        ),
        rounds=len(answers),
    )
