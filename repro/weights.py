"""Model weights for offline runs: fetch a pinned snapshot, record a sha256 manifest, verify it.

``fetch`` downloads what the engine needs of a profile's model (config, tokenizer, chat
template, ``*.safetensors`` and their index) with ``huggingface_hub.snapshot_download`` into
a Hugging Face cache folder, at one full 40-hex commit:

- the commit is, in this order: ``--revision``, the profile's ``revision``, the entry for the
  repo in the lock file (``containers/weights.lock.json``), or else what ``main`` points to on
  the Hub now, which is then written to the lock file so later fetches get the same files;
- the snapshot is ``<cache>/models--ORG--NAME/snapshots/<commit>/`` (the cache's layout: the
  snapshot's files are relative links into ``../../blobs``, so a container mounts the whole
  ``models--ORG--NAME`` folder, not the snapshot alone);
- ``repro-weights-manifest.json`` is written inside the snapshot folder (so it travels with
  the mount): repo id, commit, the allow patterns, and every file's path, size and sha256,
  validated against ``schemas/weights-manifest.v1.schema.json``;
- a fetch that finds the manifest and every file it lists, with the listed sizes, returns
  without touching the network (sizes only; ``verify`` re-hashes). An interrupted download
  is resumed by the next fetch (``snapshot_download`` keeps ``.incomplete`` blobs and asks
  for the rest with a Range request).

A token, where a repo needs one, comes from ``HF_TOKEN`` in the environment and is read by
huggingface_hub itself; the kit never writes it anywhere (the manifest and the lock entry are
scanned for credentials before they are written, as artifacts are).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.artifact import _describe, _validator, schema_path
from repro.core.atomicio import sha256_file, write_json_atomic
from repro.core.clock import utc_text
from repro.core.errors import ReproError
from repro.core.jsonread import JSONUnreadable, read_json
from repro.core.redaction import scan_document

__all__ = [
    "ALLOW_PATTERNS",
    "DEFAULT_LOCK",
    "PIN_ENV",
    "model_pin",
    "MANIFEST_NAME",
    "FetchResult",
    "WeightsError",
    "build_manifest",
    "check_snapshot",
    "default_cache_dir",
    "fetch",
    "lock_revision",
    "pinned_revision",
    "repo_folder",
    "snapshot_dir",
    "validate_manifest",
    "verify",
]

MANIFEST_NAME = "repro-weights-manifest.json"
DEFAULT_LOCK = Path(__file__).resolve().parent.parent / "containers" / "weights.lock.json"
COMMIT = re.compile(r"^[0-9a-f]{40}$")

# What vLLM reads of a checkpoint: the configs, the tokenizer (either kind), the chat
# template, the weights and their index. Nothing else (README, images, original/ PyTorch
# files, GGUF) is fetched. Qwen3.6 is a vision-language checkpoint; vLLM builds its
# processor from preprocessor_config.json even for text-only prompts, so that is fetched too.
ALLOW_PATTERNS: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
)

_HASH_CHUNK = 8 << 20


class WeightsError(ReproError):
    """The weights cannot be fetched or do not match their manifest."""


@dataclass(frozen=True)
class FetchResult:
    snapshot: Path
    revision: str
    revision_source: str  # "--revision", "profile", "lock file" or "hub (main)"
    downloaded: bool  # False: everything was present, the Hub was not contacted
    manifest: dict[str, Any]


# --- where things are ----------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``REPRO_WEIGHTS_CACHE``, else the Hugging Face cache (``HF_HUB_CACHE``, ``HF_HOME``)."""
    for name in ("REPRO_WEIGHTS_CACHE", "HF_HUB_CACHE"):
        if value := os.environ.get(name):
            return Path(value).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def repo_folder(cache: Path, repo_id: str) -> Path:
    """The cache folder of a model repo (huggingface_hub's ``models--ORG--NAME`` layout)."""
    return Path(cache) / ("models--" + repo_id.replace("/", "--"))


