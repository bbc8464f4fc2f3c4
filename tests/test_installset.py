"""repro.installset: the host, the resolution (uv stood in by fakes), and a real set.

The network half (uv resolving vLLM against PyPI) is exercised with fakes; downloading runs
real pip against wheels served on loopback (a stand-in for the index, which the tests do not
reach). The transfer half runs for real on two wheels built here: parts, manifest (validated
against its schema), verify, and pip's hash-checking install, then an import from the
installed folder in a fresh interpreter.
"""

from __future__ import annotations

import base64
import email.parser
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from folder_server import serve_folder

from repro.installset import InstallSetError
from repro.installset.build import Wheel, download, pack_set, parse_size, write_parts
from repro.installset.host import Target, expand_platforms, parse_freeze, read_freeze
from repro.installset.install import (
    MANIFEST_NAME,
    MARKER_NAME,
    ManifestInvalid,
    PartsInvalid,
    UnsafeArchive,
    check_structure,
    install,
    load_manifest,
    verify,
)
from repro.installset.resolve import (
    Locked,
    LockedWheel,
    UvFailed,
    fewest,
    parse_pylock,
    resolve,
    stub_version,
    uv_platform,
    write_stub_wheel,
)

REPO = Path(__file__).resolve().parents[1]
H200_FREEZE = REPO / "containers" / "hosts" / "h200-pip-freeze.txt"
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"
PART_SIZE = 8 * 1024


# --- the host --------------------------------------------------------------------------------


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
    assert env.get("jinja2").version == "3.1.6" and env.get("JINJA2") is env.get("Jinja2")
    assert env.get("MyPkg").version is None
    assert "local-thing" in env and "Local.Thing" in env and "torch" in env
    assert env.skipped_lines == ("--index-url https://example.invalid/simple",)
    assert env.sha256 == hashlib.sha256(text.encode()).hexdigest()


def test_parse_freeze_refuses_two_versions_of_one_package():
    with pytest.raises(InstallSetError, match="twice"):
        parse_freeze("numpy==2.5.2\nNumPy==2.4.0\n")


def test_the_h200_freeze_is_the_measured_host():
    host = read_freeze(H200_FREEZE)
    assert host.get("torch").version == "2.11.0"
    assert host.get("triton").version == "3.6.0"
    assert host.get("transformers").version == "5.17.0"
    assert host.get("pip").version == "24.0", "the host installs with its own pip"
    for lacking in ("vllm", "pydantic", "msgspec", "pyzmq", "xgrammar", "blake3"):
        assert lacking not in host
    assert host.sha256 == hashlib.sha256(H200_FREEZE.read_bytes()).hexdigest()


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


def test_the_target_is_the_hosts_python_and_tags():
    target = Target.create("3.12.3", ["manylinux_2_31_x86_64"])
    assert target.python_tag == "cp312" and target.machine == "x86_64"
    assert uv_platform(target) == "x86_64-manylinux_2_31"
    assert uv_platform(Target.create("3.12", ["linux_x86_64"])) == "x86_64-unknown-linux-gnu"
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
    with zipfile.ZipFile(path) as zf:
        meta = email.parser.HeaderParser().parsestr(
            zf.read("typing_extensions-4.16.0+installset.host.dist-info/METADATA").decode()
        )
    assert (meta["Name"], meta["Version"], meta.get_all("Requires-Dist")) == (
        "Typing_Extensions",
        "4.16.0+installset.host",
        None,
    )


def test_fewest_leaves_out_every_member_it_can():
    needed = {"numba", "setuptools", "numpy"}
    candidates = sorted(needed | {f"pkg{i:02d}" for i in range(29)})
    calls = []

    def solves(trial):
        calls.append(trial)
        return needed <= set(trial)

    assert sorted(fewest(candidates, solves)) == sorted(needed)
    assert len(calls) < len(candidates), "chunks first: fewer tries than one per candidate"
    assert fewest(["a", "b"], lambda trial: True) == []


def _locked(name: str, version: str, size: int = 100) -> Locked:
    sha = hashlib.sha256(f"{name}{version}".encode()).hexdigest()
    url = f"https://files.example/{name}-{version}-py3-none-any.whl"
    return Locked(name, version, (LockedWheel(url, sha, size),))


