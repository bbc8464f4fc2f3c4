"""The engine's OpenMP pool follows the cores free when it starts (repro.engine.cpu_threads)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from repro.engine import cpu_threads

BUSY_LOOP = (
    "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); print('spinning', flush=True)\n"
    "while True: pass"
)


def test_every_core_free_sets_nothing():
    choice = cpu_threads.choose({}, allowed=[0, 1], shares={0: 0.02, 1: 0.1})
    assert choice.chosen_by == "default" and choice.variables == {} and choice.threads == 2
    env = {"PATH": "/usr/bin"}
    cpu_threads.apply(choice, env)
    assert env == {"PATH": "/usr/bin"}, "a solo run keeps OpenMP's defaults"


def test_a_busy_core_is_left_to_its_process():
    choice = cpu_threads.choose({}, allowed=[0, 1, 2, 3], shares={0: 0.97, 1: 0.1, 2: 0.6, 3: 0})
    assert choice.busy_cpus == [0, 2] and choice.threads == 2
    env: dict[str, str] = {}
    cpu_threads.apply(choice, env)
    assert env == {"OMP_NUM_THREADS": "2"}
    assert choice.as_dict()["busy_share"] == {"0": 0.97, "1": 0.1, "2": 0.6, "3": 0.0}


def test_every_core_busy_still_gives_one_thread():
    choice = cpu_threads.choose({}, allowed=[0, 1], shares={0: 1.0, 1: 0.9})
    assert choice.threads == 1 and choice.variables == {"OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("name", cpu_threads.USER_OPENMP_VARIABLES)
def test_the_users_openmp_setting_wins(name):
    choice = cpu_threads.choose({name: "3"}, allowed=[0, 1], shares={0: 1.0, 1: 1.0})
    assert choice.chosen_by == "user" and choice.variables == {name: "3"}
    env = {name: "3"}
    cpu_threads.apply(choice, env)
    assert env == {name: "3"}


def test_no_per_core_figures_is_named_not_guessed(tmp_path):
    missing = tmp_path / "stat"
    assert cpu_threads.sample_busy_share([0], 0.01, stat=missing) is None
    odd = tmp_path / "odd"
    odd.write_text("cpu  1 2 3 4\nintr 5\n")  # no per-core lines (some containers)
    assert cpu_threads.sample_busy_share([0], 0.01, stat=odd) is None


def test_a_real_busy_loop_is_seen_on_its_core():
    """This machine's /proc/stat: a process spinning on the last allowed core makes that core
    busy and the engine gets one thread fewer."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two cores")
    target = allowed[-1]
    spinner = subprocess.Popen(
        [sys.executable, "-c", BUSY_LOOP, str(target)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert spinner.stdout is not None and spinner.stdout.readline() == "spinning\n"
        choice = cpu_threads.choose({}, allowed=allowed)
    finally:
        spinner.kill()
        spinner.wait()
    assert choice.busy_share is not None and choice.busy_share[str(target)] >= 0.9, choice
    assert target in choice.busy_cpus
    assert choice.threads is not None and choice.threads <= len(allowed) - 1


def test_the_report_says_what_was_chosen_and_why():
    from types import SimpleNamespace

    from repro.evidence import report

    kit = cpu_threads.choose({}, allowed=[0, 1], shares={0: 0.1, 1: 0.99}).as_dict()
    user = cpu_threads.choose({"OMP_NUM_THREADS": "2"}, allowed=[0, 1]).as_dict()
    run = SimpleNamespace(
        documents={
            "cold-race": {"engine": {"cpu_threads": kit}},
            "multi-turn": {"engine": {"cpu_threads": user}},
        }
    )
    assert report.cpu_threads_text(run) == (
        "cold-race: 1 of 2 (busy at start: 1); multi-turn: the user's OMP_NUM_THREADS=2"
    )


GIB = 1024**3


def test_a_matrix_runs_one_engine_per_free_core_as_memory_allows():
    two = cpu_threads.engines_at_once(4, allowed=[0, 1], shares={0: 0, 1: 0}, memory=24 * GIB)
    assert (two.at_once, two.threads_each) == (2, 1), two
    # One core taken by another process: one cell at a time, OpenMP left to the engine.
    busy = cpu_threads.engines_at_once(4, allowed=[0, 1], shares={0: 1, 1: 0}, memory=24 * GIB)
    assert (busy.at_once, busy.threads_each) == (1, None), busy
    # Memory for one engine only, or memory that cannot be read: one at a time.
    for memory in (5 * GIB, None):
        one = cpu_threads.engines_at_once(4, allowed=[0, 1, 2, 3], shares={}, memory=memory)
        assert one.at_once == 1, one
    # Never more engines than cells.
    assert cpu_threads.engines_at_once(1, allowed=[0, 1], shares={}, memory=24 * GIB).at_once == 1


def test_the_users_count_splits_the_free_cores():
    asked = cpu_threads.engines_at_once(8, requested=2, allowed=[0, 1, 2, 3], shares={})
    assert (asked.at_once, asked.threads_each) == (2, 2) and "--cells-at-once 2" in asked.why


def test_a_matrix_share_is_the_engines_pool_and_is_recorded():
    choice = cpu_threads.choose({cpu_threads.SHARE_ENV: "1"}, allowed=[0, 1], shares={})
    assert choice.chosen_by == "matrix" and choice.variables == {"OMP_NUM_THREADS": "1"}
