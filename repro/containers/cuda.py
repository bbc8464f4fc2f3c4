"""The kit's CUDA image: vLLM at a ref, every Python package from one wheel lock.

What goes in, all pinned and all recorded (labels and ``artifacts/images/<tag>.json``):

- the base: ``nvidia/cuda`` by digest (containers/base-images.json) where a registry is
  reachable, else the kit's local Ubuntu base (`python -m repro base-image --recipe
  ubuntu-noble`), by image id. CUDA's user-space libraries come from torch's ``nvidia-*``
  wheels in both cases (the lock holds them); only the driver comes from the GPU host.
- the wheels: the lock (repro/installset/lock.py) as a hash-checking requirements file, so
  pip installs exactly those files. From a wheelhouse (`cuda-wheelhouse`) they are served to
  the build by a wheel server on this host's loopback, with no index at all; otherwise pip
  fetches them from the lock's index, still checked by hash.
- vLLM at the ref: a release (PyPI), a main commit (upstream's per-commit wheel index,
  https://wheels.vllm.ai/<commit>/<variant>), and Python-only ``--patch`` overlays on either.
- the kit, as a wheel built here from the checkout.

A failed build leaves no tag: the legacy builder tags only a finished image, and an image that
fails the in-image check afterwards is untagged again before the error is raised.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from repro import machine_facts
from repro.containers import base as base_mod
from repro.containers import build as build_mod
from repro.containers import labels as label_keys
from repro.containers import pins as pins_mod
from repro.containers.imagecheck import ImageCheckFailed, check_image
from repro.containers.refs import VllmRef, parse_vllm_ref
from repro.core.atomicio import sha256_file
from repro.core.errors import ReproError
from repro.installset.host import Target, python_tag
from repro.installset.lock import FORMAT, ORIGINS, locked_packages, read_lock
from repro.venv import patching, pip_settings

DOCKERFILE = build_mod.REPO / "containers" / "cuda.Dockerfile"
DEFAULT_VARIANT = "cu130"
# The Python of the CUDA image and of its wheel lock (the lent H200 host's).
LOCK_PYTHON = "3.12"
# The lock's index for main commits. REPRO_VLLM_WHEELS_URL replaces the server (tests point it
# at a stand-in served from files; the real one cannot be reached from the kit's machines).
WHEELS_SERVER = "https://wheels.vllm.ai"
# A fixed port: the wheel server's URL is in the context's pip.conf, and a new URL each build
# would defeat the layer cache.
WHEEL_SERVER_PORT = 47391
LABEL_MARKER = "# REPRO-LABELS (the kit puts one LABEL instruction here)"
LOCKS_DIR = build_mod.REPO / "containers" / "locks"
# Disk a build needs, per byte of locked wheels: the install step's container (about twice
# the wheels installed) and, while it commits, the new layer's copy of it under vfs. Measured
# 4.7 for 0.32.0 (docs/cuda-image.md, §Measured).
DISK_PER_WHEEL_BYTE = 5.0


class CudaBuildError(ReproError):
    """The CUDA image cannot be built as asked."""


class CommitHasNoWheel(CudaBuildError):
    """Upstream's per-commit index has no wheel for the commit and variant."""


class CommitIndexUnreachable(CommitHasNoWheel):
    """Upstream's per-commit index cannot be asked (no network to it): the wheel is unknown."""


class BaseDigestMismatch(CudaBuildError):
    """The base image here is not the one base-images.json pins."""


class NotEnoughDisk(CudaBuildError):
    """The Docker host has less free disk than the build needs."""


# --- what vLLM is -------------------------------------------------------------------------------


@dataclass(frozen=True)
class VllmSource:
    ref: VllmRef
    requirement: str  # the lock's root
    extra_index_urls: tuple[str, ...] = ()

    def as_record(self) -> dict[str, Any]:
        return {
            "ref": self.ref.value,
            "kind": self.ref.kind,
            "requirement": self.requirement,
            "extra_index_urls": list(self.extra_index_urls),
        }


