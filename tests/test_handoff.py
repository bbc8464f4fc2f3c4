"""Image hand-off with the real Docker daemon: export → import round trip, tampering refused.

The image under test is made here: a LABEL-only image on the kit's local base image (no new
layer, seconds to build), with a label unique to this test session so its id is too. The test
removes it (and every tag it made) at the end; it never touches images it did not create.

Skips with a reason when no daemon answers, unless REPRO_REQUIRE_DOCKER=1 (CI), where a
missing daemon or base image is a failure. Start one with `sh containers/start-dockerd.sh`.
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import tarfile
import uuid
from pathlib import Path

import pytest
from small_images import import_one_file_image

from repro.artifact import schema_violations, validate_artifact
from repro.containers import handoff
from repro.containers.handoff import HandoffError

REPO = "repro-kit-test/handoff"
FIXTURE = Path(__file__).parent / "fixtures" / "runs" / "clean" / "cold-race.json"

pytestmark = pytest.mark.docker


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("REPRO_REQUIRE_DOCKER") == "1":
        pytest.fail(f"REPRO_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def client():
    from repro.containers import DockerUnavailable, docker_client

    try:
        client = docker_client()
    except DockerUnavailable as exc:
        _skip_or_fail(str(exc))
    return client


@pytest.fixture(scope="module")
def base_tag(client):
    """A one-file image made here with `docker import` (nothing to pull, no debootstrap), so
    the hand-off tests need no other image on the daemon; removed afterwards."""
    reference = import_one_file_image(client, f"{REPO}-base")
    yield reference
    _remove(client, client.images.get(reference).id)


@pytest.fixture(scope="module")
def image(client, base_tag):
    """A small labelled image made for this module; removed afterwards with its tags."""
    token = uuid.uuid4().hex[:12]
    tag = f"{REPO}:{token}"
    dockerfile = (
        f"FROM {base_tag}\n"
        f'LABEL io.repro-kit.test.handoff="{token}" org.opencontainers.image.title="handoff"\n'
    )
    built, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    yield built.id, tag, token
    _remove(client, built.id)


def _remove(client, image_id: str) -> None:
    import docker

    try:
        image = client.images.get(image_id)
    except docker.errors.ImageNotFound:
        return
    for tag in image.tags:
        client.images.remove(tag, noprune=True)
    try:
        client.images.remove(image_id, noprune=True)
    except docker.errors.ImageNotFound:
        pass


def _exists(client, ref: str) -> bool:
    import docker

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


@pytest.fixture(scope="module")
def exported(client, image, tmp_path_factory):
    image_id, tag, _ = image
    out = tmp_path_factory.mktemp("export") / "handoff.tar"
    result = handoff.export_image(client, tag, out, images_dir=None, log=lambda _m: None)
    return result


def test_export_writes_archive_sha256_and_record(exported, image):
    image_id, tag, token = image
    record = json.loads(exported.record_path.read_text())
    assert schema_violations(record, "image-archive") == []
    assert record["image"]["id"] == image_id and record["image"]["tags"] == [tag]
    assert record["image"]["labels"]["io.repro-kit.test.handoff"] == token
    assert record["archive"]["sha256"] == exported.sha256
    assert record["archive"]["bytes"] == exported.archive.stat().st_size == exported.bytes
    side = handoff.sha256_path_for(exported.archive).read_text()
    assert side == f"{exported.sha256}  handoff.tar\n"
    with open(exported.archive, "rb") as f:
        config_id, labels, repo_tags = handoff.archive_config(f)
    assert config_id == image_id and labels["io.repro-kit.test.handoff"] == token
    assert repo_tags == [], "the archive must not tag anything when loaded"


def test_tampered_archive_is_refused_and_nothing_is_loaded(client, exported, image, tmp_path):
    image_id, tag, _ = image
    _remove(client, image_id)
    bad = tmp_path / "handoff.tar"
    shutil.copy(exported.archive, bad)
    shutil.copy(exported.record_path, handoff.record_path_for(bad))
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(HandoffError, match=r"sha256 [0-9a-f]{64} .* does not match the record"):
        handoff.import_image(client, bad, images_dir=tmp_path / "images", log=lambda _m: None)
    assert not _exists(client, image_id) and not _exists(client, tag)
    assert not (tmp_path / "images").exists()


def test_record_with_other_labels_is_refused_before_loading(client, exported, image, tmp_path):
    image_id, tag, _ = image
    _remove(client, image_id)
    record = json.loads(exported.record_path.read_text())
    forged = copy.deepcopy(record)
    forged["image"]["labels"]["io.repro-kit.test.handoff"] = "someone-else"
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(forged))
    with pytest.raises(HandoffError, match=r"labels differ from the record: io\.repro-kit"):
        handoff.import_image(client, exported.archive, record=path, log=lambda _m: None)
    forged = copy.deepcopy(record)
    forged["image"]["id"] = "sha256:" + "0" * 64
    path.write_text(json.dumps(forged))
    with pytest.raises(HandoffError, match="the image inside is sha256:"):
        handoff.import_image(client, exported.archive, record=path, log=lambda _m: None)
    assert not _exists(client, image_id) and not _exists(client, tag)


def test_import_round_trip_tags_and_records_the_archive(client, exported, image, tmp_path):
    image_id, tag, token = image
    _remove(client, image_id)
    assert not _exists(client, image_id)
    images = tmp_path / "images"
    done = handoff.import_image(client, exported.archive, images_dir=images, log=lambda _m: None)
    assert done.image_id == image_id and done.tags == [tag]
    assert client.images.get(tag).id == image_id
    assert client.images.get(image_id).labels["io.repro-kit.test.handoff"] == token
    record = json.loads(done.record_path.read_text())
    assert schema_violations(record, "image-import") == []
    assert record["archive"]["sha256"] == exported.sha256
    assert len(done.checks) == 4 and done.checks[-1] == f"tagged {tag}"
    again = handoff.import_image(client, exported.archive, images_dir=images, log=lambda _m: None)
    assert again.checks[-1] == f"tagged nothing new; already tagged here: {tag}"
    # A run in this image records which archive it came from, and the artifact schema takes it.
    location = handoff.location_image(image_id, client.images.get(image_id).labels, images)
    assert location["archive_sha256"] == exported.sha256
    doc = json.loads(FIXTURE.read_text())
    doc["run"]["location"] = {"kind": "container", "hostname_sha256": "0" * 64, "image": location}
    validate_artifact(doc)


def test_import_never_moves_an_existing_tag(client, exported, image, base_tag, tmp_path):
    image_id, tag, _ = image
    record = json.loads(exported.record_path.read_text())
    record["image"]["tags"] = [base_tag]  # names another image here
    path = tmp_path / "retag.json"
    path.write_text(json.dumps(record))
    base_id = client.images.get(base_tag).id
    with pytest.raises(HandoffError, match="already names image .* not overwritten"):
        handoff.import_image(client, exported.archive, record=path, log=lambda _m: None)
    assert client.images.get(base_tag).id == base_id


def test_missing_record_and_unknown_image_are_named(client, tmp_path):
    archive = tmp_path / "lonely.tar"
    archive.write_bytes(b"x")
    with pytest.raises(HandoffError, match="no archive record"):
        handoff.import_image(client, archive, log=lambda _m: None)
    with pytest.raises(HandoffError, match="no image 'repro-kit-test/none:missing'"):
        handoff.export_image(client, "repro-kit-test/none:missing", tmp_path / "x.tar")


# --- crafted archives: whatever `docker load` would read beyond the one image is refused ----


def _members(archive: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(archive) as tar:
        return [(m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar.getmembers()]


def _craft(exported, tmp_path: Path, name: str, edit) -> Path:
    """A copy of the export with ``edit`` applied to its members, and a record that matches
    it (the sender controls both, so the hashes prove nothing here)."""
    members = edit(_members(exported.archive))
    out = tmp_path / name
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    record = json.loads(exported.record_path.read_text())
    data = out.read_bytes()
    record["archive"].update(
        file=out.name, bytes=len(data), sha256=__import__("hashlib").sha256(data).hexdigest()
    )
    handoff.record_path_for(out).write_text(json.dumps(record))
    return out


def _manifest(members) -> list[dict]:
    return json.loads(next(d for m, d in members if m.name == "manifest.json"))


def _with_manifest(members, manifest: list[dict], name: str = "manifest.json"):
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    kept = [(m, d) for m, d in members if m.name != name]
    return kept + [(info, json.dumps(manifest).encode())]


def _second_image_entry(members, victim):
    """A second entry: another image (the config with one label changed) tagged as victim."""
    manifest = _manifest(members)
    config_name = manifest[0]["Config"]
    config = json.loads(next(d for m, d in members if m.name == config_name))
    config["config"]["Labels"]["org.opencontainers.image.title"] = "impostor"
    raw = json.dumps(config).encode()
    info = tarfile.TarInfo(__import__("hashlib").sha256(raw).hexdigest() + ".json")
    info.mode = 0o644
    entry = {"Config": info.name, "RepoTags": [victim], "Layers": manifest[0]["Layers"]}
    return _with_manifest(members + [(info, raw)], manifest + [entry])


def _alias_entry(members, victim):
    """``./manifest.json`` after ``manifest.json``: docker extracts both to one file."""
    manifest = _manifest(members)
    tagged = [dict(manifest[0], RepoTags=[victim])]
    return _with_manifest(members, manifest) + _with_manifest([], tagged, "./manifest.json")


def _same_image_victim_entry(members, victim):
    """A second entry naming the recorded image itself, tagged as the victim."""
    manifest = _manifest(members)
    return _with_manifest(members, manifest + [dict(manifest[0], RepoTags=[victim])])


@pytest.mark.parametrize(
    "craft, refusal",
    [
        (_second_image_entry, "lists 2 manifest entries"),
        (_alias_entry, r"member named '\./manifest\.json'"),
        (_same_image_victim_entry, "lists 2 manifest entries"),
    ],
    ids=["second-entry", "alias", "same-image-victim-tag"],
)
def test_crafted_archives_are_refused_and_move_no_tag(
    client, exported, image, base_tag, tmp_path, craft, refusal
):
    image_id, tag, _ = image
    _remove(client, image_id)
    victim = f"{REPO}-victim:{uuid.uuid4().hex[:12]}"
    base = client.images.get(base_tag)
    base.tag(*victim.split(":"))
    try:
        crafted = _craft(exported, tmp_path, "crafted.tar", lambda m: craft(m, victim))
        before = sorted((t, i.id) for i in client.images.list() for t in i.tags)
        with pytest.raises(HandoffError, match=refusal):
            handoff.import_image(
                client, crafted, images_dir=tmp_path / "images", log=lambda _m: None
            )
        after = sorted((t, i.id) for i in client.images.list() for t in i.tags)
        assert after == before and client.images.get(victim).id == base.id
        assert not _exists(client, image_id) and not (tmp_path / "images").exists()
    finally:
        client.images.remove(victim, noprune=True)


def test_docker_loads_the_clean_rebuilt_archive_not_the_received_file(client, exported, image):
    """The rebuilt archive holds one untagged entry, the config and the layers only."""
    with open(exported.archive, "rb") as f:
        plan = handoff.inspect_archive(f)
        rebuilt = b"".join(handoff.clean_archive(f, plan))
    with tarfile.open(fileobj=io.BytesIO(rebuilt)) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())
    assert names == ["manifest.json", plan.config_name, *plan.layer_names]
    assert manifest == [{"Config": plan.config_name, "RepoTags": None, "Layers": plan.layer_names}]
    assert plan.image_id == image[0]
