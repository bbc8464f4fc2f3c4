"""Reading JSON the kit did not write itself: every way it can be wrong, said by name.

Artifacts, records, manifests and model configs arrive from other labs and other tools.
Python's `json` module is lenient where evidence must not be: it takes `NaN` and `Infinity`,
keeps the last of two equal keys, guesses UTF-16 and UTF-32, lets lone surrogates through,
turns `1e310` into infinity, and goes as deep as the stack does (then RecursionError, not
a JSON error). Opening a path can block on a FIFO or loop through links. Here each of those
is one `JSONUnreadable` naming the file, what was found and what was expected:

- the path must be a regular file (stat is checked before the open, and the open never
  blocks) of at most `max_bytes`;
- the bytes must be strict UTF-8 without a byte-order mark or a NUL byte;
- nesting is counted before parsing and refused past `MAX_DEPTH`;
- no NaN/Infinity, no duplicate key, no number that overflows a float or exceeds Python's
  integer digit limit, no string that is not valid Unicode (a lone surrogate escape).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from itertools import accumulate
from pathlib import Path
from typing import Any

from repro.core.errors import ReproError

MAX_DEPTH = 64  # the kit's records are under ten levels deep
MAX_BYTES = 32 << 20  # the largest artifact or model index seen is a few MiB
# A JSON string, escapes included; an unterminated one runs to the end of the text.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_BRACKETS = re.compile(r"[^\[\]{}]+")
_BOMS = (
    (b"\xef\xbb\xbf", "a UTF-8 byte-order mark"),
    (b"\xff\xfe\x00\x00", "a UTF-32 byte-order mark"),
    (b"\x00\x00\xfe\xff", "a UTF-32 byte-order mark"),
    (b"\xff\xfe", "a UTF-16 byte-order mark"),
    (b"\xfe\xff", "a UTF-16 byte-order mark"),
)
_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class JSONUnreadable(ReproError):
    """A file or bytes that are not readable JSON."""


class _Refused(Exception):
    """Raised inside the parser's hooks; becomes JSONUnreadable with the file's name."""


def parse_json_bytes(data: bytes, where: str, *, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON value of `data`; `where` names it in the error."""
    if len(data) > max_bytes:
        raise JSONUnreadable(
            f"{where}: {len(data)} bytes; expected a JSON record of at most {max_bytes} bytes"
        )
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise JSONUnreadable(
                f"{where}: starts with {name}; expected UTF-8 JSON without one (save it as "
                "UTF-8 without BOM)"
            )
    nul = data.find(b"\x00")
    if nul >= 0:
        raise JSONUnreadable(f"{where}: a NUL byte at byte {nul}; expected UTF-8 JSON text")
    try:
        text = data.decode("utf-8")  # strict: no surrogates, no overlong forms
    except UnicodeDecodeError as exc:
        raise JSONUnreadable(
            f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}); expected a JSON "
            "file as the kit writes it (UTF-8)"
        ) from None
    return _parse_text(text, where)


def parse_json_text(text: str, where: str, *, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON value of `text` (e.g. a command-line value); `where` names it."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:  # argv bytes that were not UTF-8 (surrogateescape)
        raise JSONUnreadable(
            f"{where}: not UTF-8 text (character {exc.start}); expected JSON text"
        ) from None
    return parse_json_bytes(data, where, max_bytes=max_bytes)


def read_json_bytes(path: Path, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file at `path` (at most `max_bytes`), never blocking."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise JSONUnreadable(f"{path}: no such file; expected a JSON file") from None
    except OSError as exc:
        raise JSONUnreadable(f"{path}: cannot be read ({_reason(exc)})") from None
    _require_regular(path, info.st_mode, info.st_size, max_bytes)
    try:
        # O_NONBLOCK: a FIFO swapped in after the stat must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise JSONUnreadable(f"{path}: cannot be read ({_reason(exc)})") from None
    try:
        info = os.fstat(fd)
        _require_regular(path, info.st_mode, info.st_size, max_bytes)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise JSONUnreadable(f"{path}: cannot be read ({_reason(exc)})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew after the stat
        raise JSONUnreadable(f"{path}: more than {max_bytes} bytes; expected a JSON record")
    return data


def read_json(path: Path, *, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON value of the file at `path`."""
    return parse_json_bytes(read_json_bytes(path, max_bytes=max_bytes), str(path))


def _require_regular(path: Path, mode: int, size: int, max_bytes: int) -> None:
    if stat.S_ISDIR(mode):
        raise JSONUnreadable(f"{path}: a directory; expected a JSON file")
    for test, name in _SPECIAL_FILES:
        if test(mode):
            raise JSONUnreadable(f"{path}: {name}; expected a regular JSON file")
    if not stat.S_ISREG(mode):
        raise JSONUnreadable(f"{path}: not a regular file; expected a JSON file")
    if size > max_bytes:
        raise JSONUnreadable(
            f"{path}: {size} bytes; expected a JSON record of at most {max_bytes} bytes"
        )


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a loop of symbolic links"
    return exc.strerror or str(exc)


def _parse_text(text: str, where: str) -> Any:
    depth = _depth(text)
    if depth > MAX_DEPTH:
        raise JSONUnreadable(
            f"{where}: JSON nested deeper than can be read ({depth} levels; expected a record "
            f"of the kit's shape, at most {MAX_DEPTH} levels deep)"
        )
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object,
            parse_constant=_constant,
            parse_float=_float,
            parse_int=_int,
        )
        _check_strings(value)
    except _Refused as exc:
        raise JSONUnreadable(f"{where}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise JSONUnreadable(f"{where}: not JSON ({exc})") from None
    except RecursionError:  # not reached below MAX_DEPTH; kept so it can never escape
        raise JSONUnreadable(f"{where}: JSON nested deeper than can be read") from None
    return value


def _depth(text: str) -> int:
    """How deep arrays and objects nest in `text`, counted outside strings."""
    brackets = _BRACKETS.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    return max(accumulate(1 if c in "[{" else -1 for c in brackets))


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise _Refused(
                f"the key {key!r} twice in one object; expected each key once (JSON readers "
                "differ on which one wins)"
            )
        value[key] = item
    return value


def _constant(name: str) -> Any:
    raise _Refused(f"{name}, which is not a JSON number; expected finite numbers only")


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Refused(
            f"the number {text[:40]} is beyond a float's range; expected a finite number"
        )
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # Python's limit on integer digits (sys.get_int_max_str_digits)
        raise _Refused(
            f"an integer of {len(text.lstrip('-'))} digits; expected a number of usual size"
        ) from None


def _check_strings(value: Any) -> None:
    """Refuse lone surrogates (``"\\ud800"``): they are not text and break any later write."""
    if isinstance(value, str):
        _check_string(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_string(key)
            _check_strings(item)
    elif isinstance(value, list):
        for item in value:
            _check_strings(item)


def _check_string(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _Refused(
            f"a string with a lone surrogate (\\u{ord(text[exc.start]):04x}); expected text"
        ) from None


__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "JSONUnreadable",
    "parse_json_bytes",
    "parse_json_text",
    "read_json",
    "read_json_bytes",
]
