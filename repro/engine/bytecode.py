"""Where an engine process keeps Python's byte code, on a host that forbids writing it.

Python compiles a module's source at every import unless a `.pyc` of it is at hand. The kit's
engine environments and images are installed with byte code (`repro.venv.installer`). The
lent GPU hosts set ``PYTHONDONTWRITEBYTECODE=1`` and ship torch without byte code, and the
install-set tree that brings vLLM has none either (`repro.installset.install`): there every
engine process compiled torch, vLLM and transformers again, and vLLM's import took 17 s
instead of 9.3 s (docs/measured.md, §GPU hosts).

So where this Python's torch has no byte code and the host forbids writing it, the engine
process writes its byte code under a folder of the kit's cache instead
(``PYTHONPYCACHEPREFIX``): no folder of the host's is written, the first engine compiles, the
later ones read. Keyed on torch, the largest of an engine's imports and always the host's
own on a bare host: where torch has byte code beside it, the prefix (under which Python looks
nowhere else) makes the first engine compile torch again, which a few engines on one tree do
not win back (the bare-host matrix test of three engines took 220 s that way against 170 s
before, one CI run each on the 2-core build machine).
A prefix the user set stands, and nothing changes where Python may write its byte code.
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path

from repro.venv.engine_venvs import cache_root

PREFIX_ENV = "PYTHONPYCACHEPREFIX"
NO_WRITE_ENV = "PYTHONDONTWRITEBYTECODE"


def default_prefix() -> Path:
    return cache_root() / "bytecode"


def has_bytecode(package: str, search_path: Sequence[str] | None = None) -> bool | None:
    """Whether ``package``'s ``__init__`` has byte code beside it (None: not found). Finds the
    package on ``search_path`` (default ``sys.path``) without importing it."""
    spec = importlib.machinery.PathFinder.find_spec(package, search_path)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    source = Path(spec.origin)
    # Beside the source, not importlib.util.cache_from_source: that follows this process's
    # own prefix, and the question is what the engine process would find without one.
    compiled = source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"
    return compiled.is_file()


def prefix_for(env: Mapping[str, str], search_path: Sequence[str] | None = None) -> Path | None:
    """The folder an engine process with ``env`` should write its byte code to; None to leave
    Python's own choice."""
    if env.get(PREFIX_ENV) or not env.get(NO_WRITE_ENV):
        return None
    if has_bytecode("torch", search_path) is not False:
        return None
    return default_prefix()


def apply(env: MutableMapping[str, str], search_path: Sequence[str] | None = None) -> Path | None:
    """Point ``env``'s byte code at the kit's folder where `prefix_for` says so; the folder,
    or None where nothing changed."""
    prefix = prefix_for(env, search_path)
    if prefix is not None:
        env[PREFIX_ENV] = str(prefix)
        env.pop(NO_WRITE_ENV, None)
    return prefix
