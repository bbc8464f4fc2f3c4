"""The closure of a requirement for another host, the host's own packages kept, resolved by uv.

uv resolves (``uv pip compile``: backtracking, ``--python-platform`` so that environment
markers are the host's, and a PEP 751 lock listing every wheel's URL, size and sha256). pip
cannot do this alone: it evaluates markers with the interpreter it runs on, and has no
overrides.

Host packages are *stubs*: an empty wheel per package the host has, at the host's version
with the local label ``+installset.host``. uv therefore never resolves the host's own
dependency trees (torch's CUDA libraries are the host's business), and a stub in the lock
says the closure uses that host package. Each stub is either a *constraint* (uv keeps what it
picks compatible with the host's version where it can, backtracking a package that wants
another numpy) or an *override* (the host's version whatever the closure asks: vLLM 0.26.0
pins ``numba==0.65.0`` and ``setuptools<81``, the H200 host has 0.68.0 and 81.0.0). The set
must never shadow a host package, so where constraints leave uv no answer, the fewest host
packages the closure uses are overridden: found by uv's answers alone (exit status and
lock), never by reading its messages, and recorded.

``exclude`` removes packages and what only they need (uv's ``--excludes``). For vLLM,
``VLLM_OPTIONAL`` names the optional GPU-kernel and codec libraries that ``from vllm import
LLM`` does not import (docs/measured.md, §GPU hosts: the H200 run worked without them); they
would change vLLM's backend choices, and they are most of the closure's size.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import tomllib
from packaging import tags
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from repro.installset import InstallSetError
from repro.installset.host import HostEnv, Target
from repro.installset.pipcmd import DEFAULT_INDEX

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


def stub_version(version: str | None) -> str | None:
    """The stub's version: the host's, with the local label ``+installset.host`` added."""
    if not version:
        return None
    public, _, local = version.partition("+")
    return f"{public}+{local}.{STUB_LABEL}" if local else f"{public}+{STUB_LABEL}"


def write_stub_wheel(directory: Path, name: str, version: str) -> Path:
    """An empty, valid wheel standing for a package the host has (no files, no deps)."""
    dist = canonicalize_name(name).replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: repro.installset\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"])
    path = directory / f"{dist}-{version}-py3-none-any.whl"
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


# --- choosing one wheel, as pip does ------------------------------------------------------------


def tag_priority(target: Target) -> dict[tags.Tag, int]:
    """Every tag the target runs, best first (packaging's order, as pip's)."""
    version = tuple(int(x) for x in target.python_minor.split("."))
    ordered = [*tags.cpython_tags(version, platforms=list(target.platforms))]
    ordered += tags.compatible_tags(version, f"cp{version[0]}{version[1]}", target.platforms)
    priority: dict[tags.Tag, int] = {}
    for rank, tag in enumerate(ordered):
        priority.setdefault(tag, rank)
    return priority


def choose_wheel(pkg: Locked, target: Target, priority: Mapping | None = None) -> LockedWheel:
    """The wheel of ``pkg`` pip would install on ``target`` (its best-ranked tag)."""
    priority = priority if priority is not None else tag_priority(target)
    ranked = []
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


# --- uv -----------------------------------------------------------------------------------------


class UvFailed(InstallSetError):
    """uv gave no lock; the message is uv's own explanation."""


def find_uv(explicit: str | None = None) -> str:
    """``--uv PATH``, else ``uv`` on PATH, else the ``uv`` Python package's binary."""
    if explicit or (explicit := shutil.which("uv")):
        return explicit
    try:
        import uv  # type: ignore[import-not-found]

        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        raise InstallSetError(
            "the build resolves with uv, which is not installed here: "
            f"`{sys.executable} -m pip install uv` (or pass --uv PATH)"
        ) from None


def uv_platform(target: Target) -> str:
    """uv's ``--python-platform`` for the target's first (newest) tag."""
    tag = target.platforms[0]
    if tag.startswith("manylinux_"):
        return f"{target.machine}-{tag[: -len(target.machine) - 1]}"
    if tag.startswith("manylinux"):
        return f"{target.machine}-manylinux2014"
    return f"{target.machine}-unknown-linux-gnu"


