"""Turn an arm's result (or its failure) into the run-artifact document.

The document's shape is fixed by `schemas/run-artifact.v1.schema.json`; this module only
fills it. Figures are recorded so that `repro.grading` can re-derive the verdict from the
document alone (`repro.evidence.verdicts.regrade`).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from repro import answer_logprob, confidence, grading, ladder, sensitivity, witness
from repro.arms.common import ArmResult, RunRecord
from repro.artifact import SCHEMA_VERSION
from repro.evidence.verdicts import answer_line, verdict_section
from repro.profiles import Profile
from repro.vllm_plugin.fault_injection import fault_scale

if TYPE_CHECKING:
    from repro.runcontext import EngineFacts, RunContext


def base_document(
    *,
    arm: str,
    context: RunContext,
    environment: EngineFacts,
    profile: Profile,
) -> dict[str, Any]:
    """The sections every record has, whatever the outcome; ``environment`` is where the arm
    ran (or, for a record written elsewhere, what is known of it)."""
    model_path, fault_kind = context.model_path, context.fault_kind
    return {
        "schema_version": SCHEMA_VERSION,
        "arm": arm,
        "kit": context.kit,
        "run": {
            "id": context.run_id,
            "started_at": context.started_at,
            "finished_at": context.started_at,
            "duration_s": 0.0,
            "location": environment.location,
            "command": context.command,
        },
        "profile": {
            "name": profile.name,
            "model": profile.model,
            "model_path": model_path,
            "revision": _weights_revision(profile, context),
            "weights_pin": context.weights_pin,
            "tensor_parallel_size": profile.tensor_parallel_size,
            "device": profile.device,
            "signal": profile.signal,
            "calibrated_fault_scale": sensitivity.calibrated(profile.name, profile.device, arm),
        },
        "engine": None,
        "geometry": None,
        "hardware": environment.hardware,
        "software": environment.software,
        "counters": None,
        "signal": None,
        "figures": None,
        "verdict": None,
        "fault_injection": _fault_section(fault_kind),
        "logs": [],
    }


def _fault_section(fault_kind: str | None) -> dict[str, Any]:
    section: dict[str, Any] = {"enabled": fault_kind is not None, "kind": fault_kind}
    if fault_kind is not None:
        section["scale"] = fault_scale()
    return section


def engine_section(
    *,
    context: RunContext,
    environment: EngineFacts,
    apc: RunRecord | None,
    control: RunRecord | None,
) -> dict[str, Any]:
    return {
        "vllm_version": environment.vllm_version,
        "vllm_distribution": environment.vllm_distribution,
        "vllm_commit": environment.vllm_commit,
        "apc_run": _settings(apc),
        "control_run": _settings(control),
        "environment": environment.environment,
        "patches": environment.patches,
        "overrides": context.overrides,
        "cpu_threads": context.cpu_threads,
    }


def _settings(run: RunRecord | None) -> dict[str, Any]:
    if run is None:
        return {}
    settings = dict(run.settings)
    if run.dropped_settings:
        # Settings the profile asks for that this vLLM does not know: recorded, not silent.
        settings["_not_supported_by_this_vllm"] = list(run.dropped_settings)
    return settings


def fill_result(
    doc: dict[str, Any],
    result: ArmResult,
    verdict: grading.Verdict,
    *,
    context: RunContext,
    environment: EngineFacts,
) -> None:
    doc["engine"] = engine_section(
        context=context, environment=environment, apc=result.apc, control=result.control
    )
    doc["geometry"] = {
        "mamba_block_size": result.geometry.mamba_block_size,
        "cache_block_size": result.geometry.cache_block_size,
        "max_num_batched_tokens": result.geometry.max_num_batched_tokens,
        "prompt_tokens": result.prompt_tokens,
    }
    doc["counters"] = {
        "apc": {name: c.as_dict() for name, c in result.apc.counters.items()},
        "control": {name: c.as_dict() for name, c in result.control.counters.items()},
        "read": {
            "apc": dict(result.apc.counter_read),
            "control": dict(result.control.counter_read),
        },
    }
    threshold = verdict.threshold
    doc["signal"] = {
        "kind": doc["profile"]["signal"],
        "threshold": threshold.value if threshold else None,
        "noise_floor": threshold.noise_floor if threshold else None,
        "noise_samples": threshold.noise_samples if threshold else None,
        "threshold_min": grading.THRESHOLD_MIN if threshold else None,
        "noise_multiplier": grading.NOISE_MULTIPLIER if threshold else None,
        "flip_margin": grading.FLIP_MARGIN,
        "control_spread_gate": grading.CONTROL_SPREAD_GATE if threshold else None,
        "rules": grading.RULES_UPSTREAM,
    }
    grades = {g.name: g for g in verdict.waves}
    answers = answer_logprob.applies(doc["profile"]["signal"])
    doc["figures"] = {
        "waves": [
            _wave_figures(wave, grades.get(wave.name), result, index, answers=answers)
            for index, wave in enumerate(result.waves)
        ],
        "liveness": (
            {
                "prompt_tokens": result.liveness.prompt_tokens,
                "hits": result.liveness.hits,
                "queries": result.liveness.queries,
                "cached_tokens": result.liveness.cached_tokens,
                "passed": result.liveness.passed,
            }
            if result.liveness
            else None
        ),
    }
    doc["witness"] = witness_section(result, doc["figures"]["waves"])
    doc["verdict"] = verdict_section(verdict)
    sure = confidence.of_document(doc)
    if sure is not None:
        doc["verdict"]["confidence"] = sure
    # From the recorded figures, by the call `verify` re-derives it with.
    line = answer_line(doc)
    if line is not None:
        doc["answer_logprob"] = line


def ladder_section(
    doc: dict[str, Any],
    reference: ArmResult,
    verdict: grading.Verdict,
    *,
    context: RunContext,
    environment: EngineFacts,
) -> dict[str, Any]:
    """The connector ladder (`repro.ladder`): the reference rung (APC on, no connector) as
    its own figures against the same control, and what the connector did on the rung of
    record. `doc` is already filled with the connector rung."""
    scratch = copy.deepcopy(doc)
    fill_result(scratch, reference, verdict, context=context, environment=environment)
    waves = [w["name"] for w in doc["figures"]["waves"]]
    return {
        "control": ladder.CONTROL,
        "reference": {
            "settings": scratch["engine"]["apc_run"],
            "counters": scratch["counters"]["apc"],
            "signal": scratch["signal"],
            "figures": scratch["figures"],
            "witness": scratch["witness"],
            "verdict": scratch["verdict"],
            # The rung's own answer log-prob line (needle profiles), never the run's.
            **(
                {"answer_logprob": scratch["answer_logprob"]} if "answer_logprob" in scratch else {}
            ),
        },
        "finding": ladder.finding(verdict.status, doc["verdict"]["status"]),
        "external": ladder.external(doc["counters"]["apc"], waves),
        "probe": ladder.probe_summary(
            [r for w in doc["figures"]["waves"] for r in w["per_request"]]
        ),
    }


def witness_section(result: ArmResult, waves: list[dict[str, Any]]) -> dict[str, Any]:
    """The restore witness's figures over the recorded requests, and its hooks."""
    status = witness.engine_status(result.apc.witness)
    summary = witness.summarize(status, [r for w in waves for r in w["per_request"]])
    return {
        **summary.as_dict(),
        "hooks": list(result.apc.witness.get("installed") or []),
        "hit_lengths_seen": bool(result.apc.witness.get("hit_lengths")),
        # The APC engine's time in the witness (rank 0), for its cost against the arm's.
        "seconds": round(float(result.apc.witness.get("seconds") or 0.0), 4),
    }


