"""Fuzzing the kit's input readers and its command line (hypothesis).

Beside tests/test_fuzz_archives.py (archives), this module gives every reader of a text the
user or another lab supplies random and crafted input, and checks one property each: the
reader answers with a value or its own named refusal (a `ReproError`), never another
exception, and what it accepts is what it promises.

- `repro.core.jsonread`: any bytes; valid JSON round-trips; nesting around the 64-level bound;
  NaN/Infinity and duplicate keys spliced into valid documents; every kind of path (FIFO,
  device, directory, link loop, dangling link, oversize file);
- the conditions file (`repro.fanout.conditions.load`): TOML built from its keys, typos and
  every TOML value type;
- `--override` (`repro.profiles.parse_overrides`): what it accepts is strict JSON or a
  printable bare word;
- vLLM refs (`repro.containers.refs.parse_vllm_ref`): what it accepts is inert in a shell;
- connector specs (`repro.connectors.parse`), with PATH.py files of random Python;
- `--out` (`repro.core.output_paths.check_output`) over a tree of files, folders, links and FIFOs:
  it writes nothing, and what it allows is safe to write;
- the CLI (`python -m repro` in a subprocess) with random argv for validate, kit-digest,
  report, compare, verify, bundle, plan, releases and an unknown command: exit 0, 1 or 2,
  no traceback, and the evidence it was given byte-identical afterwards.

Cases per property (`max_examples`; a deeper run sets REPRO_FUZZ_SCALE, e.g. 10):
jsonread bytes 400, jsonread round-trip 300, jsonread depth 60, jsonread spliced 200,
jsonread paths 60, conditions 200, overrides 300, vLLM refs 400, release spellings 100,
connector specs 200, connector files 30, --out 200, CLI 24 (2,474 in all). Each property's
count of cases and outcomes is printed at the end of the module (run with ``-s`` to see them).

The tests at the end pin the defects it found (and that were fixed), one each.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro import connectors
from repro.containers.refs import InvalidRef, parse_vllm_ref
from repro.core.errors import ReproError
from repro.core.jsonread import MAX_DEPTH, JSONUnreadable, parse_json_bytes, read_json
from repro.core.output_paths import UnsafeOutput, check_output
from repro.fanout import conditions
from repro.profiles import parse_overrides

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "runs"
SCALE = float(os.environ.get("REPRO_FUZZ_SCALE", "1"))
STATS: dict[str, collections.Counter] = {}


def fuzz(cases: int):
    return settings(
        max_examples=max(1, int(cases * SCALE)),
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )


def _record(prop: str, outcome: str) -> None:
    STATS.setdefault(prop, collections.Counter())[outcome] += 1


def _kind(text: str) -> str:
    """A refusal's kind: its first words without names, numbers and quoted values."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"|/\S+|\d+", "", str(text).split("\n")[0])
    return " ".join(text.split()[:6])


@pytest.fixture(scope="module", autouse=True)
def counted():
    yield
    for prop, outcomes in STATS.items():
        shown = ", ".join(f"{n} × {k}" for k, n in outcomes.most_common(6))
        print(f"\n[fuzz] {prop}: {sum(outcomes.values())} cases; outcomes: {shown}")


# --- jsonread ------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
# Bytes that are near JSON: valid documents with pieces of JSON syntax and odd bytes spliced in.
JSON_PIECES = [
    b"[",
    b"]",
    b"{",
    b"}",
    b'"',
    b"\\",
    b",",
    b":",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e310",
    b"-0",
    b"1" * 5000,
    b'"\\ud800"',
    b"\x00",
    b"\xff",
    b"\xef\xbb\xbf",
    b"\xff\xfe",
    b"\xed\xa0\x80",
    b"\xc3",
    b"true",
    b"null",
    b" ",
    b"\n",
    b'{"a":1,"a":2}',
    b"[" * 70,
]
near_json = st.builds(
    lambda value, pieces, at: _splice(json.dumps(value).encode(), pieces, at),
    json_values,
    st.lists(st.sampled_from(JSON_PIECES), max_size=4),
    st.integers(0, 1 << 16),
)


