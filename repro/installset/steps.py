"""What the host sees while a set is checked and installed: one line per step, with its time.

The host has no rich, so the build prints with this too.
"""

from __future__ import annotations

import contextlib
import sys
import time


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Steps:
    """``name …`` when a step starts, ``name: N.N s`` when it ends; keeps the timings (the
    host has no rich, so both sides print with this)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    def say(self, text: str) -> None:
        print(f"[installset] {text}", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def step(self, name: str):
        self.say(f"{name} …")
        start = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = round(time.monotonic() - start, 2)
            self.say(f"{name}: {self.timings[name]:.1f} s")
