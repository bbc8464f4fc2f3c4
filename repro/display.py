"""The terminal while a run's arms go: one live line per arm (rich), fed by `repro.progress`.

Each arm shows its phase (booting an engine, the APC run, the control run, grading), the
`generate()` call in progress (wave) with its requests done, the arm's requests done in all,
and its elapsed time. vLLM's own output goes to the arms' log files only; with `verbose` it
is also printed above the live lines. Where the output is not a terminal (CI logs, a
container's log) each change of phase is one plain line instead.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text


@dataclass
class ArmState:
    phase: str = "waiting"
    wave: str = ""
    wave_done: int = 0
    wave_total: int = 0
    requests_done: int = 0
    started: float | None = None
    finished: float | None = None
    verdict: str = ""

    def elapsed(self, now: float) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or now) - self.started


@dataclass
class RunDisplay:
    arms: list[str]
    verbose: bool = False
    console: Console = field(default_factory=lambda: Console(highlight=False))

    def __post_init__(self) -> None:
        self.states = {arm: ArmState() for arm in self.arms}
        self._lock = threading.Lock()
        self._live: Live | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> RunDisplay:
        if self.console.is_terminal:
            self._live = Live(
                get_renderable=self._table,
                console=self.console,
                refresh_per_second=4,
                transient=False,
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.__exit__(*exc_info)
            self._live = None

    # -- input -----------------------------------------------------------------------------
    def starting(self, arm: str) -> None:
        """The engine process for `arm` is starting (its clock starts with the import)."""
        with self._lock:
            state = self.states[arm]
            state.started = state.started or time.monotonic()
            state.phase = "starting the engine process"
        self._line(arm)

    def event(self, arm: str | None, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if arm is None or arm not in self.states:
            return
        with self._lock:
            state = self.states[arm]
            if kind == "arm":
                state.started = state.started or time.monotonic()
                state.phase = "starting"
            elif kind == "phase":
                state.phase = str(event.get("name", ""))
                state.wave, state.wave_done, state.wave_total = "", 0, 0
            elif kind == "wave":
                state.wave = f"{event.get('run')} wave {event.get('index')}"
                state.wave_done, state.wave_total = 0, int(event.get("requests", 0))
            elif kind == "done":
                done = int(event.get("requests", 0))
                state.requests_done += max(0, done - state.wave_done)
                state.wave_done = done
                return  # too frequent for a plain line
        if kind in ("phase", "wave"):
            self._line(arm)

    def finished(self, arm: str, verdict: str) -> None:
        with self._lock:
            state = self.states[arm]
            state.finished = time.monotonic()
            state.phase, state.wave, state.verdict = "done", "", verdict
        self._line(arm)

    def log_line(self, text: str) -> None:
        """A line of an engine log; shown only with `verbose`."""
        if self.verbose:
            self.console.print(text.rstrip("\n"), markup=False, soft_wrap=True)

    # -- output ----------------------------------------------------------------------------
    def _line(self, arm: str) -> None:
        if self._live is not None:
            return
        state = self.states[arm]
        what = state.verdict if state.phase == "done" else state.phase
        wave = f", {state.wave}: {state.wave_total} requests" if state.wave else ""
        elapsed = state.elapsed(time.monotonic())
        self.console.print(f"[repro] {arm}: {what}{wave} ({elapsed:.0f} s)", markup=False)

    def _table(self) -> Table:
        now = time.monotonic()
        table = Table(box=None, pad_edge=False, show_edge=False)
        for column in ("arm", "phase", "wave", "requests", "elapsed"):
            table.add_column(column, justify="right" if column == "elapsed" else "left")
        with self._lock:
            for arm, state in self.states.items():
                phase = state.verdict if state.phase == "done" else state.phase
                wave = f"{state.wave}: {state.wave_done}/{state.wave_total}" if state.wave else ""
                requests = str(state.requests_done) if state.started else ""
                elapsed = f"{state.elapsed(now):.0f} s" if state.started else ""
                table.add_row(*(Text(cell) for cell in (arm, phase, wave, requests, elapsed)))
        return table
