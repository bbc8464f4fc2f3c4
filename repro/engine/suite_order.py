"""Which test files the suite's workers get first: the longest, by the seconds each file took in
a measured run, so that no long file starts last and runs alone while the other workers idle.

`nox -s tests` runs pytest-xdist with `--dist loadfile`: a worker takes a whole file at a
time, in the order the files are collected. xdist's own default (`--loadscope-reorder`) puts
the files with the most tests first, which put the files of a few long engine tests last: in
a CI run from nothing one worker ran alone for its last 100 s
(docs/measured.md, §The test suite). So the suite turns that off
(`repro.engine.suite_workers.DISTRIBUTION`) and its conftest orders the files here, longest
first; a file with no measured figure (a new one) comes after the measured ones, in
collection order. Within a file the order stays as written.

The figures are tests/file_seconds.json, made from a JUnit report of a whole run:
`python -m repro.engine.suite_order REPORT.xml > tests/file_seconds.json`.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

Item = TypeVar("Item")


def read_seconds(path: Path) -> dict[str, float]:
    """The measured seconds of each test file, by file name (none where the file is absent)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    return {str(name): float(seconds) for name, seconds in json.loads(text).items()}


def in_order(items: Sequence[Item], seconds: Mapping[str, float], file_of: Callable) -> list[Item]:
    """`items` with their files' longest first (unmeasured files last, as collected); a file's
    own items keep their order and stay together."""
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(file_of(item), len(first_seen))

    def key(item) -> tuple[bool, float, int]:
        name = file_of(item)
        measured = name in seconds
        return (not measured, -seconds.get(name, 0.0), first_seen[name])

    return sorted(items, key=key)  # stable: a file's items keep their order


def seconds_from_junit(report: Path) -> dict[str, float]:
    """Each test file's seconds in a JUnit report (setup, call and teardown of its tests)."""
    totals: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        # pytest writes `tests.test_x` (a class inside: `tests.test_x.Class`).
        parts = case.get("classname", "").split(".")
        name = next((f"{p}.py" for p in parts if p.startswith("test_")), None)
        if name is not None:
            totals[name] = totals.get(name, 0.0) + float(case.get("time") or 0.0)
    return {name: round(totals[name], 1) for name in sorted(totals, key=lambda n: -totals[n])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m repro.engine.suite_order REPORT.xml", file=sys.stderr)
        return 2
    try:
        seconds = seconds_from_junit(Path(argv[0]))
    except (OSError, ET.ParseError) as exc:
        print(
            f"error: expected a JUnit XML report (pytest --junitxml=FILE), could not read "
            f"{argv[0]}: {exc}",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(seconds, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
