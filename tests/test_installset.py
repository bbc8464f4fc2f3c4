"""repro.installset: resolve logic (offline, with fakes), packing, verifying and installing.

The network half (uv resolving vLLM against PyPI, pip downloading) is exercised with fakes;
the transfer half runs for real on two wheels built here: staging install with pip, tar +
xz, parts, manifest (validated against its schema), verify and install, then an import
from the installed folder in a fresh interpreter.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from crafted_archives import sparse_tar

from repro.installset import InstallSetError
from repro.installset.build import pack_set
from repro.installset.fetch import parse_wheel_filename, record_wheel
from repro.installset.graph import Candidate, read_wheel_metadata, target_walk
from repro.installset.hostenv import (
    Pin,
    canonical_name,
    parse_freeze,
    read_freeze,
    subtract_host,
)
from repro.installset.manifest import (
    MANIFEST_NAME,
    ManifestInvalid,
    check_structure,
    load_manifest,
    validate_schema,
)
from repro.installset.pack import parse_size, split_file
from repro.installset.resolve import (
    Locked,
    LockedWheel,
    UvConflict,
    conflict_names,
    parse_pylock,
    resolve,
    stub_version,
    uv_platform,
    write_stub_wheel,
)
from repro.installset.target import Target, expand_platforms
from repro.installset.unpack import (
    MARKER_NAME,
    PartsInvalid,
    UnsafeArchive,
    install,
    unsafe_reason,
    verify,
)

REPO = Path(__file__).resolve().parents[1]
H200_FREEZE = REPO / "containers" / "hosts" / "h200-pip-freeze.txt"
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"
PART_SIZE = 8 * 1024


# --- the host's packages ---------------------------------------------------------------------


def test_canonical_names_follow_pep_503():
    assert canonical_name("Typing_Extensions") == "typing-extensions"
    assert canonical_name("typing.extensions") == "typing-extensions"
    assert canonical_name("zope__Interface") == "zope-interface"
    assert canonical_name(" PyYAML ") == "pyyaml"


def test_subtract_host_matches_names_in_any_spelling_and_keeps_host_versions():
    closure = [
        Pin("vllm", "0.26.0"),
        Pin("typing-extensions", "4.12.0"),
        Pin("Pydantic", "2.14.4"),
        Pin("numba", "0.65.0"),
        Pin("PyYAML", "6.0.3"),
    ]
    host = {"Typing_Extensions": "4.16.0", "numba": "0.68.0", "pyyaml": "6.0.3"}
    split = subtract_host(closure, host)
    assert [p.name for p in split.ship] == ["vllm", "Pydantic"]
    on_host = {h.name: (h.wanted, h.host_version, h.same_version) for h in split.on_host}
    assert on_host == {
        "typing-extensions": ("4.12.0", "4.16.0", False),
        "numba": ("0.65.0", "0.68.0", False),
        "PyYAML": ("6.0.3", "6.0.3", True),
    }


def test_subtract_host_takes_a_parsed_freeze_and_ignores_local_labels():
    host = parse_freeze("Torch==2.11.0+cu130\ntyping_extensions==4.16.0\n")
    split = subtract_host([Pin("torch", "2.11.0"), Pin("Typing-Extensions", "4.16.0")], host)
    assert split.ship == []
    assert all(h.same_version for h in split.on_host)


def test_subtract_host_refuses_a_closure_naming_a_package_twice():
    with pytest.raises(InstallSetError, match="twice"):
        subtract_host([Pin("Foo_Bar", "1"), Pin("foo-bar", "1")], {})


def test_parse_freeze_reads_pins_direct_references_and_editables():
    text = (
        "# pip list --format=freeze\n"
        "torch==2.11.0\n"
        "Jinja2==3.1.6  # a comment\n"
        "mypkg @ file:///src/mypkg\n"
        "-e git+https://example.invalid/x.git@abc#egg=Local_Thing\n"
        "--index-url https://example.invalid/simple\n"
        "\n"
    )
    env = parse_freeze(text)
    assert env.get("jinja2").version == "3.1.6"
    assert env.get("MyPkg").version is None
    assert "local-thing" in env and "torch" in env
    assert env.skipped_lines == ("--index-url https://example.invalid/simple",)
    assert env.sha256 == hashlib.sha256(text.encode()).hexdigest()


def test_parse_freeze_refuses_two_versions_of_one_package():
    with pytest.raises(InstallSetError, match="twice"):
        parse_freeze("numpy==2.5.2\nNumPy==2.4.0\n")


def test_the_h200_freeze_is_the_host_architecture_describes():
    host = read_freeze(H200_FREEZE)
    assert host.get("torch").version == "2.11.0"
    assert host.get("triton").version == "3.6.0"
    assert host.get("transformers").version == "5.17.0"
    for lacking in ("vllm", "pydantic", "msgspec", "pyzmq", "xgrammar", "blake3"):
        assert lacking not in host
    assert host.sha256 == hashlib.sha256(H200_FREEZE.read_bytes()).hexdigest()


# --- the target ------------------------------------------------------------------------------


def test_platforms_expand_to_older_glibc_tags_newest_first():
    tags = expand_platforms(["manylinux_2_28_x86_64", "manylinux_2_31_x86_64"])
    assert tags[:4] == [
        "manylinux_2_31_x86_64",
        "manylinux_2_30_x86_64",
        "manylinux_2_29_x86_64",
        "manylinux_2_28_x86_64",
    ]
    assert tags.index("manylinux2014_x86_64") == tags.index("manylinux_2_17_x86_64") + 1
    assert tags[-1] == "manylinux1_x86_64" and len(tags) == len(set(tags))
    assert expand_platforms(["linux_x86_64"]) == ["linux_x86_64"]


def test_target_markers_are_the_hosts_not_this_interpreters():
    target = Target.create("3.12.3", ["manylinux_2_31_x86_64"])
    env = target.marker_environment()
    assert env["python_version"] == "3.12" and env["python_full_version"] == "3.12.3"
    assert env["platform_machine"] == "x86_64" and env["sys_platform"] == "linux"
    assert target.python_tag == "cp312"
    assert uv_platform(target) == "x86_64-manylinux_2_31"
    args = target.pip_args()
    assert args[:3] == ["--only-binary=:all:", "--python-version", "3.12"]
    assert args.count("--platform") == len(target.platforms)


@pytest.mark.parametrize(
    "python, platforms",
    [("3.12.x", ["manylinux_2_31_x86_64"]), ("3.12", ["win_amd64"]), ("3.12", [])],
)
def test_target_refuses_what_it_cannot_serve(python, platforms):
    with pytest.raises(InstallSetError):
        Target(python, tuple(platforms))


def test_parse_size():
    assert parse_size("55MiB") == 55 * 1024 * 1024
    assert parse_size("50MB") == 50_000_000
    assert parse_size("1048576") == 1048576
    assert parse_size("1.5 KiB") == 1536
    for bad in ("", "0", "-5MiB", "12 parsecs"):
        with pytest.raises(InstallSetError):
            parse_size(bad)


# --- resolution (offline: fakes stand in for uv) ---------------------------------------------


def test_stub_wheels_are_valid_wheels_at_the_hosts_version(tmp_path):
    assert stub_version("2.11.0") == "2.11.0+installset.host"
    assert stub_version("2.11.0+cu130") == "2.11.0+cu130.installset.host"
    assert stub_version(None) is None
    path = write_stub_wheel(tmp_path, "Typing_Extensions", stub_version("4.16.0"))
    assert path.name == "typing_extensions-4.16.0+installset.host-py3-none-any.whl"
    meta = read_wheel_metadata(path)
    assert (meta.name, meta.version, meta.requires_dist) == (
        "Typing_Extensions",
        "4.16.0+installset.host",
        (),
    )


# Two of the conflicts uv reported for vllm==0.26.0 against the H200 host (shortened).
UV_NUMBA = (
    "error: No solution found when resolving dependencies\n  cause: Because vllm==0.26.0 "
    "depends on numba==0.65.0 and numba==0.68.0+installset.host, we can conclude that "
    "vllm==0.26.0 cannot be used."
)
UV_PROTOBUF = (
    "  cause: Because nvidia-cutlass-dsl-libs-base==4.6.0 depends on protobuf>=6.30.2,<7 and "
    "nvidia-cutlass-dsl==4.6.0 depends on nvidia-cutlass-dsl-libs-base==4.6.0, we can conclude "
    "that nvidia-cutlass-dsl==4.6.0 depends on protobuf>=6.30.2,<7.\n         And because "
    "vllm==0.26.0 depends on protobuf==7.36.2+installset.host, we can conclude that ..."
)


def test_conflict_names_finds_the_host_stubs_uv_blames():
    host = read_freeze(H200_FREEZE)
    assert conflict_names(UV_NUMBA, host) == {"numba"}
    assert conflict_names(UV_PROTOBUF, host) == {"protobuf"}
    # Phrased without the stub label: every host package named with a specifier.
    assert conflict_names("Because x==1 depends on Numba>=1 and torch<2", host) == {
        "numba",
        "torch",
    }


def _locked(name: str, version: str, size: int = 100) -> Locked:
    sha = hashlib.sha256(f"{name}{version}".encode()).hexdigest()
    url = f"https://files.example/{name}-{version}-py3-none-any.whl"
    return Locked(name, version, (LockedWheel(url, sha, size),))


class FakeUv:
    """Answers like uv: a conflict until numba is overridden; excludes drop their subtree."""

    def __init__(self):
        self.calls: list[tuple[set[str], set[str]]] = []

    def compile(self, requirements, host, *, overrides=frozenset(), excludes=frozenset()):
        self.calls.append((set(overrides), set(excludes)))
        if "numba" not in overrides:
            raise UvConflict(UV_NUMBA)
        locked = [_locked("vllm", "0.26.0", 300), _locked("pydantic", "2.14.4")]
        if "flashinfer-python" not in excludes:
            locked += [_locked("flashinfer-python", "0.6.14", 5000), _locked("cuda-tile", "1.7")]
        return locked


def test_resolve_overrides_host_packages_uv_blames_and_measures_exclusions():
    host = read_freeze(H200_FREEZE)
    fake = FakeUv()
    res = resolve("vllm==0.26.0", host, fake, exclude={"FlashInfer_Python": "optional"})
    assert [p.name for p in res.packages] == ["vllm", "pydantic"]
    assert res.overrides == ["numba"]
    assert res.excluded == {"flashinfer-python": "optional"}
    assert [p.name for p in res.excluded_closure] == ["cuda-tile", "flashinfer-python"]
    assert res.wheel_bytes == 400
    assert fake.calls[0] == (set(), {"flashinfer-python"})
    assert fake.calls[-1] == ({"numba"}, set())


def test_resolve_refuses_a_root_the_host_has_and_conflicts_it_cannot_override():
    host = parse_freeze("vllm==0.25.0\nnumba==0.68.0\n")
    with pytest.raises(InstallSetError, match="already has vllm"):
        resolve("vllm==0.26.0", host, FakeUv())

    class Stuck:
        def compile(self, *a, **k):
            raise UvConflict("Because foo==1 depends on bar<1 and you require bar>2 …")

    with pytest.raises(InstallSetError, match="names no host package"):
        resolve("foo==1", parse_freeze("numba==0.68.0\n"), Stuck())


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is new in 3.11")
def test_parse_pylock_drops_stubs_and_keeps_every_wheel():
    text = """
