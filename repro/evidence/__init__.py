"""Evidence: the run artifact a run writes, and everything that reads it back.

Each module imports only those above it in this list (``tests/test_layout.py`` fails on a
circle):

``runs``      a run as the evidence commands see it (directory or bundled); ``EvidenceError``
``verdicts``  a recorded verdict re-derived from its figures (``regrade``, ``check_verdict``)
``report``    GitHub Markdown for runs; ``summary``: the table printed after a run
``archive``   the bundle's canonical tar + gzip bytes, and reading them safely
``bundle``    one deterministic ``.tar.gz`` of runs
``contents``  the checks on a bundle's files once read, and ``VerifyResult``
``verify``    a received bundle checked in full; ``load_runs`` for directories and bundles
``compare``   two labs' runs side by side

This is the read side: it imports nothing that imports vLLM, the engine or the arms, so a
receiver checks evidence without them (``tests/test_evidence_standalone.py``). The runner
builds documents with ``repro.arms.record``; ``regrade`` and ``verdict_section`` are the
package's own.
"""

from repro.evidence.verdicts import regrade, verdict_section, waves_from_document

__all__ = ["regrade", "verdict_section", "waves_from_document"]
