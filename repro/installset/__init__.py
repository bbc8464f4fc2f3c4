"""Offline install sets: vLLM and the wheels a GPU host lacks, packed to carry by hand.

A lab behind a firewall (and the kit's own lent GPU machine, which has no network) cannot
``pip install vllm``. This package turns "vLLM X on a host with this ``pip freeze``" into a
directory of files to move there: a few xz-compressed parts of one tar archive plus a
``manifest.json`` with every part's sha256.

Build side (needs PyPI, pip, jsonschema; rich optional)::

    python -m repro.installset build --vllm 0.26.0 --python 3.12 \\
        --for-host containers/hosts/h200-pip-freeze.txt --out DIR

Host side (the Python standard library only; the kit's source on PYTHONPATH)::

    python3 -m repro.installset verify  --parts DIR
    python3 -m repro.installset install --parts DIR --target TARGET
    export PYTHONPATH=TARGET          # then: python3 -c "from vllm import LLM"

One module per concern:

``hostenv``   the host's freeze file; canonical names; taking host packages out of a closure
``target``    the host's Python and wheel platform tags; its environment-marker values
``pipcmd``    running pip for another host, apart from this machine's pip settings
``resolve``   the closure with uv, host packages as stubs (overridden where they conflict)
``fetch``     downloading the exact wheels and recording name, version, size and sha256
``graph``     the downloaded wheels' requirements walked as the host sees them
``pack``      staging install, tar + xz, splitting into parts
``build``     the build command: the above in order, then the manifest
``manifest``  the manifest's shape: constants, a stdlib structural check, schema validation
``unpack``    verify and install on the host: standard library only
``progress``  step timings and an optional rich progress display

On the bare host only ``unpack`` (with ``manifest``, ``progress`` and ``repro.atomicio``)
is imported, all standard library; the build's modules are imported by ``build`` alone.
"""

from __future__ import annotations

from repro.errors import ReproError


class InstallSetError(ReproError):
    """An install set cannot be built, verified or installed; the message says why."""
