"""`engine.freeze_long_lived_objects`: garbage is collected first, survivors are frozen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# In a fresh interpreter: the freeze is process-wide and would follow other tests around.
PROBE = """
import gc, weakref
from repro.engine.llm import freeze_long_lived_objects

class Node: pass
dead = Node(); dead.me = dead          # a cycle only the collector can free
gone = weakref.ref(dead); del dead
kept = Node(); kept.me = kept          # alive: must be frozen, not freed
before = gc.get_freeze_count()
freeze_long_lived_objects()
print(gone() is None, gc.get_freeze_count() > before, kept.me is kept)
"""


def test_cycles_are_collected_before_the_survivors_are_frozen():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "True", "True"], out.stdout + out.stderr
