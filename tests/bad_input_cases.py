"""Every bad input of issue 31, run through the real CLI: the command, its exit code and the
first line it prints, and whether it kept its promises.

Each case builds its own inputs in a fresh temporary folder, runs `python -m repro …` (or
`python -m repro.installset …`) there as a subprocess with no engine, and checks:

- the exit code: 2 for bad input, 1 for a failed check, 0 for the good-input controls;
- no Python traceback on stdout or stderr;
- every file that existed before is byte-identical after (a control names what it may change);
- a refusal makes nothing: no new file, no engine environment, no model (the kit's caches
  point into the case's folder, so a multi-GB environment it would make shows up as new files
  there, and a short timeout stops one before it grows).

    python tests/bad_input_cases.py --table      the Markdown table of every case
    python tests/bad_input_cases.py --check      the same, then exit 1 if any case failed

tests/test_bad_input_table.py runs each case under pytest.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: the kit from this checkout
    sys.path.insert(0, str(REPO))

# A real run of the stock vLLM 0.26.0 on an H200 (cold-race corrupted): small, schema-valid.
EXAMPLE_RUN = REPO / "artifacts" / "examples" / "h200-vllm-0.26.0" / "stock"
DEEP = "[" * 100_000
# A command that starts an engine or makes an environment would run far past this; a refusal
# (even one that imports vLLM to read its engine arguments) comes well within it.
DEFAULT_TIMEOUT_S = 45.0
# A line of output that means Python gave up, not the kit.
TRACEBACK = "Traceback (most recent call last)"


class Inputs:
    """The case's folder and the inputs a case builds in it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __truediv__(self, name: str) -> Path:
        return self.root / name

    def write(self, name: str, data: str | bytes) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
        return path

    def run(self, name: str = "run") -> Path:
        """A copy of a real run directory (both arms, their logs)."""
        return Path(shutil.copytree(EXAMPLE_RUN, self.root / name))

    def forged_run(self, name: str = "forged") -> Path:
        """The corrupted run with a clean verdict written over its own (figures unchanged)."""
        run = self.run(name)
        artifact = run / "cold-race.json"
        doc = json.loads(artifact.read_text(encoding="utf-8"))
        doc["verdict"] = {
            "status": "clean",
            "gate": None,
            "reason": "no one-sided flips",
            "outcome": "clean-engaged",
        }
        artifact.write_text(json.dumps(doc, indent=2), encoding="utf-8")
        return run

    def deep_run(self, name: str = "deep") -> Path:
        run = self.run(name)
        (run / "cold-race.json").write_text(DEEP, encoding="utf-8")
        return run

    def bundle(self, name: str = "evidence.tar.gz") -> Path:
        from repro.evidence.bundle import build_bundle

        out = self.root / name
        build_bundle([self.run("bundled")], out, created="2026-12-01T00:00:00Z", images_dir=None)
        shutil.rmtree(self.root / "bundled")
        return out

    def site(self) -> Path:
        """A stand-in for site-packages holding a `vllm` package of two modules."""
        site = self.root / "site"
        self.write("site/vllm/__init__.py", "")
        self.write("site/vllm/sched.py", "".join(f"line {i}\n" for i in range(1, 11)))
        return site

    def diff(self, name: str, body: str) -> Path:
        return self.write(name, body)

    def model(self, name: str = "model", **config_edits) -> Path:
        """A local checkpoint folder of a hybrid model with an MTP head (config only)."""
        config = json.loads(
            (REPO / "tests" / "fixtures" / "model-configs" / "qwen3.5-shaped.json").read_text()
        )
        config["text_config"].update(config_edits)
        self.write(f"{name}/config.json", json.dumps(config, indent=2))
        return self.root / name

    def installset(self, name: str = "parts") -> Path:
        """A real install set: two small wheels cut into parts with their manifest."""
        from repro.installset.build import Wheel, pack_set
        from repro.installset.host import Target

        wheels = self.root / "wheels"
        wheels.mkdir(exist_ok=True)
        made = [  # the root first, as a set lists it
            _wheel(
                wheels,
                "tinypkg",
                "1.0",
                {"tinypkg/__init__.py": b"from tinydep import ANSWER\n"},
                requires=("tinydep>=2",),
            ),
            _wheel(wheels, "tinydep", "2.0", {"tinydep/__init__.py": b"ANSWER = 42\n"}),
        ]
        here = f"{sys.version_info[0]}.{sys.version_info[1]}"
        target = Target.create(here, ["manylinux_2_17_x86_64"])
        root = {"requirement": "tinypkg==1.0", "name": "tinypkg", "version": "1.0"}
        entries = []
        for path in made:
            wheel_name, version = path.name.split("-")[:2]
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            entries.append(
                Wheel(wheel_name, version, path.name, path.stat().st_size, sha, None, path)
            )
        out = self.root / name
        pack_set(entries, out, target, root=root, part_size=4096, steps=_quiet())
        shutil.rmtree(wheels)
        return out

    def installed(self, parts: Path, name: str = "target") -> Path:
        """`parts` installed into a fresh folder, as `installset install` does it."""
        from repro.installset.install import install

        install(parts, self.root / name, steps=_quiet())
        return self.root / name

    def edit_manifest(self, parts: Path, edit: Callable[[dict], None]) -> Path:
        manifest = parts / "manifest.json"
        doc = json.loads(manifest.read_text(encoding="utf-8"))
        edit(doc)
        manifest.write_text(json.dumps(doc, indent=2), encoding="utf-8")
        return parts

    def conditions(self, body: str | bytes, name: str = "conditions.toml") -> Path:
        return self.write(name, body)