class FakeUv:
    """Answers like uv: no lock while numba is only a constraint (vLLM pins another version);
    excludes drop their subtree; the lock holds the stubs of the host packages it uses."""

    def __init__(self):
        self.calls: list[tuple[set[str], set[str]]] = []

    def compile(self, requirements, *, constraints, overrides, excludes, find_links):
        overridden = {pin.split("==")[0].lower() for pin in overrides}
        self.calls.append((overridden, set(excludes)))
        if "numba" not in overridden:
            raise UvFailed("No solution found: vllm==0.26.0 depends on numba==0.65.0 …")
        locked = [_locked("vllm", "0.26.0", 300), _locked("pydantic", "2.14.4")]
        locked += [
            _locked("numba", "0.68.0+installset.host"),
            _locked("torch", "2.11.0+installset.host"),
        ]
        if "flashinfer-python" not in excludes:
            locked += [_locked("flashinfer-python", "0.6.14", 5000), _locked("cuda-tile", "1.7")]
        return locked


def test_resolve_overrides_only_the_host_packages_that_need_it():
    host = read_freeze(H200_FREEZE)
    fake = FakeUv()
    res = resolve("vllm==0.26.0", host, fake, exclude={"FlashInfer_Python": "optional"})
    assert [p.name for p in res.packages] == ["vllm", "pydantic"]
    assert res.overrides == ["numba"], "torch is used but stays a constraint"
    assert ("numba", "0.68.0") in res.host_used and ("torch", "2.11.0") in res.host_used
    assert res.excluded == {"flashinfer-python": "optional"}
    assert [p.name for p in res.excluded_closure] == ["cuda-tile", "flashinfer-python"]
    assert res.wheel_bytes == 400
    assert fake.calls[0] == (set(), {"flashinfer-python"}), "first: every host package kept"
    assert len(fake.calls[1][0]) == len(host), "then: every host package overridden"
    assert fake.calls[-1] == ({"numba"}, set()), "last: the full closure, measured"


def test_resolve_refuses_to_keep_the_hosts_torch_against_the_closure():
    """vLLM 0.32.0 pins torch==2.13.0 and the lent hosts have 2.11.0: a set that kept the
    host's torch would install a vLLM whose compiled kernels cannot load there."""

    class PinsAnotherTorch(FakeUv):
        def compile(self, requirements, *, constraints, overrides, excludes, find_links):
            if "torch" not in {pin.split("==")[0].lower() for pin in overrides}:
                raise UvFailed("No solution found: vllm==0.32.0 depends on torch==2.13.0 …")
            return super().compile(
                requirements,
                constraints=constraints,
                overrides=[*overrides, "numba==0.68.0"],
                excludes=excludes,
                find_links=find_links,
            )

    host = read_freeze(H200_FREEZE)
    with pytest.raises(InstallSetError, match=r"another torch than the host's torch 2\.11\.0"):
        resolve("vllm==0.32.0", host, PinsAnotherTorch())


def test_resolve_refuses_a_root_the_host_has_and_a_closure_nothing_solves():
    with pytest.raises(InstallSetError, match="already has vllm"):
        resolve("vllm==0.26.0", parse_freeze("vllm==0.25.0\nnumba==0.68.0\n"), FakeUv())

    class Stuck:
        def compile(self, *a, **k):
            raise UvFailed("Because foo==1 depends on bar<1 and you require bar>2 …")

    with pytest.raises(InstallSetError, match="(?s)even with every host package kept.*bar>2"):
        resolve("foo==1", parse_freeze("numba==0.68.0\n"), Stuck())


def test_parse_pylock_keeps_the_stubs_and_every_wheel():
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
    stub, pkg = parse_pylock(text)
    assert stub.version == "0.68.0+installset.host"
    assert (pkg.key, pkg.version, pkg.size) == ("apache-tvm-ffi", "0.1.10", 12)
    assert pkg.wheels[1].filename == "apache_tvm_ffi-0.1.10-cp312-abi3-manylinux_2_28_x86_64.whl"


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


def wheel_of(path: Path) -> Wheel:
    name, version = path.name.split("-")[:2]
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return Wheel(name, version, path.name, path.stat().st_size, sha, None, path)


TARGET = Target.create(HERE, ["manylinux_2_17_x86_64"])
ROOT = {"requirement": "tinypkg==1.0", "name": "tinypkg", "version": "1.0"}


@pytest.fixture(scope="module")
def tiny_wheels(tmp_path_factory) -> list[Path]:
    wheels = tmp_path_factory.mktemp("wheels")
    noise = os.urandom(40_000)  # incompressible: the set spans several 8 KiB parts
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
    return [tinypkg, tinydep]


