"""The kit's exceptions: every failure it reports by name.

Upstream's reproducer learned that a run which cannot gather evidence must never look green.
A run stopped before its first wave raises `NotEvidence` (`GeometryUnsupported`: the engine's
block geometry cannot make the arm's trigger), which the runner records as `inconclusive` at
that gate. The gates decided from a finished run's figures (control quality, engagement,
corruption, liveness) raise nothing: `repro.grading.grade` returns the verdict with the gate
that stopped it. Any other failure leaves an `error` record. None of them is ever `clean`.
"""

from __future__ import annotations


class ReproError(Exception):
    """Base class of every failure the kit reports by name."""


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
