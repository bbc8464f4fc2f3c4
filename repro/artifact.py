"""The run artifact: validate it against its JSON Schema, keep secrets out, write it atomically.

One artifact per arm. Its shape and the rules that tie its fields together (an ``error``
record may be partial, only an ``inconclusive`` verdict names a gate, ...) live in
``schemas/run-artifact.v1.schema.json``; this module only finds the schema, runs it with
format checking on, and turns violations into one readable message.

Where the schemas are found
---------------------------
The canonical files are in ``schemas/`` at the repository root (the project layout fixes
that folder). A wheel ships the same files as ``repro/_schemas/``: ``pyproject.toml`` maps
the package ``repro._schemas`` onto the ``schemas/`` folder, so there is one copy in the
source tree and nothing to keep in sync. At run time ``schema_path`` looks in the installed
package first and then in the checkout the package was imported from.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.core import redaction
from repro.core.atomicio import write_json_atomic
from repro.core.errors import ValidationUnavailable
from repro.engine.process_vars import GPU_HOST_VARIABLES, SHARED_CORES_VARIABLES

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

__all__ = [
    "SCHEMA_VERSION",
    "ArtifactContainsSecrets",
    "ArtifactInvalid",
    "SchemaNotFound",
    "load_schema",
    "redact_env",
    "require_validation",
    "schema_path",
    "schema_violations",
    "validate_artifact",
    "write_artifact",
]

SCHEMA_VERSION = "1.0"

_PACKAGE_DIR = Path(__file__).resolve().parent
# Installed wheel first (repro._schemas exists only there), then the checkout's schemas/.
_SCHEMA_DIRS = (_PACKAGE_DIR / "_schemas", _PACKAGE_DIR.parent / "schemas")


class SchemaNotFound(FileNotFoundError):
    """No schema file of the requested name and version exists where the kit looks."""


class ArtifactInvalid(ValueError):
    """A document does not satisfy the run-artifact schema. ``violations`` lists each one."""

    def __init__(self, violations: list[str], schema_file: Path | None = None) -> None:
        self.violations = violations
        where = f" (schema: {schema_file})" if schema_file else ""
        lines = "\n".join(f"  - {v}" for v in violations)
        super().__init__(
            f"run artifact is invalid: {len(violations)} violation(s){where}\n{lines}\n"
            "Fix the code that assembled the document; an invalid artifact is never written."
        )


class ArtifactContainsSecrets(ValueError):
    """A document holds something that looks like a credential; it is not written."""

    def __init__(self, findings: list[str]) -> None:
        self.findings = findings
        lines = "\n".join(f"  - {f}" for f in findings)
        super().__init__(
            f"refusing to write the artifact: {len(findings)} value(s) look like secrets\n"
            f"{lines}\n"
            "Artifacts are shared in public issues. Drop the value at its source (environment "
            "variables go through repro.artifact.redact_env) and write again."
        )


# --- schemas -------------------------------------------------------------------------------


def schema_path(name: str = "run-artifact", version: int = 1) -> Path:
    """Return the path of ``<name>.v<version>.schema.json``; raise ``SchemaNotFound``."""
    file_name = f"{name}.v{version}.schema.json"
    for directory in _SCHEMA_DIRS:
        candidate = directory / file_name
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(d) for d in _SCHEMA_DIRS)
    raise SchemaNotFound(
        f"schema {file_name!r} not found; looked in: {looked}. Run the kit from its checkout "
        "or install it as a package (pip install .), which ships schemas/ as repro/_schemas."
    )


def load_schema(name: str = "run-artifact", version: int = 1) -> dict[str, Any]:
    """Return the parsed schema (a fresh copy each call; mutating it affects nothing else)."""
    return json.loads(_schema_text(name, version))


@functools.cache
def _schema_text(name: str, version: int) -> str:
    return schema_path(name, version).read_text(encoding="utf-8")


# Format checkers whose libraries the kit keeps jsonschema from importing: its schemas use
# none of them (`schema_formats`), and rfc3987_syntax builds 39 grammars at import, 1.4 s of
# a 1.5 s `import jsonschema` on the development machine (docs/measured.md, §Engine process).
UNUSED_FORMAT_LIBRARIES = ("rfc3987_syntax",)


def _import_validator():
    """jsonschema's Draft 2020-12 validator, imported without the unused format libraries."""
    if "jsonschema" in sys.modules:
        from jsonschema import Draft202012Validator

        return Draft202012Validator
    # A None entry makes `import` raise ImportError, which jsonschema takes as "not installed"
    # (it then has no checker for that format); the entries are removed again right after.
    held = [m for m in UNUSED_FORMAT_LIBRARIES if m not in sys.modules]
    for module in held:
        sys.modules[module] = None  # type: ignore[assignment]
    try:
        from jsonschema import Draft202012Validator
    finally:
        for module in held:
            del sys.modules[module]
    return Draft202012Validator


