"""`python -m repro.installset verify|install` on bad input: a refusal, never a traceback.

Each case runs the real command on a real install set (tests/test_installset.py builds it) and
checks the exit code (1: a check failed, a damaged or forged set or install; 2: bad input), the
first line of the message, and that every file that existed before is byte-identical after
(for ``--replace``: every file the user added). The manifest's schema check, which the host runs
without jsonschema, is held to jsonschema's answers on generated manifests.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_installset import (
    PART_SIZE,
    ROOT,
    TARGET,
    set_copy,  # noqa: F401 (a fixture)
    tiny_set,  # noqa: F401 (a fixture)
    tiny_wheels,  # noqa: F401 (a fixture)
    wheel_of,
)

from repro.artifact import load_schema
from repro.installset.build import pack_set
from repro.installset.install import MANIFEST_NAME, MARKER_NAME
from repro.installset.schemacheck import violations

REPO = Path(__file__).resolve().parents[1]


def snapshot(root: Path) -> dict[str, object]:
    """Every file, link and folder under ``root``: its bytes, its link text, or "folder"."""
    seen: dict[str, object] = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(here, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                seen[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                seen[rel] = "folder"
            elif path.is_file():
                seen[rel] = path.read_bytes()
            else:
                seen[rel] = "special"
    return seen


def cli(*args: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("REPRO_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "repro.installset", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def refused(code: int, first_line: str, *args: object, untouched: Path) -> str:
    """Run the command; check its exit code, that ``first_line`` is in the first line of what
    it says and that nothing under ``untouched`` changed. Returns stderr."""
    before = snapshot(untouched)
    result = cli(*args)
    # Progress lines ("[installset] …") come first; the message is the rest.
    said = [line for line in result.stderr.splitlines() if not line.startswith("[installset]")]
    first = said[0] if said else ""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, result.stderr
    assert first.startswith("error: ") and first_line in first, result.stderr
    assert snapshot(untouched) == before, "a file that was there changed"
    return "\n".join(said)


def edit_manifest(parts: Path, change) -> None:
    doc = json.loads((parts / MANIFEST_NAME).read_text())
    change(doc)
    (parts / MANIFEST_NAME).write_text(json.dumps(doc, indent=2))


def _installed(set_copy: Path, tmp_path: Path) -> Path:  # noqa: F811
    target = tmp_path / "site"
    done = cli("install", "--parts", set_copy, "--target", target)
    assert done.returncode == 0, done.stderr
    return target


# --- verify: the manifest, checked in full ---------------------------------------------------


@pytest.mark.parametrize(
    "change, first_line",
    [
        (lambda d: d.update(signed_by="me"), "$.signed_by: unknown field"),
        (lambda d: d["wheels"][0].update(extra=1), "$.wheels[0].extra: unknown field"),
        (lambda d: d["stream"].update({"a b": 1}), '$.stream["a b"]: unknown field'),
        (lambda d: d.pop("created"), "$.created: required field missing"),
        (lambda d: d.update(part_size="8KiB"), '$.part_size: expected an integer, found "8KiB"'),
        (lambda d: d.update(part_size=8192.0), "$.part_size: expected an integer, found 8192.0"),
        (
            lambda d: d["wheels"][0].update(bytes=True),
            "$.wheels[0].bytes: expected an integer, found true",
        ),
        (lambda d: d.update(platforms=[]), "$.platforms: empty; expected at least 1 item(s)"),
        (lambda d: d["python"].update(tag="cp27"), '$.python.tag: "cp27" does not match'),
        (lambda d: d.update(format_version=1), "$.format_version: this installer reads 2"),
        (
            lambda d: d.update(format="zip"),
            'expected a repro-install-set manifest, found format "zip"',
        ),
        (
            lambda d: d["parts"][0].update(name="../../etc/passwd"),
            "$.parts[0].name: expected a plain file name: no folder, no '..'",
        ),
        (
            lambda d: d.update(part_size=PART_SIZE * 2),
            "$.parts[0].bytes: 8192, expected $.part_size",
        ),
        (
            lambda d: d["wheels"][1].update(version="2.1"),
            '$.wheels[1].version: "2.1", but its file tinydep-2.0-py3-none-any.whl is 2.0',
        ),
        (
            lambda d: d["wheels"][1].update(name="otherdep"),
            '$.wheels[1].name: "otherdep", but its file tinydep-2.0-py3-none-any.whl is tinydep',
        ),
        (
            lambda d: d["root"].update(version="1.1"),
            "$.root: tinypkg 1.1, but the first wheel is tinypkg 1.0",
        ),
    ],
    ids=[
        "unknown-field",
        "unknown-nested-field",
        "unknown-odd-field",
        "missing-field",
        "part-size-text",
        "part-size-float",
        "bytes-bool",
        "no-platforms",
        "python-tag",
        "format-version",
        "not-a-set",
        "part-name-escapes",
        "part-size-lies",
        "wheel-version-edited",
        "wheel-name-edited",
        "root-version-edited",
    ],
)
def test_verify_refuses_a_manifest_the_kit_did_not_write(set_copy, change, first_line):  # noqa: F811
    edit_manifest(set_copy, change)
    path = set_copy / MANIFEST_NAME
    refused(
        1,
        f"{path} is not a manifest the kit wrote: {first_line}",
        "verify",
        "--parts",
        set_copy,
        untouched=set_copy.parent,
    )


def test_verify_refuses_part_size_nan(set_copy):  # noqa: F811
    text = (set_copy / MANIFEST_NAME).read_text()
    text = text.replace(f'"part_size": {PART_SIZE}', '"part_size": NaN')
    (set_copy / MANIFEST_NAME).write_text(text)
    stderr = refused(
        1, str(set_copy / MANIFEST_NAME), "verify", "--parts", set_copy, untouched=set_copy.parent
    )
    assert "NaN" in stderr.splitlines()[0]


def test_verify_refuses_duplicate_keys(set_copy):  # noqa: F811
    text = (set_copy / MANIFEST_NAME).read_text()
    (set_copy / MANIFEST_NAME).write_text(text.replace("{", '{"part_size": "x", ', 1))
    refused(
        1, str(set_copy / MANIFEST_NAME), "verify", "--parts", set_copy, untouched=set_copy.parent
    )


@pytest.mark.parametrize(
    "content, first_line",
    [
        (b"[" * 100_000, "JSON nested deeper than can be read"),
        (b'{"format": "\xff"}', "not UTF-8 text"),
        (b'{"format": ', "not JSON"),
        (b"[]", "expected a repro-install-set manifest, found an array"),
    ],
    ids=["deep", "not-utf8", "truncated", "a-list"],
)
def test_verify_refuses_a_manifest_that_is_not_one(set_copy, content, first_line):  # noqa: F811
    (set_copy / MANIFEST_NAME).write_bytes(content)
    path = set_copy / MANIFEST_NAME
    said = refused(
        1,
        f"{path} is not a manifest the kit wrote: ",
        "verify",
        "--parts",
        set_copy,
        untouched=set_copy.parent,
    )
    assert first_line in said.splitlines()[0]


def test_verify_reads_each_wheels_metadata(set_copy):  # noqa: F811
    """A version edited in the file name too: only the wheel's own METADATA tells."""

    def rename(doc):
        doc["wheels"][1].update(version="2.1", filename="tinydep-2.1-py3-none-any.whl")

    edit_manifest(set_copy, rename)
    refused(
        1,
        "$.wheels[1]: tinydep 2.1, but the METADATA of tinydep-2.1-py3-none-any.whl "
        "says tinydep 2.0",
        "verify",
        "--parts",
        set_copy,
        untouched=set_copy.parent,
    )