lock-version = "1.0"
[[packages]]
name = "numba"
version = "0.68.0+installset.host"
wheels = [{ url = "file:///tmp/stubs/numba.whl", hashes = { sha256 = "aa" } }]
[[packages]]
name = "apache-tvm-ffi"
version = "0.1.10"
wheels = [
  { url = "https://f/apache_tvm_ffi-0.1.10-cp312-abi3-manylinux2014_x86_64.whl", size = 10, hashes = { sha256 = "bb" } },
  { url = "https://f/apache_tvm_ffi-0.1.10-cp312-abi3-manylinux_2_28_x86_64.whl", size = 12, hashes = { sha256 = "cc" } },
]
"""  # noqa: E501
    (pkg,) = parse_pylock(text)
    assert (pkg.key, pkg.version, pkg.size, pkg.sha256s) == (
        "apache-tvm-ffi",
        "0.1.10",
        12,
        {"bb", "cc"},
    )
    assert pkg.wheels[1].filename == "apache_tvm_ffi-0.1.10-cp312-abi3-manylinux_2_28_x86_64.whl"


def test_target_walk_uses_the_hosts_markers_and_records_what_the_host_must_meet():
    host = parse_freeze("numba==0.68.0\ntorch==2.11.0\nsetuptools==81.0.0\n")
    env = Target.create("3.12").marker_environment()
    root = Candidate(
        "vllm",
        "0.26.0",
        (
            "numba==0.65.0",
            "torch==2.11.0",
            'setuptools<81.0.0,>=77.0.3; python_version > "3.11"',
            'tomli; python_version < "3.11"',
            "fastapi[standard]<0.137",
            "flashinfer-python==0.6.14",
            'zentorch==2.11.0.0; extra == "zen"',
        ),
    )
    shipped = {
        "fastapi": Candidate(
            "fastapi", "0.136.3", ("starlette>=1", 'uvicorn>=0.12; extra == "standard"')
        ),
        "starlette": Candidate("starlette", "1.10.0"),
        "uvicorn": Candidate("uvicorn", "0.54.0", ("h11>=0.8",)),
        "orphan": Candidate("orphan", "1.0"),
    }
    walk = target_walk(root, (), shipped, host, env, exclude=["flashinfer-python"])
    # python_version > "3.11" holds on the 3.12 host whatever runs this test; tomli does not.
    unmet = {(h.name, h.specifier) for h in walk.host_conflicts}
    assert unmet == {("numba", "==0.65.0"), ("setuptools", "<81.0.0,>=77.0.3")}
    assert {h.name for h in walk.host if h.satisfied} == {"torch"}
    assert walk.excluded == [("flashinfer-python==0.6.14", "vllm 0.26.0")]
    # uvicorn is reached through fastapi's "standard" extra; its h11 is neither here nor there.
    assert "uvicorn" in walk.reached and walk.reached["fastapi"] == {"standard"}
    assert ("h11>=0.8", "uvicorn 0.54.0") in walk.missing
    assert ("tomli", "vllm 0.26.0") not in walk.missing
    assert walk.unreachable == {"orphan"}
    assert walk.required_by["starlette"] == {"fastapi 0.136.3 (>=1)"}


# --- a tiny install set, built and installed for real ----------------------------------------


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    *,
    requires: tuple[str, ...] = (),
    entry_points: str = "",
) -> Path:
    """A minimal valid pure-Python wheel (METADATA, WHEEL, RECORD with hashes)."""
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    content = dict(files)
    content[f"{info}/METADATA"] = meta.encode()
    content[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
    content[f"{info}/WHEEL"] += b"Tag: py3-none-any\n"
    if entry_points:
        content[f"{info}/entry_points.txt"] = entry_points.encode()
    record = [_record_line(n, d) for n, d in content.items()] + [f"{info}/RECORD,,"]
    content[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in content.items():
            zf.writestr(member, data)
    return path


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory) -> Path:
    """Two wheels packed into several small parts; built once, copied by each test."""
    base = tmp_path_factory.mktemp("tiny")
    wheels = base / "wheels"
    wheels.mkdir()
    noise = os.urandom(40_000)  # incompressible: the archive spans several 8 KiB parts
    tinydep = make_wheel(
        wheels,
        "tinydep",
        "2.0",
        {"tinydep/__init__.py": b"ANSWER = 42\n", "tinydep/noise.bin": noise},
    )
    tinypkg = make_wheel(
        wheels,
        "tinypkg",
        "1.0",
        {
            "tinypkg/__init__.py": b"from tinydep import ANSWER\n\ndef main():\n"
            b"    print('tinypkg says', ANSWER)\n",
        },
        requires=("tinydep>=2",),
        entry_points="[console_scripts]\ntinypkg = tinypkg:main\n",
    )
    records = [record_wheel(tinypkg), record_wheel(tinydep)]
    out = base / "set"
    target = Target.create(HERE, ["manylinux_2_17_x86_64"])
    pack_set(
        records,
        out,
        target,
        root={"requirement": "tinypkg==1.0", "name": "tinypkg", "version": "1.0"},
        part_size=PART_SIZE,
    )
    return out


@pytest.fixture
def set_copy(tiny_set, tmp_path) -> Path:
    copy = tmp_path / "parts"
    shutil.copytree(tiny_set, copy)
    return copy


def test_the_tiny_set_has_several_parts_and_a_valid_manifest(tiny_set):
    manifest, sha = load_manifest(tiny_set)
    validate_schema(manifest)
    assert sha == hashlib.sha256((tiny_set / MANIFEST_NAME).read_bytes()).hexdigest()
    parts = manifest["parts"]
    assert len(parts) >= 3
    assert all(p["bytes"] == PART_SIZE for p in parts[:-1]) and 0 < parts[-1]["bytes"] <= PART_SIZE
    assert sorted(p.name for p in tiny_set.iterdir()) == sorted(
        [MANIFEST_NAME] + [p["name"] for p in parts]
    )
    joined = b"".join((tiny_set / p["name"]).read_bytes() for p in parts)
    assert hashlib.sha256(joined).hexdigest() == manifest["archive"]["sha256"]
    assert [w["name"] for w in manifest["wheels"]] == ["tinypkg", "tinydep"]
    assert manifest["vllm_version"] is None and manifest["host"] is None
    assert manifest["python"] == {"version": HERE, "tag": f"cp{HERE.replace('.', '')}"}
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(joined))) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert "tinypkg/__init__.py" in names and "tinydep-2.0.dist-info/METADATA" in names
    assert not any(n.endswith(".pyc") for n in names), "the build must not byte-compile"
    assert manifest["archive"]["files"] == sum(1 for m in members if m.isreg())
    assert {(m.uid, m.gid, m.uname, m.mtime) for m in members} == {(0, 0, "", members[0].mtime)}


def test_install_then_import_from_a_fresh_interpreter(set_copy, tmp_path):
    target = tmp_path / "site" / "target"
    result = install(set_copy, target)
    marker = json.loads((target / MARKER_NAME).read_text())
    manifest, sha = load_manifest(set_copy)
    assert marker["manifest_sha256"] == sha == result.manifest_sha256
    assert marker["archive_sha256"] == manifest["archive"]["sha256"]
    assert result.files == manifest["archive"]["files"]
    assert not [p for p in target.parent.iterdir() if p.name != "target"], "no leftovers"
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = (
        "import importlib.metadata as m, tinypkg, tinydep; "
        "print(tinydep.ANSWER, m.version('tinypkg'), tinypkg.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    answer, version, where = out.stdout.split()
    assert (answer, version) == ("42", "1.0") and where.startswith(str(target))
    script = (target / "bin" / "tinypkg").read_text()
    assert script.startswith("#!/usr/bin/env python3\n"), "console scripts must be portable"
    # Installing the same set again is a no-op; a different folder content is refused.
    assert install(set_copy, target).already
    (target / "stray.txt").write_text("x")
    marker_of_another_set = {"format": "repro-install-set-marker", "manifest_sha256": "0" * 64}
    (target / MARKER_NAME).write_text(json.dumps(marker_of_another_set))
    with pytest.raises(InstallSetError, match="not empty"):
        install(set_copy, target)
    assert install(set_copy, target, replace=True).files == manifest["archive"]["files"]
    assert not (target / "stray.txt").exists()


def _part(set_dir: Path, index: int) -> Path:
    manifest, _ = load_manifest(set_dir)
    return set_dir / manifest["parts"][index]["name"]


def test_a_corrupted_part_is_refused_by_name_with_expected_and_found(set_copy, tmp_path):
    part = _part(set_copy, 1)
    data = bytearray(part.read_bytes())
    data[100] ^= 0x01
    part.write_bytes(bytes(data))
    expected = load_manifest(set_copy)[0]["parts"][1]["sha256"]
    found = hashlib.sha256(bytes(data)).hexdigest()
    for attempt in (lambda: verify(set_copy), lambda: install(set_copy, tmp_path / "t")):
        with pytest.raises(PartsInvalid) as info:
            attempt()
        (problem,) = info.value.problems
        assert part.name in problem and "corrupted" in problem
        assert expected in problem and found in problem
    assert not (tmp_path / "t").exists()


def test_a_missing_part_is_refused_by_name(set_copy):
    part = _part(set_copy, 0)
    part.unlink()
    with pytest.raises(PartsInvalid) as info:
        verify(set_copy)
    (problem,) = info.value.problems
    assert part.name in problem and "missing" in problem


def test_a_truncated_part_is_refused_by_name(set_copy):
    part = _part(set_copy, -1)
    data = part.read_bytes()
    part.write_bytes(data[:-7])
    with pytest.raises(PartsInvalid) as info:
        verify(set_copy)
    (problem,) = info.value.problems
    assert part.name in problem and "truncated" in problem
    assert f"expected {len(data)} bytes, found {len(data) - 7}" in problem


def test_every_bad_part_is_named_at_once(set_copy):
    _part(set_copy, 0).unlink()
    _part(set_copy, 1).write_bytes(b"short")
    with pytest.raises(PartsInvalid) as info:
        verify(set_copy)
    assert len(info.value.problems) == 2


def test_a_manifest_that_lies_about_the_archive_is_refused(set_copy):
    path = set_copy / MANIFEST_NAME
    doc = json.loads(path.read_text())
    doc["archive"]["sha256"] = "0" * 64
    path.write_text(json.dumps(doc))
    with pytest.raises(PartsInvalid, match="parts joined in order"):
        verify(set_copy)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["parts"][0].update(name="../../etc/passwd"), "plain file name"),
        (lambda d: d["parts"][0].update(bytes=d["parts"][0]["bytes"] + 1), "add up"),
        (lambda d: d.update(format_version=2), "format_version"),
        (lambda d: d.update(parts=[]), "empty"),
        (lambda d: d["archive"].pop("files"), "files is missing"),
    ],
)
def test_check_structure_refuses_what_the_installer_cannot_trust(tiny_set, mutate, message):
    doc, _ = load_manifest(tiny_set)
    mutate(doc)
    with pytest.raises(ManifestInvalid, match=message):
        check_structure(doc)


def _evil_set(tmp_path: Path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    """A set whose hashes are all right but whose archive holds ``member``."""
    out = tmp_path / "evil"
    out.mkdir()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        ok = tarfile.TarInfo("pkg/__init__.py")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"#\n"))
        tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    archive = out / "evil-1.0-cp312.tar.xz"
    archive.write_bytes(lzma.compress(raw.getvalue()))
    parts, sha, size = split_file(archive, out, 256)
    archive.unlink()
    doc = {
        "format": "repro-install-set",
        "format_version": 1,
        "archive": {
            "name": archive.name,
            "bytes": size,
            "sha256": sha,
            "files": 2,
            "unpacked_bytes": 2 + (len(data) if member.isreg() else 0),
        },
        "parts": [p.as_dict() for p in parts],
    }
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    return out


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = 4 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    "member, reason",
    [
        (_member("../escaped.txt"), "contains '..'"),
        (_member("pkg/../../escaped.txt"), "contains '..'"),
        (_member("/tmp/escaped.txt"), "absolute path"),
        (_member("pkg/link", tarfile.SYMTYPE, "../../escaped.txt"), "leaving the target"),
        (_member("pkg/link", tarfile.SYMTYPE, "/etc/passwd"), "absolute path"),
        (_member("pkg/hard", tarfile.LNKTYPE, "../x"), "hard link"),
        (_member("pkg/fifo", tarfile.FIFOTYPE), "special file"),
    ],
)
def test_an_archive_member_escaping_the_target_is_refused(tmp_path, member, reason):
    assert reason in unsafe_reason(member)
    parts = _evil_set(tmp_path, member, b"evil")
    verify(parts)  # the hashes are fine: the archive itself is the problem
    target = tmp_path / "inside" / "target"
    with pytest.raises(UnsafeArchive, match=reason):
        install(parts, target)
    assert not target.exists()
    assert not list((tmp_path / "inside").iterdir()), "the partial extraction is removed"
    assert not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path / "inside" / "escaped.txt").exists()


def test_safe_members_pass():
    assert unsafe_reason(_member("pkg/mod.py")) is None
    assert unsafe_reason(_member("pkg/sub", tarfile.DIRTYPE)) is None
    assert unsafe_reason(_member("pkg/sub/link", tarfile.SYMTYPE, "../mod.py")) is None


def test_verify_and_install_run_on_the_standard_library_alone(set_copy, tmp_path):
    """``python -S`` has no site-packages: no jsonschema, rich, packaging or pip."""
    target = tmp_path / "bare-target"
    base = [sys.executable, "-S", "-m", "repro.installset"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    verified = subprocess.run(
        [*base, "verify", "--parts", str(set_copy)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert verified.returncode == 0, verified.stderr
    assert "ok:" in verified.stdout
    done = subprocess.run(
        [*base, "install", "--parts", str(set_copy), "--target", str(target)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    for step in ("read manifest:", "verify ", "extract ", "write marker and move into place:"):
        assert step in done.stderr
    assert (target / MARKER_NAME).is_file() and (target / "tinypkg" / "__init__.py").is_file()
    _part(set_copy, 0).write_bytes(b"x")
    refused = subprocess.run(
        [*base, "verify", "--parts", str(set_copy)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1 and _part(set_copy, 0).name in refused.stderr


def test_wheel_file_names_and_records(tmp_path):
    assert parse_wheel_filename("Partial_JSON_Parser-0.2.1.1.post7-py3-none-any.whl") == (
        "partial-json-parser",
        "0.2.1.1.post7",
    )
    with pytest.raises(InstallSetError):
        parse_wheel_filename("foo-1.0.tar.gz")
    wheel = make_wheel(tmp_path, "demo", "3.1", {"demo.py": b"x = 1\n"}, requires=("a>=1",))
    rec = record_wheel(wheel)
    assert (rec.name, rec.version, rec.bytes) == ("demo", "3.1", wheel.stat().st_size)
    assert rec.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert read_wheel_metadata(wheel).requires_dist == ("a>=1",)


def test_the_same_wheels_give_the_same_archive_on_another_day(tiny_set, tmp_path, monkeypatch):
    # A set rebuilt later from the same wheels must hash the same (last stop's rebuild of the
    # vLLM 0.26.0 set did not: its tar times came from the clock).
    from datetime import datetime, timezone

    import repro.installset.build as build

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    manifest, _ = load_manifest(tiny_set)
    monkeypatch.setattr(
        build, "_utc_now", lambda: datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    )
    records = [record_wheel(Path(w)) for w in sorted(tiny_set.parent.glob("wheels/*.whl"))]
    again, _ = pack_set(
        sorted(records, key=lambda r: [w["name"] for w in manifest["wheels"]].index(r.name)),
        tmp_path / "again",
        Target.create(HERE, ["manylinux_2_17_x86_64"]),
        root=manifest["root"],
        part_size=PART_SIZE,
    )
    assert again["created"] == "2031-05-06T07:08:09Z" != manifest["created"]
    assert again["archive"]["sha256"] == manifest["archive"]["sha256"]
    assert [p["sha256"] for p in again["parts"]] == [p["sha256"] for p in manifest["parts"]]


def test_the_same_wheels_give_the_same_archive_from_another_folder(tiny_set, tmp_path):
    # pip records each wheel's absolute path in direct_url.json; a set built from a wheels
    # folder elsewhere (another checkout) must still hash the same and carry no such path.
    import shutil

    manifest, _ = load_manifest(tiny_set)
    elsewhere = tmp_path / "another" / "checkout"
    elsewhere.mkdir(parents=True)
    order = [w["name"] for w in manifest["wheels"]]
    records = []
    for wheel in sorted(tiny_set.parent.glob("wheels/*.whl")):
        records.append(record_wheel(Path(shutil.copy(wheel, elsewhere))))
    again, _ = pack_set(
        sorted(records, key=lambda r: order.index(r.name)),
        tmp_path / "again",
        Target.create(HERE, ["manylinux_2_17_x86_64"]),
        root=manifest["root"],
        part_size=PART_SIZE,
        keep_staging=True,
    )
    staged = tmp_path / "again" / ".staging"
    assert not list(staged.glob("*.dist-info/direct_url.json"))
    assert not any("direct_url" in r.read_text() for r in staged.glob("*.dist-info/RECORD"))
    assert again["archive"]["sha256"] == manifest["archive"]["sha256"]


# --- extraction resolved against what is on disk, bounded, and never without the filter ----


def _set_of(tmp_path: Path, members, *, files: int, unpacked: int) -> Path:
    """A set whose hashes are all right, holding ``members`` (TarInfo, data) in order."""
    out = tmp_path / "crafted"
    out.mkdir()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    archive = out / "crafted-1.0-cp312.tar.xz"
    archive.write_bytes(lzma.compress(raw.getvalue()))
    parts, sha, size = split_file(archive, out, 256)
    archive.unlink()
    doc = {
        "format": "repro-install-set",
        "format_version": 1,
        "archive": {
            "name": archive.name,
            "bytes": size,
            "sha256": sha,
            "files": files,
            "unpacked_bytes": unpacked,
        },
        "parts": [p.as_dict() for p in parts],
    }
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    return out


def _link_chain():
    """``l1 -> .``, ``l1/l2 -> ..``, ``l2/ESCAPED``: each lexically inside, together outside."""
    escaped = _member("l2/ESCAPED")
    return [
        (_member("l1", tarfile.SYMTYPE, "."), b""),
        (_member("l1/l2", tarfile.SYMTYPE, ".."), b""),
        (escaped, b"evil"),
    ]


def test_a_link_chain_passes_the_lexical_check_but_not_the_installer(tmp_path, monkeypatch):
    """A data filter that lets the chain through (as on Pythons before the 2025 tarfile
    fixes) is stood in by tarfile's fully trusting filter: the kit's own resolution refuses."""
    chain = _link_chain()
    assert all(unsafe_reason(m) is None for m, _ in chain), "lexically, every member is inside"
    parts = _set_of(tmp_path, chain, files=1, unpacked=4)
    monkeypatch.setattr(tarfile, "data_filter", tarfile.fully_trusted_filter)
    target = tmp_path / "inside" / "target"
    with pytest.raises(UnsafeArchive, match=r"'l1/l2' is a symbolic link resolving outside"):
        install(parts, target)
    assert not (tmp_path / "inside" / "ESCAPED").exists() and not target.exists()
    assert not list((tmp_path / "inside").iterdir()), "the partial extraction is removed"


def test_the_installer_refuses_to_extract_without_tarfiles_data_filter(tmp_path, monkeypatch):
    parts = _set_of(tmp_path, _link_chain(), files=1, unpacked=4)
    monkeypatch.delattr(tarfile, "data_filter")  # Python 3.10.0-3.10.11, 3.11.0-3.11.3
    target = tmp_path / "inside" / "target"
    with pytest.raises(InstallSetError, match="has no tarfile data filter"):
        install(parts, target)
    assert not (tmp_path / "inside" / "ESCAPED").exists() and not target.exists()


def test_extraction_stops_past_the_manifests_unpacked_size(tmp_path):
    big = _member("pkg/big.bin")
    big.size = 1 << 20
    parts = _set_of(tmp_path, [(big, bytes(1 << 20))], files=1, unpacked=4)
    with pytest.raises(UnsafeArchive, match=r"more than the manifest's 1 files / 4 unpacked"):
        install(parts, tmp_path / "target")
    assert not (tmp_path / "target").exists()


def test_a_sparse_member_is_refused(tmp_path):
    with tarfile.open(fileobj=io.BytesIO(sparse_tar("pkg/sparse.bin", 1 << 30))) as tar:
        sparse = tar.next()
    assert sparse.isreg() and sparse.size == 1 << 30, "tarfile counts it a regular file"
    assert "sparse" in unsafe_reason(sparse)


def test_replace_never_deletes_a_folder_the_installer_did_not_write(set_copy, tmp_path):
    target = tmp_path / "home"
    target.mkdir()
    (target / "thesis.tex").write_text("years of work\n")
    with pytest.raises(InstallSetError, match=r"has no \.repro-installset\.json.*will not delete"):
        install(set_copy, target, replace=True)
    assert (target / "thesis.tex").read_text() == "years of work\n"
    install(set_copy, tmp_path / "site")  # an install the kit made is replaced as before
    (tmp_path / "site" / "stale.py").write_text("")
    install(set_copy, tmp_path / "site", replace=True)
    assert not (tmp_path / "site" / "stale.py").exists()


@pytest.mark.parametrize(
    "members, refusal",
    [
        ([(_member("."), b"evil")], "is not a plain relative path"),
        ([(_member("pkg/./mod.py"), b"evil")], "is not a plain relative path"),
        ([(_member("pkg/hard", tarfile.LNKTYPE, "pkg/absent.py"), b"")], "does not hold before"),
    ],
    ids=["dot-as-file", "dot-component", "hard-link-to-nothing"],
)
def test_members_the_fuzzer_found_are_named_refusals(tmp_path, members, refusal):
    """Each crashed the installer with a raw tarfile or OS error (found by
    tests/test_fuzz_archives.py); each is a named refusal now."""
    parts = _set_of(tmp_path, members, files=1, unpacked=4)
    with pytest.raises(UnsafeArchive, match=refusal):
        install(parts, tmp_path / "target")
    assert not (tmp_path / "target").exists()


def test_a_damaged_tar_with_matching_hashes_is_a_named_refusal(tmp_path):
    good = io.BytesIO()
    with tarfile.open(fileobj=good, mode="w") as tar:
        info = _member("pkg/mod.py")
        tar.addfile(info, io.BytesIO(b"evil"))
    damaged = bytearray(good.getvalue())
    damaged[0] ^= 0xFF  # the first header's checksum no longer holds
    out = tmp_path / "crafted"
    out.mkdir()
    archive = out / "crafted-1.0-cp312.tar.xz"
    archive.write_bytes(lzma.compress(bytes(damaged)))
    parts, sha, size = split_file(archive, out, 256)
    archive.unlink()
    doc = {
        "format": "repro-install-set",
        "format_version": 1,
        "archive": {
            "name": archive.name,
            "bytes": size,
            "sha256": sha,
            "files": 1,
            "unpacked_bytes": 4,
        },
        "parts": [p.as_dict() for p in parts],
    }
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(UnsafeArchive, match="not a readable tar.xz"):
        install(out, tmp_path / "target")
