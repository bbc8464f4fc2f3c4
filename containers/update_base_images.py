"""Refresh the digests in containers/base-images.json from the registry.

    python containers/update_base_images.py [--dry-run]

For each CUDA variant it asks Docker Hub's registry API for the tag's manifest-list (index)
digest, the digest `docker pull IMAGE:TAG@DIGEST` then checks, and writes it with today's
date. Standard library only. Needs the registry: it cannot run on the kit's development
machine (Docker Hub is unreachable there), which is why the pins there are null and the
kit builds on its local base.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

PINS = Path(__file__).resolve().parent / "base-images.json"
ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)


def _repository(image: str) -> str:
    name = image.removeprefix("docker.io/")
    return name if "/" in name else f"library/{name}"


def index_digest(image: str, tag: str, timeout: float = 30) -> str:
    repo = _repository(image)
    token_url = (
        f"https://auth.docker.io/token?service=registry.docker.io&scope=repository:{repo}:pull"
    )
    with urllib.request.urlopen(token_url, timeout=timeout) as response:
        token = json.load(response)["token"]
    request = urllib.request.Request(
        f"https://registry-1.docker.io/v2/{repo}/manifests/{tag}",
        method="HEAD",
        headers={"Authorization": f"Bearer {token}", "Accept": ACCEPT},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        digest = response.headers.get("Docker-Content-Digest")
    if not digest or not digest.startswith("sha256:"):
        raise RuntimeError(f"{image}:{tag}: the registry sent no Docker-Content-Digest")
    return digest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print, do not write")
    args = parser.parse_args(argv)
    pins = json.loads(PINS.read_text())
    today = datetime.date.today().isoformat()
    failed = 0
    for variant, entry in sorted(pins["cuda"].items()):
        if variant.startswith("_"):
            continue
        try:
            digest = index_digest(entry["image"], entry["tag"])
        except OSError as exc:
            print(f"{variant}: {entry['image']}:{entry['tag']}: {exc}", file=sys.stderr)
            failed += 1
            continue
        changed = "unchanged" if digest == entry.get("digest") else f"was {entry.get('digest')}"
        print(f"{variant}: {entry['image']}:{entry['tag']} {digest} ({changed})")
        entry.update({"digest": digest, "refreshed": today})
        entry.pop("note", None)
    if not args.dry_run and not failed:
        fd, tmp = tempfile.mkstemp(dir=PINS.parent, prefix=".base-images.")
        with os.fdopen(fd, "w") as out:
            json.dump(pins, out, indent=2)
            out.write("\n")
        os.replace(tmp, PINS)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
