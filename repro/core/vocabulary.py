"""The kit's small vocabularies, each named once: arms, signals, devices, verdicts, and the
environment variable that switches the positive control on.

The values are what artifacts record (schemas/run-artifact.v1.schema.json holds the same
enums; tests/test_schema.py checks that they agree), so none may change.
"""

from __future__ import annotations

from typing import Literal, get_args

# The arms, in the order the kit runs and reports them.
Arm = Literal["cold-race", "multi-turn"]
ARMS: tuple[Arm, ...] = get_args(Arm)

# What tells corruption apart: "needle" (a trained model's recall) or "logprob" (random
# weights, the first answer token's log-probabilities).
Signal = Literal["needle", "logprob"]
SIGNALS: tuple[Signal, ...] = get_args(Signal)

# Where a profile runs.
Device = Literal["cpu", "cuda"]
DEVICES: tuple[Device, ...] = get_args(Device)

# A verdict, and the gate that stopped an inconclusive one (repro.grading).
Status = Literal["corrupted", "clean", "inconclusive", "error"]
STATUSES: tuple[Status, ...] = get_args(Status)
Gate = Literal["geometry", "control_quality", "engagement", "liveness"]
GATES: tuple[Gate, ...] = get_args(Gate)

# The positive control's switch: set (to a fault's name) in the engine process's environment,
# read by the plugin in every engine process (repro.vllm_plugin.fault_injection).
FAULT_ENV = "REPRO_INJECT_FAULT"
