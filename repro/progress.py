"""What the engine process is doing, as events for the run's display (`repro.display`).

The process that runs the arms writes its output (its own, vLLM's, and anything C code
prints) to one pipe that the parent reads line by line, masks and files into the arm's log
(`repro.runner`). Events travel in the same stream, each a line that starts with `MARK`
followed by a JSON object; there is no second channel, so an event always arrives after
every line written before it. That is what lets the parent close an arm's log, complete,
when the arm's `arm_done` event arrives. Without `REPRO_PROGRESS=1` (an arm run by hand, a
test) nothing is emitted.

Events:

- `arm` (arm, started_at): an arm starts; `phase` (name): what it does now (booting an
  engine, a run, grading); `wave` (run, index, requests): a `generate()` call starts;
  `done` (requests): requests of that call finished so far;
- `arm_done` (arm, outcome, message): the arm's document is written
  (`.<arm>.partial.json`); outcome "written", or "invalid" when it failed validation.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

ENV = "REPRO_PROGRESS"
# ASCII record separator: never part of vLLM's or torch's text output.
MARK = "\x1e"

_broken = False


def enabled() -> bool:
    return os.environ.get(ENV) == "1" and not _broken


def emit(event: str, **fields: Any) -> None:
    """Send one event to the parent; a closed pipe (parent gone) only stops the events."""
    global _broken
    if not enabled():
        return
    line = MARK + json.dumps({"event": event, "t": time.time(), **fields}) + "\n"
    try:
        # Python's buffered text first, so the event follows everything printed before it.
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(1, line.encode("utf-8"))
    except (OSError, ValueError):
        _broken = True


def split(line: str) -> tuple[str | None, dict[str, Any] | None]:
    """A line of the engine process's output as (log text or None, event or None)."""
    text, mark, rest = line.partition(MARK)
    if not mark:
        return line, None
    try:
        event = json.loads(rest)
    except json.JSONDecodeError:
        return line, None  # not one of ours: keep it in the log as it came
    return (text + "\n" if text else None), event