def _wave_figures(
    wave: grading.Wave,
    grade: grading.WaveGrade | None,
    result: ArmResult,
    index: int,
    *,
    answers: bool,
) -> dict[str, Any]:
    flagged = grade.flagged if grade else (False,) * len(wave.requests)
    extra: dict[str, Any] = {"graded": wave.graded, "distinct_rule": wave.distinct_rule}
    if index == 0 and result.extra_noise:
        extra["benign_noise"] = list(result.extra_noise)
    if index == 0 and answers and result.answer_noise:
        extra[answer_logprob.NOISE_KEY] = list(result.answer_noise)
    hit = [r.divergence for r in wave.requests if r.read_cache and r.divergence is not None]
    cold = [r.divergence for r in wave.requests if not r.read_cache and r.divergence is not None]
    extra["median_divergence_cache_hit"] = grading.median(hit)
    extra["median_divergence_no_hit"] = grading.median(cold)
    return {
        "name": wave.name,
        "requests": len(wave.requests),
        "cache_hit_requests": sum(1 for r in wave.requests if r.read_cache),
        "apc": {
            "distinct_outputs": wave.apc_distinct_outputs,
            "misses": grade.apc_misses if grade else None,
        },
        "control": {
            "distinct_outputs": wave.control_distinct_outputs,
            "misses": grade.control_misses if grade else None,
        },
        "forward_flips": grade.forward_flips if grade else 0,
        "reverse_flips": grade.reverse_flips if grade else 0,
        "margin": grading.FLIP_MARGIN,
        "per_request": [
            {
                "index": r.index,
                "num_cached_tokens": r.num_cached_tokens,
                "divergence": r.divergence,
                "apc_miss": r.apc_miss,
                "control_miss": r.control_miss,
                "flagged": bool(f),
                **({"answer_divergence": r.answer_divergence} if answers else {}),
                **_answers(r),
                **({"restores": [dict(x) for x in r.restores]} if r.restores else {}),
                **({"connector": dict(r.connector)} if r.connector else {}),
            }
            for r, f in zip(wave.requests, flagged, strict=False)
        ],
        "extra": extra,
    }


def _answers(request: grading.RequestResult) -> dict[str, str]:
    """The code and both answers, on the needle signal only (log-prob answers are noise)."""
    if request.code is None:
        return {}
    return {
        "code": request.code,
        "apc_answer": request.apc_answer or "",
        "control_answer": request.control_answer or "",
    }


def _weights_revision(profile, context: RunContext) -> str | None:
    """The commit of the weights the run was checked to have (the context's weights pin,
    from the CLI's check for GPU profiles), else the profile's own pin."""
    if context.weights_pin is not None:
        revision = context.weights_pin.get("revision")
        return revision if isinstance(revision, str) else None
    return profile.revision
