"""`--repeat K` refused out of range, before any engine.

The real `--repeat 2` run (K run directories and one pooled line) is the stock cell of
test_matrix_repeats.py's matrix: one engine run serves both files' checks.
"""

from __future__ import annotations

import pytest

# run_kit: the kit with the engine environment's Python, as a user runs it.
pytestmark = pytest.mark.engine


def test_a_repeat_count_out_of_range_is_refused_before_any_engine(run_kit, tmp_path):
    proc = run_kit("run", "--repeat", "0", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert "expected 1 to 50 repeats, found 0" in proc.stderr
    assert not any(tmp_path.iterdir())