def _splice(doc: bytes, pieces: list[bytes], at: int) -> bytes:
    for piece in pieces:
        cut = at % (len(doc) + 1)
        doc = doc[:cut] + piece + doc[cut:]
    return doc


def _parses(data: bytes) -> bool:
    try:
        parse_json_bytes(data, "case.json")
    except JSONUnreadable:
        return False
    return True


def _parse(data: bytes, prop: str):
    try:
        value = parse_json_bytes(data, "case.json")
    except JSONUnreadable as exc:
        assert str(exc).startswith("case.json: "), exc  # the refusal names the file
        _record(prop, _kind(str(exc).removeprefix("case.json: ")))
        return None, False
    _record(prop, "accepted")
    return value, True


@fuzz(400)
@given(data=st.one_of(st.binary(max_size=200), near_json))
def test_jsonread_answers_any_bytes_with_a_value_or_a_named_refusal(data):
    value, accepted = _parse(data, "jsonread bytes")
    if accepted:
        # Never more lenient than the standard library, and what it accepts is strict JSON
        # that writes back out as UTF-8.
        assert value == json.loads(data)
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")


@fuzz(300)
@given(value=json_values, ascii_only=st.booleans(), indent=st.sampled_from([None, 1, 2]))
def test_jsonread_reads_back_every_valid_document(value, ascii_only, indent):
    data = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode("utf-8")
    read, accepted = _parse(data, "jsonread round-trip")
    assert accepted and read == value


@fuzz(60)
@given(
    depth=st.integers(0, 3 * MAX_DEPTH) | st.integers(10_000, 200_000),
    opener=st.sampled_from(["[", '{"k":']),
    closed=st.booleans(),
)
def test_jsonread_bounds_nesting_without_recursion_error(depth, opener, closed):
    closer = "]" if opener == "[" else "}"
    text = opener * depth + "1" + (closer * depth if closed else "")
    value, accepted = _parse(text.encode(), "jsonread depth")
    assert accepted == ((closed or depth == 0) and depth <= MAX_DEPTH)
    if not accepted:
        with pytest.raises(JSONUnreadable, match="nested deeper|not JSON"):
            parse_json_bytes(text.encode(), "case.json")


@fuzz(200)
@given(
    value=st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=4),
    flaw=st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "dup", "9" * 4301]),
)
def test_jsonread_refuses_what_python_json_would_let_through(value, flaw):
    key = next(iter(value))
    text = json.dumps(value)
    if flaw == "dup":
        text = text[:-1] + ", " + json.dumps(key) + ": 0}"
        found = "twice in one object"
    else:
        text = text[:-1] + ', "flaw": ' + flaw + "}"
        found = "not a JSON number|beyond a float|digits"
    if key == "flaw" and flaw != "dup":
        found += "|twice"
    with pytest.raises(JSONUnreadable, match=found):
        parse_json_bytes(text.encode(), "case.json")
    _record("jsonread spliced", flaw if flaw != "9" * 4301 else "long integer")


PATH_KINDS = ["file", "dir", "fifo", "loop", "dangling", "link-to-file", "dev", "missing", "big"]


