"""Evidence: the run artifact a run writes, and everything that reads it back.

Each module imports only those above it in this list (``tests/test_layout.py`` fails on a
circle):

``runs``      a run as the evidence commands see it (directory or bundled); ``EvidenceError``
``verdicts``  a recorded verdict re-derived from its figures (``regrade``, ``check_verdict``)
``record``    an arm's result turned into the run-artifact document (the runner's side)
``report``    GitHub Markdown for runs; ``summary``: the table printed after a run
``archive``   the bundle's canonical tar + gzip bytes, and reading them safely
``bundle``    one deterministic ``.tar.gz`` of runs
``contents``  the checks on a bundle's files once read, and ``VerifyResult``
``verify``    a received bundle checked in full; ``load_runs`` for directories and bundles
``compare``   two labs' runs side by side

The runner builds documents through this package (``evidence.base_document`` …); those
names, and ``regrade``, are the package's own.
"""

from repro.evidence.record import (
    base_document,
    engine_section,
    fill_result,
    ladder_section,
    verdict_section,
)
from repro.evidence.verdicts import regrade, waves_from_document

__all__ = [
    "base_document",
    "engine_section",
    "fill_result",
    "ladder_section",
    "regrade",
    "verdict_section",
    "waves_from_document",
]
