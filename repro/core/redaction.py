"""Secrets: one scanner and one redactor for everything the kit writes.

Logs (as they are written), environment capture (`repro.artifact.redact_env`), run records
(`repro.artifact.write_artifact` refuses a document holding one), crash records (their log
tail is masked), image records and bundles (their logs are scanned) all use the rules here,
so what one of them masks the others find, and what the scanner finds the redactor masks.

Rules:
  - credential formats: Hugging Face, GitHub and AWS tokens, ``Authorization:`` values,
    ``Bearer`` credentials, private-key blocks, and the password of a URL
    (``https://user:password@host``);
  - secret-named values: ``NAME=value`` and ``--name value`` / ``--name=value`` where a
    component of the name (split on ``_``, ``-`` and ``.``) is one of `SECRET_WORDS`
    (so HF_TOKEN matches and TOKENIZERS_PARALLELISM does not). A value that only names
    another variable (``$HF_TOKEN``) is not a secret.

This module uses the standard library only (the install-set installer may import it).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

# What a masked value becomes. No rule below matches it, so masked text scans clean.
MASK = "[redacted]"

SECRET_WORDS = frozenset(
    {"token", "key", "apikey", "secret", "password", "passwd", "credential", "credentials"}
)
# The same words anywhere in a name. `schemas/run-artifact.v1.schema.json` refuses recorded
# environment names matching it and carries a copy (JSON cannot import this module);
# tests/test_redaction.py fails when the two differ.
SECRET_ENV_NAME = re.compile("|".join(sorted(word.upper() for word in SECRET_WORDS)))

# (kind, pattern); the group "secret" (else the whole match) is what gets masked.
_NOT_MASKED = r"(?!\[redacted\])"
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("Hugging Face token", re.compile(r"hf_[A-Za-z0-9]{30,}")),
    ("GitHub token", re.compile(r"\b(?:gh[pousr]|github_pat)_[A-Za-z0-9_]{30,}")),
    ("AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("Bearer credential", re.compile(r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/=-]{8,})")),
    (
        "Authorization header",
        re.compile(rf"(?i)\bauthorization\s*[:=]\s*(?P<secret>{_NOT_MASKED}[^\s\"',;]+)"),
    ),
    (
        "private key",
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----)?"
        ),
    ),
    (
        "credentials in a URL",
        re.compile(
            rf"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@\"']+:(?P<secret>{_NOT_MASKED}[^\s/@\"']+)@"
        ),
    ),
)
# NAME=value as in an environment dump or a keyword-argument repr.
_ASSIGNMENT = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z][A-Za-z0-9_]*)=(\S+)")
# --hf-token=value or --hf-token value on a command line.
_OPTION = re.compile(r"(?<![A-Za-z0-9-])--([A-Za-z0-9][A-Za-z0-9_-]*)(=|\s+)(\S+)")
_OPTION_FLAG = re.compile(r"^--([A-Za-z0-9][A-Za-z0-9_-]*)$")
# A value that names another variable instead of holding one ($HF_TOKEN, ${HF_TOKEN}).
_REFERENCE = re.compile(r"^['\"]?\$\{?[A-Za-z_][A-Za-z0-9_]*\}?['\"]?$")


def is_secret_name(name: str) -> bool:
    """Whether a variable, key or option called ``name`` holds a credential."""
    return any(part.lower() in SECRET_WORDS for part in re.split(r"[_\-.]+", name) if part)


def is_secret_env_name(name: str) -> bool:
    """The broader test for environment variables the kit records: any SECRET_WORDS word
    anywhere in the name (the run-artifact schema refuses the same substrings)."""
    return SECRET_ENV_NAME.search(name.upper()) is not None


def _secret_value(value: str) -> bool:
    return bool(value.strip()) and not _REFERENCE.match(value) and not value.startswith(MASK)


def describe(value: str) -> str:
    """A finding's view of a secret: its first four characters and its length."""
    return f"{value[:4]}… ({len(value)} chars)"