@fuzz(60)
@given(kind=st.sampled_from(PATH_KINDS), content=st.binary(max_size=64) | near_json)
def test_jsonread_names_every_kind_of_path_and_never_blocks(tmp_path_factory, kind, content):
    work = tmp_path_factory.mktemp("jsonread-path")
    path = work / "case.json"
    if kind in ("file", "link-to-file", "big"):
        target = work / "target.json"
        target.write_bytes(content)
        if kind == "big":
            os.truncate(target, 33 << 20)  # past MAX_BYTES, without writing it
        if kind == "link-to-file":
            path.symlink_to(target)
        else:
            target.rename(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # a reader that opened it without O_NONBLOCK would hang here
    elif kind == "loop":
        path.symlink_to(work / "other.json")
        (work / "other.json").symlink_to(path)
    elif kind == "dangling":
        path.symlink_to(work / "nowhere.json")
    elif kind == "dev":
        path = Path("/dev/null")
    try:
        read_json(path)
        outcome = "accepted"
    except JSONUnreadable as exc:
        assert str(exc).startswith(f"{path}: "), exc
        outcome = _kind(str(exc).removeprefix(f"{path}: "))
    if kind in ("file", "link-to-file"):  # a file reads as its bytes parse
        assert (outcome == "accepted") == _parses(content)
    else:
        assert outcome != "accepted"
    _record("jsonread paths", f"{kind}: {outcome}")


# --- the conditions file -------------------------------------------------------------------

toml_keys = st.sampled_from([*conditions.KEYS, "nmae", "overide", "vllm_version", "Name"])
toml_values = st.sampled_from(
    [
        '"tiny"',
        '"0.32.0"',
        '"a b"',
        '""',
        '"x;y"',
        '"\\u0000"',
        "1",
        "-1",
        "1.5",
        "nan",
        "inf",
        "true",
        "1979-05-27",
        "1979-05-27T07:32:00Z",
        "07:32:00",
        '["tiny"]',
        "[1, 2]",
        '["cold-race"]',
        '["nope"]',
        "[]",
        "{}",
        "{ async_scheduling = false }",
        "{ seed = 1979-05-27 }",
        "{ x = [1, { y = 2 }] }",
        '"probe"',
        '"a.b:C"',
        '"x.py:C"',
        '["../missing.diff"]',
        "{ size = 2 }",
        "[" * 40 + "]" * 40,
        '"multi-turn"',
    ]
)
toml_lines = st.tuples(toml_keys, toml_values).map(lambda kv: f"{kv[0]} = {kv[1]}")
toml_tables = st.lists(toml_lines, max_size=6, unique_by=lambda line: line.split(" =")[0]).map(
    lambda ls: "\n".join(["[[condition]]", *ls])
)
toml_texts = st.lists(toml_tables, min_size=0, max_size=3).map("\n\n".join)
RAW_TAILS = [b"", b"\xff\xfe", b"\x00", b"[condition]\n", b"x = 1\n", b"[[condition]\n", b"\xc3"]


@fuzz(200)
@given(text=toml_texts, tail=st.sampled_from(RAW_TAILS), where=st.integers(0, 400))
def test_a_conditions_file_is_read_or_refused_by_line(tmp_path_factory, text, tail, where):
    data = text.encode()
    data = data[: where % (len(data) + 1)] + tail + data[where % (len(data) + 1) :]
    path = tmp_path_factory.mktemp("conditions") / "c.toml"
    path.write_bytes(data)
    try:
        items = conditions.load(path)
    except conditions.ConditionsFileError as exc:
        _record("conditions", _kind(str(exc).removeprefix(str(path))))
        return
    for item in items:
        if isinstance(item, conditions.BadCondition):
            assert item.problem.startswith("line "), item.problem  # docs/matrix.md's promise
        else:
            assert item.as_record()["content_hash"]
    bad = sum(isinstance(item, conditions.BadCondition) for item in items)
    _record("conditions", f"read, {bad} of {len(items)} bad")


# --- --override ----------------------------------------------------------------------------

override_values = st.one_of(
    st.text(max_size=20),
    json_values.map(json.dumps),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "[" * 2000, "{bad", "bfloat16"]),
    st.binary(max_size=10).map(lambda b: b.decode("utf-8", "surrogateescape")),  # as argv has it
)