def commit_index_url(commit: str, variant: str = DEFAULT_VARIANT) -> str:
    server = os.environ.get("REPRO_VLLM_WHEELS_URL", WHEELS_SERVER).rstrip("/")
    return f"{server}/{commit}/{variant}"


def vllm_source(ref_text: str, variant: str = DEFAULT_VARIANT, *, probe: bool = True):
    """The lock root for ``ref_text``; a commit's index is probed so a missing wheel is named."""
    ref = parse_vllm_ref(ref_text)
    if ref.kind == "release":
        return VllmSource(ref, f"vllm=={ref.value}")
    if ref.kind == "commit":
        index = commit_index_url(ref.value, variant)
        if probe:
            _probe_commit_index(index, ref.value, variant)
        return VllmSource(ref, "vllm", (index,))
    raise CudaBuildError(
        f"vLLM ref {ref.value!r} is a branch or PR name; the CUDA image takes a release or a "
        f"40-hex main commit. For a PR, build its merge base (a main commit, or the release "
        f"it is based on) with the PR's diff as --patch FILE (Python-only files)"
    )


def _probe_commit_index(index: str, commit: str, variant: str) -> None:
    url = f"{index}/vllm/"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        raise CommitHasNoWheel(
            f"no {variant} wheel for vLLM commit {commit}: {url} answered {exc.code}. Upstream "
            f"builds wheels for commits merged into main (not for PR heads, and a commit's "
            f"variants other than the default only on demand); check the sha "
            f"(`git rev-parse`), or build a release with --patch"
        ) from exc
    except OSError as exc:
        raise CommitIndexUnreachable(
            f"vLLM's per-commit wheel index {url} cannot be reached ({exc}); building a "
            f"commit needs it (or REPRO_VLLM_WHEELS_URL naming a copy)"
        ) from exc
    if ".whl" not in body:
        raise CommitHasNoWheel(f"{url} lists no wheel for vLLM commit {commit} ({variant})")


# --- the base -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CudaBase:
    kind: str  # "registry" | "local"
    name: str
    id: str
    python: str
    digest: str | None  # the registry digest (registry kind)
    why: str  # why this base was chosen

    @property
    def cuda_source(self) -> str:
        if self.kind == "registry":
            return f"{self.name} plus torch's nvidia-* wheels"
        return "torch's nvidia-* wheels (the local base has no CUDA)"


def choose_base(client, *, variant: str, base: str, pins: dict[str, Any], log=print) -> CudaBase:
    """``base``: "auto", "registry", "local", or an image tag/id used as given (local kind)."""
    if base in ("auto", "registry"):
        try:
            pin = pins_mod.cuda_base(pins, variant)
        except pins_mod.PinError as exc:
            if base == "registry":
                raise
            why = f"no registry base: {exc}"
        else:
            image = _registry_image(client, pin, log)
            if image is not None:
                _check_digest(image, pin)
                return CudaBase(
                    "registry", pin["reference"], image.id, pin["python"], pin["digest"], "pinned"
                )
            if base == "registry":
                raise CudaBuildError(
                    f"{pin['reference']} is not here and cannot be pulled; no registry is "
                    f"reachable. Build on the local base instead (--base local)"
                )
            why = f"{pin['reference']} could not be pulled (no registry reachable)"
        log(f"[repro] {why}; using the local base")
        base = "local"
    if base == "local":
        tag, recipe = base_mod.RECIPES["ubuntu-noble"]
        made = base_mod.ensure_base_image(client, tag=tag, recipe=recipe, log=log)
        image = client.images.get(made.id)
        return CudaBase("local", tag, image.id, _python_of(client, image.id), None, "local")
    next_step = "leave --base out (the kit picks or makes one)"
    image = build_mod.local_base(client, base, next_step=next_step, error=CudaBuildError)
    return CudaBase("local", base, image.id, _python_of(client, image.id), None, "given")


