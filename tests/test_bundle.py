"""Evidence bundles: build → verify round trip, byte-identical rebuilds, and each fault named.

The runs are real `repro-tiny` artifacts (tests/fixtures/runs/clean and .../fault, the second
with --inject-fault; their logs are trimmed to an excerpt and the artifacts' log hashes updated
to match). Faulty bundles are made from a good one by editing its members and, where the
fault is meant to survive the hashes, rewriting the manifest and the .sha256 to match: what a
careless or dishonest edit would look like.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
import zlib
from pathlib import Path

import pytest
from crafted_archives import gnu_sparse_member

from repro.cli import main
from repro.evidence import archive, bundle, report, runs
from repro.evidence.runs import EvidenceError
from repro.evidence.verify import load_runs, verify_bundle

FIXTURES = Path(__file__).parent / "fixtures" / "runs"


@pytest.fixture
def run_dirs(tmp_path) -> list[Path]:
    dirs = []
    for name in ("clean", "fault"):
        dirs.append(Path(shutil.copytree(FIXTURES / name, tmp_path / "in" / name)))
    return dirs


@pytest.fixture
def good(run_dirs, tmp_path) -> Path:
    out = tmp_path / "evidence.tar.gz"
    bundle.build_bundle(run_dirs, out, images_dir=None, environ={})
    return out


def members_of(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def repack(
    src: Path,
    dst: Path,
    files: dict[str, bytes],
    *,
    rehash: bool,
    extra: list[tarfile.TarInfo] = (),
) -> Path:
    """Write ``files`` (plus raw ``extra`` members) as a bundle at ``dst``.

    ``rehash``: rewrite MANIFEST.json to match the files (a consistent forgery); otherwise the
    original manifest stays. The .sha256 always matches the new archive, so only the fault
    under test can be what verify finds.
    """
    files = dict(files)
    manifest = json.loads(files["MANIFEST.json"])
    if rehash:
        for entry in manifest["files"]:
            data = files.get(entry["path"])
            if data is not None:
                entry["bytes"] = len(data)
                entry["sha256"] = hashlib.sha256(data).hexdigest()
        manifest["total_bytes"] = sum(e["bytes"] for e in manifest["files"])
        files["MANIFEST.json"] = (json.dumps(manifest, indent=2) + "\n").encode()
    mtime = int(bundle.parse_timestamp(manifest["created"]).timestamp())
    tar = bytearray(archive.tar_bytes(files, mtime))
    if extra:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as out:
            for path in sorted(files):
                info = tarfile.TarInfo(path)
                info.size, info.mtime = len(files[path]), mtime
                out.addfile(info, io.BytesIO(files[path]))
            for info in extra:
                out.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
        tar = bytearray(buffer.getvalue())
    data = archive.gzip_bytes(bytes(tar))
    dst.write_bytes(data)
    bundle.sidecar(dst).write_text(f"{hashlib.sha256(data).hexdigest()}  {dst.name}\n")
    return dst


def problems(path: Path) -> list[str]:
    result = verify_bundle(path)
    assert not result.ok, result.render()
    return result.problems


# --- round trip ----------------------------------------------------------------------------


def test_round_trip_verifies_and_keeps_every_byte(good, run_dirs):
    result = verify_bundle(good)
    assert result.ok, result.render()
    files = members_of(good)
    manifest = json.loads(files["MANIFEST.json"])
    listed = {e["path"]: e for e in manifest["files"]}
    assert set(files) == set(listed) | {"MANIFEST.json"}
    for name in ("clean", "fault"):
        for arm in ("cold-race", "multi-turn"):
            assert (
                files[f"runs/{name}/{arm}.json"] == (FIXTURES / name / f"{arm}.json").read_bytes()
            )
            log = (FIXTURES / name / "logs" / f"{arm}.log").read_bytes()
            assert files[f"runs/{name}/logs/{arm}.log"] == log
            assert files[f"runs/{name}/log-excerpts/{arm}.log"] == bundle.log_excerpt(log)
            assert listed[f"runs/{name}/{arm}.json"]["kind"] == "run-artifact"
    for path, entry in listed.items():
        assert hashlib.sha256(files[path]).hexdigest() == entry["sha256"]
        assert len(files[path]) == entry["bytes"]
    assert manifest["kit"] == {"name": "repro-kit", "version": "0.1.0"}
    assert [r["label"] for r in manifest["runs"]] == ["clean", "fault"]
    # SUMMARY.md is the report of the same runs.
    assert files["SUMMARY.md"].decode() == report.render(load_runs(run_dirs))
    # Every re-derived verdict is reported as agreeing.
    text = result.render()
    assert text.count("re-derived from its figures: agrees") == 4
    assert "nothing extracted" in text


def test_members_have_fixed_metadata(good):
    with tarfile.open(good, "r:gz") as tar:
        infos = tar.getmembers()
    assert [i.name for i in infos] == sorted(i.name for i in infos)
    for info in infos:
        assert info.isreg() and info.mode == 0o644 and info.uid == info.gid == 0
        assert info.uname == info.gname == ""
    raw = good.read_bytes()
    assert raw[:10] == archive.GZIP_HEADER  # mtime 0, no file name


def test_same_inputs_give_identical_bytes(run_dirs, tmp_path):
    first = bundle.build_bundle(run_dirs, tmp_path / "a.tar.gz", images_dir=None, environ={})
    # The same runs copied elsewhere (other parent folder, new file times).
    moved = [Path(shutil.copytree(d, tmp_path / "elsewhere" / d.name)) for d in run_dirs]
    second = bundle.build_bundle(moved, tmp_path / "b.tar.gz", images_dir=None, environ={})
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    assert first.sha256 == second.sha256
    newest = max(
        json.loads(p.read_text())["run"]["finished_at"] for d in run_dirs for p in d.glob("*.json")
    )
    assert first.manifest["created"] == newest
    assert first.manifest["created_from"] == "newest-artifact"


def test_creation_time_sources(run_dirs, tmp_path):
    epoch = bundle.build_bundle(
        run_dirs, tmp_path / "e.tar.gz", images_dir=None, environ={"SOURCE_DATE_EPOCH": "0"}
    )
    assert epoch.manifest["created"] == "1970-01-01T00:00:00Z"
    assert epoch.manifest["created_from"] == "SOURCE_DATE_EPOCH"
    given = bundle.build_bundle(
        run_dirs,
        tmp_path / "g.tar.gz",
        images_dir=None,
        environ={"SOURCE_DATE_EPOCH": "0"},
        created="2026-12-01T10:00:00+01:00",
    )
    assert given.manifest["created"] == "2026-12-01T09:00:00Z"
    assert given.manifest["created_from"] == "--created"
    assert epoch.sha256 != given.sha256
    with tarfile.open(tmp_path / "g.tar.gz", "r:gz") as tar:
        assert {m.mtime for m in tar.getmembers()} == {1796115600}
    with pytest.raises(EvidenceError, match="RFC 3339"):
        bundle.build_bundle(run_dirs, tmp_path / "x.tar.gz", created="yesterday", environ={})


def test_cli_bundle_then_verify(run_dirs, tmp_path, capsys):
    out = tmp_path / "cli.tar.gz"
    assert main(["bundle", *map(str, run_dirs), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"sha256 {hashlib.sha256(out.read_bytes()).hexdigest()}" in said
    assert main(["verify", str(out)]) == 0
    said = capsys.readouterr().out
    assert "PASS:" in said and "archive sha256 matches cli.tar.gz.sha256" in said


def test_log_excerpt_keeps_head_and_tail():
    lines = [f"line {i:05d} " + "x" * 50 for i in range(2000)]
    data = ("\n".join(lines) + "\n").encode()
    short = bundle.log_excerpt(data)
    assert len(short) < bundle.EXCERPT_HEAD_BYTES + bundle.EXCERPT_TAIL_BYTES + 200
    assert short.startswith(b"line 00000 ") and short.endswith(b"line 01999 " + b"x" * 50 + b"\n")
    assert b"bytes omitted" in short
    assert bundle.log_excerpt(b"small\n") == b"small\n"


# --- refusing to bundle bad input ----------------------------------------------------------


def test_bundle_refuses_a_changed_log_and_writes_nothing(run_dirs, tmp_path):
    log = run_dirs[0] / "logs" / "cold-race.log"
    log.write_bytes(log.read_bytes() + b"edited\n")
    out = tmp_path / "x.tar.gz"
    with pytest.raises(EvidenceError, match=r"logs/cold-race.log: sha256 .* differs"):
        bundle.build_bundle(run_dirs, out, images_dir=None, environ={})
    assert not out.exists() and not bundle.sidecar(out).exists()


def test_bundle_refuses_invalid_artifact_and_keeps_old_output(run_dirs, tmp_path):
    out = tmp_path / "x.tar.gz"
    out.write_bytes(b"previous bundle")
    doc = json.loads((run_dirs[0] / "cold-race.json").read_text())
    doc["verdict"]["status"] = "fine"
    (run_dirs[0] / "cold-race.json").write_text(json.dumps(doc))
    with pytest.raises(
        EvidenceError, match=r"(?s)cold-race.json.*\$\.verdict\.status: expected one of"
    ):
        bundle.build_bundle(run_dirs, out, images_dir=None, environ={})
    assert out.read_bytes() == b"previous bundle"


def test_bundle_refuses_a_verdict_that_does_not_follow(run_dirs, tmp_path):
    doc = json.loads((run_dirs[1] / "cold-race.json").read_text())
    doc["verdict"] = {"status": "clean", "gate": None, "reason": "edited by hand"}
    (run_dirs[1] / "cold-race.json").write_text(json.dumps(doc))
    with pytest.raises(EvidenceError, match="re-graded corrupted"):
        bundle.build_bundle(run_dirs, tmp_path / "x.tar.gz", images_dir=None, environ={})


def test_bundle_refuses_links(run_dirs, tmp_path):
    (run_dirs[0] / "logs" / "extra.log").symlink_to("/etc/hostname")
    with pytest.raises(EvidenceError, match="regular files only"):
        bundle.build_bundle(run_dirs, tmp_path / "x.tar.gz", images_dir=None, environ={})


def test_same_directory_names_get_distinct_labels(tmp_path):
    a = Path(shutil.copytree(FIXTURES / "clean", tmp_path / "lab1" / "out"))
    b = Path(shutil.copytree(FIXTURES / "fault", tmp_path / "lab2" / "out"))
    result = bundle.build_bundle([a, b], tmp_path / "x.tar.gz", images_dir=None, environ={})
    assert [r["label"] for r in result.manifest["runs"]] == ["out", "out-2"]
    assert verify_bundle(tmp_path / "x.tar.gz").ok


# --- each fault named ----------------------------------------------------------------------


def test_truncated_archive(good, tmp_path):
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    found = problems(cut)
    assert len(found) == 1 and "archive is truncated" in found[0]


def test_changed_byte_in_the_compressed_stream(good, tmp_path):
    data = bytearray(good.read_bytes())
    data[len(data) // 2] ^= 0x01
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(bytes(data))
    shutil.copy(bundle.sidecar(good), bundle.sidecar(bad))
    found = problems(bad)
    assert any("differs from the" in p and "bad.tar.gz.sha256" in p for p in found)
    assert any("archive is corrupt" in p or "content changed" in p for p in found), found
    bundle.sidecar(bad).unlink()  # without its .sha256 the stream itself still gives it away
    assert problems(bad)


def test_changed_byte_in_a_member(good, tmp_path):
    files = members_of(good)
    log = bytearray(files["runs/clean/logs/cold-race.log"])
    log[100] ^= 0x20
    files["runs/clean/logs/cold-race.log"] = bytes(log)
    found = problems(repack(good, tmp_path / "m.tar.gz", files, rehash=False))
    assert any(p.startswith("runs/clean/logs/cold-race.log: content changed") for p in found)


def test_changed_byte_in_a_gzip_header_field(good, tmp_path):
    data = bytearray(good.read_bytes())
    data[4] = 0x01  # gzip mtime: the content is intact, the archive is not what was written
    bad = tmp_path / "h.tar.gz"
    bad.write_bytes(bytes(data))
    found = problems(bad)
    assert any("gzip header" in p for p in found)


def test_changed_byte_in_a_tar_header(good, tmp_path):
    tar = bytearray(bundle_tar(good))
    tar[100] = ord("7")  # the first member's mode field; the header checksum no longer fits
    bad = tmp_path / "t.tar.gz"
    bad.write_bytes(archive.gzip_bytes(bytes(tar)))
    assert problems(bad) == ["the tar inside the gzip stream is damaged (bad checksum)"]


def test_changed_byte_in_tar_padding(good, tmp_path):
    tar = bytearray(bundle_tar(good))
    size = len(members_of(good)["MANIFEST.json"])
    tar[512 + size + 10] = 0x01  # zero padding after the first member: tar readers skip it
    bad = tmp_path / "p.tar.gz"
    bad.write_bytes(archive.gzip_bytes(bytes(tar)))
    found = problems(bad)
    assert len(found) == 1, found
    assert f"at byte {512 + size + 10}" in found[0] and "data of MANIFEST.json" in found[0]


def bundle_tar(path: Path) -> bytes:
    import gzip

    return gzip.decompress(path.read_bytes())


def test_missing_file(good, tmp_path):
    files = members_of(good)
    del files["runs/fault/logs/multi-turn.log"]
    found = problems(repack(good, tmp_path / "m.tar.gz", files, rehash=False))
    assert any(p.startswith("missing file 'runs/fault/logs/multi-turn.log'") for p in found)


def test_extra_file(good, tmp_path):
    files = members_of(good)
    files["runs/clean/notes.txt"] = b"not in the manifest\n"
    found = problems(repack(good, tmp_path / "x.tar.gz", files, rehash=False))
    assert found == ["extra file 'runs/clean/notes.txt' is not in MANIFEST.json"]


def _forge(good: Path, tmp_path: Path, name: str, edit) -> list[str]:
    """Edit one artifact, keep every hash consistent, and return what verify names."""
    files = members_of(good)
    doc = json.loads(files[name])
    edit(doc)
    files[name] = json.dumps(doc).encode()
    return problems(repack(good, tmp_path / "forged.tar.gz", files, rehash=True))


def test_schema_invalid_artifact_with_consistent_hashes(good, tmp_path):
    def edit(doc):
        del doc["hardware"]["cpu"]["model"]

    found = _forge(good, tmp_path, "runs/clean/multi-turn.json", edit)
    assert found == [
        "runs/clean/multi-turn.json: does not match schemas/run-artifact.v1.schema.json: "
        "$.hardware.cpu.model: required property is missing"
    ]


def test_verdict_that_does_not_follow_from_its_figures(good, tmp_path):
    def edit(doc):
        doc["verdict"] = {"status": "clean", "gate": None, "reason": "no one-sided flips"}

    found = _forge(good, tmp_path, "runs/fault/cold-race.json", edit)
    assert any(
        p.startswith(
            "runs/fault/cold-race.json: recorded verdict clean does not follow from its "
            "figures: re-graded corrupted (wave1: 14 forward flips vs 0 reverse (margin 2))"
        )
        for p in found
    ), found


def test_figures_edited_to_fit_a_verdict(good, tmp_path):
    def edit(doc):
        doc["figures"]["waves"][1]["forward_flips"] = 0

    found = _forge(good, tmp_path, "runs/fault/multi-turn.json", edit)
    assert any("wave2.forward_flips recorded 0, re-derived 30" in p for p in found), found


def _member(name: str, **kw) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    for key, value in kw.items():
        setattr(info, key, value)
    return info


@pytest.mark.parametrize(
    "member,expected",
    [
        (_member("../evil.txt", size=1), "'../evil.txt': path goes up with '..'"),
        (_member("runs/../../evil.txt", size=1), "path goes up with '..'"),
        (_member("/tmp/evil.txt", size=1), "'/tmp/evil.txt': absolute path"),
        (
            _member("runs/clean/passwd", type=tarfile.SYMTYPE, linkname="../../../etc/passwd"),
            "symbolic link to '../../../etc/passwd' points outside the bundle",
        ),
        (
            _member("runs/clean/abs", type=tarfile.SYMTYPE, linkname="/etc/passwd"),
            "points outside the bundle",
        ),
        (
            _member("runs/clean/hard", type=tarfile.LNKTYPE, linkname="SUMMARY.md"),
            "hard link to 'SUMMARY.md'; a bundle holds regular files only",
        ),
        (_member("runs/dev", type=tarfile.CHRTYPE), "special file"),
    ],
)
def test_unsafe_members_are_refused_without_extracting(good, tmp_path, member, expected):
    work = tmp_path / "deep" / "down"
    work.mkdir(parents=True)
    bad = repack(good, work / "u.tar.gz", members_of(good), rehash=False, extra=[member])
    found = problems(bad)
    refused = [p for p in found if p.startswith("refused member")]
    assert len(refused) == 1 and expected in refused[0], found
    assert "not read, nothing extracted" in refused[0]
    assert not (tmp_path / "deep" / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()
    assert sorted(p.name for p in work.iterdir()) == ["u.tar.gz", "u.tar.gz.sha256"]


def test_cli_verify_names_the_fault_and_fails(good, tmp_path, capsys):
    files = members_of(good)
    bad = repack(good, tmp_path / "e.tar.gz", files, rehash=False, extra=[_member("../x", size=1)])
    assert main(["verify", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  refused member '../x': path goes up with '..'" in out
    assert "do not use this bundle as evidence" in out


def test_not_a_gzip_file(tmp_path):
    path = tmp_path / "plain.tar.gz"
    path.write_bytes(b"hello")
    assert "not a gzip file" in problems(path)[0]


def test_streamed_atomic_output_keeps_the_old_file_on_failure(tmp_path):
    from repro.core.atomicio import open_atomic

    target = tmp_path / "image.tar"
    target.write_bytes(b"old archive")
    with pytest.raises(RuntimeError):
        with open_atomic(target) as out:
            out.write(b"half of a new arch")
            raise RuntimeError("docker save broke off")
    assert target.read_bytes() == b"old archive"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.tar"]
    with open_atomic(target) as out:
        out.write(b"new archive")
    assert target.read_bytes() == b"new archive"


# --- relabelled verdicts: every verdict whose figures exist is re-derived, current rules ----


def _relabel_geometry(doc):
    doc["verdict"] = {"status": "inconclusive", "gate": "geometry", "reason": "geometry"}


def _relabel_error(doc):
    doc["verdict"] = {"status": "error", "gate": None, "reason": "engine died"}
    doc["error"] = {"type": "ArmProcessFailed", "message": "engine died", "phase": "arm"}


@pytest.mark.parametrize(
    "relabel, problem",
    [
        (
            _relabel_geometry,
            "recorded inconclusive (geometry), yet it carries figures (they grade corrupted)",
        ),
        (
            _relabel_error,
            "recorded error, yet its figures grade corrupted (wave1: 14 forward flips",
        ),
    ],
    ids=["geometry", "error"],
)
def test_a_corrupted_run_relabelled_is_named(good, tmp_path, relabel, problem):
    found = _forge(good, tmp_path, "runs/fault/cold-race.json", relabel)
    assert any(p.startswith(f"runs/fault/cold-race.json: {problem}") for p in found), found


@pytest.mark.parametrize("relabel", [_relabel_error, _relabel_geometry], ids=["error", "geometry"])
def test_a_stopped_record_carrying_figures_that_cannot_be_graded_is_named(good, tmp_path, relabel):
    def edit(doc):
        relabel(doc)
        doc["counters"] = None  # figures without the counters they are graded with

    found = _forge(good, tmp_path, "runs/fault/cold-race.json", edit)
    assert any(
        p.startswith("runs/fault/cold-race.json: figures cannot be re-graded (TypeError")
        for p in found
    ), found


@pytest.mark.parametrize("recorded", ["absent", False])
def test_an_artifact_cannot_switch_off_the_control_spread_gate(
    good, tmp_path, recorded, monkeypatch
):
    """The control disagrees with itself (one benign spread of 0.09, far above the 0.024
    threshold): the current rules grade it inconclusive whatever the artifact records."""
    from repro import evidence, grading

    def edit(doc):
        doc["figures"]["waves"][0]["extra"]["benign_noise"].append(0.09)
        if recorded == "absent":
            doc["signal"].pop("control_spread_gate", None)
        else:
            doc["signal"]["control_spread_gate"] = recorded
        with monkeypatch.context() as rules_before_the_gate:
            rules_before_the_gate.setattr(grading, "CONTROL_SPREAD_GATE", False)
            old_rules = evidence.regrade(doc)
        assert old_rules.status == "clean", "without the gate the forger's verdict holds"
        doc["verdict"] = evidence.verdict_section(old_rules)
        doc["signal"]["threshold"] = old_rules.threshold.value
        doc["signal"]["noise_samples"] = old_rules.threshold.noise_samples

    found = _forge(good, tmp_path, "runs/clean/cold-race.json", edit)
    assert any(
        p.startswith(
            "runs/clean/cold-race.json: recorded verdict clean does not follow from its "
            "figures: re-graded inconclusive (control_quality)"
        )
        and p.endswith("which this kit always applies")
        for p in found
    ), found


def test_an_error_record_without_figures_is_noted_not_failed(good, tmp_path):
    def edit(doc):
        _relabel_error(doc)
        doc["figures"] = doc["counters"] = doc["signal"] = None

    files = members_of(good)
    doc = json.loads(files["runs/fault/cold-race.json"])
    edit(doc)
    from repro.evidence.verdicts import check_verdict

    check = check_verdict(doc)
    assert not check.rederived and check.problems == []
    assert check.note == "error record: no figures to re-derive a verdict from"


# --- hiding an artifact, memory bombs ------------------------------------------------------


def _gzip_tar(dst: Path, tar: bytes) -> Path:
    data = archive.gzip_bytes(tar)
    dst.write_bytes(data)
    bundle.sidecar(dst).write_text(f"{hashlib.sha256(data).hexdigest()}  {dst.name}\n")
    return dst


def test_two_artifacts_of_one_arm_under_one_label_are_refused(good, tmp_path):
    files = members_of(good)
    doc = json.loads(files["runs/fault/cold-race.json"])
    files["runs/fault/cold-race-again.json"] = json.dumps(doc).encode()
    manifest = json.loads(files["MANIFEST.json"])
    data = files["runs/fault/cold-race-again.json"]
    manifest["files"].append(
        {
            "path": "runs/fault/cold-race-again.json",
            "kind": "run-artifact",
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    )
    manifest["files"].sort(key=lambda e: e["path"])
    files["MANIFEST.json"] = (json.dumps(manifest, indent=2) + "\n").encode()
    found = problems(repack(good, tmp_path / "two.tar.gz", files, rehash=True))
    assert any(p.startswith("run fault holds 2 artifacts of the cold-race arm (") for p in found), (
        found
    )
    with pytest.raises(EvidenceError, match="holds two cold-race files"):
        runs.runs_from_files(manifest, files, source="two.tar.gz")


def _peak_bytes(function):
    import tracemalloc

    tracemalloc.start()
    try:
        value = function()
        return value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_sparse_member_is_refused_unread(good, tmp_path):
    """79 bytes of gzip hold a member that reads as 512 MiB: refused from its header."""
    files = members_of(good)
    mtime = int(bundle.parse_timestamp(json.loads(files["MANIFEST.json"])["created"]).timestamp())
    pieces = list(archive.tar_chunks(files, mtime))
    sparse = gnu_sparse_member("runs/clean/big.bin", 512 << 20)
    bad = _gzip_tar(tmp_path / "sparse.tar.gz", b"".join(pieces[:-1]) + sparse + bytes(1024))
    result, peak = _peak_bytes(lambda: verify_bundle(bad))
    assert "refused member 'runs/clean/big.bin': a sparse file (536870912 bytes once " in (
        " ".join(result.problems)
    ), result.render()
    assert peak < 32 << 20, f"verify held {peak} bytes for a sparse member"


def test_a_gzip_bomb_stops_at_the_cap_within_one_slice(tmp_path, monkeypatch):

    monkeypatch.setattr(archive, "MAX_UNCOMPRESSED_BYTES", 4 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    bomb = b"".join(deflate.compress(zeros) for _ in range(64)) + deflate.flush()
    assert len(bomb) < 1 << 20, "the whole 64 MiB bomb fits in one input chunk"
    path = tmp_path / "bomb.tar.gz"
    path.write_bytes(bomb)
    result, peak = _peak_bytes(lambda: verify_bundle(path))
    assert result.problems == [
        f"more than {4 << 20} bytes uncompressed; refused (a bundle of artifacts and logs is "
        "far smaller)"
    ]
    assert peak < 12 << 20, f"verify held {peak} bytes for a 4 MiB cap"


def test_tar_chunks_are_the_bytes_tarfile_writes(good):
    files = members_of(good)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files):
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(files[path]), 1234, archive.MEMBER_MODE
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[path]))
    assert archive.tar_bytes(files, 1234) == buffer.getvalue()


def test_a_bundle_carrying_a_secret_is_named(good, tmp_path):
    files = members_of(good)
    token = "ghp_" + "Z9y8X7w6V5" * 4  # made up
    files["runs/clean/log-excerpts/cold-race.log"] += f"pushed with {token}\n".encode()
    found = problems(repack(good, tmp_path / "secret.tar.gz", files, rehash=True))
    assert any(
        p.startswith(
            "runs/clean/log-excerpts/cold-race.log holds what looks like a secret "
            "(GitHub token at offset"
        )
        for p in found
    ), found
    assert not any(token in p for p in found), "the finding never repeats the secret"