@fuzz(300)
@given(
    key=st.one_of(
        st.sampled_from(["max_num_seqs", "dtype", "seed", "enable_prefix_cachng"]),
        st.sampled_from(["max_num_seqs", "dtype", "seed", "enable_prefix_cachng"]),
        st.sampled_from(["model", "1x", "", "a-b", "x y"]),
        st.text(max_size=8),
    ),
    sep=st.sampled_from(["=", "=", "=", "=", ":", ""]),
    value=override_values,
)
def test_overrides_are_strict_json_or_a_printable_word(key, sep, value):
    item = key + sep + value
    try:
        parsed = parse_overrides([item])
    except ReproError as exc:
        _record("overrides", _kind(exc))
        return
    _record("overrides", "accepted")
    given_key, _, raw = item.partition("=")
    ((name, setting),) = parsed.items()
    assert name == given_key and name.isidentifier() and name != "model"
    json.dumps(setting, allow_nan=False).encode("utf-8")  # strict JSON, writable as UTF-8
    if setting == raw:  # taken as a bare word, not as JSON
        assert raw.isprintable()


# --- vLLM refs -----------------------------------------------------------------------------

releases = st.builds(
    lambda parts, pre: ".".join(map(str, parts)) + pre,
    st.lists(st.integers(0, 99), min_size=2, max_size=4),
    st.sampled_from(["", "rc1", "a2", "b3", ".post1", ".dev0", "rc1.post2.dev3"]),
)
ref_text = st.one_of(
    releases,
    st.text(alphabet="0123456789abcdefABCDEF", min_size=6, max_size=44),
    st.text(alphabet="abcXYZ019._/-;$` \n~^:", max_size=24),
    st.text(max_size=16),
)


@fuzz(400)
@given(ref=ref_text, allow_branch=st.booleans())
def test_a_vllm_ref_is_accepted_only_when_inert_in_a_shell(ref, allow_branch):
    try:
        parsed = parse_vllm_ref(ref, allow_branch=allow_branch)
    except InvalidRef as exc:
        assert repr(ref) in str(exc) or "must be a string" in str(exc)
        _record("vLLM refs", "refused")
        return
    _record("vLLM refs", parsed.kind)
    assert parsed.value == ref
    assert re.fullmatch(r"[A-Za-z0-9._/-]+", ref) and not ref.startswith("-") and ".." not in ref
    assert allow_branch or parsed.kind != "branch"


@fuzz(100)
@given(ref=releases)
def test_every_release_spelling_is_a_release(ref):
    assert parse_vllm_ref(ref).kind == "release"
    _record("vLLM refs", "release spelling")


# --- connector specs -----------------------------------------------------------------------

connector_specs = st.one_of(
    st.sampled_from([*connectors.NAMES, "probe:X", "none:", ":", "a.b:C", "a..b:C", "1a:C"]),
    st.builds(
        lambda module, cls: f"{module}:{cls}",
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,10}", fullmatch=True) | st.text(max_size=6),
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True) | st.text(max_size=4),
    ),
    st.text(max_size=16),
)
config_texts = st.none() | override_values


@fuzz(200)
@given(spec=st.none() | connector_specs, config=config_texts)
def test_a_connector_spec_is_parsed_or_refused_by_name(spec, config):
    try:
        parsed = connectors.parse(spec, config)
    except connectors.ConnectorRefused as exc:
        assert "--connector" in str(exc)
        _record("connector specs", _kind(exc))
        return
    _record("connector specs", parsed.kind if parsed else "none")
    if parsed is not None:
        json.dumps(parsed.engine_settings(), allow_nan=False)


PYTHON_BODIES = st.one_of(
    st.sampled_from(
        [
            "class C:\n    pass\n",
            "class D: pass\n",
            "-" * 100_000 + "1\n",
            "x = " + "+".join(["1"] * 100_000) + "\n",
            "(" * 300 + ")" * 300 + "\n",
            "[" * 100_000,
            "class C(\n",
        ]
    ),
    st.text(max_size=40),
).map(str.encode) | st.binary(max_size=40)


