"""Offline install sets: vLLM and the wheels a GPU host lacks, packed to carry by hand.

A lab behind a firewall (and the kit's own lent GPU machine, which has no network) cannot
``pip install vllm``. This package turns "vLLM X on a host with this ``pip freeze``" into a
folder to move there: the wheels themselves, cut into parts, and a ``manifest.json`` naming
every wheel and part by size and sha256 (and ``SHA256SUMS`` for ``sha256sum -c``).

Build side (needs the index, uv, pip, packaging, jsonschema, rich)::

    python -m repro.installset build --vllm 0.26.0 --python 3.12 \\
        --for-host containers/hosts/h200-pip-freeze.txt --out DIR

Host side (the standard library and the host's pip; the kit's source on PYTHONPATH)::

    python3 -m repro.installset verify  --parts DIR
    python3 -m repro.installset install --parts DIR --target TARGET
    export PYTHONPATH=TARGET          # then: python3 -c "from vllm import LLM"

``host``       the host: its freeze file, Python and wheel platform tags
``resolve``    the closure with uv (host packages as stubs) and the wheel pip would pick
``lock``       one wheel lock for the CUDA image and the install set
``build``      download by URL and sha256 (pip), cut into parts, the manifest
``install``    verify and install on the host (standard library + pip)
``pipcmd``     running pip apart from the machine's own pip settings
``hostcheck``  the host's installed packages against the lock's wheels, file for file
"""

from __future__ import annotations

from repro.errors import ReproError


class InstallSetError(ReproError):
    """An install set cannot be built, verified or installed; the message says why."""