def _quiet():
    """The install-set steps without their progress lines (the case's output is the CLI's)."""
    from repro.installset.install import Steps

    class Quiet(Steps):
        def say(self, text: str) -> None:
            pass

    return Quiet()


def _wheel(
    folder: Path, name: str, version: str, files: dict[str, bytes], requires: tuple[str, ...] = ()
) -> Path:
    """A minimal valid pure-Python wheel (METADATA, WHEEL and a RECORD with hashes)."""
    info = f"{name}-{version}.dist-info"
    content = dict(files)
    content[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    ).encode()
    content[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for member, data in content.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{member},sha256={digest},{len(data)}")
    content[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in content.items():
            zf.writestr(member, data)
    return path


def _safetensors(tensor_names_or_header) -> bytes:
    header = json.dumps(tensor_names_or_header).encode()
    return struct.pack("<Q", len(header)) + header


# --- the cases --------------------------------------------------------------------------------

Build = Callable[[Inputs], list[str]]


@dataclass(frozen=True)
class Case:
    """One command line and what it must do.

    `build` makes the inputs in the case's folder and returns the arguments after
    `python -m MODULE`. `says`: text the output must hold (a file the refusal must name, the
    good file a later line must still report); `not_says`: text it must not hold (the later
    refusal that would mean the bad input got through). `may_change`: for a control, which
    files (relative to the folder) it is meant to write or replace.
    """

    id: str
    group: str
    build: Build
    exit: int
    says: tuple[str, ...] = ()
    not_says: tuple[str, ...] = ()
    module: str = "repro"
    may_change: Callable[[str], bool] | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S


CASES: list[Case] = []


def case(id: str, group: str, exit: int, **kwargs) -> Callable[[Build], Build]:
    def register(build: Build) -> Build:
        CASES.append(Case(id=id, group=group, build=build, exit=exit, **kwargs))
        return build

    return register


def under(*prefixes: str) -> Callable[[str], bool]:
    return lambda rel: any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in prefixes)


GOOD_DIFF = """\
--- a/vllm/sched.py
+++ b/vllm/sched.py
@@ -2,3 +2,3 @@
 line 2
-line 3
+line three
 line 4
"""
STALE_DIFF = """\
--- a/vllm/sched.py
+++ b/vllm/sched.py
@@ -6,3 +6,3 @@
 line 6
-line seven, as an older release had it
+line 7 fixed
 line 8
"""

# -- data written or deleted

WRITES = "data written or deleted"


@case("report-out-is-the-run-artifact", WRITES, 2)
def _(t):
    return ["report", str(t.run()), "--out", str(t / "run/cold-race.json")]


@case("report-out-is-the-bundle", WRITES, 2)
def _(t):
    bundle = t.bundle()
    return ["report", str(bundle), "--out", str(bundle)]


@case("compare-out-inside-a-run", WRITES, 2)
def _(t):
    run = t.run()
    return ["compare", str(run), str(run), "--out", str(run / "multi-turn.json")]


@case("report-out-an-unrelated-file", WRITES, 2)
def _(t):
    t.write("notes.md", "my notes\n")
    return ["report", str(t.run()), "--out", str(t / "notes.md")]


@case("compare-out-an-unrelated-file", WRITES, 2)
def _(t):
    t.write("notes.md", "my notes\n")
    run = t.run()
    return ["compare", str(run), str(run), "--out", str(t / "notes.md")]


@case("bisect-out-an-unrelated-file", WRITES, 2)
def _(t):
    t.write("notes.md", "my notes\n")
    return ["bisect", "--arm", "cold-race", "--bad", "0.26.0", "--good", "0.32.0", "--out",
            str(t / "notes.md")]  # fmt: skip


@case("bundle-out-an-existing-bundle", WRITES, 2)
def _(t):
    bundle = t.bundle()
    return ["bundle", str(t.run()), "--out", str(bundle)]


@case("patch-good-then-stale", WRITES, 2, says=("stale.diff",))
def _(t):
    site = t.site()
    good, stale = t.diff("good.diff", GOOD_DIFF), t.diff("stale.diff", STALE_DIFF)
    return ["patch", "--site", str(site), str(good), str(stale)]


@case(
    "installset-replace-keeps-a-file-the-user-added",
    WRITES,
    0,
    module="repro.installset",
    may_change=lambda rel: rel.startswith("target/") and rel != "target/tinypkg/my-notes.txt",
)
def _(t):
    parts = t.installset()
    target = t.installed(parts)
    (target / "tinypkg" / "my-notes.txt").write_text("mine\n")
    return ["install", "--parts", str(parts), "--target", str(target), "--replace"]


# -- tracebacks: names the kit does not know

TRACEBACKS = "tracebacks"

for _command in ("plan", "run", "fetch-weights", "verify-weights"):
    for _name, _label in (("nope", "unknown"), ("", "empty")):

        def _profile_case(t, command=_command, name=_name):
            extra = {"run": ["--out", str(t / "out")], "plan": []}.get(
                command, ["--cache", str(t / "weights")]
            )
            return [command, "--profile", name, *extra]

        case(f"{_command}-profile-{_label}", TRACEBACKS, 2, says=("unknown profile",))(
            _profile_case
        )


@case("run-nemotron-super-on-cpu", TRACEBACKS, 2, says=("no cpu variant",))
def _(t):
    return ["run", "--profile", "nemotron-super", "--device", "cpu", "--out", str(t / "out")]


# -- tracebacks: JSON nested 100 000 deep, in every reader


@case("validate-deep-json", TRACEBACKS, 1, says=("deep.json",))
def _(t):
    return ["validate", str(t.write("deep.json", DEEP))]


@case("report-deep-json-run", TRACEBACKS, 2, says=("cold-race.json",))
def _(t):
    return ["report", str(t.deep_run())]


@case("compare-deep-json-run", TRACEBACKS, 2, says=("cold-race.json",))
def _(t):
    return ["compare", str(t.deep_run()), str(t.run())]


@case("bundle-deep-json-run", TRACEBACKS, 2, says=("cold-race.json",))
def _(t):
    return ["bundle", str(t.deep_run()), "--out", str(t / "new.tar.gz")]


@case("kit-digest-deep-json", TRACEBACKS, 1, says=("deep.json",))
def _(t):
    return ["kit-digest", str(t.write("deep.json", DEEP))]


@case("run-model-deep-config", TRACEBACKS, 2, says=("config.json",))
def _(t):
    t.write("model/config.json", DEEP)
    return ["run", "--model", str(t / "model"), "--out", str(t / "out")]


@case("import-image-deep-record", TRACEBACKS, 2, says=("record.json",))
def _(t):
    archive = t.write("image.tar", b"\0" * 1024)
    record = t.write("record.json", DEEP)
    return [
        "import-image",
        str(archive),
        "--record",
        str(record),
        "--images",
        str(t / "images"),
    ]


@case("installset-verify-deep-manifest", TRACEBACKS, 1, module="repro.installset")
def _(t):
    parts = t.installset()
    (parts / "manifest.json").write_text(DEEP)
    return ["verify", "--parts", str(parts)]


# -- tracebacks: validate on what is not a JSON file; one bad file does not stop the rest


@case("validate-not-utf8", TRACEBACKS, 1, says=("latin1.json",))
def _(t):
    return ["validate", str(t.write("latin1.json", '{"a": "caf\u00e9"}'.encode("latin-1")))]


@case("validate-utf16", TRACEBACKS, 1, says=("utf16.json",))
def _(t):
    return ["validate", str(t.write("utf16.json", '{"a": 1}'.encode("utf-16")))]


@case("validate-missing-file", TRACEBACKS, 1, says=("missing.json",))
def _(t):
    return ["validate", str(t / "missing.json")]


@case("validate-a-directory", TRACEBACKS, 1, says=("folder.json",))
def _(t):
    (t / "folder.json").mkdir()
    return ["validate", str(t / "folder.json")]


@case("validate-symlink-loop", TRACEBACKS, 1, says=("loop.json",))
def _(t):
    (t / "loop.json").symlink_to(t / "loop2.json")
    (t / "loop2.json").symlink_to(t / "loop.json")
    return ["validate", str(t / "loop.json")]


@case("validate-a-bundle", TRACEBACKS, 1, says=("evidence.tar.gz",))
def _(t):
    return ["validate", str(t.bundle())]


@case("validate-bad-then-good", TRACEBACKS, 1, says=("cold-race.json: valid",))
def _(t):
    return ["validate", str(t.write("deep.json", DEEP)), str(t.run() / "cold-race.json")]


# -- tracebacks: --out that cannot be a file


def _out_case(command: str, where: str) -> Build:
    def build(t: Inputs) -> list[str]:
        run = t.run()
        out = {
            "dir": t / "a-folder",
            "proc": Path("/proc/self/x"),
            "missing-folder": t / "no-such-folder" / "out.md",
        }[where]
        if where == "dir":
            out.mkdir()
        if command == "bundle":
            out = out if where == "dir" else out.with_name("out.tar.gz")
            return ["bundle", str(run), "--out", str(out)]
        inputs = [str(run), str(run)] if command == "compare" else [str(run)]
        return [command, *inputs, "--out", str(out)]

    return build


for _command in ("bundle", "report", "compare"):
    for _where in ("dir", "proc", "missing-folder"):
        case(f"{_command}-out-{_where}", TRACEBACKS, 2, says=("--out",))(
            _out_case(_command, _where)
        )


@case("installset-install-target-in-proc", TRACEBACKS, 2, module="repro.installset")
def _(t):
    return ["install", "--parts", str(t.installset()), "--target", "/proc/self/t"]


# -- tracebacks: conditions files (the failing line named)


def _conditions_case(body: str | bytes) -> Build:
    def build(t: Inputs) -> list[str]:
        conditions = t.conditions(body)
        return [
            "matrix",
            "--conditions",
            str(conditions),
            "--out",
            str(t / "matrix"),
            "--executor",
            "slurm",
            "--dry-run",
        ]

    return build


ONE = '[[condition]]\nname = "a"\nvllm = "0.32.0"\n'
for _id, _body, _line in (
    ("conditions-profile-a-list", ONE + 'profile = ["tiny"]\n', "line 4"),
    ("conditions-override-a-date", ONE + "overrides = { seed = 1979-05-27 }\n", "line 4"),
    ("conditions-not-tables", "condition = [1, 2]\n", "line 1"),
    ("conditions-not-utf8", b'[[condition]]\nname = "caf\xe9"\n', "line 2"),
):
    case(_id, TRACEBACKS, 2, says=(_line,))(_conditions_case(_body))


# -- tracebacks: containers of the wrong JSON kind


@case("run-model-index-a-list", TRACEBACKS, 2, not_says=("nvidia-smi",))
def _(t):
    model = t.model(mtp_num_hidden_layers=0)
    t.write("model/model.safetensors.index.json", "[]")
    return ["run", "--model", str(model), "--out", str(t / "out")]


@case("installset-verify-manifest-a-directory", TRACEBACKS, 2, module="repro.installset")
def _(t):
    parts = t.installset()
    (parts / "manifest.json").unlink()
    (parts / "manifest.json").mkdir()
    return ["verify", "--parts", str(parts)]


@case("installset-verify-parts-a-file", TRACEBACKS, 2, module="repro.installset")
def _(t):
    return ["verify", "--parts", str(t.write("parts.txt", "not a folder\n"))]


# -- accepted silently or misleading: overrides, flags


SILENT = "accepted silently or misleading"

for _id, _item, _says in (
    ("run-override-typo", "enable_prefix_cachng=false", "enable_prefix_caching"),
    ("run-override-unknown-key", "no_such_engine_setting=1", "no_such_engine_setting"),
    ("run-override-wrong-type", 'max_num_seqs="lots"', "max_num_seqs"),
    ("run-override-not-json", "max_num_seqs={bad", "max_num_seqs"),
    ("run-override-model", 'model="/etc"', "model"),
):

    def _override_case(t, item=_item):
        return ["run", "--override", item, "--out", str(t / "out")]

    case(_id, SILENT, 2, says=(_says,))(_override_case)


@case("tiny-override-not-key-value", SILENT, 2, says=("KEY=JSON",))
def _(t):
    return ["tiny", "--override", "x", "--out", str(t / "out")]


@case("tiny-out-a-file", SILENT, 2, says=("notes.txt",))
def _(t):
    return ["tiny", "--out", str(t.write("notes.txt", "mine\n"))]


@case("run-out-empty", SILENT, 2, says=("--out",))
def _(t):
    return ["run", "--out", ""]


@case("run-model-path-missing", SILENT, 2, says=("/nonexistent",))
def _(t):
    return ["run", "--model-path", "/nonexistent", "--out", str(t / "out")]


@case("run-arm-timeout-negative", SILENT, 2, says=("-5",))
def _(t):
    return ["run", "--arm-timeout", "-5", "--out", str(t / "out")]


@case("run-arm-timeout-nan", SILENT, 2, says=("nan",))
def _(t):
    return ["run", "--arm-timeout", "nan", "--out", str(t / "out")]


@case("report-forged-clean-verdict", SILENT, 2, says=("does not follow",), not_says=("✅",))
def _(t):
    return ["report", str(t.forged_run())]


@case("compare-forged-clean-verdicts", SILENT, 2, says=("does not follow",))
def _(t):
    return ["compare", str(t.forged_run("a")), str(t.forged_run("b"))]


# A real, schema-valid artifact with one edit that only a strict JSON reader refuses: the
# schema check alone calls each of them valid.
for _id, _old, _new in (
    ("validate-nan", '"duration_s": 120.541', '"duration_s": NaN'),
    ("validate-infinity", '"duration_s": 120.541', '"duration_s": Infinity'),
    ("validate-duplicate-keys", '"arm": "cold-race",', '"arm": "multi-turn", "arm": "cold-race",'),
):

    def _validate_case(t, old=_old, new=_new):
        text = (EXAMPLE_RUN / "cold-race.json").read_text(encoding="utf-8")
        assert old in text, f"the example artifact no longer holds {old}"
        return ["validate", str(t.write("artifact.json", text.replace(old, new, 1)))]

    case(_id, SILENT, 1, says=("artifact.json",), not_says=(": valid",))(_validate_case)


# -- accepted silently: matrix --dry-run plans conditions that cannot run


def _matrix(*flags: str) -> Build:
    def build(t: Inputs) -> list[str]:
        t.write("lib.so", b"\x7fELF\x02\x01\x01\0" + bytes(64))
        t.write("notes.txt", "not a diff\n")
        resolved = [f.replace("T/", f"{t.root}/") for f in flags]
        return ["matrix", *resolved, "--out", str(t / "matrix"), "--executor", "slurm", "--dry-run"]

    return build


for _id, _flags in (
    ("matrix-dry-run-vllm-not-a-release", ("--vllm", "x;y")),
    ("matrix-dry-run-patch-missing", ("--vllm", "0.32.0", "--patch", "T/missing.diff")),
    ("matrix-dry-run-patch-a-shared-library", ("--vllm", "0.32.0", "--patch", "T/lib.so")),
    ("matrix-dry-run-patch-not-a-diff", ("--vllm", "0.32.0", "--patch", "T/notes.txt")),
    ("matrix-dry-run-vllm-twice", ("--vllm", "0.32.0", "--vllm", "0.32.0")),
):
    case(_id, SILENT, 2)(_matrix(*_flags))

for _id, _body in (
    ("matrix-dry-run-unknown-release", '[[condition]]\nname = "a"\nvllm = "99.99.99"\n'),
    ("matrix-dry-run-name-with-newline", '[[condition]]\nname = "a\\nb"\nvllm = "0.32.0"\n'),
):
    case(_id, SILENT, 2)(_conditions_case(_body))

# A condition's vLLM ref (issue 33): each refusal names the table's line and what to write.
_SHA = "0123456789abcdef0123456789abcdef01234567"
for _id, _body, _says in (
    ("matrix-dry-run-pr-without-base", 'vllm = "pr:51113"\n', "line 3: vllm = 'pr:51113' needs"),
    ("matrix-dry-run-base-without-pr", 'vllm = "0.32.0"\nbase = "0.32.0"\n', "line 4: base ="),
    ("matrix-dry-run-short-commit", 'vllm = "commit:0123abc"\n', "line 3: vllm = 'commit:"),
    ("matrix-dry-run-pr-not-a-number", 'vllm = "pr:abc"\n', "line 3: vllm = 'pr:abc'"),
    ("matrix-dry-run-commit-on-cpu", f'vllm = "commit:{_SHA}"\n', "no per-commit wheels"),
):
    case(_id, SILENT, 2, says=(_says,))(_conditions_case('[[condition]]\nname = "a"\n' + _body))


# `matrix --gpus-per-cell` (issue 33): refused before anything is made, where no cell fits
# the host's GPUs (none here) and where the executor hands out no GPUs.
@case("matrix-gpus-per-cell-beyond-the-host", SILENT, 2, says=("expected at least 99 GPU(s)",))
def _(t):
    parts = ["--executor", "bare", "--parts", str(t.installset()), "--vllm", "0.32.0"]
    return ["matrix", *parts, "--gpus-per-cell", "99", "--out", str(t / "matrix")]


@case("matrix-gpus-per-cell-not-bare", SILENT, 2, says=("applies to --executor bare",))
def _(t):
    return ["matrix", "--vllm", "0.32.0", "--gpus-per-cell", "2", "--out", str(t / "matrix")]


# -- accepted silently: engine environments and patches


@case("engine-env-unknown-release", SILENT, 2, says=("99.99.99",))
def _(t):
    return ["engine-env", "--vllm", "99.99.99"]


@case("engine-env-empty-release", SILENT, 2, says=("--vllm",))
def _(t):
    return ["engine-env", "--vllm", ""]


@case("engine-env-patch-a-directory", SILENT, 2, not_says=("does not exist",))
def _(t):
    (t / "patches").mkdir()
    return ["engine-env", "--patch", str(t / "patches")]


# `patch` passes over a line it does not know: the shared library's change would be dropped.
BINARY_DIFF = GOOD_DIFF + "Binary files a/vllm/_C.so and b/vllm/_C.so differ\n"
SYMLINK_DIFF = """\
diff --git a/vllm/link.py b/vllm/link.py
new file mode 120000
index 0000000..1111111
--- /dev/null
+++ b/vllm/link.py
@@ -0,0 +1 @@
+../../../../etc/passwd
\\ No newline at end of file
"""
RENAME_DIFF = """\
diff --git a/vllm/sched.py b/../../x.so
similarity index 90%
rename from vllm/sched.py
rename to ../../x.so
--- a/vllm/sched.py
+++ b/vllm/sched.py
@@ -2,3 +2,3 @@
 line 2
-line 3
+line three
 line 4
"""
for _id, _body in (
    ("patch-binary-section", BINARY_DIFF),
    ("patch-symlink-entry", SYMLINK_DIFF),
    ("patch-rename-out-of-tree", RENAME_DIFF),
):

    def _patch_case(t, body=_body):
        site = t.site()
        return ["patch", "--site", str(site), str(t.diff("change.diff", body))]

    case(_id, SILENT, 2, says=("change.diff",))(_patch_case)


# -- accepted silently: an install set's manifest checked in full by verify


def _manifest_case(edit: Callable[[Inputs, Path], None]) -> Build:
    def build(t: Inputs) -> list[str]:
        parts = t.installset()
        edit(t, parts)
        return ["verify", "--parts", str(parts)]

    return build


def _edit_version(t: Inputs, parts: Path) -> None:
    def edit(doc):
        wheel = next(w for w in doc["wheels"] if w["name"] == "tinypkg")
        wheel["version"] = "9.9"

    t.edit_manifest(parts, edit)


def _edit_sha256sums(t: Inputs, parts: Path) -> None:
    sums = parts / "SHA256SUMS"
    lines = sums.read_text(encoding="utf-8").splitlines()
    lines[0] = "0" * 64 + lines[0][64:]
    sums.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _edit_unknown_field(t: Inputs, parts: Path) -> None:
    t.edit_manifest(parts, lambda doc: doc.update(extra_field="surprise"))


def _edit_duplicate_key(t: Inputs, parts: Path) -> None:
    manifest = parts / "manifest.json"
    text = manifest.read_text(encoding="utf-8")
    manifest.write_text(text.replace("{", '{"part_size": 1, ', 1), encoding="utf-8")


def _edit_nan_part_size(t: Inputs, parts: Path) -> None:
    manifest = parts / "manifest.json"
    doc = json.loads(manifest.read_text(encoding="utf-8"))
    doc["part_size"] = float("nan")
    manifest.write_text(json.dumps(doc), encoding="utf-8")  # json writes NaN


for _id, _edit in (
    ("installset-verify-edited-wheel-version", _edit_version),
    ("installset-verify-sha256sums-mismatch", _edit_sha256sums),
    ("installset-verify-unknown-field", _edit_unknown_field),
    ("installset-verify-duplicate-key", _edit_duplicate_key),
    ("installset-verify-part-size-nan", _edit_nan_part_size),
):
    case(_id, SILENT, 1, module="repro.installset")(_manifest_case(_edit))


@case(
    "installset-install-package-folder-deleted",
    SILENT,
    1,
    module="repro.installset",
    not_says=("already holds",),
)
def _(t):
    parts = t.installset()
    target = t.installed(parts)
    shutil.rmtree(target / "tinypkg")
    return ["install", "--parts", str(parts), "--target", str(target)]


# -- accepted silently: what `run --model` takes for an MTP head; --tp


@case("run-model-mtp-count-true", SILENT, 2, not_says=("nvidia-smi",))
def _(t):
    model = t.model(mtp_num_hidden_layers=0)
    config = json.loads((model / "config.json").read_text())
    config["text_config"]["num_nextn_predict_layers"] = True
    (model / "config.json").write_text(json.dumps(config))
    return ["run", "--model", str(model), "--out", str(t / "out")]


@case("run-model-safetensors-header-a-list", SILENT, 2, not_says=("nvidia-smi",))
def _(t):
    model = t.model(mtp_num_hidden_layers=0)
    t.write("model/model.safetensors", _safetensors(["mtp.fc.weight"]))
    return ["run", "--model", str(model), "--out", str(t / "out")]


@case("run-model-tp-zero", SILENT, 2, not_says=("none was found",))
def _(t):
    return ["run", "--model", str(t.model()), "--tp", "0", "--out", str(t / "out")]


# -- good-input controls: the same commands on good inputs still work

CONTROLS = "good-input controls"


@case("ok-validate", CONTROLS, 0, says=("cold-race.json: valid",))
def _(t):
    return ["validate", str(t.run() / "cold-race.json")]


@case("ok-report", CONTROLS, 0)
def _(t):
    return ["report", str(t.run())]


@case("ok-report-bundle", CONTROLS, 0)
def _(t):
    return ["report", str(t.bundle())]


@case("ok-report-out-new-file", CONTROLS, 0, may_change=under("report.md"))
def _(t):
    return ["report", str(t.run()), "--out", str(t / "report.md")]


@case("ok-report-out-force", CONTROLS, 0, may_change=under("notes.md"))
def _(t):
    t.write("notes.md", "my notes\n")
    return ["report", str(t.run()), "--out", str(t / "notes.md"), "--force"]


@case("ok-compare", CONTROLS, 0)
def _(t):
    run = t.run()
    return ["compare", str(run), str(t.run("again"))]


@case("ok-bundle", CONTROLS, 0, may_change=under("new.tar.gz", "new.tar.gz.sha256"))
def _(t):
    return ["bundle", str(t.run()), "--out", str(t / "new.tar.gz")]


@case("ok-verify", CONTROLS, 0)
def _(t):
    return ["verify", str(t.bundle())]


@case("ok-kit-digest", CONTROLS, 0)
def _(t):
    return ["kit-digest"]


@case("ok-plan", CONTROLS, 0)
def _(t):
    return ["plan", "--profile", "qwen3.6-27b-fp8", "--cache", str(t / "weights")]


@case("ok-patch", CONTROLS, 0, may_change=under("site"))
def _(t):
    site = t.site()
    return ["patch", "--site", str(site), str(t.diff("good.diff", GOOD_DIFF))]


@case("ok-installset-verify", CONTROLS, 0, module="repro.installset")
def _(t):
    return ["verify", "--parts", str(t.installset())]


@case("ok-matrix-dry-run", CONTROLS, 0)
def _(t):
    return [
        "matrix",
        "--vllm",
        "0.32.0",
        "--out",
        str(t / "matrix"),
        "--executor",
        "slurm",
        "--dry-run",
    ]


@case("ok-conditions-dry-run", CONTROLS, 0)
def _(t):
    return _conditions_case(ONE)(t)


# --- running a case ---------------------------------------------------------------------------


@dataclass
class Result:
    case: Case
    argv: list[str]
    exit: int | None  # None: timed out
    stdout: str
    stderr: str
    changed: list[str] = field(default_factory=list)  # existed before, differ or gone after
    created: list[str] = field(default_factory=list)  # did not exist before
    root: str = ""  # the case's folder, shown as T
    setup_error: str = ""  # the case's inputs could not be made (the command did not run)
    seconds: float = 0.0  # the command's wall time

    @property
    def first_line(self) -> str:
        """The refusal's line: the first `error` line of stderr (the kit's `error: …`,
        argparse's `prog: error: …`), else stderr's first line, else for a non-zero exit the
        first line of stdout that names an input (validate and kit-digest report there), else
        stdout's first line. A line that only announces what follows (`…: INVALID`, `…:`)
        gets the next line after it. The case's folder is shown as `T`."""
        err = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        out = [line.strip() for line in self.stdout.splitlines() if line.strip()]
        errors = [
            i for i, line in enumerate(err) if line.startswith("error") or ": error: " in line
        ]
        naming = [i for i, line in enumerate(out) if self.exit and self.root in line]
        if errors or err:
            lines, at = err, (errors or [0])[0]
        else:
            lines, at = out, (naming or [0])[0]
        if not lines:
            return ""
        line = lines[at]
        if line.endswith((":", ": INVALID")) and at + 1 < len(lines):
            line = f"{line} {lines[at + 1]}"
        return line.replace(self.root, "T")

    @property
    def command(self) -> str:
        """The command line as a user would type it, the case's folder shown as `T`."""
        text = " ".join(shlex.quote(a) for a in ["python", "-m", self.case.module, *self.argv])
        return text.replace(self.root, "T")

    def problems(self) -> list[str]:
        """Each promise this case broke, in words; empty when it kept them all."""
        case, out = self.case, self.stdout + self.stderr
        if self.setup_error:
            return [f"its inputs could not be made: {self.setup_error}"]
        found = []
        if self.exit is None:
            found.append(f"still running after {case.timeout_s:.0f} s (killed)")
        elif self.exit != case.exit:
            found.append(f"exit {self.exit}, expected {case.exit}")
        if TRACEBACK in out:
            found.append("printed a traceback")
        found += [f"missing from the output: {s!r}" for s in case.says if s not in out]
        found += [f"in the output: {s!r}" for s in case.not_says if s in out]
        may = case.may_change or (lambda rel: False)
        found += _listed("changed or deleted", [rel for rel in self.changed if not may(rel)])
        if case.exit != 0:
            found += _listed("made", [rel for rel in self.created if not may(rel)])
        return found


def _listed(what: str, paths: list[str], shown: int = 3) -> list[str]:
    """`what` and the first few paths (an engine environment is thousands of files)."""
    if not paths:
        return []
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return [f"{what} {', '.join(paths[:shown])}{more}"]


def _tree(root: Path) -> dict[str, str]:
    """Every file and link under `root` by relative path: its sha256, or its link target."""
    state = {}
    for folder, dirs, files in os.walk(root):
        for name in [*files, *(d for d in dirs if (Path(folder) / d).is_symlink())]:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                state[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                state[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                state[rel] = "special"
    return state


def environment(root: Path) -> dict[str, str]:
    """The CLI's environment: this checkout's kit, and every cache the kit would fill (engine
    environments, models, Hugging Face) inside the case's folder, offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("REPRO_DEBUG", "REPRO_CACHE")}
    cache = root / ".cache"
    env.update(
        PYTHONPATH=str(REPO),
        REPRO_KIT_CHECKOUT=str(REPO),
        XDG_CACHE_HOME=str(cache),
        HF_HOME=str(cache / "huggingface"),
        HF_HUB_OFFLINE="1",
        REPRO_WEIGHTS_CACHE=str(cache / "weights"),
        # Should a refusal not come, nothing is downloaded meanwhile.
        PIP_NO_INDEX="1",
        UV_OFFLINE="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def run_case(case: Case, python: str = sys.executable) -> Result:
    with tempfile.TemporaryDirectory(prefix=f"repro-bad-{case.id[:40]}-") as tmp:
        root = Path(tmp).resolve()
        try:
            argv = case.build(Inputs(root))
        except Exception as exc:  # a case whose inputs cannot be made fails alone, by name
            return Result(case, [], None, "", "", setup_error=f"{type(exc).__name__}: {exc}")
        before = _tree(root)
        started = time.monotonic()
        proc = subprocess.Popen(
            [python, "-m", case.module, *argv],
            cwd=root,
            env=environment(root),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: a timeout stops all of it
        )
        try:
            stdout, stderr = proc.communicate(timeout=case.timeout_s)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            code = None
        seconds = time.monotonic() - started
        after = _tree(root)
        result = Result(case, argv, code, stdout, stderr, root=str(root), seconds=seconds)
        result.changed = sorted(rel for rel, sha in before.items() if after.get(rel) != sha)
        result.created = sorted(set(after) - set(before))
        return result


def run_all(cases: list[Case], workers: int = 3) -> dict[str, Result]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip((c.id for c in cases), pool.map(run_case, cases), strict=True))


def table(results: list[Result]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("`", "'")

    rows = ["| case | command | exit | first line |", "|---|---|---|---|"]
    for r in results:
        code = "no run" if r.setup_error else "timeout" if r.exit is None else str(r.exit)
        rows.append(f"| {r.case.id} | `{cell(r.command)}` | {code} | {cell(r.first_line)} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--table", action="store_true", help="print the Markdown table")
    what.add_argument("--check", action="store_true", help="the table, then each broken promise")
    parser.add_argument("-k", default="", help="only the cases whose id contains this")
    parser.add_argument("--workers", type=int, default=3)
    args = parser.parse_args(argv)
    cases = [c for c in CASES if args.k in c.id]
    with contextlib.redirect_stdout(io.StringIO()):  # building inputs may print (rich)
        results = run_all(cases, workers=args.workers)
    print(table(list(results.values())))
    if args.check:
        broken = {i: r.problems() for i, r in results.items() if r.problems()}
        for case_id, problems in broken.items():
            print(f"{case_id}: {'; '.join(problems)}", file=sys.stderr)
        print(
            f"{len(results) - len(broken)}/{len(results)} cases kept every promise", file=sys.stderr
        )
        slowest = sorted(results.values(), key=lambda r: -r.seconds)[:5]
        print(
            "slowest: " + ", ".join(f"{r.case.id} {r.seconds:.1f} s" for r in slowest),
            file=sys.stderr,
        )
        return 1 if broken else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
