"""Ways a run can fail to be evidence, each its own exception.

Upstream's reproducer learned that a run which cannot gather evidence must never look green:
each such case raises its own exception, and the runner turns it into a named `inconclusive`
verdict (with the gate that stopped it) or an `error` record. None of them is ever `clean`.
"""

from __future__ import annotations


class ReproError(Exception):
    """Base class of every failure the kit reports by name."""


class NotEvidence(ReproError):
    """The run finished but cannot grade the cache: verdict `inconclusive` at `gate`."""

    gate: str = ""


class GeometryUnsupported(NotEvidence):
    """The engine's block geometry does not allow the arm's trigger pattern."""

    gate = "geometry"


class ControlQualityFailure(NotEvidence):
    """The APC-off control is no yardstick (cannot answer, or its noise floor is too high)."""

    gate = "control_quality"


class NotEngaged(NotEvidence):
    """Prefix caching or speculative decoding did not engage (zero hits, zero drafts)."""

    gate = "engagement"


class LivenessFailure(NotEvidence):
    """After the arm, the prefix cache no longer produced hits: a quiet cache is no cure."""

    gate = "liveness"


class EngineBootError(ReproError):
    """The engine did not start for a reason other than unsupported geometry."""


class HardwareUnavailable(ReproError):
    """The profile needs hardware this machine does not have (refused before any engine)."""


class PatchError(ReproError):
    """A --patch file does not apply to the installed vLLM."""


class ValidationUnavailable(ReproError):
    """Artifacts cannot be fully validated in this Python (a checker library is missing)."""