@dataclass
class UvCompiler:
    """``uv pip compile`` for the target, into a PEP 751 lock."""

    target: Target
    uv: str = ""
    index_url: str = DEFAULT_INDEX
    extra_index_urls: tuple[str, ...] = ()
    exclude_newer: str | None = None
    calls: int = 0

    def compile(
        self,
        requirements: Sequence[str],
        *,
        constraints: Sequence[str] = (),
        overrides: Sequence[str] = (),
        excludes: Sequence[str] = (),
        find_links: Sequence[str] = (),
    ) -> list[Locked]:
        self.calls += 1
        with tempfile.TemporaryDirectory(prefix="installset-uv-") as tmp:
            work = Path(tmp)
            cmd = [self.uv or find_uv(), "pip", "compile", "--no-config", "--quiet"]
            cmd += ["--no-python-downloads", "--python-version", self.target.python]
            cmd += ["--python-platform", uv_platform(self.target), "--only-binary", ":all:"]
            cmd += ["--index-url", self.index_url, "--format", "pylock.toml"]
            cmd += [f"--extra-index-url={url}" for url in self.extra_index_urls]
            cmd += [f"--find-links={link}" for link in find_links]
            if self.exclude_newer:
                cmd += ["--exclude-newer", self.exclude_newer]
            for option, lines in [
                ("--constraint", constraints),
                ("--overrides", overrides),
                ("--excludes", excludes),
                (None, requirements),
            ]:
                path = work / f"{option or 'requirements'}.txt".lstrip("-")
                path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
                cmd += [option, str(path)] if option else [str(path)]
            cmd += ["--output-file", str(work / "pylock.toml")]
            # uv settings kept from the environment: how to reach the network, where to cache.
            keep = {"UV_CACHE_DIR", "UV_HTTP_TIMEOUT", "UV_NATIVE_TLS", "UV_CONCURRENT_DOWNLOADS"}
            env = {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in keep}
            env["NO_COLOR"] = "1"
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise UvFailed((proc.stderr or proc.stdout).strip())
            return parse_pylock((work / "pylock.toml").read_text(encoding="utf-8"))


# --- the resolution -----------------------------------------------------------------------------


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
        locked = attempt(())
        if locked is None:
            everything = attempt(list(pins))
            if everything is None:
                raise InstallSetError(
                    f"no solution for {root} on this host, even with every host package kept "
                    f"at the host's version; uv says:\n{failures[0]}"
                )
            used = sorted(p.key for p in everything if p.version.endswith(STUB_LABEL))
            log(f"the host's versions conflict with the closure; finding which of {len(used)}")
            overrides = fewest(used, lambda trial: attempt(trial) is not None)
            log(f"kept at the host's version against the closure: {', '.join(overrides)}")
            locked = attempt(overrides)
        assert locked is not None  # `fewest` returns only answers uv solved
        saved: list[Locked] = []
        if excludes and measure_excluded:
            log("measuring the full closure (what the exclusions leave out)")
            full = attempt(overrides, excluding=False) or []
            kept = {p.key for p in locked}
            saved = sorted((p for p in full if p.key not in kept), key=lambda p: p.key)
    by_key = {p.key: p for p in locked if not p.version.endswith(STUB_LABEL)}
    if root_key not in by_key:
        raise InstallSetError(f"uv's lock does not contain {root_key}")
    packages = [by_key.pop(root_key)] + [by_key[k] for k in sorted(by_key)]
    host_used = [(p.key, host.packages[p.key].version or "") for p in locked if p.key in pins]
    return Resolution(
        root=packages[0],
        packages=packages,
        host_used=sorted(host_used),
        overrides=sorted(overrides),
        excluded=dict(sorted(excludes.items())),
        excluded_closure=[p for p in saved if not p.version.endswith(STUB_LABEL)],
        rounds=compiler.calls,
    )
