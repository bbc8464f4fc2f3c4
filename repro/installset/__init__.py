"""Offline install sets: vLLM and the wheels a GPU host lacks, packed to carry by hand.

A host behind a firewall cannot ``pip install vllm``: ``build`` turns "vLLM X on a host with
this ``pip freeze``" into a folder of wheels cut into parts, with a ``manifest.json`` (and a
``SHA256SUMS``) naming every wheel and part by size and sha256. docs/design.md maps the
modules. Build side (uv, packaging, jsonschema, rich)::

    python -m repro.installset build --vllm 0.26.0 --python 3.12 \\
        --for-host containers/hosts/h200-pip-freeze.txt --out DIR

Host side (the standard library and the host's pip; the kit's source on PYTHONPATH)::

    python3 -m repro.installset verify  --parts DIR
    python3 -m repro.installset install --parts DIR --target TARGET
"""

from __future__ import annotations

from repro.core.errors import ReproError


class InstallSetError(ReproError):
    """An install set cannot be built, verified or installed; the message says why. Exit 1:
    a check failed (a damaged or forged set, a damaged install)."""

    exit_code = 1


class BadInstallInput(InstallSetError):
    """What the command line names cannot be used (a --parts that is no install-set folder, a
    --target that cannot be written, the wrong Python). Exit 2: bad input."""

    exit_code = 2
