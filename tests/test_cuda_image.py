"""The CUDA image: refs, the wheel lock, the base, faults, and GPU container arguments.

Most tests are quick. Those marked `docker` use the real daemon (they skip without one unless
REPRO_REQUIRE_DOCKER=1). The per-commit wheel server (https://wheels.vllm.ai) cannot be
reached here: the commit tests use a *stand-in index served from files* on loopback, with a
stand-in vllm wheel (metadata only) named as a commit's wheel is. Resolving a lock asks PyPI
(through uv), as the kit does.

The whole build (several GB: the 0.26.0 wheelhouse, the image, its check, export and import,
the install set from the same lock and the comparison) runs only with REPRO_BUILD_CUDA_IMAGE=1.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from folder_server import serve_folder
from kept_images import remove_unless_kept
from small_images import import_one_file_image

from repro.containers import cuda
from repro.containers import labels as label_keys
from repro.containers.refs import InvalidRef
from repro.core.atomicio import sha256_file
from repro.core.errors import PatchError
from repro.installset import InstallSetError
from repro.installset import lock as lockmod
from repro.installset.host import Target
from repro.installset.resolve import Locked, LockedWheel, choose_wheel, write_stub_wheel

REPO = Path(__file__).resolve().parent.parent
SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER_SHA = "fedcba9876543210fedcba9876543210fedcba98"
LOCK_026 = REPO / "containers" / "locks" / "vllm-0.26.0-cu130-cp312.lock.json"
LOCK_032 = REPO / "containers" / "locks" / "vllm-0.32.0-cu130-cp312.lock.json"
FREEZE = REPO / "containers" / "hosts" / "h200-pip-freeze.txt"


# --- a stand-in for upstream's per-commit wheel index, served from files ----------------------


def _stand_in_wheel(folder: Path, version: str, files: dict[str, str] | None = None) -> Path:
    """A wheel named and versioned as a commit's vllm wheel; metadata and ``files`` only."""
    return write_stub_wheel(
        folder,
        "vllm",
        version,
        tag="cp38-abi3-manylinux_2_31_x86_64",
        requires=("packaging",),
        files=files,
    )


@pytest.fixture(scope="module")
def stand_in_index(tmp_path_factory):
    """http://127.0.0.1:PORT/<SHA>/cu130/vllm/ lists one stand-in wheel; OTHER_SHA has none."""
    root = tmp_path_factory.mktemp("wheels-vllm-ai-stand-in")
    folder = root / SHA / "cu130" / "vllm"
    folder.mkdir(parents=True)
    _stand_in_wheel(folder, f"0.26.1.dev5+g{SHA[:9]}.cu130")
    with serve_folder(root) as url:
        yield url


# --- refs -------------------------------------------------------------------------------------


def test_a_release_locks_from_pypi():
    source = cuda.vllm_source("0.26.0")
    assert source.requirement == "vllm==0.26.0" and source.extra_index_urls == ()


def test_a_commit_derives_upstreams_per_commit_index(monkeypatch, stand_in_index):
    monkeypatch.delenv("REPRO_VLLM_WHEELS_URL", raising=False)
    assert cuda.commit_index_url(SHA) == f"https://wheels.vllm.ai/{SHA}/cu130"
    monkeypatch.setenv("REPRO_VLLM_WHEELS_URL", stand_in_index)
    source = cuda.vllm_source(SHA)
    assert source.requirement == "vllm"
    assert source.extra_index_urls == (f"{stand_in_index}/{SHA}/cu130",)


def test_a_commit_with_no_wheel_is_named(monkeypatch, stand_in_index):
    monkeypatch.setenv("REPRO_VLLM_WHEELS_URL", stand_in_index)
    with pytest.raises(cuda.CommitHasNoWheel, match=f"no cu130 wheel for vLLM commit {OTHER_SHA}"):
        cuda.vllm_source(OTHER_SHA)
    with pytest.raises(cuda.CommitHasNoWheel, match="answered 404"):
        cuda.vllm_source(SHA, "cu129")


