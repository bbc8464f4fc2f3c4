"""fetch-weights / verify-weights against a local stand-in for the Hugging Face Hub.

The Hub cannot be reached from here, so ``FakeHub`` (http.server on 127.0.0.1, one thread,
shut down after each test) answers the endpoints huggingface_hub's ``snapshot_download``
and ``HfApi.model_info`` call (checked against huggingface_hub 2.4):

- ``GET  /api/models/{repo}/revision/{rev}``      model_info: JSON with ``sha``, ``siblings``
- ``GET  /api/models/{repo}/tree/{commit}``        list_repo_tree (``?recursive=true``)
- ``HEAD /{repo}/resolve/{commit}/{file}``         metadata: ``X-Repo-Commit``, ``ETag``,
                                                   ``Content-Length``
- ``GET  /{repo}/resolve/{commit}/{file}``         the bytes (``Range: bytes=N-`` gives 206)

It serves a small model folder made in tmp_path (a fake ``model.safetensors`` of 64 KiB, not a
real model) and counts every request.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip("huggingface_hub")

from repro import cli, weights  # noqa: E402

REPO_ID = "acme/tiny-hybrid"
SHA = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7"


def _model_files(root: Path) -> dict[str, bytes]:
    files = {
        "config.json": json.dumps({"model_type": "qwen3_next", "hidden_size": 64}).encode(),
        "generation_config.json": b'{"do_sample": false}',
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"vocab": {"a": 0}}}).encode(),
        "tokenizer_config.json": b'{"model_max_length": 4096}',
        "model.safetensors": os.urandom(64 * 1024),
        "README.md": b"# not fetched\n",
        "original/consolidated.pth": b"not fetched either",
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


FETCHED = sorted(
    [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
)


class FakeHub:
    """A stand-in for the Hub: serves ``files`` of one repo at commit ``SHA``."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.drop_file: str | None = None  # the first GET of it sends half, then hangs up
        self.failing_file: str | None = None  # every GET of it answers 503
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output quiet
                pass

            def do_HEAD(self):
                self._answer(head=True)

            def do_GET(self):
                self._answer(head=False)

            def _json(self, obj, status=200):
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _answer(self, head):
                path = unquote(urlsplit(self.path).path)
                hub.requests.append(
                    (self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
                )
                api = f"/api/models/{REPO_ID}/"
                resolve = f"/{REPO_ID}/resolve/"
                if path.startswith(api + "revision/"):
                    return self._json(
                        {
                            "id": REPO_ID,
                            "modelId": REPO_ID,
                            "sha": SHA,
                            "private": False,
                            "siblings": [{"rfilename": n} for n in sorted(hub.files)],
                        }
                    )
                if path.startswith(api + "tree/"):
                    return self._json(
                        [
                            {
                                "type": "file",
                                "path": n,
                                "size": len(d),
                                "oid": hashlib.sha1(d).hexdigest(),
                            }
                            for n, d in sorted(hub.files.items())
                        ]
                    )
                if path.startswith(resolve):
                    rev, _, name = path[len(resolve) :].partition("/")
                    if rev not in (SHA, "main") or name not in hub.files:
                        return self._json({"error": "Entry not found"}, 404)
                    return self._file(name, head)
                return self._json({"error": "unknown endpoint"}, 404)

            def _file(self, name, head):
                data = hub.files[name]
                etag = hashlib.sha256(data).hexdigest()
                start = 0
                rng = self.headers.get("Range")
                if not head and name == hub.failing_file:
                    return self._json({"error": "temporarily unavailable"}, 503)
                if rng and not head:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", SHA)
                self.send_header("ETag", f'"{etag}"')
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if head:
                    return
                if name == hub.drop_file:
                    hub.drop_file = None
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data[start:])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored token is read
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    remote = tmp_path / "remote"
    remote.mkdir()
    with FakeHub(_model_files(remote)) as server:
        yield server


@pytest.fixture
def where(tmp_path):
    return {"cache": tmp_path / "cache", "lock_path": tmp_path / "weights.lock.json"}


def _fetch(hub, where, **kw):
    return weights.fetch(REPO_ID, endpoint=hub.url, log=lambda msg: None, **where, **kw)