def scan(text: str) -> list[str]:
    """A description of each thing in ``text`` that looks like a credential (never the value
    itself, only its first four characters)."""
    findings: list[str] = []
    for kind, pattern in PATTERNS:
        for m in pattern.finditer(text):
            secret = m.group("secret") if "secret" in pattern.groupindex else m.group(0)
            findings.append(f"{kind} at offset {m.start()}: {describe(secret)}")
    for m in _ASSIGNMENT.finditer(text):
        if is_secret_name(m.group(1)) and _secret_value(m.group(2)):
            findings.append(
                f"secret-named variable {m.group(1)} at offset {m.start()}: {describe(m.group(2))}"
            )
    for m in _OPTION.finditer(text):
        value = m.group(3)
        if value.startswith("-"):
            continue  # the option has no value here; the next token is another option
        if is_secret_name(m.group(1)) and _secret_value(value):
            findings.append(
                f"secret-named option {m.group(1)} at offset {m.start()}: {describe(value)}"
            )
    return findings


def redact(text: str) -> str:
    """``text`` with every secret `scan` would find replaced by MASK."""
    for _kind, pattern in PATTERNS:
        if "secret" in pattern.groupindex:
            text = pattern.sub(_mask_group, text)
        else:
            text = pattern.sub(MASK, text)

    def assignment(m: re.Match[str]) -> str:
        if is_secret_name(m.group(1)) and _secret_value(m.group(2)):
            return f"{m.group(1)}={MASK}"
        return m.group(0)

    def option(m: re.Match[str]) -> str:
        value = m.group(3)
        if not value.startswith("-") and is_secret_name(m.group(1)) and _secret_value(value):
            return f"--{m.group(1)}{m.group(2)}{MASK}"
        return m.group(0)

    return _OPTION.sub(option, _ASSIGNMENT.sub(assignment, text))


def _mask_group(m: re.Match[str]) -> str:
    start, end = m.span("secret")
    whole = m.group(0)
    return whole[: start - m.start()] + MASK + whole[end - m.start() :]


# --- JSON-like documents --------------------------------------------------------------------


def scan_document(doc: Any) -> list[str]:
    """Secrets anywhere in a JSON-like document, each with its JSON path: in every string, in
    the value of every key whose name says it holds a credential, and in argv-style lists
    where a secret-named option (``--hf-token``) is followed by its value."""
    return [f"{path}: {finding}" for path, finding in _walk(doc, "$")]


def _walk(node: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, str):
        for finding in scan(node):
            yield path, finding
    elif isinstance(node, Mapping):
        for key, value in node.items():
            child = f"{path}.{key}"
            key = str(key)
            yield from ((child, f) for f in scan(key))
            if is_secret_name(key) and isinstance(value, str) and _secret_value(value):
                yield child, f"secret-named key {key}: {describe(value)}"
            yield from _walk(value, child)
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            yield from _walk(item, f"{path}[{i}]")
        for i, (flag, value) in enumerate(zip(node, node[1:], strict=False)):
            if isinstance(flag, str) and isinstance(value, str):
                m = _OPTION_FLAG.match(flag)
                if m and is_secret_name(m.group(1)) and not value.startswith("-"):
                    if _secret_value(value):
                        yield f"{path}[{i + 1}]", f"value of option {flag}: {describe(value)}"


def redact_document(doc: Any) -> Any:
    """A copy of ``doc`` with everything `scan_document` finds masked."""
    if isinstance(doc, str):
        return redact(doc)
    if isinstance(doc, Mapping):
        out = {}
        for key, value in doc.items():
            if is_secret_name(str(key)) and isinstance(value, str) and _secret_value(value):
                out[redact(str(key))] = MASK
            else:
                out[redact(str(key))] = redact_document(value)
        return out
    if isinstance(doc, (list, tuple)):
        items = [redact_document(item) for item in doc]
        for i in range(1, len(items)):
            flag, value = items[i - 1], items[i]
            if isinstance(flag, str) and isinstance(value, str):
                m = _OPTION_FLAG.match(flag)
                if m and is_secret_name(m.group(1)) and not value.startswith("-"):
                    if _secret_value(value):
                        items[i] = MASK
        return items
    return doc


__all__ = [
    "MASK",
    "PATTERNS",
    "SECRET_ENV_NAME",
    "SECRET_WORDS",
    "describe",
    "is_secret_env_name",
    "is_secret_name",
    "redact",
    "redact_document",
    "scan",
    "scan_document",
]
