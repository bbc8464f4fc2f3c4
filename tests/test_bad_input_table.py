"""Issue 31's table, case by case: every bad input refused by name (exit 2 for bad input, 1 for
a failed check), no traceback, no file of the user's changed, nothing made; every good-input
control still works. The cases and their checks are tests/bad_input_cases.py; `python
tests/bad_input_cases.py --table` prints the same runs as the table.

The cases run once per module, a few subprocesses at a time (each case is one `python -m
repro …` with no engine), and each test reads its own case's result.
"""

from __future__ import annotations

import pytest
from bad_input_cases import CASES, run_all, table


@pytest.fixture(scope="module")
def results(request):
    """The selected cases of this module, run together (three subprocesses at a time)."""
    wanted = {
        item.callspec.params["case_id"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    return run_all([c for c in CASES if c.id in wanted])


@pytest.mark.parametrize("case_id", [c.id for c in CASES])
def test_case_keeps_every_promise(case_id, results):
    result = results[case_id]
    problems = result.problems()
    assert not problems, (
        f"{result.command}\n  exit {result.exit}: {result.first_line}\n  "
        + "\n  ".join(problems)
        + f"\n--- stderr (end) ---\n{result.stderr[-2000:]}"
    )


def test_every_case_has_its_own_id():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "two cases share an id"


def test_the_table_has_a_row_per_case_and_hides_the_temporary_folder():
    from bad_input_cases import Result

    fake = [
        Result(c, ["validate", "/tmp/x/f.json"], 1, "", "error: /tmp/x/f.json: no", root="/tmp/x")
        for c in CASES
    ]
    rows = table(fake).splitlines()
    assert len(rows) == 2 + len(CASES)
    assert all("/tmp/x" not in row for row in rows)
    assert rows[2].endswith("| 1 | error: T/f.json: no |")