# --- verify: SHA256SUMS, parts and paths -----------------------------------------------------


def _sums(parts: Path) -> list[str]:
    return (parts / "SHA256SUMS").read_text().splitlines()


@pytest.mark.parametrize(
    "change, first_line",
    [
        (
            lambda lines: ["0" * 64 + lines[0][64:], *lines[1:]],
            "SHA256SUMS: {part} has sha256 0000000000000000000000000000000000000000000000000000"
            "000000000000; the manifest says ",
        ),
        (lambda lines: lines[1:], "SHA256SUMS does not list the part {part}"),
        (
            lambda lines: [*lines, "1" * 64 + "  extra.bin"],
            'SHA256SUMS lists "extra.bin", not a part of the manifest',
        ),
        (lambda lines: [*lines, "nonsense"], 'SHA256SUMS line 7: "nonsense" is not SHA256  NAME'),
        (lambda lines: [*lines, lines[0]], 'SHA256SUMS line 7: "{part}" is listed twice'),
        (None, "SHA256SUMS: missing (the build writes it beside manifest.json)"),
    ],
    ids=["wrong-hash", "part-left-out", "extra-file", "bad-line", "twice", "missing"],
)
def test_verify_compares_sha256sums(set_copy, change, first_line):  # noqa: F811
    part = json.loads((set_copy / MANIFEST_NAME).read_text())["parts"][0]["name"]
    if change is None:
        (set_copy / "SHA256SUMS").unlink()
    else:
        (set_copy / "SHA256SUMS").write_text("\n".join(change(_sums(set_copy))) + "\n")
    refused(
        1,
        f"refusing the install set in {set_copy}: {first_line.format(part=part)}",
        "verify",
        "--parts",
        set_copy,
        untouched=set_copy.parent,
    )