def snapshot_dir(cache: Path, repo_id: str, revision: str) -> Path:
    return repo_folder(cache, repo_id) / "snapshots" / revision


# --- the lock file -------------------------------------------------------------------------


def _read_lock(lock_path: Path) -> dict[str, Any]:
    if not (Path(lock_path).exists() or Path(lock_path).is_symlink()):
        return {"format": "repro-weights-lock", "format_version": 1, "models": {}}
    try:
        doc = read_json(Path(lock_path))
    except JSONUnreadable as exc:
        raise WeightsError(f"lock file {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
        raise WeightsError(f"lock file {lock_path} has no 'models' object")
    return doc


def lock_revision(repo_id: str, lock_path: Path = DEFAULT_LOCK) -> str | None:
    entry = _read_lock(lock_path)["models"].get(repo_id)
    if entry is None:
        return None
    revision = entry.get("revision") if isinstance(entry, dict) else None
    if not isinstance(revision, str) or not COMMIT.fullmatch(revision):
        raise WeightsError(f"lock file {lock_path}: {repo_id} has no 40-hex revision: {entry!r}")
    return revision


def _write_lock_entry(repo_id: str, revision: str, lock_path: Path, resolved_from: str) -> None:
    doc = _read_lock(lock_path)
    doc["models"][repo_id] = {
        "revision": revision,
        "resolved_from": resolved_from,
        "resolved_at": utc_text(),
    }
    doc["models"] = dict(sorted(doc["models"].items()))
    _refuse_secrets(doc, f"lock file {lock_path}")
    Path(lock_path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(lock_path, doc)


def pinned_revision(
    repo_id: str,
    *,
    revision: str | None = None,
    profile_revision: str | None = None,
    lock_path: Path = DEFAULT_LOCK,
) -> tuple[str | None, str]:
    """The commit to use and where it came from; ``(None, "unresolved")`` when none is pinned."""
    for value, source in ((revision, "--revision"), (profile_revision, "profile")):
        if value is not None:
            if not COMMIT.fullmatch(value):
                raise WeightsError(
                    f"{source} must be a full 40-hex commit (branch names move), got {value!r}"
                )
            return value, source
    locked = lock_revision(repo_id, lock_path)
    if locked is not None:
        return locked, "lock file"
    return None, "unresolved"


# The pin a GPU run's model was checked against, as JSON, for the run's processes (inside a
# container too): REPRO_* variables are recorded in every artifact's environment section, so
# each artifact says whether its weights were the pinned ones.
PIN_ENV = "REPRO_WEIGHTS_PIN"


def model_pin(
    repo_id: str,
    model_path: str | Path | None,
    *,
    profile_revision: str | None = None,
    lock_path: Path = DEFAULT_LOCK,
    allow_unpinned: bool = False,
) -> dict[str, Any]:
    """Whether ``model_path`` (None: the pinned snapshot in the cache) holds ``repo_id`` at its
    pinned commit; refuses an unpinned model unless ``allow_unpinned``.

    Pinned means: a commit is pinned (profile or lock file) and the folder is that commit's
    snapshot (named by it, as in a Hub cache) or carries the kit's manifest for it.
    """
    revision, source = pinned_revision(
        repo_id, profile_revision=profile_revision, lock_path=lock_path
    )
    pinned = revision is not None
    if model_path is not None and pinned:
        folder = Path(model_path)
        manifest = _load_manifest(folder) if folder.is_dir() else None
        pinned = folder.name == revision or bool(
            manifest and manifest["repo_id"] == repo_id and manifest["revision"] == revision
        )
    if not pinned and not allow_unpinned:
        where = f"{model_path}" if model_path is not None else "the weights cache"
        raise WeightsError(
            f"{repo_id} in {where} is not at a pinned commit (pinned: {revision or 'none'}, "
            f"from {source}). Fetch the pinned snapshot (`python -m repro fetch-weights "
            f"--repo {repo_id}`, which writes {lock_path.name}) and give it, or pass "
            f"--allow-unpinned to run this folder anyway (the artifacts then say unpinned)"
        )
    return {
        "repo_id": repo_id,
        "pinned": pinned,
        "revision": revision if pinned else None,
        "pinned_revision": revision,
        "source": source,
        "allowed_unpinned": not pinned,
    }


# --- the manifest --------------------------------------------------------------------------


def _allowed(paths: list[str], patterns: tuple[str, ...]) -> list[str]:
    # lazy: huggingface_hub is slow to import; only the Hub's users need it
    from huggingface_hub.utils import filter_repo_objects

    return sorted(filter_repo_objects(paths, allow_patterns=list(patterns)))


def _snapshot_files(snapshot: Path, patterns: tuple[str, ...]) -> list[str]:
    """Relative paths of the files (links followed) under ``snapshot`` that match the patterns."""
    found = []
    for root, dirs, files in os.walk(snapshot, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            rel = Path(root, name).relative_to(snapshot).as_posix()
            if rel != MANIFEST_NAME and not name.startswith("."):
                found.append(rel)
    return _allowed(found, patterns)


@contextlib.contextmanager
def _hash_progress(total: int, label: str) -> Iterator[Any]:
    """A rich progress bar on a terminal (``advance(n)``); a no-op elsewhere or without rich."""
    try:
        # lazy: rich is slow to import; only output that draws needs it
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
    except ImportError:
        yield lambda n: None
        return
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=True,
    ) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.advance(task, n)


def build_manifest(
    snapshot: Path, repo_id: str, revision: str, patterns: tuple[str, ...] = ALLOW_PATTERNS
) -> dict[str, Any]:
    """Hash every allowed file of ``snapshot`` and return the (validated) manifest."""
    snapshot = Path(snapshot)
    paths = _snapshot_files(snapshot, patterns)
    if not paths:
        raise WeightsError(f"{snapshot} holds no file matching {list(patterns)}")
    sizes = {p: (snapshot / p).stat().st_size for p in paths}
    files = []
    with _hash_progress(sum(sizes.values()), f"sha256 {repo_id}") as advance:
        for p in paths:
            files.append(
                {"path": p, "size": sizes[p], "sha256": sha256_file(snapshot / p, progress=advance)}
            )
    manifest = {
        "format": "repro-weights-manifest",
        "format_version": 1,
        "repo_id": repo_id,
        "revision": revision,
        "created": utc_text(),
        "allow_patterns": list(patterns),
        "files": files,
        "total_bytes": sum(sizes.values()),
    }
    validate_manifest(manifest)
    return manifest


def validate_manifest(doc: Any) -> None:
    """Raise ``WeightsError`` listing every violation of the weights-manifest schema."""
    errors = sorted(
        _validator("weights-manifest", 1).iter_errors(doc), key=lambda e: (e.json_path, e.message)
    )
    if errors:
        lines = "\n".join(f"  - {_describe(e)}" for e in errors)
        raise WeightsError(
            f"weights manifest is invalid ({schema_path('weights-manifest', 1)}):\n{lines}"
        )


def _load_manifest(snapshot: Path) -> dict[str, Any] | None:
    path = Path(snapshot) / MANIFEST_NAME
    if not (path.exists() or path.is_symlink()):
        return None
    try:
        doc = read_json(path)
    except JSONUnreadable as exc:
        raise WeightsError(str(exc)) from None
    validate_manifest(doc)
    return doc


def check_snapshot(snapshot: Path, manifest: dict[str, Any], *, rehash: bool) -> list[str]:
    """One line per problem: a missing, changed or unlisted file (expected vs found).

    Without ``rehash`` only presence and sizes are compared (what a repeated fetch does).
    """
    snapshot = Path(snapshot)
    problems = []
    listed = {f["path"]: f for f in manifest["files"]}
    present = []
    for entry in manifest["files"]:
        path = snapshot / entry["path"]
        if not path.is_file():  # a dangling link (blob gone) counts as missing
            problems.append(
                f"missing: {entry['path']} (expected size {entry['size']}, "
                f"sha256 {entry['sha256']})"
            )
        else:
            present.append((entry, path, path.stat().st_size))
    total = sum(size for _, _, size in present) if rehash else 0
    with _hash_progress(total, f"verify {manifest['repo_id']}") as advance:
        for entry, path, size in present:
            found_sha = sha256_file(path, progress=advance) if rehash else None
            if size != entry["size"] or (rehash and found_sha != entry["sha256"]):
                found = f"size {size}" + (f", sha256 {found_sha}" if rehash else "")
                problems.append(
                    f"changed: {entry['path']}: expected size {entry['size']}, "
                    f"sha256 {entry['sha256']}; found {found}"
                )
    patterns = tuple(manifest["allow_patterns"])
    for extra in sorted(set(_snapshot_files(snapshot, patterns)) - set(listed)):
        problems.append(f"unlisted: {extra} (in the snapshot, not in the manifest)")
    return problems


# --- fetch and verify ----------------------------------------------------------------------


def fetch(
    repo_id: str,
    *,
    revision: str | None = None,
    profile_revision: str | None = None,
    cache: Path | None = None,
    lock_path: Path = DEFAULT_LOCK,
    endpoint: str | None = None,
    patterns: tuple[str, ...] = ALLOW_PATTERNS,
    log: Any = None,
) -> FetchResult:
    """Fetch (or find) the pinned snapshot of ``repo_id`` and write its manifest."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    cache = Path(cache or default_cache_dir()).expanduser().resolve()
    pinned, source = pinned_revision(
        repo_id, revision=revision, profile_revision=profile_revision, lock_path=lock_path
    )

    previous = None
    if pinned is not None:
        snapshot = snapshot_dir(cache, repo_id, pinned)
        manifest = previous = _load_manifest(snapshot) if snapshot.is_dir() else None
        if (
            manifest is not None
            and manifest["repo_id"] == repo_id
            and manifest["revision"] == pinned
            and tuple(manifest["allow_patterns"]) == tuple(patterns)
            and not check_snapshot(snapshot, manifest, rehash=False)
        ):
            say(
                f"{repo_id}@{pinned}: all {len(manifest['files'])} files present "
                f"({manifest['total_bytes']} bytes) in {snapshot}; the Hub was not contacted "
                f"(`verify-weights` re-hashes them)"
            )
            return FetchResult(snapshot, pinned, source, False, manifest)

    # lazy: huggingface_hub is slow to import; only the Hub's users need it
    from huggingface_hub import HfApi, snapshot_download

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        raise WeightsError(
            f"{repo_id}: the snapshot is incomplete or has no manifest in {cache}, and "
            "HF_HUB_OFFLINE is set; fetch on a machine that can reach the Hub"
        )
    if pinned is None:
        say(f"{repo_id}: no revision pinned; resolving 'main' on the Hub")
        try:
            info = HfApi(endpoint=endpoint).model_info(repo_id, revision="main")
        except Exception as exc:  # connection, auth (gated repo: set HF_TOKEN), not found
            raise WeightsError(
                f"{repo_id}: cannot resolve 'main' on the Hub: {type(exc).__name__}: {exc}"
            ) from exc
        if not info.sha or not COMMIT.fullmatch(info.sha):
            raise WeightsError(f"{repo_id}: the Hub answered no commit for 'main': {info.sha!r}")
        pinned, source = info.sha, "hub (main)"
        _write_lock_entry(repo_id, pinned, lock_path, resolved_from="main")
        say(f"{repo_id}: pinned {pinned} in {lock_path}")

    say(f"{repo_id}@{pinned}: fetching {list(patterns)} into {cache}")
    try:
        path = Path(
            snapshot_download(
                repo_id,
                revision=pinned,
                cache_dir=cache,
                allow_patterns=list(patterns),
                endpoint=endpoint,
            )
        )
    except Exception as exc:
        raise WeightsError(
            f"{repo_id}@{pinned}: download stopped: {type(exc).__name__}: {exc}\n"
            "Completed files are kept in the cache; run fetch-weights again to go on."
        ) from exc
    if path.name != pinned:
        raise WeightsError(f"{repo_id}: snapshot_download returned {path}, not commit {pinned}")
    manifest = build_manifest(path, repo_id, pinned, patterns)
    if previous is not None:
        # snapshot_download keeps blobs it finds; one changed on disk since the last manifest
        # would otherwise be recorded as the truth.
        before = {f["path"]: f["sha256"] for f in previous["files"]}
        changed = [
            f"{f['path']}: manifest sha256 {before[f['path']]}, now {f['sha256']} "
            f"(blob {(path / f['path']).resolve()})"
            for f in manifest["files"]
            if f["path"] in before and before[f["path"]] != f["sha256"]
        ]
        if changed:
            raise WeightsError(
                f"{repo_id}@{pinned}: file(s) changed on disk since the manifest was written; "
                "delete each named blob and fetch again:\n  " + "\n  ".join(changed)
            )
    _refuse_secrets(manifest, f"manifest of {repo_id}")
    write_json_atomic(path / MANIFEST_NAME, manifest)
    say(
        f"{repo_id}@{pinned}: {len(manifest['files'])} files, {manifest['total_bytes']} bytes; "
        f"manifest {path / MANIFEST_NAME}"
    )
    return FetchResult(path, pinned, source, True, manifest)


def verify(
    repo_id: str,
    *,
    revision: str | None = None,
    profile_revision: str | None = None,
    cache: Path | None = None,
    lock_path: Path = DEFAULT_LOCK,
) -> tuple[Path, list[str]]:
    """Re-hash the snapshot against its manifest (offline); return it and the problems."""
    cache = Path(cache or default_cache_dir()).expanduser().resolve()
    pinned, _ = pinned_revision(
        repo_id, revision=revision, profile_revision=profile_revision, lock_path=lock_path
    )
    if pinned is None:
        candidates = sorted(
            p.parent for p in repo_folder(cache, repo_id).glob(f"snapshots/*/{MANIFEST_NAME}")
        )
        if len(candidates) != 1:
            raise WeightsError(
                f"{repo_id}: no revision pinned (profile, lock file) and "
                f"{len(candidates)} snapshots with a manifest in {repo_folder(cache, repo_id)}; "
                "pass --revision"
            )
        pinned = candidates[0].name
    snapshot = snapshot_dir(cache, repo_id, pinned)
    manifest = _load_manifest(snapshot)
    if manifest is None:
        raise WeightsError(
            f"{repo_id}@{pinned}: no {MANIFEST_NAME} in {snapshot}; run fetch-weights first"
        )
    problems = []
    if manifest["repo_id"] != repo_id or manifest["revision"] != pinned:
        problems.append(
            f"manifest: expected {repo_id}@{pinned}, found "
            f"{manifest['repo_id']}@{manifest['revision']}"
        )
    return snapshot, problems + check_snapshot(snapshot, manifest, rehash=True)


# --- helpers -------------------------------------------------------------------------------


def _refuse_secrets(doc: Any, what: str) -> None:
    findings = scan_document(doc)
    text = json.dumps(doc)
    token = os.environ.get("HF_TOKEN")
    if token and len(token) >= 8 and token in text:
        findings.append("the value of HF_TOKEN")
    if findings:
        raise WeightsError(f"refusing to write the {what}: it holds secrets: {findings}")
