"""Are the bare host's own packages the lock's wheels, file for file?

Equal versions do not make equal files (another index, a patch), so both sides reduce each
package to one digest over its files (``path,sha256`` sorted), read by ``importlib.metadata``
from its RECORD: on the host the files as they are now (standard library only; files changed
since install are counted), in a wheel its RECORD's hashes. Scripts (``..``), a wheel's
``.data/`` and the installer's own dist-info files are left out on both sides.

    python3 -m repro.installset.hostcheck digests --out host-digests.json      # on the host
    python -m repro.installset.hostcheck compare --lock LOCK --wheels DIR --digests FILE
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import json
import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_INSTALLER_FILES = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503, as the host has no packaging


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _digest(dist: md.Distribution, version: str, *, rehash: bool) -> list:
    """``[version, files, digest, changed since install]``; ``rehash``: hash the files as they
    are, not as RECORD says."""
    rows, changed = [], 0
    for f in dist.files or []:
        path, top = str(f), str(f).split("/", 1)[0]
        installer_file = ".dist-info/" in path and f.name in _INSTALLER_FILES
        if not (f.hash and f.hash.mode == "sha256") or installer_file:
            continue
        if path.startswith("..") or top.endswith(".data"):
            continue
        found = f.hash.value
        if rehash:
            with open(f.locate(), "rb") as fh:
                found = _b64(hashlib.file_digest(fh, "sha256").digest())
            changed += found != f.hash.value
        rows.append(f"{path},{found}")
    return [
        version,
        len(rows),
        hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest(),
        changed,
    ]


def installed_digests(paths: Sequence[str] | None = None) -> dict[str, list]:
    """Every distribution of this interpreter (or of ``paths``), by PEP 503 name."""
    found = md.distributions(path=list(paths)) if paths is not None else md.distributions()
    return {_key(d.metadata["Name"]): _digest(d, d.version, rehash=True) for d in found}


def wheel_digests(lock: Mapping[str, Any], wheels_dir: Path) -> dict[str, list]:
    """The same digest for every ``host`` wheel of the lock, from ``wheels_dir``."""
    out = {}
    for pkg in (p for p in lock["packages"] if p["origin"] == "host"):
        with zipfile.ZipFile(Path(wheels_dir) / pkg["filename"]) as zf:
            # The wheel's own RECORD, not a vendored package's (setuptools/_vendor/…).
            record = next(
                n for n in zf.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1
            )
            dist = md.PathDistribution(zipfile.Path(zf, record.split("/")[0] + "/"))
            out[_key(pkg["name"])] = _digest(dist, pkg["version"], rehash=False)
    return out


def compare(wheels: Mapping[str, list], host: Mapping[str, list]) -> dict[str, Any]:
    same, differ, missing, version = [], [], [], []
    for name, (want_version, files, digest, _) in sorted(wheels.items()):
        found = host.get(name)
        if found is None:
            missing.append(name)
        elif found[0] != want_version:
            version.append(f"{name}: host {found[0]}, lock {want_version}")
        elif found[2] != digest:
            differ.append(f"{name} {want_version}: {found[1]} files on the host, {files} in wheel")
        else:
            same.append(name)
    return {
        "packages": len(wheels),
        "identical": len(same),
        "files": sum(wheels[n][1] for n in same),
        "differ": differ,
        "missing_on_host": missing,
        "other_version_on_host": version,
        "changed_since_install": {n: v[3] for n, v in host.items() if n in wheels and v[3]},
        "all_identical": len(same) == len(wheels),
    }


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python3 -m repro.installset.hostcheck")
    sub = parser.add_subparsers(dest="command", required=True)
    host = sub.add_parser("digests", help="(on the host) digest every installed distribution")
    host.add_argument("--out", type=Path, required=True)
    both = sub.add_parser("compare", help="(build side) the lock's host wheels vs the host")
    both.add_argument("--lock", type=Path, required=True)
    both.add_argument("--wheels", type=Path, required=True, help="folder holding the wheels")
    both.add_argument("--digests", type=Path, required=True, help="the host's digests file")
    args = parser.parse_args(argv)
    if args.command == "digests":
        args.out.write_text(json.dumps(installed_digests(), indent=1, sort_keys=True))
        return 0
    lock, digests = (json.loads(p.read_text(encoding="utf-8")) for p in (args.lock, args.digests))
    result = compare(wheel_digests(lock, args.wheels), digests)
    print(json.dumps(result, indent=2))
    return 0 if result["all_identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