def test_sha256sums_that_agree_with_a_replaced_part_say_so(set_copy):  # noqa: F811
    import hashlib

    manifest = json.loads((set_copy / MANIFEST_NAME).read_text())
    part = set_copy / manifest["parts"][0]["name"]
    part.write_bytes(b"\0" * PART_SIZE)
    sha = hashlib.sha256(part.read_bytes()).hexdigest()
    lines = _sums(set_copy)
    (set_copy / "SHA256SUMS").write_text("\n".join([f"{sha}  {part.name}", *lines[1:]]) + "\n")
    stderr = refused(
        1, f"{part.name}: corrupted", "verify", "--parts", set_copy, untouched=set_copy.parent
    )
    assert f"{part.name} has sha256 {sha} (as the file is); the manifest says" in stderr


def test_verify_refuses_paths_that_are_not_a_set(set_copy, tmp_path):  # noqa: F811
    file = tmp_path / "a-file"
    file.write_text("x")
    refused(
        2, f"--parts {file} is a file, not a folder", "verify", "--parts", file, untouched=tmp_path
    )
    refused(
        2,
        f"--parts {tmp_path / 'nowhere'}: no such folder",
        "verify",
        "--parts",
        tmp_path / "nowhere",
        untouched=tmp_path,
    )
    (set_copy / MANIFEST_NAME).unlink()
    (set_copy / MANIFEST_NAME).mkdir()
    refused(
        2,
        f"{set_copy / MANIFEST_NAME}: a directory, not a file",
        "verify",
        "--parts",
        set_copy,
        untouched=tmp_path,
    )
    (set_copy / MANIFEST_NAME).rmdir()
    os.mkfifo(set_copy / MANIFEST_NAME)  # reading it would wait for ever
    refused(
        2,
        f"{set_copy / MANIFEST_NAME}: not a regular file",
        "verify",
        "--parts",
        set_copy,
        untouched=tmp_path,
    )
    (set_copy / MANIFEST_NAME).unlink()
    refused(
        2, f"{set_copy / MANIFEST_NAME}: missing", "verify", "--parts", set_copy, untouched=tmp_path
    )


def test_a_part_that_is_a_folder_is_named(set_copy):  # noqa: F811
    manifest = json.loads((set_copy / MANIFEST_NAME).read_text())
    part = set_copy / manifest["parts"][2]["name"]
    part.unlink()
    part.mkdir()
    refused(
        1,
        f"part 3/6 {part.name}: not a file",
        "verify",
        "--parts",
        set_copy,
        untouched=set_copy.parent,
    )


# --- install: the target ---------------------------------------------------------------------


def test_install_refuses_a_target_it_cannot_write(set_copy, tmp_path):  # noqa: F811
    refused(
        2,
        "--target /proc/self/t: cannot create folders in /proc/self",
        "install",
        "--parts",
        set_copy,
        "--target",
        "/proc/self/t",
        untouched=tmp_path,
    )
    if Path("/sys").is_dir():  # a read-only file system, for root too
        refused(
            2,
            "--target /sys/repro-t: cannot create folders in /sys",
            "install",
            "--parts",
            set_copy,
            "--target",
            "/sys/repro-t",
            untouched=tmp_path,
        )
    file = tmp_path / "notes.txt"
    file.write_text("mine\n")
    refused(
        2,
        f"--target {file} exists and is not a folder",
        "install",
        "--parts",
        set_copy,
        "--target",
        file,
        untouched=tmp_path,
    )
    refused(
        2,
        f"--target {file}/deeper/t: {file} is a file, not a folder",
        "install",
        "--parts",
        set_copy,
        "--target",
        file / "deeper" / "t",
        untouched=tmp_path,
    )
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    refused(
        2,
        f"--target {tmp_path / 'link'} is a symbolic link",
        "install",
        "--parts",
        set_copy,
        "--target",
        tmp_path / "link",
        untouched=tmp_path,
    )


