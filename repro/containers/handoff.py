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
2. before loading, the whole archive is inspected (`inspect_archive`; nothing is extracted):
   every member header, names only in `docker save`'s spelling (``./manifest.json`` is
   refused: `docker load` would read it as ``manifest.json``), no name twice, no sparse
   member, no hard link or link to anything but an earlier file; exactly one manifest entry,
   carrying no tags; no ``repositories`` file or ``index.json`` annotation naming a tag; the
   image config hashes to the recorded image id and carries the recorded labels;
3. ``docker load`` of a clean archive the kit rebuilds from the inspected blobs
   (`clean_archive`): one untagged manifest entry, the config and the layers, so nothing
   else in the received file, however another tar reader reads it, reaches the daemon;
4. after loading, the loaded image's id and labels are compared with the record again;
5. only then are the recorded tags applied, and never over a tag that names another image;
6. an import record (schemas/image-import.v1.schema.json) is written into the images folder:
   it ties the image id to the archive's sha256, which a run in that image records as
   ``run.location.image.archive_sha256`` (see `location_image`).

The archive is hashed, inspected and loaded through one open file descriptor, so a file
swapped in by name between the check and the load is not what gets loaded.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from repro import KIT_SOURCE, __version__
from repro.artifact import schema_violations
from repro.core.atomicio import open_atomic, sha256_stream, write_json_atomic, write_text_atomic
from repro.core.clock import utc_text
from repro.core.errors import ReproError
from repro.core.jsonread import JSONUnreadable, parse_json_bytes, read_json, read_json_bytes

DEFAULT_IMAGES_DIR = KIT_SOURCE / "artifacts" / "images"
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
    violations = schema_violations(doc, schema)
    if violations:
        lines = "\n".join(f"  - {v}" for v in violations)
        raise HandoffError(f"{where} does not match schemas/{schema}.v1.schema.json:\n{lines}")


def _validity(doc: Any, schema: str) -> bool:
    return not schema_violations(doc, schema)


def find_image_record(images_dir: Path | None, schema_tag: str, ids: set[str]) -> bytes | None:
    """The bytes of a record (``schema`` ``schema_tag``) of one of the images ``ids`` in the
    images folder, where build-image and import-image write them; None if there is none."""
    if images_dir is None or not images_dir.is_dir():
        return None
    for file in sorted(images_dir.glob("*.json")):
        if file.is_symlink():
            continue  # a record is a file the kit wrote here, never a link to one elsewhere
        try:
            data = read_json_bytes(file)
            doc = parse_json_bytes(data, str(file))
        except JSONUnreadable:
            continue  # not a record (or a damaged one): no image is matched by it
        if isinstance(doc, dict) and doc.get("schema") == schema_tag:
            if (doc.get("image") or {}).get("id") in ids:
                return data
    return None


# --- export --------------------------------------------------------------------------------


def export_image(
    client, image_ref: str, out: Path, *, images_dir: Path | None = DEFAULT_IMAGES_DIR, log=print
) -> Exported:
    """Save ``image_ref`` to ``out`` with its sha256 and archive record (all atomic)."""
    # lazy: docker-py, needed only where a Docker daemon is used
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
    raw = find_image_record(images_dir, "repro-kit/image-record", {image.id})
    build_record = json.loads(raw) if raw else None
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
        "exported_at": utc_text(),
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
    if not (path.exists() or path.is_symlink()):
        raise HandoffError(
            f"no archive record {path}: import-image needs the {archive.name}.json that "
            f"export-image wrote next to the archive (or give it with --record)"
        )
    try:
        raw = read_json_bytes(path)
        doc = parse_json_bytes(raw, str(path))
    except JSONUnreadable as exc:
        raise HandoffError(f"{exc}; give the record export-image wrote") from None
    _validate(doc, "image-archive", str(path))
    return doc, raw, path


# Annotations by which `docker load` (containerd image store) names what it loads.
_TAGGING_ANNOTATIONS = ("io.containerd.image.name", "org.opencontainers.image.ref.name")


@dataclass
class ArchivePlan:
    """What the pre-load inspection found: the one image, and where its blobs lie."""

    image_id: str
    labels: dict[str, str]
    config_name: str
    config: bytes
    layer_names: list[str]  # the manifest's Layers, links resolved to the file they name
    blobs: dict[str, tuple[int, int]]  # name -> (offset of its data, size) in the archive
    members: int


def _refuse(text: str) -> HandoffError:
    return HandoffError(f"the image archive {text}. Nothing was loaded or tagged")


def _member_name(member: tarfile.TarInfo) -> str:
    """The member's name exactly as `docker save` writes names, or a refusal.

    `docker load` extracts the archive before reading it, so ``./manifest.json`` and
    ``manifest.json`` are one file there; a name in any other spelling is refused here."""
    name = member.name
    parts = name.split("/")
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or not name.isprintable()
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise _refuse(f"has a member named {name!r}: not a plain relative path")
    return name


