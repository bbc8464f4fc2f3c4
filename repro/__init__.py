"""Reproduction kit for hybrid-Mamba prefix-cache corruption in vLLM (upstream issue #43559)."""

__version__ = "0.1.0"