@pytest.mark.parametrize("ref", ["latest!", "v0.26", SHA[:12], SHA.upper(), "a..b", "x;id"])
def test_unknown_refs_are_refused(ref):
    """Not a release, not a 40-hex commit: refused by name (a branch-like one with the way to
    build a PR) before anything is resolved or built."""
    with pytest.raises((InvalidRef, cuda.CudaBuildError), match="release|40-hex"):
        cuda.vllm_source(ref)


def test_a_branch_points_at_its_merge_base_and_patch():
    with pytest.raises(cuda.CudaBuildError, match="--patch FILE"):
        cuda.vllm_source("my-feature-branch")


def test_a_commit_lock_takes_the_commits_wheel(monkeypatch, stand_in_index):
    monkeypatch.setenv("REPRO_VLLM_WHEELS_URL", stand_in_index)
    source = cuda.vllm_source(SHA)
    doc = lockmod.make_lock(
        source.requirement,
        vllm={"ref": SHA, "kind": "commit"},
        target=Target.create("3.12"),
        cuda_variant="cu130",
        freeze_file=None,
        exclude={},
        extra_index_urls=source.extra_index_urls,
    )
    root = doc["packages"][0]
    assert root["name"] == "vllm" and root["version"] == f"0.26.1.dev5+g{SHA[:9]}.cu130"
    assert root["url"].startswith(f"{stand_in_index}/{SHA}/cu130/")
    assert {p["origin"] for p in doc["packages"]} == {"install-set"}
    cuda.check_commit_version(doc, SHA)
    with pytest.raises(cuda.CommitHasNoWheel, match=OTHER_SHA):
        cuda.check_commit_version(doc, OTHER_SHA)


# --- the lock -----------------------------------------------------------------------------------


