"""Fuzzing the kit's archive readers with crafted tar, gzip and zip archives (hypothesis).

Three readers take archives from someone else: `repro verify` (bundles), `import-image`'s
pre-load check (`handoff.inspect_archive`) and the install-set installer (verify, then pip's
install of the carried wheels). Each is given archives built from a plausible base (a real
bundle, a `docker save` layout, a wheel) plus crafted members: odd names (``..``, ``.``,
``./manifest.json``, absolute paths, backslashes), links and link chains, hard links,
devices, FIFOs, GNU sparse members that expand to 1 GiB, duplicates, gzip bombs, and flipped
bytes anywhere. For every case:

- the reader returns or raises its own named refusal (VerifyResult.problems, HandoffError,
  InstallSetError); any other exception fails the test;
- nothing is written outside the folder the installer was given (and the other two readers
  write nothing at all);
- Python's peak traced memory stays under MEMORY_BOUND whatever size the members claim.

Each reader's figures (cases, refusals by kind, peak memory) are printed at the end of the
module (run with ``-s`` to see them).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tarfile
import tracemalloc
import zipfile
from pathlib import Path
from unittest import mock

import pytest
from crafted_archives import gnu_sparse_member
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro.containers import handoff
from repro.evidence import archive, bundle, verify
from repro.installset import InstallSetError, build
from repro.installset.build import Wheel
from repro.installset.host import Target
from repro.installset.install import install

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
MEMORY_BOUND = 48 << 20
# Cases per reader; CI runs the default, a deeper run sets REPRO_FUZZ_CASES.
CASES = int(os.environ.get("REPRO_FUZZ_CASES", "60"))
FUZZ = settings(
    max_examples=CASES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
STATS: dict[str, dict] = {}
TARGET = Target.create(f"{sys.version_info[0]}.{sys.version_info[1]}", ["manylinux_2_17_x86_64"])

# --- crafted members -----------------------------------------------------------------------

COMPONENTS = ["a", "b", "l1", "l2", ".", "..", "", "manifest.json", "MANIFEST.json", "runs"]
SPECIAL_NAMES = [
    "./manifest.json",
    "/tmp/repro-fuzz-escape",
    "../outside/escaped",
    "a\\b",
    "index.json",
    "repositories",
    "runs/clean/cold-race.json",
]
LINK_TARGETS = [".", "..", "../..", "../outside", "/tmp", "a", "l1/l2", "manifest.json", ""]
KINDS = ["reg", "reg", "dir", "sym", "lnk", "fifo", "chr", "sparse"]

names = st.one_of(
    st.lists(st.sampled_from(COMPONENTS), min_size=1, max_size=4).map("/".join),
    st.sampled_from(SPECIAL_NAMES),
)
members = st.tuples(
    names,
    st.sampled_from(KINDS),
    st.sampled_from(LINK_TARGETS),
    st.binary(max_size=64),
    st.sampled_from([1 << 10, 1 << 30]),  # what a sparse member expands to
)
flips = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=3)


def _header(name: str, kind: str, link: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = {
        "reg": tarfile.REGTYPE,
        "dir": tarfile.DIRTYPE,
        "sym": tarfile.SYMTYPE,
        "lnk": tarfile.LNKTYPE,
        "fifo": tarfile.FIFOTYPE,
        "chr": tarfile.CHRTYPE,
    }[kind]
    info.linkname = link if kind in ("sym", "lnk") else ""
    info.size = size if kind == "reg" else 0
    info.mode = 0o755 if kind == "dir" else 0o644
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def tar_of(base: list[tuple[str, bytes]], crafted, mutations=()) -> bytes:
    """A tar of regular ``base`` files then the ``crafted`` members, then byte flips."""
    out = bytearray()
    for name, data in base:
        out += _header(name, "reg", "", len(data)) + data + bytes(-len(data) % 512)
    for name, kind, link, data, sparse_size in crafted:
        if kind == "sparse":
            out += gnu_sparse_member(name[:99], sparse_size)
            continue
        out += _header(name, kind, link, len(data))
        if kind == "reg":
            out += data + bytes(-len(data) % 512)
    out += bytes(1024)
    for offset, value in mutations:
        out[offset % len(out)] = value
    return bytes(out)


def _record(reader: str, kind: str, peak: int) -> None:
    stats = STATS.setdefault(reader, {"cases": 0, "kinds": collections.Counter(), "peak": 0})
    stats["cases"] += 1
    stats["kinds"][kind] += 1
    stats["peak"] = max(stats["peak"], peak)


def _kind(text: str) -> str:
    """A refusal's kind: its words without names, numbers and quoted values."""
    text = text.split("\n")[0].replace("'s ", "s ")
    text = re.sub(r"'[^']*'|\"[^\"]*\"|/\S+|\d+|[0-9a-f]{16,}", "", text)
    return " ".join(text.split()[:7])