@fuzz(30)
@given(body=PYTHON_BODIES, cls=st.sampled_from(["C", "D", "c"]))
def test_a_connector_file_of_any_content_is_read_or_refused(tmp_path_factory, body, cls):
    path = tmp_path_factory.mktemp("connector") / "my_connector.py"
    path.write_bytes(body)
    try:
        parsed = connectors.parse(f"{path}:{cls}")
    except connectors.ConnectorRefused as exc:
        _record("connector files", _kind(str(exc).replace(str(path), "")))
        return
    assert parsed.cls == cls and parsed.file == str(path.resolve())
    _record("connector files", "accepted")


# --- --out ---------------------------------------------------------------------------------

OUT_PARTS = [
    "run",
    "run/cold-race.json",
    "notes.txt",
    "folder",
    "fifo",
    "link",
    "new.md",
    "..",
    ".",
]
out_names = st.one_of(
    st.lists(st.sampled_from([*OUT_PARTS, "missing", "x.md"]), min_size=1, max_size=3).map(
        "/".join
    ),
    st.sampled_from(["", " ", "/", "/proc/self/x", "/dev/null", "run/", "./notes.txt"]),
)


def _snapshot(root: Path) -> dict[str, bytes | str]:
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path)] = "link:" + os.readlink(path)
        elif path.is_file():
            found[str(path)] = path.read_bytes()
        else:
            found[str(path)] = "dir" if path.is_dir() else "special"
    return found


@pytest.fixture(scope="module")
def out_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("out-tree")
    shutil.copytree(FIXTURES / "clean", root / "run")
    (root / "notes.txt").write_text("mine")
    (root / "folder").mkdir()
    os.mkfifo(root / "fifo")
    (root / "link").symlink_to(root / "notes.txt")
    return root


@fuzz(200)
@given(name=out_names, reads=st.lists(st.sampled_from(["run", "notes.txt"])), force=st.booleans())
def test_out_is_allowed_only_where_writing_loses_nothing(out_tree, name, reads, force):
    before = _snapshot(out_tree)
    out = Path(name) if name.startswith("/") or not name.strip() else out_tree / name
    inputs = [out_tree / r for r in reads]
    try:
        target = check_output(out, reads=inputs, force=force)
    except UnsafeOutput as exc:
        assert "--out" in str(exc)
        _record("--out", _kind(str(exc).replace(str(out), "")))
        outcome = "refused"
    else:
        _record("--out", "allowed")
        outcome = "allowed"
        assert target.parent.is_dir() and not target.is_dir()
        if target.exists():
            assert force and target.is_file()
        for source in inputs:
            assert target != source.resolve() and source.resolve() not in target.parents
    assert _snapshot(out_tree) == before, f"check_output changed the tree ({outcome})"


# --- the command line ----------------------------------------------------------------------

COMMANDS = ["validate", "kit-digest", "report", "compare", "verify", "bundle", "plan", "releases"]


@pytest.fixture(scope="module")
def cli_tree(tmp_path_factory) -> Path:
    """Inputs for the CLI cases: good runs, damaged files and special paths."""
    root = tmp_path_factory.mktemp("cli-tree")
    for name in ("clean", "fault"):
        shutil.copytree(FIXTURES / name, root / name)
    (root / "deep.json").write_text("[" * 100_000)
    (root / "nan.json").write_text('{"a": NaN}')
    (root / "utf16.json").write_bytes('{"a": 1}'.encode("utf-16"))
    (root / "list.json").write_text("[1, 2]")
    (root / "notes.txt").write_text("mine")
    os.mkfifo(root / "fifo.json")
    (root / "loop.json").symlink_to(root / "loop2.json")
    (root / "loop2.json").symlink_to(root / "loop.json")
    (root / "empty").mkdir()
    return root