@pytest.fixture(scope="module")
def tiny_set(tiny_wheels, tmp_path_factory) -> Path:
    """Two wheels cut into several small parts; built once, copied by each test."""
    out = tmp_path_factory.mktemp("tiny") / "set"
    pack_set([wheel_of(w) for w in tiny_wheels], out, TARGET, root=ROOT, part_size=PART_SIZE)
    return out


@pytest.fixture
def set_copy(tiny_set, tmp_path) -> Path:
    copy = tmp_path / "parts"
    shutil.copytree(tiny_set, copy)
    return copy


def test_the_tiny_set_is_its_wheels_cut_into_parts_with_a_valid_manifest(tiny_set, tiny_wheels):
    from repro.artifact import schema_violations

    manifest, sha = load_manifest(tiny_set)
    assert schema_violations(manifest, "install-set", 2) == []
    assert sha == hashlib.sha256((tiny_set / MANIFEST_NAME).read_bytes()).hexdigest()
    parts = manifest["parts"]
    assert len(parts) >= 3
    assert all(p["bytes"] == PART_SIZE for p in parts[:-1]) and 0 < parts[-1]["bytes"] <= PART_SIZE
    assert sorted(p.name for p in tiny_set.iterdir()) == sorted(
        [MANIFEST_NAME, "SHA256SUMS"] + [p["name"] for p in parts]
    )
    joined = b"".join((tiny_set / p["name"]).read_bytes() for p in parts)
    assert joined == b"".join(w.read_bytes() for w in tiny_wheels), "the wheels, as they were"
    assert hashlib.sha256(joined).hexdigest() == manifest["stream"]["sha256"]
    assert [w["name"] for w in manifest["wheels"]] == ["tinypkg", "tinydep"]
    assert manifest["host"] is None and manifest["resolution"] is None
    assert manifest["python"] == {"version": HERE, "tag": f"cp{HERE.replace('.', '')}"}
    sums = (tiny_set / "SHA256SUMS").read_text().splitlines()
    assert sums == [f"{p['sha256']}  {p['name']}" for p in parts], "for `sha256sum -c`"


def test_install_then_import_from_a_fresh_interpreter(set_copy, tmp_path):
    target = tmp_path / "site" / "target"
    result = install(set_copy, target)
    marker = json.loads((target / MARKER_NAME).read_text())
    manifest, sha = load_manifest(set_copy)
    assert marker["manifest_sha256"] == sha == result.manifest_sha256
    assert marker["stream_sha256"] == manifest["stream"]["sha256"]
    assert result.wheels == 2
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
    script = subprocess.run(
        [target / "bin" / "tinypkg"], env=env, capture_output=True, text=True, check=True
    )
    assert script.stdout == "tinypkg says 42\n", "console scripts run with the host's python"
    # Installing the same set again is a no-op; another set's install is refused, and
    # --replace swaps it, keeping what the user added.
    assert install(set_copy, target).already
    (target / "stray.txt").write_text("x")
    marker_of_another_set = marker | {"manifest_sha256": "0" * 64}
    (target / MARKER_NAME).write_text(json.dumps(marker_of_another_set))
    with pytest.raises(InstallSetError, match="holds another install set"):
        install(set_copy, target)
    replaced = install(set_copy, target, replace=True)
    assert replaced.wheels == 2 and replaced.kept == ("stray.txt",)
    assert (target / "stray.txt").read_text() == "x"


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


def test_a_manifest_that_lies_about_the_stream_is_refused(set_copy):
    path = set_copy / MANIFEST_NAME
    doc = json.loads(path.read_text())
    doc["stream"]["sha256"] = "0" * 64
    path.write_text(json.dumps(doc))
    with pytest.raises(PartsInvalid, match="parts joined in order"):
        verify(set_copy)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["parts"][0].update(name="../../etc/passwd"), "plain file name"),
        (lambda d: d["wheels"][0].update(filename="../x.whl"), r'filename: "\.\./x\.whl"'),
        (lambda d: d["parts"][0].update(bytes=d["parts"][0]["bytes"] + 1), "add up"),
        (lambda d: d["wheels"][0].update(version="1.0 --index-url=x"), "not one pip reads"),
        (lambda d: d.update(format_version=1), "format_version"),
        (lambda d: d.update(parts=[]), "empty"),
        (lambda d: d["stream"].pop("unpacked_bytes"), "unpacked_bytes"),
    ],
)
def test_check_structure_refuses_what_the_installer_cannot_trust(tiny_set, mutate, message):
    doc, _ = load_manifest(tiny_set)
    mutate(doc)
    with pytest.raises(ManifestInvalid, match=message):
        check_structure(doc)