def inspect_archive(handle: BinaryIO) -> ArchivePlan:
    """Read every member header and the small JSON files; refuse anything `docker save`
    would not write or that could tag on load. Layers are located, not read."""
    handle.seek(0)
    regular: dict[str, tuple[int, int]] = {}
    links: dict[str, str] = {}
    seen: set[str] = set()
    count = 0
    try:
        with tarfile.open(fileobj=handle, mode="r:") as tar:
            for member in tar:
                count += 1
                name = _member_name(member)
                if name in seen:
                    raise _refuse(f"holds {name!r} twice (`docker load` keeps the last one)")
                seen.add(name)
                parents = ["/".join(name.split("/")[:i]) for i in range(1, name.count("/") + 1)]
                through = [p for p in parents if p in links or p in regular]
                if through:
                    raise _refuse(f"has {name!r} below {through[0]!r}, which is not a folder")
                if member.isdir():
                    continue
                if member.issparse():
                    raise _refuse(f"has a sparse member {name!r}; `docker save` writes none")
                if member.isreg():
                    regular[name] = (member.offset_data, member.size)
                elif member.issym():
                    # `docker save` links a layer saved twice to its first copy.
                    target = posixpath.normpath(
                        posixpath.join(posixpath.dirname(name), member.linkname)
                    )
                    if member.linkname.startswith("/") or target not in regular:
                        raise _refuse(
                            f"has a link {name!r} to {member.linkname!r}, which is not a file "
                            "earlier in the archive"
                        )
                    links[name] = target
                else:
                    raise _refuse(f"has {name!r}, a hard link or special file")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise HandoffError(f"the image archive is not a readable tar ({exc})") from exc
    finally:
        handle.seek(0)
    size = _end_of(handle)
    for name, (offset, length) in regular.items():
        if offset + length > size:
            raise _refuse(f"ends inside {name!r} (truncated)")

    def small_json(name: str) -> Any:
        offset, length = regular[name]
        if length > _SMALL_MEMBER:
            raise _refuse(f"has a {length}-byte {name}; docker writes a few KiB")
        try:
            return parse_json_bytes(_read_at(handle, offset, length), name)
        except JSONUnreadable as exc:
            raise _refuse(f"has a {name} that is not readable JSON ({exc})") from exc

    if "manifest.json" in links or "manifest.json" not in regular:
        raise _refuse("has no manifest.json file; it was not written by `docker save`")
    manifest = small_json("manifest.json")
    if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
        entries = len(manifest) if isinstance(manifest, list) else "no list of"
        raise _refuse(
            f"lists {entries} manifest entries; an export holds exactly one image and "
            "`docker load` would load (and tag) every entry"
        )
    entry = manifest[0]
    if entry.get("RepoTags"):
        raise _refuse(
            f"carries repository tags {entry['RepoTags']!r}; loading it would tag before any "
            "check. Export it again with `python -m repro export-image`"
        )
    if "repositories" in links or (
        "repositories" in regular and small_json("repositories") not in ({}, None)
    ):
        raise _refuse("has a `repositories` file naming tags (the legacy format tags on load)")
    if "index.json" in links:
        raise _refuse("has index.json as a link")
    if "index.json" in regular:
        index = small_json("index.json")
        descriptors = index.get("manifests") if isinstance(index, dict) else None
        if not isinstance(descriptors, list) or len(descriptors) > 1:
            raise _refuse("has an index.json that does not list at most one image")
        for descriptor in descriptors:
            annotations = descriptor.get("annotations") if isinstance(descriptor, dict) else {}
            named = sorted(set(annotations or {}) & set(_TAGGING_ANNOTATIONS))
            if named:
                raise _refuse(f"has an index.json naming the image ({', '.join(named)})")
    config_name, layers = entry.get("Config"), entry.get("Layers")
    if not isinstance(config_name, str) or config_name not in regular:
        raise _refuse(f"has a manifest whose Config {config_name!r} is not a file in it")
    if not isinstance(layers, list) or not all(isinstance(x, str) for x in layers):
        raise _refuse("has a manifest without a list of Layers")
    resolved = []
    for layer in layers:
        target = links.get(layer, layer)
        if target not in regular:
            raise _refuse(f"has a manifest naming layer {layer!r}, which is not a file in it")
        resolved.append(target)
    offset, length = regular[config_name]
    if length > _SMALL_MEMBER:
        raise _refuse(f"has a {length}-byte image config; docker writes a few KiB")
    config = _read_at(handle, offset, length)
    try:
        parsed = parse_json_bytes(config, config_name)
        labels = (parsed.get("config") or {}).get("Labels") or {}
        diff_ids = (parsed.get("rootfs") or {}).get("diff_ids") or []
        if not isinstance(labels, dict) or not isinstance(diff_ids, list):
            raise TypeError("Labels or rootfs.diff_ids of the wrong type")
    except (JSONUnreadable, AttributeError, TypeError) as exc:
        raise _refuse(f"has an image config that is not an image config ({exc})") from exc
    if len(diff_ids) != len(resolved):
        raise _refuse(f"has {len(resolved)} layers for an image config of {len(diff_ids)} layers")
    blobs = {name: regular[name] for name in dict.fromkeys([config_name, *resolved])}
    return ArchivePlan(
        image_id="sha256:" + hashlib.sha256(config).hexdigest(),
        labels=dict(labels),
        config_name=config_name,
        config=config,
        layer_names=resolved,
        blobs=blobs,
        members=count,
    )


