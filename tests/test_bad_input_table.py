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

# Cases the kit does not yet get right, and the part of it whose change they wait for. Each is
# a strict xfail: when the fix lands the case passes, the xfail fails as XPASS, and the entry
# is removed here.
LANES = {
    "jsonread": "JSON read through the one hardened loader (repro.jsonread)",
    "installset": "the install set's full manifest check, --replace and targets",
    "inputs": "--override keys and types, and run --model's config, checked before anything",
    "patch": "diffs parsed for what they are; engine-env releases; matrix --dry-run's checks",
}
PENDING = {
    "kit-digest-deep-json": "jsonread",
    "run-model-deep-config": "jsonread",
    "import-image-deep-record": "jsonread",
    "run-model-index-a-list": "jsonread",
    "validate-nan": "jsonread",
    "validate-infinity": "jsonread",
    "validate-duplicate-keys": "jsonread",
    "installset-replace-keeps-a-file-the-user-added": "installset",
    "installset-verify-deep-manifest": "installset",
    "installset-install-target-in-proc": "installset",
    "installset-verify-manifest-a-directory": "installset",
    "installset-verify-parts-a-file": "installset",
    "installset-verify-edited-wheel-version": "installset",
    "installset-verify-sha256sums-mismatch": "installset",
    "installset-verify-unknown-field": "installset",
    "installset-verify-duplicate-key": "installset",
    "installset-verify-part-size-nan": "installset",
    "installset-install-package-folder-deleted": "installset",
    "run-override-typo": "inputs",
    "run-override-unknown-key": "inputs",
    "run-override-wrong-type": "inputs",
    "run-model-mtp-count-true": "inputs",
    "run-model-safetensors-header-a-list": "inputs",
    "run-model-tp-zero": "inputs",
    "conditions-profile-a-list": "patch",
    "conditions-override-a-date": "patch",
    "matrix-dry-run-vllm-not-a-release": "patch",
    "matrix-dry-run-patch-missing": "patch",
    "matrix-dry-run-patch-a-shared-library": "patch",
    "matrix-dry-run-patch-not-a-diff": "patch",
    "matrix-dry-run-vllm-twice": "patch",
    "matrix-dry-run-unknown-release": "patch",
    "matrix-dry-run-name-with-newline": "patch",
    "engine-env-unknown-release": "patch",
    "engine-env-empty-release": "patch",
    "engine-env-patch-a-directory": "patch",
    "patch-binary-section": "patch",
    "patch-symlink-entry": "patch",
    "patch-rename-out-of-tree": "patch",
}


def _param(case):
    if case.id not in PENDING:
        return pytest.param(case.id, id=case.id)
    lane = PENDING[case.id]
    reason = f"not refused yet: waits for {lane} ({LANES[lane]})"
    return pytest.param(case.id, id=case.id, marks=pytest.mark.xfail(strict=True, reason=reason))


@pytest.fixture(scope="module")
def results(request):
    """The selected cases of this module, run together (three subprocesses at a time)."""
    wanted = {
        item.callspec.params["case_id"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    return run_all([c for c in CASES if c.id in wanted])


@pytest.mark.parametrize("case_id", [_param(c) for c in CASES])
def test_case_keeps_every_promise(case_id, results):
    result = results[case_id]
    problems = result.problems()
    assert not problems, (
        f"{result.command}\n  exit {result.exit}: {result.first_line}\n  "
        + "\n  ".join(problems)
        + f"\n--- stderr (end) ---\n{result.stderr[-2000:]}"
    )


def test_the_pending_cases_are_cases_of_a_known_lane():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "two cases share an id"
    assert set(PENDING) <= set(ids)
    assert set(PENDING.values()) <= set(LANES)


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