def test_verify_and_install_run_on_the_standard_library_and_pip(set_copy, tmp_path):
    """``python -S`` has no site-packages: no jsonschema, rich or packaging (the install's
    pip runs as ``python -m pip``, as on the host)."""
    target = tmp_path / "bare-target"
    base = [sys.executable, "-S", "-m", "repro.installset"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*args):
        return subprocess.run([*base, *args], cwd=REPO, env=env, capture_output=True, text=True)

    verified = run("verify", "--parts", str(set_copy))
    assert verified.returncode == 0, verified.stderr
    assert "ok:" in verified.stdout
    done = run("install", "--parts", str(set_copy), "--target", str(target))
    assert done.returncode == 0, done.stderr
    for step in ("read manifest:", "verify ", "cut the parts into 2 wheel(s):", "pip install"):
        assert step in done.stderr
    assert (target / MARKER_NAME).is_file() and (target / "tinypkg" / "__init__.py").is_file()
    _part(set_copy, 0).write_bytes(b"x")
    refused = run("verify", "--parts", str(set_copy))
    assert refused.returncode == 1 and _part(set_copy, 0).name in refused.stderr


def test_the_same_wheels_give_the_same_parts_another_day_from_another_folder(
    tiny_set, tiny_wheels, tmp_path, monkeypatch
):
    import repro.installset.build as build

    manifest, _ = load_manifest(tiny_set)
    monkeypatch.setattr(build, "utc_text", lambda: "2031-05-06T07:08:09Z")
    elsewhere = tmp_path / "another" / "checkout"
    elsewhere.mkdir(parents=True)
    copies = [wheel_of(Path(shutil.copy(w, elsewhere))) for w in tiny_wheels]
    again, _ = pack_set(copies, tmp_path / "again", TARGET, root=ROOT, part_size=PART_SIZE)
    assert again["created"] == "2031-05-06T07:08:09Z" != manifest["created"]
    assert again["stream"] == manifest["stream"] and again["parts"] == manifest["parts"]


def test_a_wheel_that_is_not_the_one_listed_is_never_packed(tiny_wheels, tmp_path):
    import dataclasses

    wrong = dataclasses.replace(wheel_of(tiny_wheels[0]), sha256="0" * 64)
    with pytest.raises(InstallSetError, match="not 0000"):
        write_parts([wrong], tmp_path, "x", PART_SIZE)


# --- what a sender could put in a set whose hashes all agree ---------------------------------


def _crafted_set(tmp_path: Path, wheels: list[Path], *, unpacked: int | None = None) -> Path:
    """A sender's own packer: the kit's, without the check of the set it made (which would
    refuse these wheels as the host does)."""
    import repro.installset.install as installer

    out = tmp_path / "crafted"
    records = [wheel_of(w) for w in wheels]
    with pytest.MonkeyPatch.context() as patch:
        skipped = installer.Verified(None, None, [])
        patch.setattr(installer, "verify", lambda *args, **kwargs: skipped)
        pack_set(records, out, TARGET, root=ROOT, part_size=256)
    if unpacked is not None:  # the manifest understates what the wheels unpack to
        doc = json.loads((out / MANIFEST_NAME).read_text())
        doc["stream"]["unpacked_bytes"] = unpacked
        (out / MANIFEST_NAME).write_text(json.dumps(doc))
    return out


@pytest.mark.parametrize(
    "member, refusal",
    [
        ("../escaped.txt", "leaves the install folder"),
        ("/tmp/escaped.txt", "leaves the install folder"),
        ("pkg/../../escaped.txt", "leaves the install folder"),
        ("C:/escaped.txt", "leaves the install folder"),
    ],
)
def test_a_wheel_member_leaving_the_target_is_refused(tmp_path, member, refusal):
    (tmp_path / "w").mkdir()
    evil = make_wheel(tmp_path / "w", "tinypkg", "1.0", {"tinypkg/__init__.py": b"#\n"})
    with zipfile.ZipFile(evil, "a") as zf:
        zf.writestr(member, b"evil")
    parts = _crafted_set(tmp_path, [evil])
    with pytest.raises(UnsafeArchive, match=refusal):  # the hashes agree: the wheel does not
        verify(parts)
    target = tmp_path / "inside" / "target"
    with pytest.raises(UnsafeArchive, match=refusal):
        install(parts, target)
    assert not target.exists()
    assert not (tmp_path / "inside").exists(), "refused before anything is made"
    assert not (tmp_path / "escaped.txt").exists()


