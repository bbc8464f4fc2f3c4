"""Atomic writes: a reader sees the old file or the whole new one, and no temporary is left."""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat

import pytest

from repro.core import atomicio
from repro.core.atomicio import sha256_file, write_json_atomic, write_text_atomic


def names(directory):
    return sorted(p.name for p in directory.iterdir())


def test_write_text_creates_and_replaces(tmp_path):
    target = tmp_path / "a.txt"
    write_text_atomic(target, "first")
    write_text_atomic(str(target), "second ✓")
    assert target.read_text(encoding="utf-8") == "second ✓"
    assert names(tmp_path) == ["a.txt"]


def test_new_file_is_readable_by_others_and_old_mode_is_kept(tmp_path):
    target = tmp_path / "a.txt"
    write_text_atomic(target, "x")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    target.chmod(0o600)
    write_text_atomic(target, "y")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@pytest.mark.parametrize("bad", [{"a": {1, 2}}, {"a": math.nan}, {"a": math.inf}, {"a": object()}])
def test_json_serialization_failure_leaves_old_file_intact(tmp_path, bad):
    target = tmp_path / "artifact.json"
    write_json_atomic(target, {"verdict": "old"})
    before = target.read_bytes()
    with pytest.raises((TypeError, ValueError)):
        write_json_atomic(target, bad)
    assert target.read_bytes() == before
    assert names(tmp_path) == ["artifact.json"]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_failure_while_writing_cleans_up_and_keeps_old_file(tmp_path, monkeypatch, failing):
    target = tmp_path / "artifact.json"
    target.write_text("old")

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomicio.os, failing, boom)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert names(tmp_path) == ["artifact.json"]


def test_interrupt_while_writing_cleans_up(tmp_path, monkeypatch):
    target = tmp_path / "artifact.json"

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomicio.os, "replace", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(target, "new")
    monkeypatch.undo()
    assert names(tmp_path) == []


def test_missing_directory_raises_and_creates_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_text_atomic(tmp_path / "no" / "such" / "file.txt", "x")
    assert names(tmp_path) == []


def test_json_is_indented_utf8_with_trailing_newline(tmp_path):
    target = tmp_path / "a.json"
    obj = {"reason": "größer", "n": [1, 2.5, None, True]}
    write_json_atomic(target, obj)
    text = target.read_text(encoding="utf-8")
    assert text.endswith("}\n") and "größer" in text and '\n  "n"' in text
    assert json.loads(text) == obj


def test_sha256_file_matches_hashlib_across_chunks(tmp_path):
    data = os.urandom((1 << 20) * 2 + 12345)  # more than two read chunks
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert sha256_file(str(empty)) == hashlib.sha256(b"").hexdigest()