def _registry_image(client, pin: dict[str, str], log):
    # lazy: docker-py, needed only where a Docker daemon is used
    import docker

    reference = f"{pin['image']}@{pin['digest']}"
    try:
        return client.images.get(reference)
    except docker.errors.ImageNotFound:
        pass
    try:
        tagged = client.images.get(f"{pin['image']}:{pin['tag']}")
    except docker.errors.ImageNotFound:
        tagged = None
    if tagged is not None:
        return tagged  # present under its tag: _check_digest decides
    log(f"[repro] pulling {reference}")
    try:
        return client.images.pull(pin["image"], tag=pin["digest"])
    except docker.errors.APIError:
        return None


def _check_digest(image, pin: dict[str, str]) -> None:
    digests = [d.split("@", 1)[-1] for d in image.attrs.get("RepoDigests") or []]
    if pin["digest"] not in digests:
        raise BaseDigestMismatch(
            f"the base image {pin['image']}:{pin['tag']} here ({image.id[:19]}) has repo "
            f"digests {digests or 'none'}, but containers/base-images.json pins "
            f"{pin['digest']}. Pull the pinned one (`docker pull {pin['image']}@"
            f"{pin['digest']}`), or refresh the pin (python containers/update_base_images.py)"
        )


def _python_of(client, image_id: str) -> str:
    out = client.containers.run(
        image_id,
        ["sh", "-c", "for p in python3.12 python3; do command -v $p >/dev/null && exec $p -c "
         "'import sys; print(\"%d.%d\" % sys.version_info[:2])'; done; echo none"],
        remove=True,
        network_mode="none",
    )  # fmt: skip
    return out.decode().strip()


# --- the context --------------------------------------------------------------------------------


@contextmanager
def wheel_server(folder: Path, port: int = WHEEL_SERVER_PORT):
    """Serve ``folder``'s files on 127.0.0.1:``port`` for the build (pip --find-links)."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise CudaBuildError(
            f"the wheel server cannot listen on 127.0.0.1:{port} ({exc}); another build may be "
            f"running; set REPRO_WHEEL_SERVER_PORT to a free port"
        ) from exc
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def check_wheelhouse(lock: dict[str, Any], wheelhouse: Path) -> list[dict[str, str]]:
    """Every locked wheel in ``wheelhouse`` with its sha256, or an error naming what is not."""
    problems, found = [], []
    for pkg in lock["packages"]:
        path = Path(wheelhouse) / pkg["filename"]
        if not path.is_file():
            problems.append(f"{pkg['filename']}: missing")
            continue
        digest = sha256_file(path)
        if digest != pkg["sha256"]:
            problems.append(f"{pkg['filename']}: sha256 {digest}, the lock has {pkg['sha256']}")
        found.append({"file": pkg["filename"], "from": str(wheelhouse), "sha256": digest})
    if problems:
        shown = "\n  ".join(problems[:20])
        raise CudaBuildError(
            f"the wheelhouse {wheelhouse} does not hold the lock's wheels ({len(problems)} "
            f"problem(s)); make it with `nox -s cuda-wheelhouse -- --vllm "
            f"{lock['vllm']['ref']} --out {wheelhouse}`:\n  {shown}"
        )
    return found


def build_kit_wheel(dest: Path, *, source_date_epoch: int | None) -> Path:
    """The kit's wheel from the checkout; SOURCE_DATE_EPOCH makes its bytes (and so the
    context and the layer cache) the same for the same commit."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dest)]
    # Without build isolation where this Python can build a wheel itself (no index needed).
    if all(importlib.util.find_spec(m) for m in ("setuptools", "wheel")):
        command.append("--no-build-isolation")
    env = dict(os.environ)
    if source_date_epoch is not None:
        env["SOURCE_DATE_EPOCH"] = str(source_date_epoch)
    with tempfile.TemporaryDirectory(prefix="repro-kit-src-") as tmp:
        build_mod._copy_kit(Path(tmp) / "src")  # no build/ or egg-info of the checkout
        result = subprocess.run(
            [*command, str(Path(tmp) / "src")], capture_output=True, text=True, env=env
        )
    if result.returncode != 0:
        raise CudaBuildError(f"building the kit's wheel failed:\n{result.stderr[-2000:]}")
    wheels = sorted(dest.glob("repro_kit-*.whl"))
    if len(wheels) != 1:
        raise CudaBuildError(f"expected one kit wheel in {dest}, found {wheels}")
    return wheels[0]