def test_an_empty_path_is_refused_not_taken_for_the_current_folder(tmp_path):
    for args in (("verify", "--parts", ""), ("install", "--parts", tmp_path, "--target", " ")):
        before = snapshot(tmp_path)
        result = cli(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.splitlines()[-1].endswith(": empty; name a folder")
        assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a folder without write permission")
def test_install_refuses_a_folder_without_write_permission(set_copy, tmp_path):  # noqa: F811
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    refused(
        2,
        f"cannot create folders in {locked} (Permission denied)",
        "install",
        "--parts",
        set_copy,
        "--target",
        locked / "t",
        untouched=tmp_path,
    )


def test_install_refuses_a_folder_it_did_not_install(set_copy, tmp_path):  # noqa: F811
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work\n")
    for replace in ((), ("--replace",)):
        refused(
            2,
            f"--target {home} is not empty and has no {MARKER_NAME}",
            "install",
            "--parts",
            set_copy,
            "--target",
            home,
            *replace,
            untouched=tmp_path,
        )


def test_install_refuses_another_python(set_copy, tmp_path):  # noqa: F811
    edit_manifest(set_copy, lambda d: d.update(python={"version": "3.9", "tag": "cp39"}))
    refused(
        2,
        "the set was built for Python 3.9; this installer runs on",
        "install",
        "--parts",
        set_copy,
        "--target",
        tmp_path / "t",
        untouched=tmp_path,
    )


def test_install_refuses_a_forged_set_before_making_anything(set_copy, tmp_path):  # noqa: F811
    edit_manifest(set_copy, lambda d: d["wheels"][1].update(version="2.1"))
    refused(
        1,
        "$.wheels[1].version",
        "install",
        "--parts",
        set_copy,
        "--target",
        tmp_path / "new" / "t",
        untouched=tmp_path,
    )


# --- install: a target this kit installed ----------------------------------------------------


def test_a_deleted_package_folder_is_not_done(set_copy, tmp_path):  # noqa: F811
    import shutil

    target = _installed(set_copy, tmp_path)
    again = cli("install", "--parts", set_copy, "--target", target)
    assert again.returncode == 0 and "already holds this install set, all" in again.stderr
    shutil.rmtree(target / "tinydep")
    stderr = refused(
        1,
        f"{target} holds this install set's marker, but 2 of its",
        "install",
        "--parts",
        set_copy,
        "--target",
        target,
        untouched=tmp_path,
    )
    assert "tinydep/__init__.py (missing)" in stderr.splitlines()[0]
    assert "Install it again with --replace" in stderr.splitlines()[0]
    assert cli("install", "--parts", set_copy, "--target", target, "--replace").returncode == 0
    assert (target / "tinydep" / "__init__.py").read_bytes() == b"ANSWER = 42\n"


def test_a_changed_installed_file_is_not_done(set_copy, tmp_path):  # noqa: F811
    target = _installed(set_copy, tmp_path)
    (target / "tinypkg" / "__init__.py").write_text("import os; os.system('x')\n")
    refused(
        1,
        "1 of its 15 file(s) are missing or changed: tinypkg/__init__.py (changed)",
        "install",
        "--parts",
        set_copy,
        "--target",
        target,
        untouched=tmp_path,
    )


def test_replace_keeps_and_names_what_the_user_added(set_copy, tmp_path):  # noqa: F811
    target = _installed(set_copy, tmp_path)
    mine = {
        "notes.txt": b"my notes\n",
        "tinypkg/local_patch.py": b"PATCHED = True\n",
        "experiments/run1/out.json": b"{}\n",
    }
    for rel, data in mine.items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_bytes(data)
    (target / "empty-folder").mkdir()
    cache = target / "tinypkg" / "__pycache__" / "__init__.cpython-311.pyc"
    cache.parent.mkdir()
    cache.write_bytes(b"byte code of a listed module goes with it")
    (target / "tinydep" / "__init__.py").unlink()  # a damaged install is replaced
    result = cli("install", "--parts", set_copy, "--target", target, "--replace")
    assert result.returncode == 0, result.stderr
    for rel, data in mine.items():
        assert (target / rel).read_bytes() == data, rel
    assert (target / "empty-folder").is_dir() and not cache.exists()
    assert (target / "tinydep" / "__init__.py").is_file()
    kept = "kept 4 file(s) you added in"
    assert f"{kept} {target}: empty-folder, experiments/run1/out.json, notes.txt, " in result.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no leftovers"
    marker = json.loads((target / MARKER_NAME).read_text())
    assert "notes.txt" not in marker["files"] and "tinydep/__init__.py" in marker["files"]


def test_replace_refuses_a_file_of_the_users_where_the_new_install_writes(set_copy, tmp_path):  # noqa: F811
    target = _installed(set_copy, tmp_path)
    marker = json.loads((target / MARKER_NAME).read_text())
    del marker["files"]["tinydep/__init__.py"]  # an older set, without that file
    marker["manifest_sha256"] = "0" * 64
    (target / MARKER_NAME).write_text(json.dumps(marker))
    refused(
        2,
        "file(s) you added sit where the new install writes: tinydep/__init__.py",
        "install",
        "--parts",
        set_copy,
        "--target",
        target,
        "--replace",
        untouched=tmp_path,
    )


@pytest.mark.parametrize(
    "change, code, first_line",
    [
        (lambda m: m.pop("files"), 2, "was written by an older kit"),
        (
            lambda m: m["files"].update({"../outside.txt": {"bytes": 1, "sha256": "0" * 64}}),
            2,
            "lists files that are not plain paths inside it",
        ),
        (lambda m: m.update(format="something"), 2, "is not a marker the kit wrote"),
    ],
    ids=["older-kit", "forged-path", "not-a-marker"],
)
def test_replace_trusts_no_marker_it_cannot_read(set_copy, tmp_path, change, code, first_line):  # noqa: F811
    target = _installed(set_copy, tmp_path)
    (tmp_path / "outside.txt").write_text("x")
    marker = json.loads((target / MARKER_NAME).read_text())
    change(marker)
    (target / MARKER_NAME).write_text(json.dumps(marker))
    refused(
        code,
        first_line,
        "install",
        "--parts",
        set_copy,
        "--target",
        target,
        "--replace",
        untouched=tmp_path,
    )


def test_an_older_kits_install_of_this_set_is_not_called_done(set_copy, tmp_path):  # noqa: F811
    target = _installed(set_copy, tmp_path)
    marker = json.loads((target / MARKER_NAME).read_text())
    del marker["files"]
    (target / MARKER_NAME).write_text(json.dumps(marker))
    refused(
        1,
        "holds this install set, but its .repro-installset.json was written by an older kit",
        "install",
        "--parts",
        set_copy,
        "--target",
        target,
        untouched=tmp_path,
    )


def test_build_refuses_a_part_size_below_one_byte(tmp_path):
    refused(
        2,
        "--part-size '0.5': expected a size of at least one byte",
        "build",
        "--lock",
        tmp_path / "lock.json",
        "--out",
        tmp_path / "out",
        "--part-size",
        "0.5",
        untouched=tmp_path,
    )
    assert not (tmp_path / "out").exists()


# --- the schema check without jsonschema, against jsonschema ---------------------------------

# ECMA's "$" (the schema's) is the end of the text; jsonschema's Python "$" also matches before
# a final newline, which the host's check does not let through.
_NO_NEWLINE = st.characters(blacklist_characters="\n")
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 10**6)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer())
    | st.text(_NO_NEWLINE, max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(_NO_NEWLINE, max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*path, i))


