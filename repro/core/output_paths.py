"""Where a command may write the file its `--out` names: never over the user's files.

`report`, `compare` and `bundle` write one file the user names. Before anything is
computed, the name is checked: its folder must exist, it must not be a directory or a
special file, it must not sit inside the evidence the command reads (a run directory, a
bundle), and an existing file is replaced only with `--force`. Each refusal says what was
expected, what was found and what to do.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path

from repro.core.errors import ReproError


class UnsafeOutput(ReproError):
    """The `--out` path would lose or damage something, or cannot be written."""


def check_output(out: Path, *, reads: Iterable[Path] = (), force: bool = False) -> Path:
    """`out`, resolved, once it is safe to write; raise UnsafeOutput otherwise.

    `reads`: the inputs the command reads (run directories, bundles, artifacts); `out` may
    not be one of them or lie inside one. `force`: an existing regular file may be replaced.
    """
    if not str(out).strip():
        raise UnsafeOutput("--out is empty; name the file to write")
    try:
        target = out.resolve()
    except (RuntimeError, OSError, ValueError) as exc:
        # A link loop (RuntimeError on Python 3.11), a NUL byte, a name too long for the file
        # system: nothing could be written there.
        raise UnsafeOutput(
            f"--out {out!r} cannot be resolved to a file ({exc}); name another file"
        ) from None
    try:
        target.lstat()
    except FileNotFoundError:
        pass
    except OSError as exc:  # a name longer than the file system allows, say
        raise UnsafeOutput(
            f"--out {str(out)[:80]!r}…: no file can have that name ({exc.strerror})"
        ) from None
    parent = target.parent
    if not parent.is_dir():
        raise UnsafeOutput(
            f"--out {out}: its folder {parent} does not exist; create it or name another file"
        )
    if target.is_dir():
        raise UnsafeOutput(f"--out {out} is a directory; name a file to write inside it")
    if target.exists() and not target.is_file():
        raise UnsafeOutput(f"--out {out} exists and is not a regular file; name a new file")
    for source in reads:
        try:
            source = source.resolve()
        except (RuntimeError, OSError, ValueError):
            continue  # an input that cannot be resolved is not one `out` can lie inside
        if target == source or (source.is_dir() and source in target.parents):
            raise UnsafeOutput(
                f"--out {out} is inside the evidence this command reads ({source}); writing "
                "there would change it: name a file outside it"
            )
    if target.exists() and not force:
        raise UnsafeOutput(
            f"--out {out} exists; the command would replace it. Name a new file, or pass "
            "--force to replace it"
        )
    _check_writable(out, parent)
    return target


def _check_writable(out: Path, parent: Path) -> None:
    """Refuse a folder the atomic write could not create its temporary file in (`/proc/self`,
    a read-only mount), before the command does its work rather than after."""
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".repro-out-", suffix=".probe"):
            pass
    except OSError as exc:
        raise UnsafeOutput(
            f"--out {out}: no file can be written in its folder ({exc.strerror or exc}); "
            "name a file in a folder you can write"
        ) from None
