"""Reading JSON the kit did not write itself: every way it can be wrong, said by name.

Artifacts, records and manifests arrive from other labs and other tools. `json.loads`
raises for undecodable bytes, bad syntax, and (as RecursionError, not a JSON error) for
nesting deeper than Python's parser goes; opening the file raises for a missing file, a
directory or a symbolic-link loop. Each becomes one `JSONUnreadable` naming the file, what
was expected and what to do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from repro.errors import ReproError


class JSONUnreadable(ReproError):
    """A file or bytes that are not readable JSON."""


def parse_json_bytes(data: bytes, where: str) -> Any:
    """The JSON value of `data`; `where` names it in the error."""
    try:
        return json.loads(data)
    except UnicodeDecodeError as exc:
        raise JSONUnreadable(
            f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}); expected a JSON "
            "file as the kit writes it (UTF-8)"
        ) from None
    except json.JSONDecodeError as exc:
        raise JSONUnreadable(f"{where}: not JSON ({exc})") from None
    except RecursionError:
        raise JSONUnreadable(
            f"{where}: JSON nested deeper than can be read; expected a record of the kit's "
            "shape (a few levels deep): this is not one"
        ) from None


def read_json(path: Path) -> Any:
    """The JSON value of the file at `path`."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise JSONUnreadable(f"{path}: a directory; expected a JSON file") from None
    except FileNotFoundError:
        raise JSONUnreadable(f"{path}: no such file") from None
    except OSError as exc:
        raise JSONUnreadable(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return parse_json_bytes(data, str(path))
