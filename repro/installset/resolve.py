"""The dependency closure of a requirement for another host, with the host's packages fixed.

uv resolves (``uv pip compile``: backtracking, ``--python-platform`` so that environment
markers are the host's, and a pylock file with every wheel's URL, size and sha256). pip
cannot do this job alone: it evaluates markers with the interpreter it runs on, and it has
no overrides.

Host packages are *stubs*: an empty local wheel per package the host has, at the host's
version with the local label ``+installset.host``, forced by a constraint. uv therefore never
resolves the host's own dependency trees (torch's CUDA libraries are the host's business) and
keeps what it picks compatible with the host's versions where it can (it backtracks a package
that wants another numpy).

Where it cannot, the set needs *override* semantics: vLLM 0.26.0 pins ``numba==0.65.0`` and
``setuptools<81`` (the H200 host has 0.68.0 and 81.0.0) and its dependencies want
``protobuf<7`` and ``numpy<2.4``. The host's package is used at the host's version
whatever the requirement says (the set must never shadow the host's numba or numpy): when uv
reports a conflict that names a stub, that host package moves from the constraints to the
overrides and uv runs again. Every mismatch is recorded (see ``graph.target_walk``).

``exclude`` removes packages from the resolution with everything only they need (uv's
``--excludes``). For vLLM, ``VLLM_OPTIONAL`` names the optional GPU-kernel and codec libraries that
``from vllm import LLM`` does not import (docs/measured.md, §GPU hosts: the H200 run worked without
them). Their presence would change vLLM's backend choices, and they are most of the closure's size.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from repro.installset import InstallSetError
from repro.installset.hostenv import HostEnv, canonical_name
from repro.installset.pipcmd import DEFAULT_INDEX
from repro.installset.target import Target

__all__ = [
    "STUB_LABEL",
    "VLLM_OPTIONAL",
    "Locked",
    "LockedWheel",
    "Resolution",
    "UvCompiler",
    "UvConflict",
    "conflict_names",
    "find_uv",
    "parse_pylock",
    "resolve",
    "stub_version",
    "write_stub_wheel",
]

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


# --- stubs for the host's packages ----------------------------------------------------------


def stub_version(version: str | None) -> str | None:
    """The stub's version: the host's, with the local label ``+installset.host`` added."""
    if version is None or not re.fullmatch(r"[A-Za-z0-9.!+_-]+", version):
        return None
    public, _, local = version.partition("+")
    return f"{public}+{local}.{STUB_LABEL}" if local else f"{public}+{STUB_LABEL}"


def write_stub_wheel(directory: Path, name: str, version: str) -> Path:
    """An empty, valid wheel standing for a package the host has (no files, no deps)."""
    dist = canonical_name(name).replace("-", "_")
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


def is_stub(version: str) -> bool:
    return version.endswith(STUB_LABEL)


# --- the lock uv writes ----------------------------------------------------------------------


@dataclass(frozen=True)
class LockedWheel:
    url: str
    sha256: str
    size: int | None

    @property
    def filename(self) -> str:
        from urllib.parse import unquote, urlsplit

        return unquote(urlsplit(self.url).path.rsplit("/", 1)[-1])


@dataclass(frozen=True)
class Locked:
    """A package at the version uv chose, with the wheels of that version the host can run."""

    name: str
    version: str
    wheels: tuple[LockedWheel, ...]

    @property
    def key(self) -> str:
        return canonical_name(self.name)

    @property
    def size(self) -> int:
        """The largest of its wheels (the one pip downloads is one of them)."""
        return max((w.size or 0 for w in self.wheels), default=0)

    @property
    def sha256s(self) -> set[str]:
        return {w.sha256 for w in self.wheels}


def parse_pylock(text: str) -> list[Locked]:
    """The packages of a PEP 751 lock file, without the host stubs."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError as exc:
            raise InstallSetError(
                "reading uv's lock file needs Python 3.11+ (tomllib) or `pip install tomli`"
            ) from exc
    doc = tomllib.loads(text)
    out = []
    for pkg in doc.get("packages", []):
        if is_stub(pkg.get("version", "")):
            continue
        wheels = tuple(
            LockedWheel(w["url"], w.get("hashes", {}).get("sha256", ""), w.get("size"))
            for w in pkg.get("wheels", [])
        )
        if not wheels:
            raise InstallSetError(f"uv locked {pkg['name']} {pkg.get('version')} with no wheel")
        out.append(Locked(pkg["name"], pkg["version"], wheels))
    return out


