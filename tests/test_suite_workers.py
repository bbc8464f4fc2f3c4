"""The test suite's workers and each one's engine threads (repro.engine.suite_workers), and the
share each worker's engines keep to (repro.engine.cpu_threads.CAP_ENV)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from repro.engine import cpu_threads, suite_workers

GIB = 1024**3
QUIET = {0: 0.02, 1: 0.1}
CAP = cpu_threads.CAP_ENV


def stat_text(*cores: tuple[int, int]) -> str:
    """A /proc/stat with (busy, idle) jiffies per core."""
    lines = ["cpu  1 2 3 4 5 6 7 8"]
    lines += [f"cpu{i} {busy} 0 0 {idle} 0 0 0 0" for i, (busy, idle) in enumerate(cores)]
    return "\n".join([*lines, "intr 1"]) + "\n"


def test_one_worker_per_free_core_and_one_more_each_with_its_share():
    three = suite_workers.choose([], {}, allowed=[0, 1], shares=QUIET, memory=22 * GIB)
    assert (three.workers, three.threads_each) == (3, 1), three
    assert three.xdist_args == ["-n", "3", "--dist", "loadfile", "--no-loadscope-reorder"]
    assert three.env == {CAP: "1"}
    assert three.line() == (
        "3 pytest worker(s), 1 engine thread(s) each (2 of 2 core(s) free, memory for 5)"
    )
    eight = suite_workers.choose(
        [], {}, allowed=list(range(8)), shares={c: 0.0 for c in range(8)}, memory=64 * GIB
    )
    assert (eight.workers, eight.threads_each) == (9, 1), eight


def test_memory_bounds_the_workers_and_the_free_cores_are_split_among_them():
    cores = list(range(8))
    few = suite_workers.choose([], {}, allowed=cores, shares={}, memory=9 * GIB)
    assert (few.workers, few.threads_each) == (2, 4), few
    for memory in (3 * GIB, None):  # memory for none, or memory unread: one process
        one = suite_workers.choose([], {}, allowed=cores, shares={}, memory=memory)
        assert (one.workers, one.threads_each, one.xdist_args) == (1, None, []), one
        assert one.env == {}


def test_a_busy_core_is_left_out_of_the_count(tmp_path):
    """From a real /proc/stat format: core 0 was busy over the sample, core 1 idle."""
    before, after = tmp_path / "before", tmp_path / "after"
    before.write_text(stat_text((100, 100), (100, 100)))
    after.write_text(stat_text((190, 110), (105, 195)))
    reads = iter([before.read_text(), after.read_text()])

    class Stat:
        def read_text(self):
            return next(reads)

    shares = cpu_threads.sample_busy_share([0, 1], 0, stat=Stat())
    assert shares == {0: 0.9, 1: 0.05}
    busy = suite_workers.choose([], {}, allowed=[0, 1], shares=shares, memory=22 * GIB)
    assert (busy.workers, busy.threads_each) == (2, 1), busy
    assert busy.why.startswith("1 of 2 core(s) free")
    # Every core busy: one free core is still counted, and one worker more.
    worst = suite_workers.choose([], {}, allowed=[0, 1], shares={0: 1, 1: 1}, memory=22 * GIB)
    assert (worst.workers, worst.threads_each) == (2, 1), worst


def test_the_users_count_wins_and_splits_the_free_cores():
    for args in (["-n", "3"], ["-n3"], ["--numprocesses", "3"], ["--numprocesses=3"]):
        named = suite_workers.choose(
            [*args, "tests"], {}, allowed=[0, 1], shares=QUIET, memory=22 * GIB
        )
        assert (named.workers, named.threads_each, named.xdist_args) == (3, 1, []), args
        assert named.env == {CAP: "1"}
    wide = suite_workers.choose(["-n", "2"], {}, allowed=list(range(8)), shares={}, memory=None)
    assert (wide.workers, wide.threads_each) == (2, 4)
    auto = suite_workers.choose(["-n", "auto"], {}, allowed=[0, 1, 2, 3], shares={})
    assert auto.workers == 4
    env = {suite_workers.WORKERS_ENV: "3"}
    by_env = suite_workers.choose([], env, allowed=[0, 1], shares=QUIET, memory=22 * GIB)
    assert by_env.xdist_args == ["-n", "3", *suite_workers.DISTRIBUTION]
    assert by_env.threads_each == 1
    assert by_env.why.startswith("REPRO_TEST_WORKERS=3")


def test_arguments_without_a_count_run_as_given_in_one_process():
    given = suite_workers.choose(["-k", "tiny"], {}, allowed=[0, 1], shares=QUIET)
    assert (given.workers, given.threads_each, given.xdist_args) == (1, None, [])


def test_a_share_the_user_set_is_kept():
    kept = suite_workers.choose([], {CAP: "2"}, allowed=[0, 1], shares=QUIET, memory=22 * GIB)
    assert kept.threads_each == 2 and kept.env == {CAP: "2"}


def test_the_module_prints_one_json_line_for_the_noxfile():
    done = subprocess.run(
        [sys.executable, "-m", "repro.engine.suite_workers", "-n", "2", "-k", "x"],
        capture_output=True,
        text=True,
        check=True,
    )
    (line,) = done.stdout.splitlines()
    choice = json.loads(line)
    assert choice["xdist_args"] == [] and choice["line"].startswith("2 pytest worker(s)")


# --- an engine keeps to its worker's share ----------------------------------------------------


def test_an_engine_takes_no_more_than_its_share_and_says_so():
    capped = cpu_threads.choose({CAP: "1"}, allowed=[0, 1], shares=QUIET)
    assert capped.chosen_by == "kit" and capped.variables == {"OMP_NUM_THREADS": "1"}
    assert capped.busy_cpus == [] and capped.busy_share == {"0": 0.02, "1": 0.1}
    assert capped.share_cap == 1
    # The sample still counts: a busy core can leave fewer than the share.
    fewer = cpu_threads.choose({CAP: "3"}, allowed=[0, 1, 2, 3], shares={0: 1, 1: 1, 2: 0.9})
    assert fewer.threads == 1 and fewer.busy_cpus == [0, 1, 2]
    # A share as wide as the cores leaves OpenMP's default; the user's setting still wins.
    wide = cpu_threads.choose({CAP: "2"}, allowed=[0, 1], shares=QUIET)
    assert wide.chosen_by == "default" and wide.variables == {}
    user = cpu_threads.choose({CAP: "1", "OMP_NUM_THREADS": "2"}, allowed=[0, 1], shares=QUIET)
    assert user.chosen_by == "user" and user.variables == {"OMP_NUM_THREADS": "2"}
    # No per-core figures: the share alone bounds the pool.
    unread = cpu_threads.choose({CAP: "1"}, allowed=[0, 1], shares=None)
    assert unread.threads == 1 and unread.variables == {"OMP_NUM_THREADS": "1"}


def test_a_capped_choice_is_a_valid_record_and_reads_in_the_report():
    from types import SimpleNamespace

    import jsonschema

    from repro.artifact import load_schema
    from repro.evidence import report

    choice = cpu_threads.choose({CAP: "1"}, allowed=[0, 1], shares=QUIET).as_dict()
    schema = load_schema("run-artifact")["properties"]["engine"]["properties"]["cpu_threads"]
    jsonschema.validate(choice, schema)
    run = SimpleNamespace(documents={"cold-race": {"engine": {"cpu_threads": choice}}})
    assert report.cpu_threads_text(run) == "cold-race: 1 of 2 (busy at start: none; its share: 1)"


def test_a_matrix_in_a_worker_splits_the_workers_share():
    inside = cpu_threads.engines_at_once(4, allowed=[0, 1], shares={}, memory=24 * GIB, cap=1)
    assert (inside.at_once, inside.threads_each) == (1, None), inside
    assert "its share: REPRO_ENGINE_CPU_CAP=1" in inside.why


@pytest.mark.parametrize("share", ["1", None])
def test_a_container_engine_gets_the_hosts_share(share):
    from repro.containers import launch

    host = {CAP: share} if share else {}
    assert launch.shared_cores_environment(host) == host
