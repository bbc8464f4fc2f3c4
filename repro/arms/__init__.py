"""The two corruption arms. Each runs an APC-on engine and an APC-off control on the same
prompts and returns the paired figures; `repro.grading` turns them into a verdict."""

from repro.arms.cold_race import run_cold_race
from repro.arms.multi_turn import run_multi_turn

ARM_RUNNERS = {"cold-race": run_cold_race, "multi-turn": run_multi_turn}

__all__ = ["ARM_RUNNERS", "run_cold_race", "run_multi_turn"]