def test_one_wheel_per_package_as_pip_chooses():
    def wheel(name):
        return LockedWheel(f"https://x/{name}", hashlib.sha256(name.encode()).hexdigest(), 1)

    pkg = Locked(
        "numpy",
        "2.2.6",
        (
            wheel("numpy-2.2.6-cp311-cp311-manylinux_2_28_x86_64.whl"),
            wheel("numpy-2.2.6-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
            wheel("numpy-2.2.6-cp312-cp312-manylinux_2_28_x86_64.whl"),
            wheel("numpy-2.2.6-cp312-cp312-manylinux_2_34_x86_64.whl"),  # too new a glibc
        ),
    )
    chosen = choose_wheel(pkg, Target.create("3.12", ["manylinux_2_31_x86_64"]))
    assert chosen.filename == "numpy-2.2.6-cp312-cp312-manylinux_2_28_x86_64.whl"
    with pytest.raises(InstallSetError, match="no wheel fits Python 3.10"):
        choose_wheel(pkg, Target.create("3.10"))


def test_the_0_26_0_lock_is_the_h200s_torch_plus_the_install_set():
    from repro.installset.host import read_freeze

    lock = lockmod.read_lock(LOCK_026)
    host = read_freeze(FREEZE)
    by_name = {p["name"].lower(): p for p in lock["packages"]}
    assert lock["packages"][0]["name"] == "vllm" and lock["packages"][0]["version"] == "0.26.0"
    assert by_name["torch"]["version"] == "2.11.0" and by_name["torch"]["origin"] == "host"
    assert by_name["nvidia-cuda-runtime"]["version"].startswith("13.0.")
    assert lock["python"]["version"] == "3.12" and lock["cuda_variant"] == "cu130"
    for pkg in lock["packages"]:
        if pkg["origin"] == "host":  # what the image installs is what the host has
            assert host.get(pkg["name"]).version == pkg["version"], pkg["name"]
        else:
            assert host.get(pkg["name"]) is None, pkg["name"]
    text = cuda.requirements_text(lock)
    assert text.count("--hash=sha256:") == len(lock["packages"])


def test_the_0_32_0_lock_ships_its_own_torch():
    lock = lockmod.read_lock(LOCK_032)
    by_name = {p["name"].lower(): p for p in lock["packages"]}
    assert by_name["vllm"]["version"] == "0.32.0"
    assert by_name["torch"]["version"] == "2.13.0" and by_name["torch"]["origin"] == "install-set"
    assert lock["host"] is None


def test_a_set_from_a_lock_that_predates_its_resolution_facts_is_valid(tmp_path):
    """The committed 0.26.0 lock (2026-12-01) records no uv_runs, host_packages_used or
    excluded_closure: the set built from it says "not recorded" (null), as the schema allows,
    instead of failing its manifest check (which the opt-in build found)."""
    from repro.installset.build import Wheel, pack_set

    lock = lockmod.read_lock(LOCK_026)
    recorded = {key: lock["resolution"][key] for key in lockmod.RECORDED_SINCE_V1}
    assert recorded == dict.fromkeys(lockmod.RECORDED_SINCE_V1)
    path = write_stub_wheel(tmp_path, "tinypkg", "1.0")
    wheel = Wheel("tinypkg", "1.0", path.name, path.stat().st_size, sha256_file(path), None, path)
    root = {"requirement": "tinypkg==1.0", "name": "tinypkg", "version": "1.0"}
    manifest, _ = pack_set(
        [wheel], tmp_path / "set", Target.create("3.12"), root=root, resolution=lock["resolution"]
    )
    assert manifest["resolution"]["uv_runs"] is None
    assert manifest["resolution"]["host_overrides"] == lock["resolution"]["host_overrides"]


def test_a_malformed_lock_is_refused(tmp_path):
    bad = tmp_path / "bad.lock.json"
    bad.write_text(json.dumps({"format": lockmod.FORMAT, "format_version": 1, "packages": [{}]}))
    with pytest.raises(InstallSetError, match="malformed package entry"):
        lockmod.read_lock(bad)
    with pytest.raises(InstallSetError, match="no wheel lock"):
        lockmod.read_lock(tmp_path / "missing.json")


def test_compare_records_names_a_wheel_that_differs():
    lock = {"sha256": "a" * 64}
    image = {
        "lock": {
            **lock,
            "wheels": [
                {"filename": "vllm.whl", "sha256": "1" * 64, "origin": "install-set"},
                {"filename": "torch.whl", "sha256": "2" * 64, "origin": "host"},
            ],
        }
    }
    manifest = {"lock": lock, "wheels": [{"filename": "vllm.whl", "sha256": "1" * 64}]}
    same = cuda.compare_records(image, manifest)
    assert same["equal"] and same["only_in_image"]["host"] == ["torch.whl"]
    manifest["wheels"][0]["sha256"] = "3" * 64
    assert not cuda.compare_records(image, manifest)["equal"]
    manifest["wheels"][0]["sha256"] = "1" * 64
    manifest["lock"] = {"sha256": "b" * 64}
    assert not cuda.compare_records(image, manifest)["same_lock"]


# --- patches ------------------------------------------------------------------------------------

PATCH = """\
--- a/vllm/foo.py
+++ b/vllm/foo.py
@@ -1,2 +1,2 @@
 x = 1
-y = {old}
+y = 3
"""


def test_a_patch_that_does_not_apply_fails_before_the_build(tmp_path):
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    wheel = _stand_in_wheel(wheelhouse, "0.26.0", {"vllm/foo.py": "x = 1\ny = 2\n"})
    lock = {
        "packages": [
            {
                "name": "vllm",
                "version": "0.26.0",
                "filename": wheel.name,
                "url": "https://pypi.invalid/" + wheel.name,
                "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            }
        ]
    }
    good, bad = tmp_path / "good.diff", tmp_path / "bad.diff"
    good.write_text(PATCH.format(old=2))
    bad.write_text(PATCH.format(old=7))
    cuda.precheck_patches(lock, [good], wheelhouse)
    with pytest.raises(PatchError, match="bad.diff"):
        cuda.precheck_patches(lock, [good, bad], wheelhouse)


# --- with the Docker daemon ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_image(docker_client):
    """A one-file image to tag and to create (not start) containers from: these tests need no
    operating system in it, so none is built (the Debian base costs a debootstrap, ~100 s)."""
    made = docker_client.images.get(import_one_file_image(docker_client, "repro-test/small"))
    yield made
    remove_unless_kept(docker_client, made.id, force=True)


@pytest.mark.docker
def test_a_base_whose_digest_does_not_match_is_refused(docker_client, small_image):
    name = "repro-test/cuda-digest"
    small_image.tag(name, "13.0.1-base-ubuntu24.04")
    pins = {
        "cuda": {
            "cu130": {
                "image": name,
                "tag": "13.0.1-base-ubuntu24.04",
                "digest": "sha256:" + "ab" * 32,
                "python": "3.12",
            }
        }
    }
    try:
        with pytest.raises(cuda.BaseDigestMismatch, match="pins sha256:abab"):
            cuda.choose_base(docker_client, variant="cu130", base="registry", pins=pins)
        with pytest.raises(cuda.BaseDigestMismatch):
            cuda.choose_base(docker_client, variant="cu130", base="auto", pins=pins)
    finally:
        docker_client.images.remove(f"{name}:13.0.1-base-ubuntu24.04")


@pytest.mark.docker
def test_a_build_that_would_run_out_of_disk_stops_first(docker_client):
    lock = lockmod.read_lock(LOCK_026)
    free, root = cuda.free_disk_bytes(docker_client)
    factor = 2 * free / sum(p["bytes"] for p in lock["packages"])
    with pytest.raises(cuda.NotEnoughDisk, match=f"free under {root}"):
        cuda.check_disk(docker_client, lock, factor=factor)
    assert cuda.check_disk(docker_client, lock, factor=0.0) == 0


@pytest.mark.docker
def test_gpu_containers_get_devices_shm_ulimits_and_ipc(docker_client, small_image):
    """docker-py's real arguments reach the daemon; starting needs the NVIDIA runtime, which
    this machine has not: that is the point where a GPU is needed."""
    import dataclasses

    import docker

    from repro import plan
    from repro.containers import run as container_run
    from repro.containers.launch import Launch
    from repro.profiles import get_profile

    doc = plan.build_plan(get_profile("nemotron-super"), hardware={"gpus": []})
    section = doc["container"]
    launch = Launch(
        image=small_image.id,
        argv=("true",),
        gpus=section["gpus"],
        shm_size=section["shm_size"],
        ulimits={k: (v["soft"], v["hard"]) for k, v in section["ulimits"].items()},
        ipc_mode=section["ipc_mode"],
    )
    assert dataclasses.asdict(launch)["gpus"] == 4
    run = container_run.ContainerRun.from_launch(
        launch, client=docker_client, user=None, labels={label_keys.RUN: "test-gpu-args"}
    )
    container = docker_client.containers.create(small_image.id, **run.create_kwargs())
    try:
        host = container.attrs["HostConfig"]
        (request,) = host["DeviceRequests"]
        assert request["Driver"] == "nvidia" and request["Count"] == 4
        assert request["Capabilities"] == [["gpu"]] and not request["DeviceIDs"]
        assert host["ShmSize"] == 16 * 2**30 and host["IpcMode"] == "private"
        assert {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]} == {
            "memlock": (-1, -1),
            "stack": (67108864, 67108864),
        }
        assert host["NetworkMode"] == "none" and host["Init"] is True
        with pytest.raises(docker.errors.APIError, match="device driver"):
            container.start()
    finally:
        container.remove(force=True)
    with pytest.raises(docker.errors.APIError, match="device driver"):
        with run:
            pass
    left = docker_client.containers.list(
        all=True, filters={"label": f"{label_keys.RUN}=test-gpu-args"}
    )
    assert left == []


def test_the_dry_run_plan_names_every_pin_and_what_needs_a_registry():
    from repro import plan
    from repro.profiles import get_profile

    doc = plan.build_plan(get_profile("nemotron-super"), hardware={"gpus": []}, vllm_ref="0.26.0")
    pins = doc["container"]["image_pins"]["pins"]
    assert pins["wheel torch"].startswith("2.11.0 (")
    assert pins["wheel vllm"].startswith("0.26.0 (")
    assert LOCK_026.name in pins["wheel lock"]
    assert "no digest pinned" in pins["base (registry)"]
    needs = doc["container"]["image_pins"]["needs_registry"]
    assert any("update_base_images.py" in item for item in needs)
    if doc["model"]["revision_source"] == "unresolved":  # no Hub here: the weights need one
        assert any("Hugging Face Hub" in item for item in needs)
    assert len(needs) == 1 + (doc["model"]["revision_source"] == "unresolved")
    gpu = doc["container"]
    assert gpu["gpus"] == 4 and gpu["shm_size"] == "16g" and gpu["ipc_mode"] == "private"
    commit = plan.image_pins(SHA, "cu130")
    needs = commit["needs_registry"]
    assert any("cuda-lock" in item and "wheels.vllm.ai" in item for item in needs)


def _one_file_image(client, reference: str, labels: dict[str, str]):
    """A labelled one-file image made with `docker import` (no base, nothing copied)."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("README")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"pin\n"))
    repository, tag = reference.rsplit(":", 1)
    changes = ["LABEL " + " ".join(f"{k}={json.dumps(v)}" for k, v in labels.items())]
    client.api.import_image_from_data(
        buffer.getvalue(), repository=repository, tag=tag, changes=changes
    )
    return client.images.get(reference)


@pytest.mark.docker
def test_the_plan_resolves_the_pins_made_here(docker_client, monkeypatch):
    """The local base's image id and the image built from the lock and the kit, asked of the
    real daemon; each described (how it gets made) when it is not here."""
    from repro import machine_facts, plan
    from repro.containers import base

    _, recipe = base.RECIPES["ubuntu-noble"]
    tag = "repro-test/plan-base:noble"
    monkeypatch.setitem(base.RECIPES, "ubuntu-noble", (tag, recipe))
    kit = {"git_commit": OTHER_SHA, "dirty": False}
    monkeypatch.setattr(machine_facts, "collect_kit", lambda *a, **k: kit)

    pins = plan.image_pins("0.26.0", "cu130", client=docker_client)["pins"]
    assert pins["base (local)"].startswith(f"{tag}: not made here yet")
    assert pins["built here"].startswith("not built here from this lock and kit")
    assert pins["kit"] == f"{OTHER_SHA} (clean)"

    made = []
    try:
        made.append(_one_file_image(docker_client, tag, {label_keys.BASE_RECIPE: "another"}))
        pins = plan.image_pins("0.26.0", "cu130", client=docker_client)["pins"]
        assert pins["base (local)"].endswith("made by another recipe: the build makes it again")
        docker_client.images.remove(tag)
        made.append(_one_file_image(docker_client, tag, {label_keys.BASE_RECIPE: recipe.digest()}))
        labels = {
            "io.repro-kit.variant": "cuda",
            "io.repro-kit.vllm.ref": "0.26.0",
            "io.repro-kit.cuda.variant": "cu130",
            "io.repro-kit.lock.sha256": sha256_file(LOCK_026),
            "io.repro-kit.patches": "none",
            "org.opencontainers.image.revision": OTHER_SHA,
            "io.repro-kit.dirty": "false",
        }
        made.append(_one_file_image(docker_client, "repro-test/plan-image:x", labels))
        pins = plan.image_pins("0.26.0", "cu130", client=docker_client)["pins"]
        assert pins["base (local)"] == (
            f"{tag} = {made[1].id}, made here by `python -m repro base-image --recipe "
            "ubuntu-noble` (Ubuntu's archive, no registry)"
        )
        assert pins["built here"] == (
            f"repro-test/plan-image:x = {made[2].id} (built here from this lock and kit)"
        )
    finally:
        for image in made:
            try:
                docker_client.images.remove(image.id, force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
    pins = plan.image_pins("0.26.0", "cu130", client=None)["pins"]
    assert "no Docker daemon answers" in pins["base (local)"] and "no Docker" in pins["built here"]


# --- the whole build (opt-in) -------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.skipif(
    os.environ.get("REPRO_BUILD_CUDA_IMAGE") != "1",
    reason="builds the several-GB CUDA image (REPRO_BUILD_CUDA_IMAGE=1 runs it)",
)
def test_the_0_26_0_image_and_install_set_from_one_lock(docker_client, tmp_path):
    from repro.containers import handoff
    from repro.containers.base import UBUNTU_TAG
    from repro.installset.build import build_from_lock

    # The build makes the Ubuntu base where none is here (439 MB); one made here goes after.
    made_base = not docker_client.images.list(name=UBUNTU_TAG)
    wheelhouse = Path(os.environ.get("REPRO_CUDA_WHEELHOUSE") or tmp_path / "wheelhouse")
    cuda.make_cuda_wheelhouse(LOCK_026, wheelhouse)
    tag = "repro-test/cuda:vllm-0.26.0"
    build = functools.partial(
        cuda.build_cuda_image,
        docker_client,
        vllm_ref="0.26.0",
        lock_path=LOCK_026,
        tag=tag,
        out_dir=tmp_path / "records",
        wheelhouse=wheelhouse,
    )
    built = None
    try:
        built = build()
        check = built.record["check"]
        assert check["torch"]["version"] == "2.11.0" and check["torch"]["cuda"] == "13.0"
        assert check["vllm"]["version"] == "0.26.0" and check["label_problems"] == []
        assert check["lock"]["mismatched"] == [] and check["repro_help_runs"]
        assert built.record["build"]["check_s"] > 0
        again = build()  # the same inputs again
        assert again.id == built.id
        assert again.record["build"]["cached_steps"] == again.record["build"]["steps"] - 2

        # The set is no longer xz-compressed (its parts are the wheels, cut), so there is no
        # preset to pass.
        manifest, _ = build_from_lock(LOCK_026, tmp_path / "set", wheels_from=wheelhouse)
        same = cuda.compare_records(built.record, manifest)
        assert same["equal"], same
        if not os.environ.get("REPRO_CUDA_WHEELHOUSE"):
            # Its 3 GB are not needed any more; the archive below takes 7 GB more.
            shutil.rmtree(wheelhouse, ignore_errors=True)
            shutil.rmtree(tmp_path / "set", ignore_errors=True)

        archive = tmp_path / "image.tar"
        handoff.export_image(docker_client, tag, archive, images_dir=tmp_path / "records")
        docker_client.images.remove(built.id, force=True)
        imported = handoff.import_image(docker_client, archive, images_dir=tmp_path / "records")
        assert imported.image_id == built.id
    finally:
        for ref in (tag, *([built.id] if built else [])):
            try:
                docker_client.images.remove(ref, force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if made_base:
            remove_unless_kept(docker_client, UBUNTU_TAG, force=True)
        # pytest keeps the last runs' tmp_path: the 7 GB archive and 3 GB of wheels must go.
        (tmp_path / "image.tar").unlink(missing_ok=True)
        if not os.environ.get("REPRO_CUDA_WHEELHOUSE"):
            shutil.rmtree(wheelhouse, ignore_errors=True)


# --- weights pinned ------------------------------------------------------------------------------


def test_a_gpu_run_refuses_unpinned_weights_unless_allowed(tmp_path):
    from repro import weights

    rev = "a" * 40
    lock = tmp_path / "weights.lock.json"
    lock.write_text(
        json.dumps(
            {
                "format": "repro-weights-lock",
                "format_version": 1,
                "models": {"org/model": {"revision": rev}},
            }
        )
    )
    snapshot = tmp_path / "models--org--model" / "snapshots" / rev
    snapshot.mkdir(parents=True)
    pin = weights.model_pin("org/model", snapshot, lock_path=lock)
    assert pin["pinned"] and pin["revision"] == rev and pin["source"] == "lock file"
    elsewhere = tmp_path / "my-copy"
    elsewhere.mkdir()
    with pytest.raises(weights.WeightsError, match="not at a pinned commit.*--allow-unpinned"):
        weights.model_pin("org/model", elsewhere, lock_path=lock)
    with pytest.raises(weights.WeightsError, match="pinned: none"):
        weights.model_pin("org/other", snapshot, lock_path=lock)
    allowed = weights.model_pin("org/model", elsewhere, lock_path=lock, allow_unpinned=True)
    assert allowed == {
        "repo_id": "org/model",
        "pinned": False,
        "revision": None,
        "pinned_revision": rev,
        "source": "lock file",
        "allowed_unpinned": True,
    }


def test_the_artifact_records_the_weights_pin():
    """The CLI's check of the weights reaches the record through the run's context (no
    variable of this process in between): the pinned commit and the whole check."""
    import dataclasses

    from repro.arms import record
    from repro.profiles import get_profile
    from repro.runcontext import EngineFacts, RunContext

    profile = get_profile("qwen3.6-27b-fp8")
    pin = {"repo_id": profile.model, "pinned": True, "revision": "b" * 40}
    context = RunContext.new(
        run_id="r",
        arm="cold-race",
        command=["run"],
        profile=profile,
        model_path="/m",
        overrides={},
        fault_kind=None,
        weights_pin=pin,
    )
    assert RunContext.from_json(context.to_json()).weights_pin == pin  # to the arm process
    doc = record.base_document(
        arm="cold-race", context=context, environment=EngineFacts.here(), profile=profile
    )
    assert doc["profile"]["revision"] == "b" * 40 and doc["profile"]["weights_pin"] == pin
    unpinned = dataclasses.replace(context, weights_pin={**pin, "pinned": False, "revision": None})
    assert record._weights_revision(profile, unpinned) is None
    # No check made (a tiny model): the profile's own pin.
    assert record._weights_revision(profile, dataclasses.replace(context, weights_pin=None)) == (
        profile.revision
    )


def test_host_packages_are_compared_file_for_file(tmp_path):
    """The bare host's check (repro/installset/hostcheck.py) on a real pip install of a
    wheel: equal digests, then one file changed after install is found."""
    import subprocess
    import sys

    from repro.installset import hostcheck

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _stand_in_wheel(wheels, "0.26.0", {"vllm/foo.py": "x = 1\n"})
    rows = []
    with zipfile.ZipFile(wheel) as zf:
        members = {n: zf.read(n) for n in zf.namelist() if not n.endswith("RECORD")}
    for name, data in members.items():
        digest = hashlib.sha256(data).digest()
        rows.append(f"{name},sha256={hostcheck._b64(digest)},{len(data)}")
    record = "vllm-0.26.0.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr(record, "\n".join([*rows, f"{record},,"]) + "\n")
    lock = {
        "packages": [
            {"name": "vllm", "version": "0.26.0", "origin": "host", "filename": wheel.name}
        ]
    }
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--target", str(target), str(wheel)],
        check=True,
    )  # fmt: skip
    want = hostcheck.wheel_digests(lock, wheels)
    result = hostcheck.compare(want, hostcheck.installed_digests([str(target)]))
    assert result["all_identical"] and result["files"] == len(members)
    (target / "vllm" / "foo.py").write_text("x = 2\n")
    result = hostcheck.compare(want, hostcheck.installed_digests([str(target)]))
    assert not result["all_identical"] and result["changed_since_install"] == {"vllm": 1}
