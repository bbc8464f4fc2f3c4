"""Reproduction kit for hybrid-Mamba prefix-cache corruption in vLLM (upstream issue #43559)."""

from pathlib import Path

__version__ = "0.1.0"

# The kit's source tree: the checkout (or the folder above an installed ``repro``). What the
# kit keeps beside its package (containers/, schemas/, artifacts/) is found from here.
KIT_SOURCE = Path(__file__).resolve().parent.parent