def _measured(function):
    tracemalloc.reset_peak()
    start = tracemalloc.get_traced_memory()[0]
    value = function()
    return value, tracemalloc.get_traced_memory()[1] - start


@pytest.fixture(scope="module", autouse=True)
def traced():
    tracemalloc.start()
    yield
    tracemalloc.stop()
    for reader, stats in STATS.items():
        kinds = ", ".join(f"{n} × {k}" for k, n in stats["kinds"].most_common())
        print(
            f"\n[fuzz] {reader}: {stats['cases']} cases, peak {stats['peak'] / 2**20:.1f} MiB "
            f"traced; outcomes: {kinds}"
        )


# --- verify --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory) -> dict[str, bytes]:
    work = tmp_path_factory.mktemp("fuzz-bundle")
    runs = [shutil.copytree(FIXTURES / n, work / "in" / n) for n in ("clean", "fault")]
    out = work / "good.tar.gz"
    bundle.build_bundle([Path(r) for r in runs], out, images_dir=None, environ={})
    with tarfile.open(out) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


@functools.cache
def gzip_bomb() -> bytes:
    """64 MiB of zeros in about 64 KiB of gzip: past the 16 MiB cap the test sets."""
    return gzip.compress(bytes(64 << 20), compresslevel=1)


@FUZZ
@given(
    keep=st.integers(0, 100),
    crafted=st.lists(members, max_size=4),
    mutations=flips,
    wrapping=st.sampled_from(["gzip", "gzip", "gzip", "bomb", "truncated", "trailing", "plain"]),
)
def test_verify_names_every_crafted_bundle(
    tmp_path_factory, good_bundle, keep, crafted, mutations, wrapping
):
    work = tmp_path_factory.mktemp("verify-case")
    base = sorted(good_bundle.items())[: max(1, len(good_bundle) * keep // 100)]
    tar = tar_of(base, crafted, mutations)
    data = {"bomb": gzip_bomb(), "plain": tar}.get(wrapping) or archive.gzip_bytes(tar)
    if wrapping == "truncated":
        data = data[: len(data) // 2]
    elif wrapping == "trailing":
        data += b"extra"
    path = work / "case.tar.gz"
    path.write_bytes(data)
    old_cap = archive.MAX_UNCOMPRESSED_BYTES
    archive.MAX_UNCOMPRESSED_BYTES = 16 << 20
    try:
        result, peak = _measured(lambda: verify.verify_bundle(path))
    finally:
        archive.MAX_UNCOMPRESSED_BYTES = old_cap
    assert os.listdir(work) == ["case.tar.gz"], "verify wrote something"
    assert peak < MEMORY_BOUND, f"verify held {peak} bytes"
    assert not (crafted and result.ok), "a crafted member passed verify"
    _record("verify", "PASS" if result.ok else _kind(result.problems[0]), peak)
    shutil.rmtree(work)


# --- import-image's pre-load check ---------------------------------------------------------


def _docker_save_base() -> list[tuple[str, bytes]]:
    layer = tar_of([("README", b"hello\n")], [])
    config = json.dumps(
        {
            "config": {"Labels": {"a": "b"}},
            "rootfs": {
                "type": "layers",
                "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()],
            },
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": None, "Layers": ["l/layer.tar"]}])
    return [("l/layer.tar", layer), (config_name, config), ("manifest.json", manifest.encode())]


@FUZZ
@given(
    keep=st.integers(0, 3),
    crafted=st.lists(members, max_size=4),
    mutations=flips,
    manifest=st.one_of(
        st.none(),
        st.sampled_from(
            [
                "[]",
                "{}",
                "[1]",
                '[{"Config": "x.json", "RepoTags": ["victim:tag"], "Layers": []}]',
                '[{"Config": "manifest.json", "Layers": ["manifest.json"]}, {}]',
                '[{"Config": "a", "Layers": ["a"]}]',
                "[" * 5000,
            ]
        ),
    ),
)
def test_the_pre_load_check_names_every_crafted_image_archive(keep, crafted, mutations, manifest):
    base = _docker_save_base()[:keep]
    if manifest is not None:
        base = [(n, d) for n, d in base if n != "manifest.json"] + [
            ("manifest.json", manifest.encode())
        ]
    archive = io.BytesIO(tar_of(base, crafted, mutations))

    def check():
        try:
            plan = handoff.inspect_archive(archive)
        except handoff.HandoffError as exc:
            return _kind(str(exc))
        rebuilt = b"".join(handoff.clean_archive(archive, plan))
        with tarfile.open(fileobj=io.BytesIO(rebuilt)) as tar:
            entries = json.loads(tar.extractfile("manifest.json").read())
        assert len(entries) == 1 and entries[0]["RepoTags"] is None
        return "PASS (one untagged image, rebuilt)"

    kind, peak = _measured(check)
    assert peak < MEMORY_BOUND, f"inspect_archive held {peak} bytes"
    _record("import-image pre-load check", kind, peak)


# --- install-set verify and install ----------------------------------------------------------


def wheel_of(base: list[tuple[str, bytes]], crafted, mutations=()) -> bytes:
    """A wheel (zip) of ``base`` files then the crafted members' names and data, then flips."""
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as zf:
        for name, data in base:
            zf.writestr(name, data)
        for name, kind, _link, data, _sparse in crafted:
            with contextlib.suppress(ValueError, IndexError):  # names zipfile refuses to write
                zf.writestr(name + ("/" if kind == "dir" else ""), data)
    out = bytearray(raw.getvalue())
    for offset, value in mutations:
        out[offset % len(out)] = value
    return bytes(out)


TINY_WHEEL = [
    ("tinypkg/__init__.py", b"#\n"),
    ("tinypkg-1.0.dist-info/METADATA", b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n"),
    (
        "tinypkg-1.0.dist-info/WHEEL",
        b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    ),
    ("tinypkg-1.0.dist-info/RECORD", b""),
]


@FUZZ
@given(crafted=st.lists(members, min_size=1, max_size=5), mutations=flips, honest=st.booleans())
def test_the_installer_never_writes_outside_its_target(
    tmp_path_factory, crafted, mutations, honest
):
    """The sender controls every byte: crafted members in a wheel whose hashes all agree (or,
    with ``honest`` off, a manifest claiming far less than the wheel unpacks to)."""
    tmp_path = tmp_path_factory.mktemp("install-case")
    box, parts_dir = tmp_path / "box", tmp_path / "parts"
    box.mkdir()
    wheel = tmp_path / "tinypkg-1.0-py3-none-any.whl"
    wheel.write_bytes(wheel_of(TINY_WHEEL, crafted, mutations))
    record = Wheel("tinypkg", "1.0", wheel.name, wheel.stat().st_size,
                   hashlib.sha256(wheel.read_bytes()).hexdigest(), None, wheel)  # fmt: skip
    root = {"requirement": "tinypkg==1.0", "name": "tinypkg", "version": "1.0"}
    # The sender's own packer: it claims 1 MiB unpacked (2 bytes when not honest) whatever
    # the crafted zip holds, and skips the check of the set it made, where the kit's build
    # would refuse a zip it cannot read.
    claim = mock.patch.object(build, "unpacked_bytes", lambda _w: (1 << 20) if honest else 2)
    skipped = build.install.Verified(None, None, [])
    unchecked = mock.patch.object(build.install, "verify", lambda *_a, **_k: skipped)
    with claim, unchecked, contextlib.redirect_stderr(io.StringIO()):
        build.pack_set([record], parts_dir, TARGET, root=root, part_size=4096)
    wheel.unlink()
    target = box / "target"

    def run():
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                install(parts_dir, target)
        except InstallSetError as exc:
            return _kind(str(exc))
        return "installed"

    kind, peak = _measured(run)
    assert peak < MEMORY_BOUND, f"the installer held {peak} bytes"
    assert sorted(os.listdir(tmp_path)) == ["box", "parts"], "written beside the box"
    assert not Path("/tmp/repro-fuzz-escape").exists()
    for folder, dirs, files in os.walk(box):
        for name in dirs + files:
            path = os.path.join(folder, name)
            assert os.path.realpath(path).startswith(str(box)), f"{path} escapes"
    if kind != "installed":
        assert not target.exists(), "a refused install leaves no target"
    _record("installset install", kind, peak)
    shutil.rmtree(tmp_path)
