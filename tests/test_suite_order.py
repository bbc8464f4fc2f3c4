"""The suite's file order: the longest measured files first (repro.engine.suite_order)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import FILE_SECONDS

from repro.engine import suite_order

TESTS = Path(__file__).resolve().parent


def _names(items):
    return [f"{file}::{test}" for file, test in items]


def test_the_longest_files_come_first_and_a_files_tests_keep_their_order():
    items = [("a.py", "1"), ("b.py", "1"), ("a.py", "2"), ("c.py", "1"), ("b.py", "2")]
    ordered = suite_order.in_order(items, {"a.py": 5.0, "b.py": 50.0}, file_of=lambda i: i[0])
    # b (50 s), a (5 s), then c (never measured) where it was collected.
    assert _names(ordered) == ["b.py::1", "b.py::2", "a.py::1", "a.py::2", "c.py::1"]


def test_unmeasured_files_keep_the_collection_order_after_the_measured_ones():
    items = [("new2.py", "x"), ("old.py", "x"), ("new1.py", "x")]
    ordered = suite_order.in_order(items, {"old.py": 0.1}, file_of=lambda i: i[0])
    assert _names(ordered) == ["old.py::x", "new2.py::x", "new1.py::x"]
    assert suite_order.in_order(items, {}, file_of=lambda i: i[0]) == items


def test_the_seconds_come_from_a_junit_report(tmp_path):
    report = tmp_path / "report.xml"
    report.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="t1" time="1.25"/>'
        '<testcase classname="tests.test_a" name="t2" time="2.5"/>'
        '<testcase classname="tests.test_b.TestGroup" name="t" time="10"/>'
        '<testcase classname="" name="collect error" time="3"/>'
        "</testsuite></testsuites>"
    )
    seconds = suite_order.seconds_from_junit(report)
    assert seconds == {"test_b.py": 10.0, "test_a.py": 3.8}
    assert list(seconds) == ["test_b.py", "test_a.py"]  # longest first, as the file reads
    assert suite_order.main([str(report)]) == 0
    assert suite_order.main([]) == 2


def test_a_report_that_is_missing_or_not_xml_is_one_line_and_exit_2(tmp_path, capsys):
    assert suite_order.main([str(tmp_path / "none.xml")]) == 2
    (bad := tmp_path / "bad.xml").write_text("<testsuites")
    assert suite_order.main([str(bad)]) == 2
    said = capsys.readouterr()
    assert said.out == ""
    lines = said.err.splitlines()
    assert len(lines) == 2 and all(line.startswith("error: expected a JUnit XML") for line in lines)
    assert "none.xml" in lines[0] and "bad.xml" in lines[1]


def test_a_missing_figures_file_orders_nothing(tmp_path):
    assert suite_order.read_seconds(tmp_path / "none.json") == {}


def test_the_shipped_figures_name_test_files_of_this_suite():
    seconds = suite_order.read_seconds(FILE_SECONDS)
    assert seconds, "tests/file_seconds.json is empty"
    gone = [name for name in seconds if not (TESTS / name).is_file()]
    assert gone == [], f"figures for files that no longer exist: {gone}"
    assert all(value >= 0 for value in seconds.values())
    json.loads(FILE_SECONDS.read_text())  # plain JSON, as the module writes it


def test_this_session_runs_in_that_order(request):
    """The conftest's hook ordered this very collection (under xdist each worker collects it
    the same way, and the scheduler hands out whole files in that order)."""
    items = request.session.items
    expected = suite_order.in_order(
        items, suite_order.read_seconds(FILE_SECONDS), file_of=lambda item: item.path.name
    )
    assert [i.nodeid for i in items] == [i.nodeid for i in expected]
