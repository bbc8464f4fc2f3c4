"""Run a profile's arms and write one validated artifact per arm.

Each arm runs in its own child process (`python -m repro arm …`), with its output streamed to
the terminal and to `logs/<arm>.log`. The child writes its document without the `logs`
section; this parent adds the log's size and hash and writes the final artifact. A child that
crashes, hangs or is killed leaves no document, and the parent then writes an `error` record
that keeps the log: a run never ends without a record.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from repro import envinfo, evidence, grading, patching, redaction
from repro.artifact import (
    ArtifactContainsSecrets,
    redact_env,
    require_validation,
    validate_artifact,
    write_artifact,
)
from repro.atomicio import sha256_file, write_json_atomic
from repro.errors import NotEvidence, ReproError
from repro.profiles import MODEL_PROFILE_NAME, Profile, for_model, get_profile

CONTEXT_ENV = "REPRO_RUN_CONTEXT"
FAULT_ENV = "REPRO_INJECT_FAULT"
# Set by the host for a run in one of the kit's images (repro/containers/run.py): the image's
# id and labels as JSON. A process inside a container cannot see its own image.
IMAGE_ENV = "REPRO_IMAGE"
# Written by a run inside a container before its first arm: the facts of the image's
# environment, which the host needs for an `error` record if the container dies mid-run.
FACTS_FILE = ".container-facts.json"
DEFAULT_FAULT_KIND = "restored-state-noise"
DEFAULT_ARM_TIMEOUT_S = 30 * 60


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def new_run_id() -> str:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"


def default_out_dir(run_id: str) -> Path:
    return Path("artifacts") / run_id


# --- parent ------------------------------------------------------------------------------


def run_profile(
    *,
    profile: Profile,
    model_path: str,
    out_dir: Path,
    arms: list[str],
    fault_kind: str | None,
    overrides: dict[str, Any],
    arm_timeout_s: float = DEFAULT_ARM_TIMEOUT_S,
    command: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run each arm in a child process; return the written documents by arm."""
    check_writable(out_dir)
    require_validation()
    (out_dir / "logs").mkdir(exist_ok=True)
    run_id = new_run_id()
    if os.environ.get("REPRO_IN_CONTAINER") == "1":
        facts = _facts({})
        write_json_atomic(out_dir / FACTS_FILE, {k: facts[k] for k in CONTAINER_FACTS})
    documents = {}
    for arm in arms:
        context = arm_context(
            run_id=run_id,
            arm=arm,
            command=command or ["python", "-m", "repro", *sys.argv[1:]],
            profile=profile,
            model_path=model_path,
            overrides=overrides,
            fault_kind=fault_kind,
        )
        documents[arm] = _run_arm_child(arm, context, out_dir, arm_timeout_s)
    return documents


def arm_context(
    *,
    run_id: str,
    arm: str,
    command: list[str],
    profile: Profile,
    model_path: str,
    overrides: dict[str, Any],
    fault_kind: str | None,
) -> dict[str, Any]:
    """What one arm's child (or a record written for it) needs to know about the run."""
    return {
        "run_id": f"{run_id}-{arm}",
        "started_at": utc_now(),
        "command": command,
        "kit": _kit(),
        "profile": profile.name,
        "device": profile.device,
        # A model without a profile is rebuilt from these in the arm's process.
        "model": profile.model,
        "tensor_parallel_size": profile.tensor_parallel_size,
        "model_path": model_path,
        "overrides": overrides,
        "fault_kind": fault_kind,
    }


def _kit() -> dict[str, Any]:
    """The kit's facts; inside an image, the commit its kit was copied from (its labels)."""
    kit = envinfo.collect_kit(os.environ.get("REPRO_KIT_CHECKOUT"))
    image = image_from_env()
    if kit["git_commit"] is None and image is not None:
        labels = image["labels"]
        commit = labels.get("org.opencontainers.image.revision", "")
        if re.fullmatch(r"[0-9a-f]{40}", commit):
            dirty = labels.get("io.repro-kit.dirty")
            kit = {**kit, "git_commit": commit, "dirty": {"true": True, "false": False}.get(dirty)}
    return kit


class OutputNotWritable(ReproError, PermissionError):
    """The output directory cannot be written: no record can be kept there."""


def check_writable(out_dir: Path) -> None:
    """Make ``out_dir`` and prove a file can be written in it, or say what to do."""
    probe = out_dir / f".write-test-{os.getpid()}"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OutputNotWritable(
            f"output directory {out_dir} is not writable ({exc.strerror or exc}); "
            f"choose another with --out or fix its permissions (no record can be kept there)"
        ) from exc


