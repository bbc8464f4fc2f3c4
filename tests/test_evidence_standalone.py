"""The read side stands alone: a receiver checks evidence without vLLM, the engine or the arms.

`repro.evidence` (verify, report, compare, bundle) is imported in a fresh interpreter where
vLLM, torch and transformers cannot be imported; none of the kit's run-side modules may be
loaded on the way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import importlib.abc, json, sys

class Unimportable(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("vllm", "torch", "transformers"):
            raise ImportError(f"{name} is made unimportable by the test")

sys.meta_path.insert(0, Unimportable())
import repro.evidence.verify, repro.evidence.report, repro.evidence.compare
import repro.evidence.bundle, repro.evidence.verdicts
print(json.dumps(sorted(m for m in sys.modules if m.startswith("repro"))))
"""

# The run side: the engine package and the arms that drive it. `repro.arms.prompts` and
# `repro.arms.geometry` are pure (the evidence side re-derives sizes with them), and so is
# `repro.engine.process_vars`, a table of variable names the artifact's checks read.
PURE = {"repro.engine", "repro.engine.process_vars"}
RUN_SIDE = (
    "repro.engine",
    "repro.arms.common",
    "repro.arms.cold_race",
    "repro.arms.multi_turn",
    "repro.arms.record",
    "repro.runner",
    "repro.vllm_plugin",
)


def test_evidence_imports_without_vllm_the_engine_or_the_arms():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.splitlines()[-1])
    assert "repro.evidence.verify" in loaded  # the probe really imported the read side
    assert [m for m in loaded if m.startswith(RUN_SIDE) and m not in PURE] == []
