"""Turn an arm's result (or its failure) into the run-artifact document.

The document's shape is fixed by `schemas/run-artifact.v1.schema.json`; this module only
fills it. Figures are recorded so that `repro.grading` can re-derive the verdict from the
document alone (`waves_from_document`).
"""

from __future__ import annotations

from typing import Any

from repro import grading
from repro.arms.common import ArmResult, RunRecord
from repro.artifact import SCHEMA_VERSION
from repro.profiles import Profile


def base_document(
    *,
    arm: str,
    context: dict[str, Any],
    profile: Profile,
    model_path: str | None,
    fault_kind: str | None,
) -> dict[str, Any]:
    """The sections every record has, whatever the outcome."""
    return {
        "schema_version": SCHEMA_VERSION,
        "arm": arm,
        "kit": context["kit"],
        "run": {
            "id": context["run_id"],
            "started_at": context["started_at"],
            "finished_at": context["started_at"],
            "duration_s": 0.0,
            "location": context["location"],
            "command": context["command"],
        },
        "profile": {
            "name": profile.name,
            "model": profile.model,
            "model_path": model_path,
            "revision": _weights_revision(profile),
            "tensor_parallel_size": profile.tensor_parallel_size,
            "device": profile.device,
            "signal": profile.signal,
        },
        "engine": None,
        "geometry": None,
        "hardware": context["hardware"],
        "software": context["software"],
        "counters": None,
        "signal": None,
        "figures": None,
        "verdict": None,
        "fault_injection": {"enabled": fault_kind is not None, "kind": fault_kind},
        "logs": [],
    }


def engine_section(
    *,
    context: dict[str, Any],
    apc: RunRecord | None,
    control: RunRecord | None,
    overrides: dict[str, Any],
) -> dict[str, Any]:
    return {
        "vllm_version": context["vllm_version"],
        "vllm_distribution": context["vllm_distribution"],
        "vllm_commit": context["vllm_commit"],
        "apc_run": _settings(apc),
        "control_run": _settings(control),
        "environment": context["environment"],
        "patches": context["patches"],
        "overrides": overrides,
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
    context: dict[str, Any],
    overrides: dict[str, Any],
) -> None:
    doc["engine"] = engine_section(
        context=context, apc=result.apc, control=result.control, overrides=overrides
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
    doc["figures"] = {
        "waves": [
            _wave_figures(wave, grades.get(wave.name), result, index)
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
    doc["verdict"] = verdict_section(verdict)


def verdict_section(verdict: grading.Verdict) -> dict[str, Any]:
    section = {"status": verdict.status, "gate": verdict.gate, "reason": verdict.reason}
    if verdict.outcome is not None:
        section["outcome"] = verdict.outcome
    return section


def _wave_figures(
    wave: grading.Wave, grade: grading.WaveGrade | None, result: ArmResult, index: int
) -> dict[str, Any]:
    flagged = grade.flagged if grade else (False,) * len(wave.requests)
    extra: dict[str, Any] = {"graded": wave.graded, "distinct_rule": wave.distinct_rule}
    if index == 0 and result.extra_noise:
        extra["benign_noise"] = list(result.extra_noise)
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
                **_answers(r),
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


def waves_from_document(doc: dict[str, Any]) -> tuple[list[grading.Wave], list[float]]:
    """The graded inputs as recorded: lets anyone re-derive a verdict from an artifact."""
    waves, noise = [], []
    for fig in doc["figures"]["waves"]:
        extra = fig.get("extra") or {}
        noise.extend(extra.get("benign_noise", []))
        waves.append(
            grading.Wave(
                name=fig["name"],
                requests=tuple(
                    grading.RequestResult(
                        index=r["index"],
                        num_cached_tokens=r["num_cached_tokens"],
                        divergence=r["divergence"],
                        apc_miss=r["apc_miss"],
                        control_miss=r["control_miss"],
                        code=r.get("code"),
                        apc_answer=r.get("apc_answer"),
                        control_answer=r.get("control_answer"),
                    )
                    for r in fig["per_request"]
                ),
                apc_distinct_outputs=fig["apc"]["distinct_outputs"],
                control_distinct_outputs=fig["control"]["distinct_outputs"],
                graded=extra.get("graded", True),
                distinct_rule=extra.get("distinct_rule", False),
            )
        )
    return waves, noise


def regrade(doc: dict[str, Any], *, as_recorded: bool = False) -> grading.Verdict:
    """Re-derive an artifact's verdict from its recorded figures and counters.

    With the current rules by default: every gate this kit has applies, whatever the artifact
    says, so an artifact cannot switch a gate off by leaving it out. ``as_recorded`` grades
    with the gates the artifact records instead (an artifact from before
    ``signal.control_spread_gate`` existed re-grades without it): how it was graded then,
    never what `verify` accepts."""
    waves, noise = waves_from_document(doc)
    apc = doc["counters"]["apc"]
    graded_waves = [w.name for w in waves]
    live = doc["figures"].get("liveness")
    # Artifacts from before the rules were recorded were graded by the kit's own.
    rules = (doc.get("signal") or {}).get("rules") or grading.RULES_KIT
    # Upstream reads drafts after the liveness probe's long decode: every APC counter entry.
    draft_runs = list(apc) if rules == grading.RULES_UPSTREAM else graded_waves
    return grading.grade(
        signal=doc["signal"]["kind"],
        waves=waves,
        engagement=grading.Engagement(
            prefix_cache_queries=sum(apc[w]["prefix_cache_queries"] for w in graded_waves),
            prefix_cache_hits=sum(apc[w]["prefix_cache_hits"] for w in graded_waves),
            spec_decode_num_drafts=sum(apc[w]["spec_decode_num_drafts"] for w in draft_runs),
            cached_prompt_tokens=sum(
                r["num_cached_tokens"] or 0
                for fig in doc["figures"]["waves"]
                for r in fig["per_request"]
            ),
        ),
        liveness=(
            grading.Liveness(
                live["prompt_tokens"],
                live["hits"],
                live["queries"],
                live.get("cached_tokens", 0),
            )
            if live
            else None
        ),
        extra_noise=noise,
        control_spread_gate=(
            bool((doc.get("signal") or {}).get("control_spread_gate"))
            if as_recorded
            else grading.CONTROL_SPREAD_GATE
        ),
        rules=rules,
        require_hits=grading.requires_hits(doc["arm"], rules),
    )


def _weights_revision(profile) -> str | None:
    """The commit of the weights the run was checked to have (REPRO_WEIGHTS_PIN, set by the
    CLI for GPU profiles), else the profile's own pin."""
    import json
    import os

    pin = os.environ.get("REPRO_WEIGHTS_PIN")
    if pin:
        try:
            return json.loads(pin).get("revision")
        except (ValueError, AttributeError):
            return None
    return profile.revision