def test_fetch_writes_snapshot_manifest_and_lock(hub, where):
    result = _fetch(hub, where)

    assert result.downloaded and result.revision == SHA and result.revision_source == "hub (main)"
    assert result.snapshot == weights.snapshot_dir(where["cache"].resolve(), REPO_ID, SHA)
    manifest = json.loads((result.snapshot / weights.MANIFEST_NAME).read_text())
    weights.validate_manifest(manifest)
    assert manifest["repo_id"] == REPO_ID and manifest["revision"] == SHA
    assert [f["path"] for f in manifest["files"]] == FETCHED  # README, original/ left out
    for entry in manifest["files"]:
        data = hub.files[entry["path"]]
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["total_bytes"] == sum(len(hub.files[p]) for p in FETCHED)

    lock = json.loads(where["lock_path"].read_text())
    assert lock["models"][REPO_ID]["revision"] == SHA
    assert weights.lock_revision(REPO_ID, where["lock_path"]) == SHA
    fetched = {unquote(p).rsplit("/", 1)[-1] for m, p, _ in hub.requests if m == "GET"}
    assert "README.md" not in fetched and "consolidated.pth" not in fetched

    snapshot, problems = weights.verify(REPO_ID, **where)
    assert snapshot == result.snapshot and problems == []


def test_second_fetch_makes_no_request(hub, where):
    _fetch(hub, where)
    hub.requests.clear()
    result = _fetch(hub, where)
    assert not result.downloaded and result.revision_source == "lock file"
    assert hub.requests == []


def test_verify_names_changed_and_missing_files(hub, where):
    snapshot = _fetch(hub, where).snapshot
    # Snapshot entries are links into blobs/; write through them as a corrupting disk would.
    blob = (snapshot / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    blob.write_bytes(bytes(data))
    (snapshot / "tokenizer.json").unlink()

    _, problems = weights.verify(REPO_ID, **where)
    assert len(problems) == 2
    changed = next(p for p in problems if p.startswith("changed: model.safetensors"))
    assert hashlib.sha256(hub.files["model.safetensors"]).hexdigest() in changed
    assert hashlib.sha256(bytes(data)).hexdigest() in changed
    assert f"size {len(data)}" in changed
    assert any(p.startswith("missing: tokenizer.json") for p in problems)

    # The CLI says the same and exits non-zero.
    code = cli.main(
        ["verify-weights", "--repo", REPO_ID, "--cache", str(where["cache"])]
        + ["--lock", str(where["lock_path"])]
    )
    assert code == 1

    # A fetch notices (sizes only), asks the Hub again, restores the missing link and refuses
    # to record the corrupted blob as the truth.
    with pytest.raises(weights.WeightsError, match=r"changed on disk.*\n  model\.safetensors"):
        _fetch(hub, where)
    assert (snapshot / "tokenizer.json").read_bytes() == hub.files["tokenizer.json"]
    blob.unlink()
    _fetch(hub, where)
    assert weights.verify(REPO_ID, **where)[1] == []


def _gets(hub, name):
    return [h.get("range") for m, p, h in hub.requests if m == "GET" and p.endswith("/" + name)]


def test_dropped_connection_resumes_with_a_range_request(hub, where, monkeypatch):
    import huggingface_hub.constants as hf_constants

    # Bytes reach the file in chunks of DOWNLOAD_CHUNK_SIZE (10 MB); a 64 KiB file needs
    # smaller ones for the half that arrived before the drop to be kept.
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 4096)
    hub.drop_file = "model.safetensors"  # half the file, then the connection drops (once)
    result = _fetch(hub, where)
    # huggingface_hub retries within the same fetch, asking only for the missing half.
    assert _gets(hub, "model.safetensors") == [None, "bytes=32768-"]
    assert result.downloaded and weights.verify(REPO_ID, **where)[1] == []


def test_interrupted_fetch_is_completed_by_the_next(hub, where):
    hub.failing_file = "model.safetensors"  # every GET of it fails: the fetch stops
    with pytest.raises(weights.WeightsError, match="download stopped"):
        _fetch(hub, where)
    snapshot = weights.snapshot_dir(where["cache"].resolve(), REPO_ID, SHA)
    assert not (snapshot / weights.MANIFEST_NAME).exists()
    assert not (snapshot / "model.safetensors").exists()

    hub.failing_file = None
    hub.requests.clear()
    result = _fetch(hub, where)
    # The files the first fetch completed are kept; only the missing one is downloaded.
    got = sorted(
        p.rsplit("/", 1)[-1] for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p
    )
    assert got == ["model.safetensors"]
    assert result.revision_source == "lock file"  # pinned by the first fetch
    assert weights.verify(REPO_ID, **where)[1] == []


def test_token_never_written(hub, where, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    result = _fetch(hub, where)
    assert any(TOKEN in h.get("authorization", "") for _, _, h in hub.requests)  # it was used
    assert TOKEN not in (result.snapshot / weights.MANIFEST_NAME).read_text()
    assert TOKEN not in where["lock_path"].read_text()


def test_revision_must_be_a_commit(where):
    with pytest.raises(weights.WeightsError, match="40-hex"):
        weights.fetch(REPO_ID, revision="main", **where)


def test_manifest_schema_refuses_a_branch_name(hub, where):
    manifest = _fetch(hub, where).manifest
    with pytest.raises(weights.WeightsError, match="revision"):
        weights.validate_manifest({**manifest, "revision": "main"})