def schema_formats(schema: dict[str, Any]) -> set[str]:
    """Every `format` a schema names, wherever it is nested."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("format"), str):
                found.add(node["format"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return found


@functools.cache
def _validator(name: str, version: int) -> Draft202012Validator:
    # Imported here: with its format checkers jsonschema takes seconds to import, which the
    # engine process (it writes documents, the parent validates them) need not pay
    # (docs/measured.md, §Engine process).
    Draft202012Validator = _import_validator()
    checker = Draft202012Validator.FORMAT_CHECKER
    # jsonschema silently skips formats whose checker library is missing; for date-time that
    # is rfc3339-validator, which the jsonschema[format-nongpl] extra installs.
    if "date-time" not in checker.checkers:
        raise ValidationUnavailable(
            "jsonschema cannot check the date-time format here, so timestamps would go "
            "unchecked; install the extra: pip install 'jsonschema[format-nongpl]' (on a "
            "host without network: carry its wheels, e.g. rfc3339-validator)"
        )
    # Any other format the schema names, so that none goes unchecked without a word (one
    # whose library `UNUSED_FORMAT_LIBRARIES` holds back would be caught here).
    schema = load_schema(name, version)
    unchecked = sorted(schema_formats(schema) - set(checker.checkers))
    if unchecked:
        raise ValidationUnavailable(
            f"jsonschema cannot check the format(s) {', '.join(unchecked)} that schema "
            f"{name!r} v{version} uses, so they would go unchecked; install the extra: "
            "pip install 'jsonschema[format-nongpl]'"
        )
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=checker)


# --- validation ----------------------------------------------------------------------------


def require_validation() -> None:
    """Raise ``ValidationUnavailable`` now if artifacts could not be validated in this Python.

    Called before any engine starts: finding out only when the first record is written
    would throw away an arm's figures after minutes of work.
    """
    _validator("run-artifact", 1)


def validate_artifact(doc: Any) -> None:
    """Raise ``ArtifactInvalid`` listing every violation of the run-artifact schema."""
    validator = _validator("run-artifact", 1)
    errors = sorted(validator.iter_errors(doc), key=lambda e: (e.json_path, e.message))
    if errors:
        raise ArtifactInvalid([_describe(e) for e in errors], schema_path("run-artifact", 1))


def schema_violations(doc: Any, name: str, version: int = 1) -> list[str]:
    """Every violation of ``schemas/<name>.v<version>.schema.json`` by ``doc``, one line each
    (format checking on, as for run artifacts); empty when ``doc`` is valid."""
    errors = sorted(
        _validator(name, version).iter_errors(doc), key=lambda e: (e.json_path, e.message)
    )
    return [_describe(e) for e in errors]


def _describe(error: ValidationError) -> str:
    """One line: where (JSON path), what was expected, what was found, and the rule's reason."""
    path = error.json_path
    kind = error.validator
    value = error.validator_value
    found = _show(error.instance)
    if isinstance(error.instance, (list, Mapping)):
        found = f"{_type_name(error.instance)} {found}"
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    if "propertyNames" in error.absolute_schema_path:
        found = f"property name {found}"

    if kind == "required":
        match = re.match(r"^'(.*)' is a required property$", error.message)
        name = match.group(1) if match else error.message
        line = f"{path}.{name}: required property is missing"
    elif kind == "additionalProperties" and isinstance(error.instance, Mapping):
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        line = f"{path}: unexpected propert{'y' if len(extra) == 1 else 'ies'} {extra}; "
        line += f"allowed: {allowed}"
    elif kind == "type":
        expected = " or ".join(value) if isinstance(value, list) else value
        line = f"{path}: expected {expected}, found {found}"
    elif kind == "const":
        line = f"{path}: expected {_show(value)}, found {found}"
    elif kind == "enum":
        line = f"{path}: expected one of {_show(value)}, found {found}"
    elif kind == "format":
        line = f"{path}: expected a {value} string, found {found}"
    elif kind == "pattern":
        line = f"{path}: expected a string matching {value!r}, found {found}"
    elif kind == "not":
        line = f"{path}: expected a value not matching {_show(value)}, found {found}"
    elif kind in _BOUNDS:
        line = f"{path}: expected {_BOUNDS[kind]} {value}, found {found}"
    else:
        line = f"{path}: {error.message}"

    # Conditional rules (if/then/else) carry a description saying why they exist.
    if ("then" in error.absolute_schema_path or "else" in error.absolute_schema_path) and (
        rule := schema.get("description")
    ):
        line += f" (rule: {rule})"
    return line


