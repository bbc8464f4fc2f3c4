"""The kit's vLLM plugin made visible to every engine process, where the kit is not installed.

vLLM loads general plugins by entry point (``vllm.general_plugins``) in each of its processes:
the front end, the engine core (a process of its own under VLLM_ENABLE_V1_MULTIPROCESSING=1)
and each worker (tensor parallel > 1). That entry point exists only where the kit is
pip-installed. On a bare GPU host, and in the kit's own engine environments, the kit is a
tree on PYTHONPATH and `repro.engine.llm` registers the plugin in its own process only; a process
vLLM spawns would run without the CPU kernels and without the injected fault.

`expose_entry_point` writes a minimal distribution, the entry point and nothing else, into a
folder of its own and puts that folder and the kit's source on ``sys.path`` and
``PYTHONPATH``, which vLLM's processes inherit (spawned or forked). ``VLLM_PLUGINS`` is the
user's and is left alone: where it leaves the kit out, the workers' figures cannot be read
and the run comes out inconclusive (`repro.engine.llm`).
"""

from __future__ import annotations

import os
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path

from repro import KIT_SOURCE, __version__

GROUP = "vllm.general_plugins"
NAME = "repro_kit"
VALUE = "repro.vllm_plugin:register"
DIST = "repro_kit_plugin"

_exposed: Path | None = None


def kit_entry_point_visible() -> bool:
    """Whether ``importlib.metadata`` finds the kit's plugin entry point on ``sys.path``."""
    return any(ep.name == NAME and ep.value == VALUE for ep in entry_points(group=GROUP))


def write_distribution(folder: Path) -> Path:
    """Write ``DIST-VERSION.dist-info`` (METADATA, entry_points.txt) under `folder`."""
    info = folder / f"{DIST}-{__version__}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {__version__}\n",
        "entry_points.txt": f"[{GROUP}]\n{NAME} = {VALUE}\n",
    }
    for name, text in files.items():
        tmp = info / f".{name}.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, info / name)
    return folder


def _prepend(paths: list[str], env_value: str | None) -> str:
    entries = [p for p in (env_value or "").split(os.pathsep) if p]
    return os.pathsep.join([p for p in paths if p not in entries] + entries)


def expose_entry_point() -> Path | None:
    """Make the entry point visible here and in every process started from here; return the
    folder written (None where the kit's entry point was already visible)."""
    global _exposed
    kit = str(KIT_SOURCE)
    # Spawned children get sys.path from multiprocessing, other children only PYTHONPATH.
    os.environ["PYTHONPATH"] = _prepend([kit], os.environ.get("PYTHONPATH"))
    if _exposed is None and not kit_entry_point_visible():
        _exposed = write_distribution(Path(tempfile.mkdtemp(prefix="repro-kit-entry-point-")))
    if _exposed is not None:
        os.environ["PYTHONPATH"] = _prepend([kit, str(_exposed)], os.environ.get("PYTHONPATH"))
        if str(_exposed) not in sys.path:
            sys.path.append(str(_exposed))
    return _exposed
