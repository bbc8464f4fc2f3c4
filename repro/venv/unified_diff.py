"""A strict reader of unified diffs (`git diff`, `diff -u`), for `--patch` files.

GNU patch, which applies them, does more than change lines: it also acts on git's extended
headers (it makes symlinks, changes file modes, renames and copies files, writes binary
patches) and takes whatever path a header names. A `--patch` file may only change the text
of files inside the tree it is applied to, so this reader takes the file apart the way
patch would and refuses, naming the line, everything else: binary sections, mode changes,
renames and copies, absolute paths, `..`, hunks whose line counts do not add up, and files
that are not diffs at all.

Written here rather than taken from a library (`unidiff`, `whatthepatch` on PyPI): the kit
applies patches on bare GPU hosts whose only packages are an install set's (vLLM's own
requirements, see containers/bare-host/red-green.sh), and the CUDA image locks pin the kit's
dependencies, so a new dependency would have to be carried into each of them; and neither
library refuses what patch would act on, which is what this reader is for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from repro.core.errors import PatchError

# What `patch -p1` strips from each path: exactly one leading component (a/, b/).
STRIP = 1
# A bound that no real diff reaches: a `--patch` of a stray large file is refused unread.
MAX_BYTES = 32 * 1024 * 1024
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_GIT_HEADER = re.compile(r"^diff --git (\S+) (\S+)$")
_REGULAR_FILE = "100644"
# Lines that patch acts on outside a hunk and that a Python-only overlay never needs.
_REFUSED = (
    (re.compile(r"^Binary files .* differ$"), "a binary file section ({line!r})"),
    (re.compile(r"^GIT binary patch$"), "a git binary patch"),
    (re.compile(r"^(old|new) mode "), "a file mode change ({line!r})"),
    (re.compile(r"^(rename|copy) (from|to) "), "a file rename or copy ({line!r})"),
    (re.compile(r"^(dis)?similarity index "), "a file rename or copy ({line!r})"),
    (re.compile(r"^Index: "), "an `Index:` line, whose name patch may take as the target"),
    (re.compile(r"^\*\*\* "), "a context-diff header ({line!r}); make a unified diff"),
)
_MODES = {"120000": "a symlink", "100755": "an executable file", "160000": "a git submodule"}


@dataclass(frozen=True)
class Hunk:
    header: str
    line: int  # 1-based line of its `@@` header


@dataclass(frozen=True)
class FileDiff:
    """One file's section: its paths as patch -p1 reads them (None for /dev/null)."""

    old: str | None
    new: str | None
    line: int  # 1-based line of its `---` header
    hunks: tuple[Hunk, ...]

    @property
    def paths(self) -> list[str]:
        return [p for p in (self.old, self.new) if p is not None]

    def named(self) -> list[tuple[str, int]]:
        """Each path with the line that names it (`---` then `+++`)."""
        pairs = ((self.old, self.line), (self.new, self.line + 1))
        return [(p, n) for p, n in pairs if p is not None]


def read_lines(path: Path) -> list[str]:
    """The diff's lines, refusing a directory, a missing file and anything that is not text."""
    path = Path(path)
    if path.is_dir():
        raise PatchError(
            f"patch file {path} is a directory; give the diff file itself (one `git diff` "
            f"or `diff -u` output per --patch)"
        )
    if not path.exists():
        raise PatchError(f"patch file {path} does not exist; check the path")
    if not path.is_file():
        raise PatchError(f"patch file {path} is not a regular file; give a diff file")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise PatchError(
            f"{path} is {size} bytes, past the {MAX_BYTES} a unified diff of Python files "
            f"reaches; it is not a diff: give the diff file"
        )
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise PatchError(
            f"{path}: line {line} is not UTF-8 text ({exc.reason}): it is not a unified diff "
            f"(a compiled or binary file?); make one with `git diff` or `diff -u`"
        ) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise PatchError(
            f"{path}: line {line} holds a NUL byte: it is not a unified diff (a binary file?); "
            f"make one with `git diff` or `diff -u`"
        )
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def parse(path: Path) -> list[FileDiff]:
    """Every file section of the diff at ``path``; PatchError naming the first bad line."""
    path = Path(path)
    lines = read_lines(path)

    def refuse(number: int, what: str) -> PatchError:
        return PatchError(f"{path}: line {number}: {what}")

    sections: list[FileDiff] = []
    i = 0
    after_hunk = False  # the previous line ended a hunk (its counts are used up)
    while i < len(lines):
        line, number = lines[i], i + 1
        for pattern, what in _REFUSED:
            if pattern.match(line):
                raise refuse(
                    number,
                    what.format(line=line) + "; only changes to the text of Python files "
                    "can be applied to an installed vLLM",
                )
        mode = re.match(r"^(new file|deleted file) mode (\d+)$", line)
        if mode and mode.group(2) != _REGULAR_FILE:
            kind = _MODES.get(mode.group(2), f"a file of mode {mode.group(2)}")
            raise refuse(
                number,
                f"{line!r} makes or deletes {kind}; only regular Python files "
                f"(mode {_REGULAR_FILE}) can be patched",
            )
        git = _GIT_HEADER.match(line)
        if line.startswith("diff --git "):
            if not git:
                raise refuse(number, f"cannot read the two paths of {line!r} (quoted or spaced)")
            for raw in git.groups():
                tree_path(raw, number, path)
        if line.startswith("+++ ") or line.startswith("@@"):
            raise refuse(number, f"{line[:3]!r} with no '--- ' file header before it")
        if after_hunk and line[:1] in ("+", "-", " ") and not line.startswith("--- "):
            if line != "-- ":  # git format-patch's signature separator
                raise refuse(
                    number,
                    "a hunk line after its hunk is complete: the '@@' header counts "
                    "fewer lines than the hunk has; fix the header (or make the diff again)",
                )
        after_hunk = False
        if line.startswith("--- "):
            section, i = _section(lines, i, path, refuse)
            sections.append(section)
            after_hunk = True
            continue
        i += 1
    if not sections:
        raise PatchError(
            f"{path} is not a unified diff (no '--- '/'+++ ' file header with an "
            f"'@@ … @@' hunk found); make one with `git diff` or `diff -u`"
        )
    return sections