@settings(max_examples=300)
@given(data=st.data())
def test_the_stdlib_check_answers_as_jsonschema_does(tiny_set, data):  # noqa: F811
    """Any one value of a real manifest replaced, removed or added: refused by the host's
    check exactly when jsonschema refuses it (whole numbers aside: 5.0 is not an integer)."""
    from jsonschema import Draft202012Validator

    schema = load_schema("install-set", 2)
    doc = json.loads((tiny_set / MANIFEST_NAME).read_text())
    path = data.draw(st.sampled_from(list(_paths(doc))[1:]))
    *above, last = path
    holder = doc
    for key in above:
        holder = holder[key]
    action = data.draw(st.sampled_from(["replace", "remove", "add"]))
    if action == "replace":
        holder[last] = data.draw(_JSON)
    elif action == "remove":
        holder.pop(last)
    elif isinstance(holder, dict):
        holder[data.draw(st.text(_NO_NEWLINE, max_size=6))] = data.draw(_JSON)
    else:
        holder.append(data.draw(_JSON))
    theirs = sorted(e.message for e in Draft202012Validator(schema).iter_errors(doc))
    ours = violations(doc, schema)
    assert bool(ours) == bool(theirs), (ours, theirs)


@pytest.mark.parametrize("value", [8192.0, math.nan, math.inf, True])
def test_the_stdlib_check_is_stricter_about_numbers(tiny_set, value):  # noqa: F811
    doc = json.loads((tiny_set / MANIFEST_NAME).read_text())
    doc["part_size"] = value
    assert violations(doc, load_schema("install-set", 2))


def test_a_set_built_here_passes_both(tiny_wheels, tmp_path):  # noqa: F811
    out = tmp_path / "set"
    manifest, _ = pack_set(
        [wheel_of(w) for w in tiny_wheels], out, TARGET, root=ROOT, part_size=PART_SIZE
    )
    assert violations(manifest, load_schema("install-set", 2)) == []
    assert cli("verify", "--parts", out).returncode == 0