_BOUNDS = {
    "minimum": "a number >=",
    "maximum": "a number <=",
    "exclusiveMinimum": "a number >",
    "exclusiveMaximum": "a number <",
    "minLength": "a string of length >=",
    "maxLength": "a string of length <=",
    "minItems": "an array of length >=",
    "maxItems": "an array of length <=",
    "minProperties": "an object with property count >=",
}


def _show(value: Any, limit: int = 80) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# JSON Schema's type names of Python values; bool before int, since a bool is an int.
_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (type(None), "null"),
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (Mapping, "object"),
)


def _type_name(value: Any) -> str:
    return next(
        (name for kind, name in _JSON_TYPES if isinstance(value, kind)), type(value).__name__
    )


# --- secrets -------------------------------------------------------------------------------

# Engine-relevant environment variables that an artifact records.
_ENV_PREFIXES = ("VLLM_", "REPRO_")
_ENV_NAMES = frozenset(
    {
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "OMP_NUM_THREADS",
    }
    | set(GPU_HOST_VARIABLES)
    | set(SHARED_CORES_VARIABLES)
)
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
# The kit's own plumbing between processes, recorded in their own sections (run, location).
_ENV_PLUMBING = frozenset({"REPRO_RUN_CONTEXT", "REPRO_IMAGE"})


def redact_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Keep only engine-relevant variables of ``env`` (default ``os.environ``), sorted by name.

    Kept: names starting with ``VLLM_`` or ``REPRO_`` (but not the kit's inter-process
    plumbing, REPRO_RUN_CONTEXT and REPRO_IMAGE, which have their own sections), and
    ``HF_HUB_OFFLINE``,
    ``TRANSFORMERS_OFFLINE``, ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` (which GPUs,
    numbered how), ``OMP_NUM_THREADS`` and the GPU host's
    NVLink switches (`repro.engine.process_vars.GPU_HOST_VARIABLES`). Dropped anyway:
    any name containing one of the scanner's secret words (`repro.core.redaction.SECRET_WORDS`,
    case-insensitive), and names that are not upper case, digits and underscores.
    """
    env = os.environ if env is None else env
    kept = {}
    for name, value in env.items():
        if not (name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES):
            continue
        if name in _ENV_PLUMBING:
            continue
        if not _ENV_NAME.fullmatch(name):
            continue  # the schema takes conventional names only (upper case, digits, '_')
        if redaction.is_secret_env_name(name):  # the scanner's words, as substrings
            continue
        kept[name] = str(value)
    return dict(sorted(kept.items()))


# --- writing -------------------------------------------------------------------------------


def write_artifact(doc: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Validate ``doc``, refuse it if it holds secrets, then write it atomically as JSON.

    Raises ``ArtifactInvalid`` or ``ArtifactContainsSecrets``; in both cases nothing is
    written and an existing file at ``path`` is left as it was.
    """
    validate_artifact(doc)
    findings = redaction.scan_document(doc)
    if findings:
        raise ArtifactContainsSecrets(findings)
    write_json_atomic(path, doc)
