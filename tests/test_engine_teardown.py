"""`Engine` teardowns deferred to the next boot (`repro.engine.llm.defer_teardowns`).

The runner's arm process ends with os._exit, so its last engine need not be torn down. A
stand-in for vLLM's `LLM` takes the engine's place here (no engine boots): what is checked is
when `engine_core.shutdown()` runs, and that a torn-down engine's objects are collected.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# In a fresh interpreter: the deferral and the collector's freeze are process-wide.
PROBE = """
import gc, sys, weakref
from types import SimpleNamespace
from repro.engine import llm as engine_llm

calls = []

class StandInLLM:
    def __init__(self, name, in_process):
        core = SimpleNamespace(shutdown=lambda: calls.append(name))
        if in_process:
            core.engine_core = object()  # vLLM's in-process client holds the core itself
        self.llm_engine = SimpleNamespace(engine_core=core)
        self.me = self  # a cycle: only the collector frees it

def exit_engine(name, in_process=True):
    engine = engine_llm.Engine(model="m", settings={})
    engine._llm = StandInLLM(name, in_process)
    ref = weakref.ref(engine._llm)
    engine.__exit__(None, None, None)
    return engine, ref

mode = sys.argv[1]
if mode == "deferred":
    engine_llm.defer_teardowns()
first, first_ref = exit_engine("first")
after_first = list(calls)
waited = engine_llm.finish_deferred_teardown()
after_boot = list(calls)
gc.collect()
collected = first_ref() is None
_, multi_ref = exit_engine("multiprocess", in_process=False)
after_multi = list(calls)
_, last_ref = exit_engine("last")
print(after_first, after_boot, after_multi, list(calls), collected, waited >= 0.0)
"""


def _probe(mode: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], cwd=REPO, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_without_deferral_every_engine_is_torn_down_at_its_exit():
    assert _probe("immediate") == (
        "['first'] ['first'] ['first', 'multiprocess'] ['first', 'multiprocess', 'last'] True True"
    )


def test_deferred_teardown_waits_for_the_next_boot_and_the_last_never_runs():
    # `first` is shut down only by the next boot's finish_deferred_teardown, and collected;
    # an engine with processes of its own is shut down at once; `last` is left to the exit.
    assert _probe("deferred") == (
        "[] ['first'] ['first', 'multiprocess'] ['first', 'multiprocess'] True True"
    )