def precheck_patches(lock: dict[str, Any], patches: list[Path], wheelhouse: Path | None) -> None:
    """Apply ``patches`` to the files of the lock's vLLM wheel here, before any build step: a
    diff that does not apply (a PR against another tree) fails now, naming its hunks."""
    if not patches:
        return
    vllm = next((p for p in lock["packages"] if p["name"].lower() == "vllm"), None)
    if vllm is None:
        raise CudaBuildError("the lock holds no vllm wheel to apply --patch files to")
    with tempfile.TemporaryDirectory(prefix="repro-patch-check-") as tmp:
        wheel = Path(wheelhouse) / vllm["filename"] if wheelhouse else None
        if wheel is None or not wheel.is_file():
            wheel = Path(tmp) / vllm["filename"]
            try:
                urllib.request.urlretrieve(vllm["url"], wheel)
            except OSError as exc:
                raise CudaBuildError(
                    f"cannot fetch {vllm['url']} to check the --patch files against: {exc}"
                ) from exc
        if sha256_file(wheel) != vllm["sha256"]:
            raise CudaBuildError(f"{wheel} is not the lock's vllm wheel (sha256 differs)")
        site = Path(tmp) / "site"
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            for patch in patches:
                for target in patching.targets(patch):
                    if target in names:
                        zf.extract(target, site)
        site.mkdir(exist_ok=True)
        for patch in patches:
            patching.apply_patch(patch, site)


def free_disk_bytes(client) -> tuple[int, str]:
    root = client.info().get("DockerRootDir") or "/var/lib/docker"
    return shutil.disk_usage(root).free, root


def check_disk(client, lock: dict[str, Any], *, factor: float = DISK_PER_WHEEL_BYTE) -> int:
    wheel_bytes = sum(p["bytes"] or 0 for p in lock["packages"])
    need = int(wheel_bytes * factor)
    free, root = free_disk_bytes(client)
    if free < need:
        raise NotEnoughDisk(
            f"the build needs about {need / 2**30:.1f} GiB free under {root} "
            f"({wheel_bytes / 2**30:.1f} GiB of wheels x {factor}), there are "
            f"{free / 2**30:.1f} GiB; free some (`docker image rm` old kit images, "
            f"`docker builder prune -f`) and build again"
        )
    return need


def default_tag(vllm_ref: str, variant: str, patches: list[Path]) -> str:
    short = vllm_ref if len(vllm_ref) < 40 else vllm_ref[:12]
    tag = f"repro-kit/cuda:vllm-{short}-{variant}"
    if patches:
        joined = "".join(sha256_file(p) for p in patches)
        tag += "-p" + hashlib.sha256(joined.encode()).hexdigest()[:8]
    return tag


def labels_for(
    source: VllmSource, lock: dict, lock_sha: str, base: CudaBase, patches: list[dict], kit: dict
) -> dict[str, str]:
    """The CUDA image's labels: the shared OCI ones plus what its lock and base say."""
    by_name = {p["name"].lower(): p for p in lock["packages"]}
    torch = by_name.get("torch", {}).get("version", "unpinned")
    vllm_version = by_name.get("vllm", {}).get("version", "")
    labels = build_mod.oci_labels("cuda", source.ref.value, (base.name, base.id), torch, kit)
    labels.update(
        {
            label_keys.VLLM_SOURCE: source.ref.kind,
            label_keys.VLLM_VERSION: vllm_version,
            label_keys.PYTHON: lock["python"]["version"],
            label_keys.CUDA_VARIANT: lock["cuda_variant"],
            label_keys.CUDA_LIBRARIES: base.cuda_source,
            label_keys.BASE_KIND: base.kind,
            label_keys.LOCK_SHA256: lock_sha,
            label_keys.PATCHES: ",".join(p["sha256"] for p in patches) or "none",
        }
    )
    if base.digest:
        labels[label_keys.BASE_REGISTRY_DIGEST] = base.digest
    torch_cuda = _torch_cuda(lock)
    if torch_cuda:
        labels[label_keys.TORCH_CUDA] = torch_cuda
    return labels