def _section(lines: list[str], i: int, path: Path, refuse) -> tuple[FileDiff, int]:
    """The file section whose `---` header is lines[i]; returns it and the next index."""
    start = i + 1
    if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
        raise refuse(start, "a '--- ' file header not followed by a '+++ ' one")
    old = tree_path(lines[i][4:], start, path)
    new = tree_path(lines[i + 1][4:], start + 1, path)
    if old is None and new is None:
        raise refuse(start, "both sides of the file header are /dev/null")
    i += 2
    hunks = []
    while i < len(lines) and lines[i].startswith("@@"):
        hunks.append(Hunk(lines[i], i + 1))
        i = _hunk_end(lines, i, refuse)
    if not hunks:
        raise refuse(start + 2, "a file header with no '@@ … @@' hunk after it")
    return FileDiff(old=old, new=new, line=start, hunks=tuple(hunks)), i


def _hunk_end(lines: list[str], i: int, refuse) -> int:
    """Index after the hunk whose header is lines[i], checking its lines against its counts."""
    header = _HUNK.match(lines[i])
    if not header:
        raise refuse(i + 1, f"{lines[i]!r} is not a hunk header ('@@ -A,B +C,D @@')")
    old_left = int(header.group(2)) if header.group(2) is not None else 1
    new_left = int(header.group(4)) if header.group(4) is not None else 1
    first = i + 1
    i += 1
    while old_left or new_left:
        if i >= len(lines):
            raise refuse(
                first,
                f"the hunk ends early: the file ends with {old_left} old and {new_left} new "
                f"line(s) of it still to come; fix the '@@' header's counts",
            )
        line = lines[i]
        kind = line[:1]
        if kind in (" ", ""):  # an empty line is an empty context line
            old_left, new_left = old_left - 1, new_left - 1
        elif kind == "-":
            old_left -= 1
        elif kind == "+":
            new_left -= 1
        elif kind != "\\":  # "\ No newline at end of file"
            raise refuse(
                i + 1,
                f"{line[:60]!r} inside the hunk at line {first}, which expects lines starting "
                f"with ' ', '-' or '+'; its '@@' header counts more lines than it has",
            )
        if old_left < 0 or new_left < 0:
            raise refuse(
                i + 1,
                f"the hunk at line {first} has more lines than its '@@' header counts",
            )
        i += 1
    while i < len(lines) and lines[i].startswith("\\"):
        i += 1
    return i


def tree_path(raw: str, number: int, path: Path) -> str | None:
    """A header's file name as `patch -p1` takes it, refused unless it stays in the tree."""
    name = raw.split("\t", 1)[0]
    if name == "/dev/null":
        return None

    def refuse(what: str) -> PatchError:
        return PatchError(f"{path}: line {number}: the path {name!r} {what}")

    if not name or name != name.strip() or any(c.isspace() for c in name):
        raise refuse("is empty or holds spaces; give plain a/… and b/… paths")
    if name.startswith('"'):
        raise refuse("is quoted (git quotes unusual names); only plain paths are read")
    if name.startswith("/"):
        raise refuse("is absolute; paths must be relative, like a/vllm/...")
    parts = name.split("/")
    if ".." in parts:
        raise refuse("has '..' and leaves the tree; paths must stay inside it")
    if any(part in ("", ".") for part in parts):
        raise refuse("has an empty or '.' component; give plain a/… and b/… paths")
    if len(parts) <= STRIP:
        raise refuse("has no a/ or b/ prefix for `patch -p1` to strip")
    return "/".join(parts[STRIP:])