def _run_arm_child(
    arm: str, context: dict[str, Any], out_dir: Path, timeout_s: float
) -> dict[str, Any]:
    log_rel = f"logs/{arm}.log"
    log_path = out_dir / log_rel
    partial = out_dir / f".{arm}.partial.json"
    partial.unlink(missing_ok=True)
    env = dict(os.environ)
    env[CONTEXT_ENV] = json.dumps(context)
    env["PYTHONUNBUFFERED"] = "1"
    if context["fault_kind"]:
        env[FAULT_ENV] = context["fault_kind"]
    else:
        env.pop(FAULT_ENV, None)
    cmd = [sys.executable, "-m", "repro", "arm", "--arm", arm, "--out", str(out_dir)]
    started = time.monotonic()
    timed_out = False
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        pump = threading.Thread(target=_tee, args=(proc.stdout, log), daemon=True)
        pump.start()
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            returncode = proc.wait()
        pump.join()
    elapsed = time.monotonic() - started

    crashed = not (partial.is_file() and returncode == 0)
    if not crashed:
        doc = json.loads(partial.read_text())
    else:
        reason = (
            f"timed out after {timeout_s:.0f} s and was killed"
            if timed_out
            else f"exited with status {returncode} before writing its record"
        )
        what = f"the {arm} arm's process {reason}"
        if partial.is_file():
            # The arm measured but its record did not validate: keep the figures for a human.
            kept = out_dir / f"{arm}.unvalidated.json"
            os.replace(partial, kept)
            what += f"; its figures, which failed validation, are kept in {kept.name}"
        doc = _crash_document(arm, context, what, log_path)
    doc["logs"] = [log_entry(out_dir, log_rel)]
    doc["run"]["duration_s"] = round(max(doc["run"]["duration_s"], elapsed), 3)
    target = out_dir / f"{arm}.json"
    if crashed:
        doc = _write_crash_record(doc, target)
    else:
        write_artifact(doc, target)
    partial.unlink(missing_ok=True)
    return doc