# --- uv --------------------------------------------------------------------------------------


class UvConflict(InstallSetError):
    """uv found no solution; the message is uv's own explanation."""


def find_uv(explicit: str | None = None) -> str:
    """``--uv PATH``, else ``uv`` on PATH, else the ``uv`` Python package's binary."""
    if explicit:
        return explicit
    found = shutil.which("uv")
    if found:
        return found
    try:
        import uv  # type: ignore[import-not-found]

        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        pass
    raise InstallSetError(
        "the build resolves with uv, which is not installed here: "
        f"`{sys.executable} -m pip install uv` (or pass --uv PATH)"
    )


# uv settings kept from the environment: how to reach the network and where to cache.
_KEEP_UV = {"UV_CACHE_DIR", "UV_HTTP_TIMEOUT", "UV_NATIVE_TLS", "UV_CONCURRENT_DOWNLOADS"}


def uv_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in _KEEP_UV}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    env["NO_COLOR"] = "1"
    return env


def uv_platform(target: Target) -> str:
    """uv's ``--python-platform`` for the target's first (newest) tag."""
    tag = target.platforms[0]
    if match := re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag):
        return f"{match[3]}-manylinux_{match[1]}_{match[2]}"
    if match := re.fullmatch(r"manylinux(2014|2010|1)_(\w+)", tag):
        return f"{match[2]}-manylinux2014"
    return f"{target.machine}-unknown-linux-gnu"


