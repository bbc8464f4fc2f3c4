"""Hand an image to another lab: export it to an archive, import it there with every check.

Export (`python -m repro export-image IMAGE --out FILE.tar`) writes three files atomically:

- ``FILE.tar``: `docker save` of the image *id*, so the archive carries no repository tags and
  loading it tags nothing (docker-py: ``image.save(named=False)``);
- ``FILE.tar.sha256``: its sha256, in `sha256sum` format;
- ``FILE.tar.json``: the archive record (schemas/image-archive.v1.schema.json): the archive's
  size and sha256, the image's id, tags, labels and size, and its build record where the kit
  built it here.

Import (`python -m repro import-image FILE.tar`), refusing at the first mismatch and naming it:

1. the record validates; the archive's size and sha256 match it (and ``FILE.tar.sha256``);
2. before loading, the image config inside the archive hashes to the recorded image id and
   carries the recorded labels (read from the tar's own manifest; nothing is extracted);
3. ``docker load`` (the archive has no tags, so nothing is tagged by the load itself);
4. after loading, the loaded image's id and labels are compared with the record again;
5. only then are the recorded tags applied, and never over a tag that names another image;
6. an import record (schemas/image-import.v1.schema.json) is written into the images folder:
   it ties the image id to the archive's sha256, which a run in that image records as
   ``run.location.image.archive_sha256`` (see `location_image`).

The archive is hashed and loaded through one open file descriptor, so a file swapped in by
name between the check and the load is not what gets loaded.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from repro import __version__
from repro.atomicio import open_atomic, write_json_atomic, write_text_atomic
from repro.errors import ReproError

DEFAULT_IMAGES_DIR = Path(__file__).resolve().parent.parent.parent / "artifacts" / "images"
_CHUNK = 8 << 20
_SMALL_MEMBER = 4 << 20


class HandoffError(ReproError):
    """An image archive, its record, or the loaded image failed a check; nothing was tagged."""


@dataclass
class Exported:
    archive: Path
    sha256: str
    bytes: int
    record_path: Path
    seconds: float


@dataclass
class Imported:
    image_id: str
    tags: list[str]
    record_path: Path
    seconds: float
    checks: list[str]


def record_path_for(archive: Path) -> Path:
    return archive.with_name(archive.name + ".json")


def sha256_path_for(archive: Path) -> Path:
    return archive.with_name(archive.name + ".sha256")


def _validate(doc: Any, schema: str, where: str) -> None:
    from repro.artifact import schema_violations

    violations = schema_violations(doc, schema)
    if violations:
        lines = "\n".join(f"  - {v}" for v in violations)
        raise HandoffError(f"{where} does not match schemas/{schema}.v1.schema.json:\n{lines}")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _find_build_record(images_dir: Path | None, image_id: str) -> dict[str, Any] | None:
    if images_dir is None or not images_dir.is_dir():
        return None
    for file in sorted(images_dir.glob("*.json")):
        try:
            doc = json.loads(file.read_bytes())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(doc, dict) and doc.get("schema") == "repro-kit/image-record":
            if (doc.get("image") or {}).get("id") == image_id:
                return doc
    return None


# --- export --------------------------------------------------------------------------------


def export_image(
    client, image_ref: str, out: Path, *, images_dir: Path | None = DEFAULT_IMAGES_DIR, log=print
) -> Exported:
    """Save ``image_ref`` to ``out`` with its sha256 and archive record (all atomic)."""
    import docker

    if not out.parent.is_dir():
        raise HandoffError(f"--out {out}: folder {out.parent} does not exist; create it first")
    try:
        image = client.images.get(image_ref)
    except docker.errors.ImageNotFound as exc:
        raise HandoffError(f"no image {image_ref!r} here; `docker images` lists them") from exc
    started = time.monotonic()
    digest = hashlib.sha256()
    size = 0
    log(f"[repro] saving {image_ref} ({image.id}) to {out}")
    with open_atomic(out) as handle:
        for chunk in image.save(named=False, chunk_size=_CHUNK):
            handle.write(chunk)
            digest.update(chunk)
            size += len(chunk)
    sha256 = digest.hexdigest()
    build_record = _find_build_record(images_dir, image.id)
    record = {
        "schema": "repro-kit/image-archive",
        "schema_version": 1,
        "archive": {"file": out.name, "bytes": size, "sha256": sha256, "format": "docker-save"},
        "image": {
            "id": image.id,
            "tags": sorted(image.tags),
            "labels": dict(image.labels or {}),
            "size_bytes": int(image.attrs.get("Size") or 0),
        },
        "exported_at": _now(),
        "kit": {"name": "repro-kit", "version": __version__},
        "build_record": build_record,
    }
    _validate(record, "image-archive", "the archive record")
    write_text_atomic(sha256_path_for(out), f"{sha256}  {out.name}\n")
    write_json_atomic(record_path_for(out), record)
    return Exported(out, sha256, size, record_path_for(out), time.monotonic() - started)


# --- import --------------------------------------------------------------------------------


def read_archive_record(archive: Path, record: Path | None = None) -> tuple[dict, bytes, Path]:
    path = record or record_path_for(archive)
    if not path.is_file():
        raise HandoffError(
            f"no archive record {path}: import-image needs the {archive.name}.json that "
            f"export-image wrote next to the archive (or give it with --record)"
        )
    raw = path.read_bytes()
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HandoffError(f"{path}: not JSON ({exc})") from exc
    _validate(doc, "image-archive", str(path))
    return doc, raw, path


def _hash_handle(handle: BinaryIO) -> tuple[str, int]:
    handle.seek(0)
    digest = hashlib.sha256()
    size = 0
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    handle.seek(0)
    return digest.hexdigest(), size


def archive_config(handle: BinaryIO) -> tuple[str, dict[str, str], list[str]]:
    """(image id, labels, repo tags) from the archive's own manifest, nothing extracted.

    `docker save` writes ``manifest.json`` naming the image config file; the image id is the
    sha256 of that file's bytes (legacy and OCI layouts alike).
    """
    handle.seek(0)
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=handle, mode="r|") as tar:  # one streaming pass
            for member in tar:
                # manifest.json and the config are small; layers are skipped unread. (The
                # config is `<hex>.json` in the legacy layout, `blobs/sha256/<hex>` in OCI.)
                if member.isreg() and member.size <= _SMALL_MEMBER:
                    members[member.name] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError) as exc:
        raise HandoffError(f"the image archive is not a readable tar ({exc})") from exc
    finally:
        handle.seek(0)
    try:
        manifest = json.loads(members["manifest.json"])
        entry = manifest[0]
        config = members[entry["Config"]]
    except (KeyError, IndexError, TypeError, json.JSONDecodeError) as exc:
        raise HandoffError(
            f"the image archive has no usable manifest.json/config ({type(exc).__name__}: "
            f"{exc}); it was not written by `docker save`"
        ) from exc
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    labels = (json.loads(config).get("config") or {}).get("Labels") or {}
    return image_id, dict(labels), list(entry.get("RepoTags") or [])


def _label_diff(expected: dict[str, str], found: dict[str, str]) -> list[str]:
    out = []
    for key in sorted(set(expected) | set(found)):
        if expected.get(key) != found.get(key):
            out.append(f"{key}: record {expected.get(key)!r}, image {found.get(key)!r}")
    return out


def import_image(
    client,
    archive: Path,
    *,
    record: Path | None = None,
    images_dir: Path = DEFAULT_IMAGES_DIR,
    log=print,
) -> Imported:
    """Check, load, re-check, tag and record ``archive``; raise HandoffError on any mismatch."""
    import docker

    started = time.monotonic()
    doc, raw_record, record_file = read_archive_record(archive, record)
    expected_id = doc["image"]["id"]
    expected_labels = doc["image"]["labels"]
    checks: list[str] = []
    if not archive.is_file():
        raise HandoffError(f"{archive}: no such archive")
    with open(archive, "rb") as handle:
        sha256, size = _hash_handle(handle)
        if sha256 != doc["archive"]["sha256"] or size != doc["archive"]["bytes"]:
            raise HandoffError(
                f"{archive}: sha256 {sha256} ({size} bytes) does not match the record's "
                f"{doc['archive']['sha256']} ({doc['archive']['bytes']} bytes): the archive is "
                "damaged or not the one exported. Nothing was loaded or tagged; ask for it again"
            )
        side = sha256_path_for(archive)
        if side.is_file():
            listed = side.read_text(encoding="utf-8", errors="replace").split()
            if not listed or listed[0] != sha256:
                raise HandoffError(
                    f"{side.name} says {listed[0] if listed else '(empty)'}, the archive hashes "
                    f"to {sha256}. Nothing was loaded or tagged"
                )
        checks.append(f"archive sha256 {sha256} ({size} bytes) matches the record")

        config_id, config_labels, repo_tags = archive_config(handle)
        if config_id != expected_id:
            raise HandoffError(
                f"{archive}: the image inside is {config_id}, the record says {expected_id}. "
                "Nothing was loaded or tagged"
            )
        diff = _label_diff(expected_labels, config_labels)
        if diff:
            raise HandoffError(
                f"{archive}: the image's labels differ from the record: {'; '.join(diff)}. "
                "Nothing was loaded or tagged"
            )
        if repo_tags:
            raise HandoffError(
                f"{archive}: carries repository tags {repo_tags}; loading it would tag before "
                "any check. Export it again with `python -m repro export-image`"
            )
        checks.append(f"before loading: image config is {config_id} with the recorded labels")

        existed = _exists(client, expected_id)
        log(f"[repro] loading {archive.name} ({size} bytes)")
        try:
            loaded = client.images.load(handle)
        except docker.errors.DockerException as exc:
            raise HandoffError(f"docker load of {archive} failed: {exc}") from exc
    ids = [image.id for image in loaded]
    if ids != [expected_id]:
        _remove_if_new(client, ids, existed)
        raise HandoffError(
            f"docker loaded {ids or 'nothing'}, the record says {expected_id}; removed what "
            "this import added, tagged nothing"
        )
    image = client.images.get(expected_id)
    diff = _label_diff(expected_labels, dict(image.labels or {}))
    if diff:
        _remove_if_new(client, ids, existed)
        raise HandoffError(
            f"the loaded image's labels differ from the record: {'; '.join(diff)}; removed "
            "what this import added, tagged nothing"
        )
    checks.append(f"after loading: image id {expected_id} and its labels match the record")

    tags = doc["image"]["tags"]
    missing = []
    for tag in tags:
        other = _tag_target(client, tag)
        if other is not None and other != expected_id:
            raise HandoffError(
                f"tag {tag} already names image {other} here; not overwritten. The image "
                f"{expected_id} is loaded untagged: tag it yourself under another name"
            )
        if other is None:
            missing.append(tag)
    for tag in missing:  # a tag that already names this image is left alone
        repository, _, version = tag.rpartition(":")
        image.tag(repository, version)
    present = [t for t in tags if t not in missing]
    checks.append(
        f"tagged {', '.join(missing) or 'nothing new'}"
        + (f"; already tagged here: {', '.join(present)}" if present else "")
    )

    images_dir.mkdir(parents=True, exist_ok=True)
    import_record = {
        "schema": "repro-kit/image-import",
        "schema_version": 1,
        "image": {"id": expected_id, "tags": tags, "labels": expected_labels},
        "archive": {"file": archive.name, "bytes": size, "sha256": sha256},
        "record": {"file": record_file.name, "sha256": hashlib.sha256(raw_record).hexdigest()},
        "imported_at": _now(),
        "kit": {"name": "repro-kit", "version": __version__},
        "checks": checks,
    }
    _validate(import_record, "image-import", "the import record")
    path = images_dir / f"imported-{expected_id.split(':', 1)[1][:16]}.json"
    write_json_atomic(path, import_record)
    return Imported(expected_id, tags, path, time.monotonic() - started, checks)


def _exists(client, image_id: str) -> bool:
    import docker

    try:
        client.images.get(image_id)
        return True
    except docker.errors.ImageNotFound:
        return False


def _tag_target(client, tag: str) -> str | None:
    import docker

    try:
        return client.images.get(tag).id
    except docker.errors.ImageNotFound:
        return None


def _remove_if_new(client, ids: list[str], existed: bool) -> None:
    """Undo a load that added an image which fails the checks (never one that was here)."""
    import docker

    if existed:
        return
    for image_id in ids:
        try:
            client.images.remove(image_id, noprune=False)
        except docker.errors.APIError:
            pass


def location_image(image_id: str, labels: dict[str, str], images_dir: Path = DEFAULT_IMAGES_DIR):
    """``run.location.image`` for a run in ``image_id``: id, labels, and the archive's sha256
    when an import record says the image came from one (for the container runner)."""
    image: dict[str, Any] = {"id": image_id, "labels": dict(labels)}
    if images_dir.is_dir():
        for file in sorted(images_dir.glob("imported-*.json")):
            try:
                doc = json.loads(file.read_bytes())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                continue
            if doc.get("schema") == "repro-kit/image-import" and doc["image"]["id"] == image_id:
                image["archive_sha256"] = doc["archive"]["sha256"]
    return image


__all__ = [
    "DEFAULT_IMAGES_DIR",
    "Exported",
    "HandoffError",
    "Imported",
    "archive_config",
    "export_image",
    "import_image",
    "location_image",
]