def _torch_cuda(lock: dict[str, Any]) -> str | None:
    """torch's CUDA as the lock's nvidia-cuda-runtime wheel says (13.0.96 -> 13.0)."""
    for pkg in lock["packages"]:
        if pkg["name"].lower() in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12"):
            return ".".join(pkg["version"].split(".")[:2])
    return None


# --- the build ----------------------------------------------------------------------------------


def build_cuda_image(
    client,
    *,
    vllm_ref: str,
    lock_path: Path,
    variant: str = DEFAULT_VARIANT,
    base: str = "auto",
    tag: str | None = None,
    out_dir: Path | None = None,
    wheelhouse: Path | None = None,
    patches: list[Path] | None = None,
    log=print,
) -> build_mod.BuiltImage:
    """Build containers/cuda.Dockerfile for ``vllm_ref`` from the lock and write its record."""
    patches = [Path(p).resolve() for p in patches or []]
    for patch in patches:
        patching.check_python_only(patch)
    lock = read_lock(lock_path)
    lock_sha = sha256_file(lock_path)
    source = vllm_source(vllm_ref, variant, probe=False)
    if lock["vllm"].get("ref") != source.ref.value or lock["cuda_variant"] != variant:
        raise CudaBuildError(
            f"lock {lock_path} is for vLLM {lock['vllm'].get('ref')} {lock['cuda_variant']}, "
            f"not {source.ref.value} {variant}; make the right one (`nox -s cuda-lock -- "
            f"--vllm {source.ref.value}`)"
        )
    tag = build_mod.validate_tag(tag or default_tag(source.ref.value, variant, patches))
    out_dir = Path(out_dir or build_mod.IMAGES_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    precheck_patches(lock, patches, wheelhouse)
    need = check_disk(client, lock)
    pins = pins_mod.load_pins()
    chosen = choose_base(client, variant=variant, base=base, pins=pins, log=log)
    if chosen.python != lock["python"]["version"]:
        raise CudaBuildError(
            f"the base {chosen.name} has Python {chosen.python}, the lock is for "
            f"{lock['python']['version']} ({lock_path}); they must match"
        )
    kit = machine_facts.collect_kit(build_mod.REPO)
    epoch = build_mod.commit_epoch(kit.get("git_commit"))
    patch_records = [{"path": p.name, "sha256": sha256_file(p)} for p in patches]
    labels = labels_for(source, lock, lock_sha, chosen, patch_records, kit)
    build_args = {"BASE_IMAGE": chosen.id, "PYTHON_VERSION": lock["python"]["version"]}
    log_path = out_dir / f"{build_mod.file_stem(tag)}.build.log"
    with tempfile.TemporaryDirectory(prefix="repro-cuda-build-") as tmp:
        context = Path(tmp)
        pip_dir = context / "pip"
        pip_dir.mkdir()
        (pip_dir / "lock.txt").write_text(requirements_text(lock))
        shutil.copyfile(lock_path, pip_dir / "lock.json")
        (pip_dir / "patches").mkdir()
        for number, patch in enumerate(patches):
            shutil.copyfile(patch, pip_dir / "patches" / f"{number:02d}-{patch.name}")
        kit_wheel = build_kit_wheel(pip_dir / "kit", source_date_epoch=epoch)
        kit_wheel_record = {"filename": kit_wheel.name, "sha256": sha256_file(kit_wheel)}
        dockerfile = DOCKERFILE.read_text()
        if LABEL_MARKER not in dockerfile:
            raise CudaBuildError(f"{DOCKERFILE} lost its line {LABEL_MARKER!r}")
        label_line = build_mod.label_step(labels)
        (context / "Dockerfile").write_text(dockerfile.replace(LABEL_MARKER, label_line))
        with _wheel_source(lock, wheelhouse, pip_dir, source) as pip_record:
            try:
                # The wheel server (or the index) is reached over the host's network.
                run = build_mod.run_build(
                    client, context, tag, build_args, log_path, log, network_mode="host"
                )
            except build_mod.BuildError as exc:
                raise _classify(exc, log_path, client) from exc
    image = client.images.get(run.image_id)
    check_started = time.monotonic()
    try:
        check = check_image(client, image.id, dict(image.labels or {}))
        if check["label_problems"]:
            raise ImageCheckFailed(
                "the image does not hold what its labels say:\n  "
                + "\n  ".join(check["label_problems"])
            )
    except ReproError:
        _untag(client, tag, log)
        raise
    # Under vfs the check's container copies the whole image: most of a cached build's time.
    check_seconds = time.monotonic() - check_started
    return build_mod.write_image_record(
        image,
        variant="cuda",
        build_args=build_args,
        base={
            "name": chosen.name,
            "id": chosen.id,
            "kind": chosen.kind,
            "registry_digest": chosen.digest,
            "why": chosen.why,
        },
        pip=pip_record,
        kit=kit,
        build=run.record(check_s=round(check_seconds, 3), disk_needed_bytes=need),
        log_path=log_path,
        tag=tag,
        sections={
            "vllm": source.as_record(),
            "lock": {
                "path": _repo_relative(lock_path),
                "sha256": lock_sha,
                "python": lock["python"]["version"],
                "wheels": [
                    {"filename": p["filename"], "sha256": p["sha256"], "origin": p["origin"]}
                    for p in lock["packages"]
                ],
                "kit_wheel": kit_wheel_record,
            },
            "patches": patch_records,
            "check": check,
        },
    )


@contextmanager
def _wheel_source(lock, wheelhouse: Path | None, pip_dir: Path, source: VllmSource):
    """Write pip.conf and yield the record's ``pip`` section; serve the wheelhouse meanwhile."""
    if wheelhouse is not None:
        wheels = check_wheelhouse(lock, Path(wheelhouse))
        port = int(os.environ.get("REPRO_WHEEL_SERVER_PORT", WHEEL_SERVER_PORT))
        with wheel_server(Path(wheelhouse), port) as url:
            (pip_dir / "pip.conf").write_text(f"[global]\nno-index = true\nfind-links = {url}\n")
            (pip_dir / "constraints.txt").write_text("")
            yield {
                "index_url": None,
                "extra_index_urls": [],
                "find_links": [url],
                "wheels": wheels,
                "constraints_sha256": sha256_file(pip_dir / "constraints.txt"),
                "cert_sha256": None,
                "dropped": [],
            }
        return
    settings = replace(
        pip_settings.read(),
        index_url=lock["index_url"],
        extra_index_urls=(*lock.get("extra_index_urls", []), *source.extra_index_urls),
        find_links=(),
        constraints=(),  # the lock pins every file; the host's caps have no say
    )
    record = build_mod.render_pip_context(settings, pip_dir, python_tag="", projects=())
    yield record


def _classify(exc: build_mod.BuildError, log_path: Path, client) -> ReproError:
    text = log_path.read_text(errors="replace") if log_path.is_file() else str(exc)
    if "No space left on device" in text or "no space left on device" in str(exc):
        free, root = free_disk_bytes(client)
        return NotEnoughDisk(
            f"the build ran out of disk ({root} has {free / 2**30:.1f} GiB free now); no image "
            f"was tagged. Free some (`docker image rm` old kit images, `docker builder prune "
            f"-f`) and build again; full log: {log_path}"
        )
    if "THESE PACKAGES DO NOT MATCH THE HASHES" in text:
        return CudaBuildError(
            f"pip refused a wheel whose sha256 is not the lock's; no image was tagged. The "
            f"wheel source serves other files than the lock names; full log: {log_path}"
        )
    return exc


def _untag(client, tag: str, log) -> None:
    # lazy: docker-py, needed only where a Docker daemon is used
    import docker

    try:
        client.images.remove(tag, noprune=False)
        log(f"[repro] removed the tag {tag}: the image failed its check")
    except docker.errors.APIError:
        pass


def _repo_relative(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(build_mod.REPO))
    except ValueError:
        return str(path)


# --- the lock, as the image reads it -----------------------------------------------------------


def default_lock_path(vllm_ref: str, cuda_variant: str, python: str) -> Path:
    """containers/locks/ file of the lock for ``vllm_ref`` with ``cuda_variant`` on Python
    ``python`` (``3.12``: the file says cp312)."""
    return LOCKS_DIR / f"vllm-{vllm_ref}-{cuda_variant}-{python_tag(python)}.lock.json"


def requirements_text(lock: dict[str, Any]) -> str:
    """The lock as a pip requirements file in hash-checking mode: exactly these files."""
    lines = [f"# from {FORMAT} (vllm {lock['vllm'].get('ref')}); pip install --require-hashes"]
    for p in lock["packages"]:
        lines.append(f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}")
    return "\n".join(lines) + "\n"


# --- the wheelhouse -------------------------------------------------------------------------------


def make_cuda_wheelhouse(lock_path: Path, dest: Path, *, log=print) -> list:
    """Download every wheel of the lock into ``dest`` (checked by sha256; reused when there)."""
    # lazy: the install-set builder imports rich; only this command downloads
    from repro.installset.build import download

    lock = read_lock(lock_path)
    target = Target(lock["python"]["version"], tuple(lock["platforms"]))
    return download(locked_packages(lock), Path(dest), target, log=log)


# --- the image against an install set from the same lock ------------------------------------


def compare_records(image_record: dict[str, Any], manifest: dict[str, Any]) -> dict:
    """How an image record's wheels and an install set manifest's wheels relate. Equal: the
    same lock (by sha256), every set wheel in the image with the same sha256, and the image's
    other wheels the lock's ``host`` and ``image-only`` ones."""
    image_lock = (image_record.get("lock") or {}).get("sha256")
    set_lock = (manifest.get("lock") or {}).get("sha256")
    image_wheels = {w["filename"]: w for w in (image_record.get("lock") or {}).get("wheels", [])}
    set_wheels = {w["filename"]: w for w in manifest["wheels"]}
    differing = [
        f"{name}: image {image_wheels[name]['sha256'][:12]}, set {w['sha256'][:12]}"
        for name, w in set_wheels.items()
        if name in image_wheels and image_wheels[name]["sha256"] != w["sha256"]
    ]
    only_set = sorted(set(set_wheels) - set(image_wheels))
    only_image = sorted(set(image_wheels) - set(set_wheels))
    unexpected = [n for n in only_image if image_wheels[n].get("origin") == "install-set"]
    same_lock = bool(image_lock) and image_lock == set_lock
    return {
        "same_lock": same_lock,
        "image_lock_sha256": image_lock,
        "set_lock_sha256": set_lock,
        "wheels_in_both": len(set(set_wheels) & set(image_wheels)),
        "sha256_differs": differing,
        "only_in_set": only_set,
        "only_in_image": {
            origin: sorted(n for n in only_image if image_wheels[n].get("origin") == origin)
            for origin in ORIGINS
        },
        "equal": same_lock and not (differing or only_set or unexpected),
    }


__all__ = [
    "DEFAULT_VARIANT",
    "BaseDigestMismatch",
    "CommitHasNoWheel",
    "CommitIndexUnreachable",
    "CudaBase",
    "CudaBuildError",
    "NotEnoughDisk",
    "VllmSource",
    "build_cuda_image",
    "check_wheelhouse",
    "precheck_patches",
    "requirements_text",
    "choose_base",
    "commit_index_url",
    "compare_records",
    "default_lock_path",
    "make_cuda_wheelhouse",
    "vllm_source",
    "wheel_server",
]


def check_commit_version(lock: dict[str, Any], commit: str) -> None:
    """A main commit's wheel carries ``+g<sha>`` in its version; anything else is not it."""
    root = lock["packages"][0]
    if root["name"].lower() != "vllm" or f"g{commit[:9]}" not in root["version"]:
        raise CommitHasNoWheel(
            f"the lock's vllm is {root['name']} {root['version']} ({root['url']}), not a "
            f"wheel of commit {commit} (its version would hold +g{commit[:9]}); the commit "
            f"index offers no wheel for it"
        )