@dataclass
class UvCompiler:
    """``uv pip compile`` for the target, the host's packages as stubs."""

    target: Target
    uv: str = ""
    index_url: str = DEFAULT_INDEX
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    exclude_newer: str | None = None
    calls: int = 0

    def compile(
        self,
        requirements: Sequence[str],
        host: HostEnv,
        *,
        overrides: set[str] = frozenset(),  # type: ignore[assignment]
        excludes: set[str] = frozenset(),  # type: ignore[assignment]
        constraints: Sequence[str] = (),
        override_pins: Sequence[str] = (),
    ) -> list[Locked]:
        """``constraints`` and ``override_pins``: extra ``name==version`` lines for real
        packages (not stubs), as constraints and as overrides."""
        self.calls += 1
        uv = self.uv or find_uv()
        with tempfile.TemporaryDirectory(prefix="installset-uv-") as tmp:
            work = Path(tmp)
            stubs = work / "stubs"
            stubs.mkdir()
            constrained, overridden = list(constraints), list(override_pins)
            for key, pkg in sorted(host.packages.items()):
                version = stub_version(pkg.version)
                if version is None:
                    continue  # a direct reference: uv sees the real package
                write_stub_wheel(stubs, pkg.name, version)
                (overridden if key in overrides else constrained).append(f"{pkg.name}=={version}")
            files = {
                "requirements.in": list(requirements),
                "constraints.txt": constrained,
                "overrides.txt": overridden,
                "excludes.txt": sorted(excludes),
            }
            for name, lines in files.items():
                (work / name).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
            cmd = [uv, "pip", "compile", "--no-config", "--no-python-downloads", "--quiet"]
            cmd += ["--python-version", self.target.python]
            cmd += ["--python-platform", uv_platform(self.target), "--only-binary", ":all:"]
            cmd += ["--index-url", self.index_url]
            for url in self.extra_index_urls:
                cmd += ["--extra-index-url", url]
            for link in [*self.find_links, str(stubs)]:
                cmd += ["--find-links", link]
            cmd += ["--constraint", str(work / "constraints.txt")]
            if overridden:
                cmd += ["--overrides", str(work / "overrides.txt")]
            if excludes:
                cmd += ["--excludes", str(work / "excludes.txt")]
            if self.exclude_newer:
                cmd += ["--exclude-newer", self.exclude_newer]
            cmd += ["--format", "pylock.toml", "--output-file", str(work / "pylock.toml")]
            cmd += [str(work / "requirements.in")]
            proc = subprocess.run(
                cmd, env=uv_environment(), capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                message = (proc.stderr or proc.stdout).strip()
                if "No solution found" in message:
                    raise UvConflict(message)
                raise InstallSetError(f"uv pip compile failed (exit {proc.returncode}):\n{message}")
            return parse_pylock((work / "pylock.toml").read_text(encoding="utf-8"))


_STUB_PIN = re.compile(
    r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==[^\s,;]*\+[^\s,;]*" + re.escape(STUB_LABEL)
)
_ANY_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(?:===?|>=|<=|!=|~=|<|>)")


def conflict_names(message: str, host: HostEnv) -> set[str]:
    """The host packages (canonical names) a uv conflict report holds against the stubs.

    First the stubs named with their pinned version (``numba==0.68.0+installset.host``);
    if uv phrased it otherwise, every host package the report names with a specifier.
    """
    named = {canonical_name(m) for m in _STUB_PIN.findall(message)}
    if not named:
        named = {canonical_name(m) for m in _ANY_PIN.findall(message)}
    return {n for n in named if n in host.packages}


# --- the resolution --------------------------------------------------------------------------


@dataclass
class Resolution:
    """uv's answer, and what it took to get it."""

    root: Locked
    packages: list[Locked]  # the root first, then by name; no host package
    overrides: list[str] = field(default_factory=list)  # host packages that needed overriding
    excluded: dict[str, str] = field(default_factory=dict)  # name -> reason
    excluded_closure: list[Locked] = field(default_factory=list)  # what the exclusions saved
    rounds: int = 0  # uv runs, the measuring one included

    @property
    def wheel_bytes(self) -> int:
        return sum(p.size for p in self.packages)


def resolve(
    root: str,
    host: HostEnv,
    compiler: UvCompiler,
    *,
    exclude: Mapping[str, str] | None = None,
    measure_excluded: bool = True,
    max_rounds: int = 30,
    log=None,
) -> Resolution:
    """Resolve ``root`` for the compiler's target; see the module docstring."""
    say = log or (lambda _msg: None)
    root_name = canonical_name(re.split(r"[\[<>=!~;@ ]", root.strip(), maxsplit=1)[0])
    if root_name in host.packages:
        raise InstallSetError(f"the host already has {root_name}; there is nothing to ship")
    excludes = {canonical_name(n): why for n, why in (exclude or {}).items()}
    overrides: set[str] = set()

    def run(excl: set[str], overrides: set[str]) -> list[Locked]:
        for round_no in range(1, max_rounds + 1):
            try:
                locked = compiler.compile([root], host, overrides=overrides, excludes=excl)
            except UvConflict as exc:
                names = conflict_names(str(exc), host) - overrides
                if not names:
                    raise InstallSetError(
                        f"no solution for {root} on this host, and the conflict names no host "
                        f"package to override:\n{exc}"
                    ) from exc
                say(
                    f"round {round_no}: keeping the host's {', '.join(sorted(names))} "
                    "against what the closure asks (recorded)"
                )
                overrides.update(names)
                continue
            return locked
        raise InstallSetError(f"the resolution did not settle in {max_rounds} rounds")

    say(f"resolving {root} with uv, host packages fixed")
    locked = run(set(excludes), overrides)
    by_key = {p.key: p for p in locked}
    if root_name not in by_key:
        raise InstallSetError(f"uv's lock does not contain {root_name}")
    packages = [by_key[root_name]] + sorted(
        (p for p in locked if p.key != root_name), key=lambda p: p.key
    )
    saved: list[Locked] = []
    if excludes and measure_excluded:
        say("measuring the full closure (what the exclusions leave out)")
        full = run(set(), set(overrides))
        saved = sorted((p for p in full if p.key not in by_key), key=lambda p: p.key)
    return Resolution(
        root=packages[0],
        packages=packages,
        overrides=sorted(overrides),
        excluded=dict(sorted(excludes.items())),
        excluded_closure=saved,
        rounds=compiler.calls,
    )