def log_entry(out_dir: Path, rel: str) -> dict[str, Any]:
    path = out_dir / rel
    return {"path": rel, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def write_error_record(
    *,
    arm: str,
    context: dict[str, Any],
    what: str,
    out_dir: Path,
    logs: list[str],
    facts: dict[str, Any] | None = None,
    error_type: str = "ArmProcessFailed",
    phase: str = "arm",
    duration_s: float = 0.0,
) -> dict[str, Any]:
    """Write ``<arm>.json`` as an `error` record saying ``what`` happened; return it.

    ``logs`` are paths relative to ``out_dir`` (missing ones are left out; the first one that
    exists gives the message its last lines). ``facts`` replace this process's own facts where
    the run happened elsewhere (a container: see FACTS_FILE).
    """
    kept = [rel for rel in logs if (out_dir / rel).is_file()]
    tail_of = out_dir / kept[0] if kept else out_dir / "logs" / "missing.log"
    doc = _crash_document(
        arm, context, what, tail_of, facts=facts, error_type=error_type, phase=phase
    )
    doc["logs"] = [log_entry(out_dir, rel) for rel in kept]
    doc["run"]["duration_s"] = round(duration_s, 3)
    return _write_crash_record(doc, out_dir / f"{arm}.json")


def _write_crash_record(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Write an `error` record, always: what it quotes is masked if the scanner objects."""
    try:
        write_artifact(doc, path)
    except ArtifactContainsSecrets:
        doc = redaction.redact_document(doc)
        write_artifact(doc, path)
    return doc


def _tee(stream, log) -> None:
    for line in stream:
        line = redaction.redact(line)
        log.write(line)
        log.flush()
        sys.stdout.write(line)
        sys.stdout.flush()


def _crash_document(
    arm: str,
    context: dict[str, Any],
    what: str,
    log_path: Path,
    *,
    facts: dict[str, Any] | None = None,
    error_type: str = "ArmProcessFailed",
    phase: str = "arm",
) -> dict:
    profile = _profile(context)
    doc = evidence.base_document(
        arm=arm,
        context={**context, **facts} if facts else _facts(context),
        profile=profile,
        model_path=context["model_path"],
        fault_kind=context["fault_kind"],
    )
    tail = _tail(log_path)
    doc["error"] = {
        "type": error_type,
        "message": f"{what}; last log lines:\n{tail}",
        "phase": phase,
    }
    doc["verdict"] = {
        "status": "error",
        "gate": None,
        "reason": f"{what}; see {log_path.name}",
    }
    doc["run"]["finished_at"] = utc_now()
    return doc


def _tail(path: Path, lines: int = 15) -> str:
    """The log's last lines, secrets masked (the record quotes them)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return redaction.redact("\n".join(text.splitlines()[-lines:]))


def _profile(context: dict[str, Any]) -> Profile:
    if context["profile"] == MODEL_PROFILE_NAME:
        return for_model(context["model"], tensor_parallel_size=context["tensor_parallel_size"])
    return get_profile(context["profile"]).for_device(context["device"])


# The facts of _facts() that belong to the environment, not to one arm.
CONTAINER_FACTS = (
    "hardware",
    "software",
    "location",
    "environment",
    "vllm_version",
    "vllm_distribution",
    "vllm_commit",
    "patches",
)


def _facts(context: dict[str, Any]) -> dict[str, Any]:
    """Context plus the facts of this interpreter's environment and machine."""
    software = envinfo.collect_software()
    vllm_pkg = software["packages"].get("vllm")
    return {
        **context,
        "hardware": envinfo.collect_hardware(),
        "software": software,
        "location": envinfo.run_location(image_from_env()),
        "environment": redact_env(),
        "vllm_version": vllm_pkg or "not installed",
        "vllm_distribution": software["distributions"].get("vllm") or "vllm",
        "vllm_commit": envinfo.vllm_commit(),
        "patches": patching.applied_patches(),
    }


def image_from_env() -> dict[str, Any] | None:
    """The image this run is in (id and labels), as the host passed it; None on a host.

    Only read inside one of the kit's images (REPRO_IN_CONTAINER=1): a stray REPRO_IMAGE on a
    host must not turn a host run into a claimed container run. Malformed values are refused
    by name, since a record with a wrong image id would be worse than none.
    """
    raw = os.environ.get(IMAGE_ENV)
    if os.environ.get("REPRO_IN_CONTAINER") != "1" or not raw:
        return None
    try:
        image = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ReproError(
            f"{IMAGE_ENV} is not JSON ({exc}); it is set by `--container` runs"
        ) from exc
    if (
        not isinstance(image, dict)
        or not re.fullmatch(r"sha256:[0-9a-f]{64}", str(image.get("id")))
        or not isinstance(image.get("labels"), dict)
    ):
        raise ReproError(
            f'{IMAGE_ENV} must be {{"id": "sha256:<64 hex>", "labels": {{...}}}}, got {raw[:200]!r}'
        )
    found = {"id": image["id"], "labels": {str(k): str(v) for k, v in image["labels"].items()}}
    if isinstance(image.get("tags"), list):
        found["tags"] = [str(t) for t in image["tags"]]
    if re.fullmatch(r"[0-9a-f]{64}", str(image.get("archive_sha256", ""))):
        found["archive_sha256"] = image["archive_sha256"]
    return found


# --- child -------------------------------------------------------------------------------


def run_arm_in_this_process(arm: str, out_dir: Path) -> int:
    """Run one arm here and write `.<arm>.partial.json`; the parent finishes the record."""
    from repro.arms import ARM_RUNNERS
    from repro.arms.common import PhaseTimer

    context = json.loads(os.environ[CONTEXT_ENV])
    facts = _facts(context)
    profile = _profile(context).with_overrides(context["overrides"])
    doc = evidence.base_document(
        arm=arm,
        context=facts,
        profile=profile,
        model_path=context["model_path"],
        fault_kind=context["fault_kind"],
    )
    timer = PhaseTimer()
    started = time.monotonic()
    phase = "arm"
    try:
        result = ARM_RUNNERS[arm](profile, context["model_path"], timer)
        phase = "grading"
        verdict = grading.grade(
            signal=profile.signal,
            waves=result.waves,
            engagement=result.engagement,
            liveness=result.liveness,
            extra_noise=result.extra_noise,
            rules=grading.RULES_UPSTREAM,
            require_hits=grading.requires_hits(arm, grading.RULES_UPSTREAM),
        )
        evidence.fill_result(doc, result, verdict, context=facts, overrides=context["overrides"])
        doc["run"]["phases_s"] = {k: round(v, 3) for k, v in timer.seconds.items()}
        _check_fault_active(doc)
    except NotEvidence as exc:
        doc["engine"] = evidence.engine_section(
            context=facts, apc=None, control=None, overrides=context["overrides"]
        )
        doc["verdict"] = {"status": "inconclusive", "gate": exc.gate, "reason": str(exc)}
    except Exception as exc:  # noqa: BLE001 - any failure must still leave a record
        traceback.print_exc()
        doc["engine"] = evidence.engine_section(
            context=facts, apc=None, control=None, overrides=context["overrides"]
        )
        doc["error"] = {"type": type(exc).__name__, "message": str(exc), "phase": phase}
        doc["verdict"] = {
            "status": "error",
            "gate": None,
            "reason": f"{type(exc).__name__} during {phase}: {exc}",
        }
    doc["run"]["finished_at"] = utc_now()
    doc["run"]["duration_s"] = round(time.monotonic() - started, 3)
    # Written before validating, so figures that fail validation are not lost (the parent
    # keeps them beside the error record); validated here too (with a placeholder log entry)
    # so a malformed document shows up in the arm's own log, next to its figures.
    write_json_atomic(out_dir / f".{arm}.partial.json", doc)
    validate_artifact({**doc, "logs": [{"path": "pending", "bytes": 0, "sha256": "0" * 64}]})
    print(
        f"[repro] {arm}: {doc['verdict']['status']}"
        f"{' (' + doc['verdict']['gate'] + ')' if doc['verdict']['gate'] else ''}"
        f" - {doc['verdict']['reason']}"
    )
    return 0


def _check_fault_active(doc: dict[str, Any]) -> None:
    """An injected fault that never reached the engine would fake a positive control."""
    if not doc["fault_injection"]["enabled"]:
        return
    from repro.vllm_plugin import fault_injection

    applied = fault_injection.applied_count()
    doc["fault_injection"]["applied"] = applied
    if applied == 0:
        raise RuntimeError(
            "fault injection was requested but no restored state was perturbed; "
            "the positive control did not run"
        )
