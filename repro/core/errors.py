"""The kit's exceptions: every failure it reports by name.

Upstream's reproducer learned that a run which cannot gather evidence must never look green.
A run stopped before its first wave raises `NotEvidence` (`GeometryUnsupported`: the engine's
block geometry cannot make the arm's trigger), which the runner records as `inconclusive` at
that gate. The gates decided from a finished run's figures (control quality, engagement,
corruption, liveness) raise nothing: `repro.grading.grade` returns the verdict with the gate
that stopped it. Any other failure leaves an `error` record. None of them is ever `clean`.

`python -m repro` turns a `ReproError` into its message and an exit code (repro.cli.main):
2 for input the command refuses (the default), 1 for a check that failed; `log_path`, where
an error has one, is printed after the message (`full log: PATH`).
"""

from __future__ import annotations

from pathlib import Path


class ReproError(Exception):
    """Base class of every failure the kit reports by name.

    `exit_code`: 2, bad input the user can correct (a subclass for a failed check sets 1).
    `log_path`: the log that holds the whole story, where there is one.
    """

    exit_code: int = 2
    log_path: Path | None = None

    def __init__(self, *args: object, log_path: Path | None = None) -> None:
        super().__init__(*args)
        if log_path is not None:
            self.log_path = log_path

    def with_context(self, line: str) -> ReproError:
        """The same refusal with one more line of context, its exit code and log kept."""
        more = ReproError(f"{self}\n{line}", log_path=self.log_path)
        more.exit_code = self.exit_code
        return more


class NotEvidence(ReproError):
    """The run cannot grade the cache: verdict `inconclusive` at `gate`, never `clean`."""

    gate: str = ""


class GeometryUnsupported(NotEvidence):
    """The engine's block geometry does not allow the arm's trigger pattern."""

    gate = "geometry"


class FiguresUnreadable(NotEvidence):
    """A figure the grading needs could not be read from the engine (e.g. from its worker
    processes when the engine core runs in a process of its own): inconclusive at `gate`."""

    def __init__(self, gate: str, message: str) -> None:
        super().__init__(message)
        self.gate = gate


class EngineBootError(ReproError):
    """The engine did not start for a reason other than unsupported geometry."""


class HardwareUnavailable(ReproError):
    """The profile needs hardware this machine does not have (refused before any engine)."""


class PatchError(ReproError):
    """A --patch file does not apply to the installed vLLM."""


class ValidationUnavailable(ReproError):
    """Artifacts cannot be fully validated in this Python (a checker library is missing)."""