def archive_config(handle: BinaryIO) -> tuple[str, dict[str, str], list[str]]:
    """(image id, labels, repo tags) of the one image the archive holds (see inspect_archive);
    the tags are always empty: an archive that carries any is refused."""
    plan = inspect_archive(handle)
    return plan.image_id, plan.labels, []


def _end_of(handle: BinaryIO) -> int:
    here = handle.tell()
    end = handle.seek(0, 2)
    handle.seek(here)
    return end


def _read_at(handle: BinaryIO, offset: int, length: int) -> bytes:
    handle.seek(offset)
    data = handle.read(length)
    if len(data) != length:
        raise _refuse(f"ends {length - len(data)} bytes early")
    return data


def clean_archive(handle: BinaryIO, plan: ArchivePlan) -> Iterator[bytes]:
    """A `docker save` archive of exactly the inspected image, rebuilt from its blobs.

    This, not the received file, is what `docker load` reads: one manifest entry without
    tags, the verified config and the manifest's layers, nothing else. Whatever the received
    tar held besides (and however another tar reader would read it) cannot reach the daemon;
    docker itself checks each layer against the config's diff_ids."""
    manifest = json.dumps(
        [{"Config": plan.config_name, "RepoTags": None, "Layers": plan.layer_names}]
    ).encode()
    yield from _tar_member("manifest.json", len(manifest), iter([manifest]))
    for name, (offset, length) in plan.blobs.items():
        yield from _tar_member(name, length, _chunks_at(handle, offset, length))
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


def _tar_member(name: str, size: int, chunks: Iterator[bytes]) -> Iterator[bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")
    yield from chunks
    if size % tarfile.BLOCKSIZE:
        yield b"\0" * (tarfile.BLOCKSIZE - size % tarfile.BLOCKSIZE)


def _chunks_at(handle: BinaryIO, offset: int, length: int) -> Iterator[bytes]:
    left = length
    while left:
        handle.seek(offset + length - left)
        chunk = handle.read(min(_CHUNK, left))
        if not chunk:
            raise HandoffError("the image archive changed while loading; nothing was tagged")
        left -= len(chunk)
        yield chunk


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
    # lazy: docker-py, needed only where a Docker daemon is used
    import docker

    started = time.monotonic()
    doc, raw_record, record_file = read_archive_record(archive, record)
    expected_id = doc["image"]["id"]
    expected_labels = doc["image"]["labels"]
    checks: list[str] = []
    if not archive.is_file():
        raise HandoffError(f"{archive}: no such archive")
    with open(archive, "rb") as handle:
        sha256, size = sha256_stream(handle)
        handle.seek(0)
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

        plan = inspect_archive(handle)
        config_id, config_labels = plan.image_id, plan.labels
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
        checks.append(
            f"before loading: {plan.members} members, one untagged image, config {config_id} "
            "with the recorded labels"
        )

        existed = _exists(client, expected_id)
        log(f"[repro] loading {archive.name} ({size} bytes)")
        try:
            loaded = client.images.load(clean_archive(handle, plan))
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
        "imported_at": utc_text(),
        "kit": {"name": "repro-kit", "version": __version__},
        "checks": checks,
    }
    _validate(import_record, "image-import", "the import record")
    path = images_dir / f"imported-{expected_id.split(':', 1)[1][:16]}.json"
    write_json_atomic(path, import_record)
    return Imported(expected_id, tags, path, time.monotonic() - started, checks)


def _exists(client, image_id: str) -> bool:
    # lazy: docker-py, needed only where a Docker daemon is used
    import docker

    try:
        client.images.get(image_id)
        return True
    except docker.errors.ImageNotFound:
        return False


def _tag_target(client, tag: str) -> str | None:
    # lazy: docker-py, needed only where a Docker daemon is used
    import docker

    try:
        return client.images.get(tag).id
    except docker.errors.ImageNotFound:
        return None


def _remove_if_new(client, ids: list[str], existed: bool) -> None:
    """Undo a load that added an image which fails the checks (never one that was here)."""
    # lazy: docker-py, needed only where a Docker daemon is used
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
            if file.is_symlink():
                continue
            try:
                doc = read_json(file)
            except JSONUnreadable:
                continue
            if not isinstance(doc, dict) or doc.get("schema") != "repro-kit/image-import":
                continue
            if _validity(doc, "image-import") and doc["image"]["id"] == image_id:
                image["archive_sha256"] = doc["archive"]["sha256"]
    return image


__all__ = [
    "DEFAULT_IMAGES_DIR",
    "find_image_record",
    "Exported",
    "HandoffError",
    "Imported",
    "ArchivePlan",
    "archive_config",
    "clean_archive",
    "export_image",
    "import_image",
    "inspect_archive",
    "location_image",
]
