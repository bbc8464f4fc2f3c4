"""`kit-archive`: the kit for a host without network, as one deterministic archive that runs
where it is unpacked."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from repro.core.errors import ReproError
from repro.kit_archive import write_kit_archive
from repro.machine_facts import kit_source_sha256

REPO = Path(__file__).resolve().parent.parent


def test_the_archive_is_the_same_bytes_each_time_and_runs_where_it_is_unpacked(tmp_path):
    first = write_kit_archive(tmp_path / "a", REPO)
    second = write_kit_archive(tmp_path / "b", REPO)
    assert first.read_bytes() == second.read_bytes()
    digest = kit_source_sha256(REPO / "repro")
    assert first.name == f"repro-kit-{digest[:12]}.tar.gz"
    assert first.stat().st_size < 12 * 2**20, "small enough to carry beside the parts"
    unpacked = tmp_path / "host"
    with tarfile.open(first) as tar:
        names = tar.getnames()
        tar.extractall(unpacked, filter="data")
    assert "containers/bare-host/red-green.toml" in names
    assert "containers/patches/vllm-0.26.0-pr51113-mamba-chunk-split.diff" in names
    assert not [n for n in names if n.startswith(("tests/", "artifacts/", "docs/"))]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert os.access(unpacked / "containers/bare-host/red-green.sh", os.X_OK)
    env = {**os.environ, "PYTHONPATH": str(unpacked)}
    said = subprocess.run(
        [sys.executable, "-m", "repro", "kit-digest"],
        cwd=unpacked,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert said.stdout.strip() == digest, "the unpacked kit is the code that was archived"


def test_an_out_that_is_a_file_or_inside_the_kit_is_refused_and_nothing_written(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(ReproError, match="is a file; name the folder"):
        write_kit_archive(afile, REPO)
    assert afile.read_text() == "mine"
    inside = REPO / "containers" / "archive-here"
    with pytest.raises(ReproError, match="inside the kit's containers/"):
        write_kit_archive(inside, REPO)
    assert not inside.exists()