def test_wheels_claiming_more_than_the_manifest_are_refused(tmp_path, tiny_wheels):
    parts = _crafted_set(tmp_path, tiny_wheels, unpacked=100)
    with pytest.raises(UnsafeArchive, match=r"unpack to \d+ bytes, more than the manifest's 100"):
        install(parts, tmp_path / "target")
    assert not (tmp_path / "target").exists()


def _needs_zip_version(data: bytes, version: int) -> bytes:
    at = data.index(b"PK\x01\x02") + 6  # the first central header's "version needed"
    return data[:at] + bytes([version, 0]) + data[at + 2 :]


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: b"not a zip at all" * 64,
        # A central directory asking for zip version 6.4: zipfile raises NotImplementedError
        # (found by tests/test_fuzz_archives.py).
        lambda data: _needs_zip_version(data, 64),
    ],
    ids=["not-a-zip", "zip-version-6.4"],
)
def test_a_wheel_that_is_not_a_readable_zip_is_a_named_refusal(tmp_path, monkeypatch, damage):
    import repro.installset.build as build

    (tmp_path / "w").mkdir()
    fake = make_wheel(tmp_path / "w", "tinypkg", "1.0", {"tinypkg/__init__.py": b"#\n"})
    damaged = damage(fake.read_bytes())
    assert damaged != fake.read_bytes()
    fake.write_bytes(damaged)
    monkeypatch.setattr(build, "unpacked_bytes", lambda wheels: 0)  # a sender's own packer
    with pytest.raises(UnsafeArchive, match="not a readable wheel"):
        install(_crafted_set(tmp_path, [fake]), tmp_path / "target")


def test_a_manifest_wheel_hash_that_lies_is_refused_by_name(tmp_path, tiny_wheels):
    parts = _crafted_set(tmp_path, tiny_wheels)
    doc = json.loads((parts / MANIFEST_NAME).read_text())
    doc["wheels"][1]["sha256"] = "1" * 64  # parts and stream still agree
    (parts / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(PartsInvalid, match=r"tinydep-2.0-py3-none-any.whl: sha256 expected 1{64}"):
        install(parts, tmp_path / "target")
    assert not (tmp_path / "target").exists()


def test_replace_never_deletes_a_folder_the_installer_did_not_write(set_copy, tmp_path):
    target = tmp_path / "home"
    target.mkdir()
    (target / "thesis.tex").write_text("years of work\n")
    with pytest.raises(InstallSetError, match=r"has no \.repro-installset\.json.*will not delete"):
        install(set_copy, target, replace=True)
    assert (target / "thesis.tex").read_text() == "years of work\n"
    install(set_copy, tmp_path / "site")  # an install the kit made is replaced, but for
    (tmp_path / "site" / "mine.py").write_text("")  # what the user added (kept, and named)
    assert install(set_copy, tmp_path / "site", replace=True).kept == ("mine.py",)
    assert (tmp_path / "site" / "mine.py").exists()


def test_a_set_for_another_python_is_refused_before_anything_is_written(set_copy, tmp_path):
    doc = json.loads((set_copy / MANIFEST_NAME).read_text())
    doc["python"] = {"version": "3.9", "tag": "cp39"}
    (set_copy / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(InstallSetError, match="built for Python 3.9; this installer runs on"):
        install(set_copy, tmp_path / "target")
    assert not (tmp_path / "target").exists()


# --- downloading: real pip, an index stood in by files served on loopback --------------------


@pytest.fixture(scope="module")
def served(tiny_wheels):
    with serve_folder(tiny_wheels[0].parent) as url:
        yield url


def _as_locked(wheel: Path, base: str, sha: str | None = None) -> Locked:
    name, version = wheel.name.split("-")[:2]
    sha = sha or hashlib.sha256(wheel.read_bytes()).hexdigest()
    return Locked(name, version, (LockedWheel(f"{base}/{wheel.name}", sha, None),))


def test_download_takes_each_wheel_by_url_and_sha256(served, tiny_wheels, tmp_path):
    got = download([_as_locked(w, served) for w in tiny_wheels], tmp_path / "dl", TARGET)
    assert [w.filename for w in got] == [w.name for w in tiny_wheels]
    for record, original in zip(got, tiny_wheels, strict=True):
        assert record.path.read_bytes() == original.read_bytes()
        assert record.url == f"{served}/{original.name}"
    with pytest.raises(InstallSetError, match="(?i)hash"):
        download([_as_locked(tiny_wheels[0], served, "2" * 64)], tmp_path / "bad", TARGET)
