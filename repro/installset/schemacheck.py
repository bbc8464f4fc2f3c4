"""A document against a JSON Schema of the kit, with the standard library only.

The host that installs a set has no jsonschema, yet `verify` must refuse every manifest the
schema refuses. This applies the schema file itself (schemas/install-set.v2.schema.json), so
the check and the schema cannot drift apart: it knows the keywords the kit's schemas use, and
a keyword it does not know is an error rather than a rule skipped.
tests/test_installset_refusals.py holds its answers to jsonschema's.

Stricter than jsonschema in two places, on purpose: an integer is a JSON integer (the kit never
writes ``5.0``), and no number is NaN or infinite (JSON has neither).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

_TYPES = {
    "object": ("an object", lambda v: isinstance(v, dict)),
    "array": ("an array", lambda v: isinstance(v, list)),
    "string": ("a string", lambda v: isinstance(v, str)),
    "integer": ("an integer", lambda v: type(v) is int),
    "number": ("a number", lambda v: type(v) in (int, float) and math.isfinite(v)),
    "boolean": ("true or false", lambda v: isinstance(v, bool)),
    "null": ("null", lambda v: v is None),
}
# Keywords that say nothing about the document.
_ANNOTATIONS = {"$schema", "$id", "$comment", "$defs", "title", "description"}
_RULES = {"type", "const", "required", "properties", "additionalProperties", "items"}
_RULES |= {"minItems", "uniqueItems", "pattern", "minLength", "minimum", "$ref", "not"}


class SchemaUnsupported(Exception):
    """The schema uses a keyword this check does not apply (a kit bug, not bad input)."""


def found(value: Any) -> str:
    """``value`` as a refusal names it: short, on one line."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 80 else text[:77] + "..."


def member(path: str, key: str) -> str:
    """The path of ``key`` in the object at ``path`` (``$.stream.bytes``, ``$["a b"]``)."""
    return (
        f"{path}.{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) else f"{path}[{found(key)}]"
    )


def _search(pattern: str, text: str) -> bool:
    # ECMA's "$" is the end of the text; Python's also matches before a final newline.
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.search(pattern, text) is not None


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def violations(doc: Any, schema: Mapping[str, Any]) -> list[str]:
    """Every way ``doc`` fails ``schema``, each as ``$.path: what was expected, what was found``."""
    problems: list[str] = []
    _check(doc, schema, schema, "$", problems)
    return problems


def _check(value: Any, rule: Mapping[str, Any], root: Mapping[str, Any], path: str, out: list):
    if unknown := set(rule) - _RULES - _ANNOTATIONS:
        raise SchemaUnsupported(f"schema keyword(s) {sorted(unknown)} at {path} are not applied")
    if "$ref" in rule:
        ref = rule["$ref"]
        if not ref.startswith("#/$defs/"):
            raise SchemaUnsupported(f"$ref {ref!r} at {path}: only #/$defs/NAME is applied")
        target = root["$defs"][ref.removeprefix("#/$defs/")]
        inner: list[str] = []
        _check(value, target, root, path, inner)
        # A refusal of the value itself says what it should be, where the schema says it.
        if "description" in target and any(p.startswith(f"{path}: ") for p in inner):
            what = target["description"].rstrip(".")
            inner = [p for p in inner if not p.startswith(f"{path}: ")]
            inner.insert(0, f"{path}: expected {what[0].lower()}{what[1:]}; found {found(value)}")
        out += inner
    if "type" in rule:
        types = [rule["type"]] if isinstance(rule["type"], str) else rule["type"]
        if not any(_TYPES[t][1](value) for t in types):
            want = " or ".join(_TYPES[t][0] for t in types)
            out.append(f"{path}: expected {want}, found {found(value)}")
            return
    if "const" in rule and not _same(value, rule["const"]):
        out.append(f"{path}: expected {found(rule['const'])}, found {found(value)}")
    if "not" in rule and not violations(value, {**rule["not"], "$defs": root.get("$defs", {})}):
        out.append(f"{path}: {found(value)} must not match {json.dumps(rule['not'])}")
    if isinstance(value, str):
        if len(value) < rule.get("minLength", 0):
            want = f"at least {rule['minLength']} character(s)"
            out.append(f"{path}: expected {want}, found {found(value)}")
        if "pattern" in rule and not _search(rule["pattern"], value):
            out.append(f"{path}: {found(value)} does not match {rule['pattern']}")
    if type(value) in (int, float) and "minimum" in rule and value < rule["minimum"]:
        out.append(f"{path}: expected at least {rule['minimum']}, found {found(value)}")
    if isinstance(value, list):
        _check_array(value, rule, root, path, out)
    if isinstance(value, dict):
        _check_object(value, rule, root, path, out)


def _check_array(value: list, rule: Mapping[str, Any], root, path: str, out: list) -> None:
    if len(value) < rule.get("minItems", 0):
        what = "empty" if not value else f"{len(value)} item(s)"
        out.append(f"{path}: {what}; expected at least {rule['minItems']} item(s)")
    if rule.get("uniqueItems"):
        seen: set[str] = set()
        for i, item in enumerate(value):
            if (key := json.dumps(item, sort_keys=True)) in seen:
                out.append(f"{path}[{i}]: {found(item)} is listed twice")
            seen.add(key)
    if "items" in rule:
        for i, item in enumerate(value):
            _check(item, rule["items"], root, f"{path}[{i}]", out)


def _check_object(value: dict, rule: Mapping[str, Any], root, path: str, out: list) -> None:
    properties = rule.get("properties", {})
    for key in rule.get("required", []):
        if key not in value:
            out.append(f"{member(path, key)}: required field missing")
    extra = rule.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            _check(item, properties[key], root, member(path, key), out)
        elif extra is False:
            out.append(f"{member(path, key)}: unknown field (the kit writes no such field)")
        elif isinstance(extra, dict):
            _check(item, extra, root, member(path, key), out)
