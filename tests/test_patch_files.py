"""The shipped diffs stay usable and accounted for: the fixes (containers/patches/) and the
reverts that take a fix back out (containers/reverts/, positive controls).

Each must pass the kit's own Python-only check, have well-formed hunks, name the upstream
PR it comes from (or takes out) in its header, and match the sha256 its folder's README
lists (runs record that sha256, so a silent edit would make artifacts name a patch nobody
can find). Offline and fast: nothing is downloaded and no vLLM is needed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from repro.core.atomicio import sha256_file
from repro.venv import patching

CONTAINERS = Path(__file__).resolve().parent.parent / "containers"
FOLDERS = (CONTAINERS / "patches", CONTAINERS / "reverts")
PATCHES = [p for folder in FOLDERS for p in sorted(folder.glob("*.diff"))]
SHA256 = re.compile(r"\b[0-9a-f]{64}\b")
PR_URL = re.compile(r"https://github\.com/vllm-project/vllm/pull/(\d+)")
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def header(path: Path) -> str:
    """The comment block before the diff proper (the first `--- ` line), which patch skips."""
    lines = path.read_text(encoding="utf-8").splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("--- "))
    return "\n".join(lines[:end])


def readme_rows(folder: Path) -> dict[str, str]:
    """The folder's README table rows keyed by the diff file name they list."""
    rows = {}
    for line in (folder / "README.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\|\s*`([^`]+\.diff)`\s*\|", line)
        if m:
            assert m.group(1) not in rows, f"README lists {m.group(1)} twice"
            rows[m.group(1)] = line
    return rows


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_each_folder_has_diffs_and_its_readme_lists_exactly_them(folder: Path):
    diffs = sorted(p.name for p in folder.glob("*.diff"))
    assert diffs, f"no *.diff in {folder}"
    assert sorted(readme_rows(folder)) == diffs


@pytest.mark.parametrize("path", PATCHES, ids=lambda p: p.name)
def test_is_python_only_and_inside_vllm(path: Path):
    patching.check_python_only(path)
    assert patching.targets(path), f"{path.name} names no file"


@pytest.mark.parametrize("path", PATCHES, ids=lambda p: p.name)
def test_sha256_matches_the_readme(path: Path):
    row = readme_rows(path.parent)[path.name]
    listed = SHA256.findall(row)
    assert len(listed) == 1, f"README row for {path.name} should hold one sha256: {row}"
    assert listed[0] == sha256_file(path), (
        f"{path.name} changed without updating containers/{path.parent.name}/README.md "
        f"(now {sha256_file(path)})"
    )


@pytest.mark.parametrize("path", PATCHES, ids=lambda p: p.name)
def test_header_names_its_source_pr(path: Path):
    text = header(path)
    assert text.strip(), f"{path.name} has no header comment before the diff"
    assert all(line.startswith("#") or not line.strip() for line in text.splitlines()), (
        f"{path.name}: header lines must be '#' comments so patch and the kit ignore them"
    )
    if path.parent.name == "reverts" and "-defect-" in path.name:
        # A defect brought in by hand (a positive control no upstream revert gives) says so,
        # here and in its README row, and names no PR it would take out.
        assert not re.findall(r"-pr(\d+)-", path.name)
        assert "NOT a revert of an upstream PR" in text, path.name
        assert "| none" in readme_rows(path.parent)[path.name], path.name
        return
    (number,) = re.findall(r"-pr(\d+)-", path.name)
    assert f"PR #{number}" in text, f"{path.name}: the header should name upstream PR #{number}"
    # The README row points at the same PR as the file name and the header.
    assert f"#{number}" in readme_rows(path.parent)[path.name]
    if path.parent.name == "patches":
        # A fix links the PR it ports.
        assert set(PR_URL.findall(text)) == {number}, f"{path.name}: link PR #{number} only"


@pytest.mark.parametrize("path", PATCHES, ids=lambda p: p.name)
def test_hunks_are_well_formed(path: Path):
    """Each hunk's line counts match its header: a hand edit must not corrupt the diff."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("--- "))
    hunks = 0
    while i < len(lines):
        line = lines[i]
        m = HUNK.match(line)
        if not m:
            assert line.startswith(("--- a/", "+++ b/")), f"{path.name}:{i + 1}: {line!r}"
            i += 1
            continue
        hunks += 1
        old = int(m.group(2) or 1)
        new = int(m.group(4) or 1)
        i += 1
        while old or new:
            assert i < len(lines), f"{path.name}: hunk at {m.group(0)} is cut short"
            body = lines[i]
            if body.startswith("-"):
                old -= 1
            elif body.startswith("+"):
                new -= 1
            elif body.startswith(" ") or body == "":
                old -= 1
                new -= 1
            elif body.startswith("\\"):
                pass  # "\ No newline at end of file"
            else:
                pytest.fail(f"{path.name}:{i + 1}: unexpected line in hunk: {body!r}")
            assert old >= 0 and new >= 0, f"{path.name}: hunk at {m.group(0)} overruns"
            i += 1
    assert hunks, f"{path.name} has no hunk"
