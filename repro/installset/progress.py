"""Step timings, and a byte-progress display that uses rich when it is there and useful.

Standard library only at import: rich is imported lazily, and only when a caller asks for a
rich display on a terminal. The host-side installer prints plain lines.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import TextIO

__all__ = ["ByteProgress", "Steps", "human_bytes"]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


class Steps:
    """Prints ``name …`` when a step starts and ``name: N.N s`` when it ends; keeps timings."""

    def __init__(self, stream: TextIO | None = None, prefix: str = "[installset]") -> None:
        self.stream = stream or sys.stderr
        self.prefix = prefix
        self.timings: dict[str, float] = {}

    def say(self, text: str) -> None:
        print(f"{self.prefix} {text}", file=self.stream, flush=True)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        self.say(f"{name} …")
        start = time.monotonic()
        try:
            yield
        finally:
            elapsed = time.monotonic() - start
            self.timings[name] = round(elapsed, 2)
            self.say(f"{name}: {elapsed:.1f} s")

    def bar(self, total: int, description: str, *, rich: bool = True) -> ByteProgress:
        return ByteProgress(total, description, self, use_rich=rich)


class ByteProgress:
    """Advance by bytes. rich's bar on a terminal; otherwise a plain line every 10 %."""

    def __init__(self, total: int, description: str, steps: Steps, *, use_rich: bool) -> None:
        self.total = max(int(total), 1)
        self.done = 0
        self.description = description
        self.steps = steps
        self._next_tenth = 1
        self._rich = None
        if use_rich and steps.stream.isatty():
            try:
                from rich.progress import (
                    BarColumn,
                    DownloadColumn,
                    Progress,
                    TimeRemainingColumn,
                    TransferSpeedColumn,
                )
            except ImportError:
                pass
            else:
                self._rich = Progress(
                    "[progress.description]{task.description}",
                    BarColumn(),
                    DownloadColumn(binary_units=True),
                    TransferSpeedColumn(),
                    TimeRemainingColumn(),
                    transient=True,
                )
                self._task = self._rich.add_task(description, total=self.total)
                self._rich.start()

    def advance(self, n: int) -> None:
        self.done += n
        if self._rich is not None:
            self._rich.update(self._task, advance=n)
            return
        tenth = min(9, self.done * 10 // self.total)
        if tenth >= self._next_tenth:
            self.steps.say(
                f"  {self.description}: {tenth * 10} % "
                f"({human_bytes(self.done)} of {human_bytes(self.total)})"
            )
            self._next_tenth = tenth + 1

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    def __enter__(self) -> ByteProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