PATH_ARGS = [
    "clean",
    "fault",
    "clean/cold-race.json",
    "deep.json",
    "nan.json",
    "utf16.json",
    "list.json",
    "notes.txt",
    "fifo.json",
    "loop.json",
    "empty",
    "missing.json",
    "",
    "-",
    "\udcff",
    "é",
    "a" * 300,
]
OPTION_ARGS = [
    ["--out", "out.md"],
    ["--out", "out.tar.gz"],
    ["--out", "notes.txt"],
    ["--out", "empty"],
    ["--out", "clean/cold-race.json"],
    ["--out", "fifo.json"],
    ["--out", "missing/x"],
    ["--out", ""],
    ["--force"],
    ["--profile", "tiny"],
    ["--profile", "nope"],
    ["--profile", ""],
    ["--vllm", "x;y"],
    ["--vllm", "0.32.0"],
    ["--json"],
    ["--created", "yesterday"],
    ["--images", "empty"],
    ["--cache", "notes.txt"],
    ["--help"],
    ["-x"],
    ["--out"],
]
cli_args = st.tuples(
    st.lists(
        st.sampled_from(["clean", "fault", "clean/cold-race.json"]) | st.sampled_from(PATH_ARGS),
        min_size=1,
        max_size=2,
    ),
    st.lists(st.sampled_from(OPTION_ARGS), max_size=2),
).map(lambda parts: parts[0] + [arg for option in parts[1] for arg in option])


@fuzz(24)
@given(command=st.sampled_from([*COMMANDS, "no-such-command", ""]), args=cli_args)
def test_the_cli_exits_0_1_or_2_without_a_traceback(cli_tree, command, args):
    before = _snapshot(cli_tree)
    argv = [command, *args] if command else args
    env = {k: v for k, v in os.environ.items() if k != "REPRO_DEBUG"}  # no debug tracebacks
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "repro", *argv],
        cwd=cli_tree,
        env=env,
        capture_output=True,
        timeout=120,  # a reader that blocked on the FIFO would stop here
    )
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode in (0, 1, 2), (argv, done.returncode, stderr[-2000:])
    assert "Traceback" not in stderr + done.stdout.decode("utf-8", "replace"), (argv, stderr)
    after = _snapshot(cli_tree)
    # Only new files (an --out) may appear; nothing that was there changes unless --force.
    changed = [p for p in before if after.get(p) != before[p]]
    assert not changed or "--force" in args, (argv, changed)
    for path in set(after) - set(before):  # leave the tree as it was for the next case
        Path(path).unlink() if not Path(path).is_dir() else shutil.rmtree(path)
    for path in changed:
        if isinstance(before[path], bytes):
            Path(path).write_bytes(before[path])
    _record("CLI", f"{command or '(none)'} exit {done.returncode}")


# --- defects found here in modules this suite does not fix -----------------------------------


def test_out_that_is_a_link_loop_is_refused_by_name(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(UnsafeOutput):
        check_output(tmp_path / "a")


@pytest.mark.parametrize("name", ["a\x00b", "a" * 5000])
def test_out_that_no_file_system_can_name_is_refused_by_name(tmp_path, name):
    with pytest.raises(UnsafeOutput):
        check_output(tmp_path / name)


@pytest.mark.parametrize(
    "text",
    [
        "x = " + "[" * 100_000,
        '[[condition]]\nname = "a"\nvllm = "0.32.0"\noverrides = { x = '
        + "[" * 2000
        + "]" * 2000
        + " }\n",
    ],
)
def test_a_bottomless_conditions_file_is_refused_by_name(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    try:
        items = conditions.load(path)
    except conditions.ConditionsFileError:
        return
    assert all(isinstance(item, conditions.BadCondition) for item in items)


def test_a_patch_path_with_a_nul_byte_is_a_bad_condition(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[[condition]]\nname = "a"\nvllm = "0.32.0"\npatches = ["\\u0000"]\n')
    (item,) = conditions.load(path)
    assert isinstance(item, conditions.BadCondition)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_condition_with_a_non_finite_override_is_bad(tmp_path, value):
    path = tmp_path / "c.toml"
    path.write_text(f'[[condition]]\nname = "a"\nvllm = "0.32.0"\noverrides = {{ x = {value} }}\n')
    (item,) = conditions.load(path)
    assert isinstance(item, conditions.BadCondition)
