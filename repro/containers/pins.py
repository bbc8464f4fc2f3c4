"""The pinned inputs of the images: `containers/base-images.json` (a data file, refreshed by
hand or by a script on a machine that reaches the registry; never edited in code)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from repro.core.errors import ReproError

PINS_FILE = Path(__file__).resolve().parent.parent.parent / "containers" / "base-images.json"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class PinError(ReproError):
    """A pin the build needs is missing or malformed."""


def load_pins(path: Path | None = None) -> dict[str, Any]:
    path = path or PINS_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise PinError(f"pins file {path} not found; build from the kit's checkout") from exc


def cuda_base(pins: dict[str, Any], variant: str) -> dict[str, str]:
    """The CUDA base image of ``variant`` (e.g. cu129), by digest; raise when unpinned."""
    entry = pins.get("cuda", {}).get(variant)
    if entry is None:
        known = ", ".join(sorted(k for k in pins.get("cuda", {}) if not k.startswith("_")))
        raise PinError(f"no CUDA base pinned for variant {variant!r}; pinned: {known}")
    digest = entry.get("digest")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise PinError(
            f"the CUDA base for {variant} ({entry['image']}:{entry['tag']}) has no digest pinned "
            f"(found {digest!r}); on a machine that reaches the registry run `python "
            f"containers/update_base_images.py`, which records it in containers/base-images.json"
        )
    return {
        "image": entry["image"],
        "tag": entry["tag"],
        "digest": digest,
        "python": entry["python"],
        "reference": f"{entry['image']}:{entry['tag']}@{digest}",
    }


def torch_pin(pins: dict[str, Any], device: str, vllm_version: str) -> str | None:
    return pins.get("torch", {}).get(device, {}).get(vllm_version)


__all__ = ["PINS_FILE", "PinError", "cuda_base", "load_pins", "torch_pin"]
