"""Run a profile's arms and write one validated artifact per arm.

All arms of a run share one engine process (`python -m repro arms …`): one Python and one
vLLM import, then each arm in turn. That process's output comes to this parent through one
pipe; every line is masked for secrets and filed into the running arm's `logs/<arm>.log`,
and the progress events that travel in the same stream (`repro.progress`) drive the
display (`repro.display`). The engine process writes each arm's document without the
`logs` section; this parent adds the log's size and hash and writes the final artifact as
soon as the arm is done, while the next arm runs.

Arms stay isolated as records: an arm that fails inside the engine process gets its `error`
record there and the next arm runs. If the process itself dies, hangs or is killed, the
running arm gets an `error` record here that keeps its log, and the arms not yet run start
in a fresh engine process: a run never ends without a record per arm.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from repro import connectors, grading, progress
from repro.arms import record
from repro.arms.cold_race import run_cold_race
from repro.arms.common import PhaseTimer, fault_counts
from repro.arms.multi_turn import run_multi_turn
from repro.artifact import (
    ArtifactContainsSecrets,
    ArtifactInvalid,
    require_validation,
    write_artifact,
)
from repro.core import redaction
from repro.core.atomicio import sha256_file, write_json_atomic, write_text_atomic
from repro.core.clock import utc_compact, utc_text
from repro.core.errors import FiguresUnreadable, NotEvidence, ReproError, ValidationUnavailable
from repro.core.vocabulary import FAULT_ENV
from repro.engine import bytecode, cpu_threads, process_vars
from repro.engine.llm import defer_teardowns, freeze_long_lived_objects
from repro.engine.process_vars import CPU_HOST_VARIABLES, GPU_HOST_VARIABLES
from repro.profiles import Profile
from repro.runcontext import FACTS_FILE, EngineFacts, RunContext
from repro.venv import engine_venvs
from repro.vllm_plugin.fault_injection import RESTORED_STATE_NOISE

# The fault --inject-fault installs (the plugin names the faults it knows).
DEFAULT_FAULT_KIND = RESTORED_STATE_NOISE
DEFAULT_ARM_TIMEOUT_S = 30 * 60
# When the parent started the arms' process (its time.monotonic()), for the `start` phase.
_SPAWNED_AT_ENV = "REPRO_ARMS_SPAWNED_AT"

ARM_RUNNERS = {"cold-race": run_cold_race, "multi-turn": run_multi_turn}


def new_run_id() -> str:
    return f"{utc_compact()}-{secrets.token_hex(3)}"


def default_out_dir(run_id: str) -> Path:
    return Path("artifacts") / run_id


# --- parent ------------------------------------------------------------------------------


def run_profile(
    *,
    run_id: str | None = None,
    profile: Profile,
    model_path: str,
    out_dir: Path,
    arms: list[str],
    fault_kind: str | None,
    overrides: dict[str, Any],
    arm_timeout_s: float = DEFAULT_ARM_TIMEOUT_S,
    command: list[str] | None = None,
    verbose: bool = False,
    connector: connectors.Connector | None = None,
    weights_pin: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the arms in one engine process; return the written documents by arm.
    `weights_pin`: the check of a GPU profile's weights (`repro.cli.models`), recorded."""
    check_writable(out_dir)
    (out_dir / "logs").mkdir(exist_ok=True)
    run_id = run_id or new_run_id()
    if os.environ.get("REPRO_IN_CONTAINER") == "1":
        write_text_atomic(out_dir / FACTS_FILE, EngineFacts.here().to_json())
    contexts = {
        arm: RunContext.new(
            run_id=run_id,
            arm=arm,
            command=command or ["python", "-m", "repro", *sys.argv[1:]],
            profile=profile,
            model_path=model_path,
            overrides=overrides,
            fault_kind=fault_kind,
            connector=connector.to_json() if connector else None,
            weights_pin=weights_pin,
        )
        for arm in arms
    }
    from repro.display import RunDisplay  # rich: the kit's dependency, imported when used

    documents: dict[str, dict[str, Any]] = {}
    with RunDisplay(list(arms), verbose=verbose) as screen:
        while pending := [arm for arm in arms if arm not in documents]:
            # Each engine process leaves at least one record: the loop always ends.
            documents.update(_run_engine_process(pending, contexts, out_dir, arm_timeout_s, screen))
    return {arm: documents[arm] for arm in arms}


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


class _EngineOutput(threading.Thread):
    """Reads the engine process's output: masks each line, files it into the running arm's
    log, and hands the progress events to the caller in order (None at the end)."""

    def __init__(self, stream, arms: list[str], out_dir: Path, screen) -> None:
        super().__init__(daemon=True)
        self.stream, self.arms, self.out_dir, self.screen = stream, arms, out_dir, screen
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        # The first arm's log also takes what the process prints before that arm starts
        # (imports), and a failure there.
        self.log = open(out_dir / "logs" / f"{arms[0]}.log", "w", encoding="utf-8")

    def run(self) -> None:
        try:
            for line in self.stream:
                text, event = progress.split(line)
                if text is not None:
                    self._write(redaction.redact(text))
                if event is not None:
                    if event.get("event") == "arm_done":
                        self._next_log(event.get("arm"))
                    self.events.put(event)
        finally:
            self._close()
            self.events.put(None)

    def _write(self, text: str) -> None:
        if self.log is not None:
            self.log.write(text)
            self.log.flush()
        self.screen.log_line(text)

    def _next_log(self, done: str) -> None:
        """`done`'s log is complete; what comes next belongs to the following arm."""
        self._close()
        later = self.arms[self.arms.index(done) + 1 :] if done in self.arms else []
        if later:
            self.log = open(self.out_dir / "logs" / f"{later[0]}.log", "w", encoding="utf-8")

    def _close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None


def engine_process_env(base, *, device: str, fault_kind: str | None) -> dict[str, str]:
    """The engine process's environment: `base` with the progress stream, the fault switch
    (vLLM's own processes inherit it), on a GPU the GPU host's settings, and a byte-code
    folder of the kit's where torch has none and the host forbids writing it
    (`repro.engine.bytecode`)."""
    env = dict(base)
    env["PYTHONUNBUFFERED"] = "1"
    env[progress.ENV] = "1"
    # Before vLLM's (and OpenMP's) first import in the engine process; a value the user set
    # is kept.
    process_vars.apply_defaults(GPU_HOST_VARIABLES if device == "cuda" else CPU_HOST_VARIABLES, env)
    # A torch without byte code on a host that forbids writing it compiles at every import.
    bytecode.apply(env)
    if fault_kind:
        env[FAULT_ENV] = fault_kind
    else:
        env.pop(FAULT_ENV, None)
    return env


def _run_engine_process(
    arms: list[str],
    contexts: dict[str, RunContext],
    out_dir: Path,
    timeout_s: float,
    screen,
) -> dict[str, dict[str, Any]]:
    """Run `arms` in one engine process; return the records of the arms it got to.

    The arms it finished have their own records; if it died or timed out in an arm, that
    arm gets an `error` record here; arms after it are left for the next process.
    """
    for arm in arms:
        (out_dir / f".{arm}.partial.json").unlink(missing_ok=True)
    env = engine_process_env(
        os.environ, device=contexts[arms[0]].device, fault_kind=contexts[arms[0]].fault_kind
    )
    if contexts[arms[0]].device == "cpu":
        # The cores free now decide the engine's OpenMP pool; each arm's record says so.
        choice = cpu_threads.choose(os.environ)
        cpu_threads.apply(choice, env)
        contexts = {arm: contexts[arm].with_cpu_threads(choice.as_dict()) for arm in contexts}
    cmd = [sys.executable, "-m", "repro", "arms", "--arms", *arms, "--out", str(out_dir)]
    # The first arm's `start` phase: from here to the child's first line (CLOCK_MONOTONIC is
    # one clock for every process of the machine).
    env[_SPAWNED_AT_ENV] = repr(time.monotonic())
    current = arms[0]
    screen.starting(current)
    arm_started = time.monotonic()
    timed_out = False
    documents: dict[str, dict[str, Any]] = {}
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    output = _EngineOutput(proc.stdout, arms, out_dir, screen)
    output.start()
    try:
        # Checked while the engine process imports vLLM; it waits for its contexts before it
        # does anything else, so a refusal here comes before any engine.
        require_validation()
    except ValidationUnavailable:
        proc.stdin.close()  # no contexts: it exits without running an arm
        proc.wait()
        output.join()
        raise
    try:
        try:
            # One JSON line: each arm's context in its own encoding (RunContext.to_json).
            proc.stdin.write(json.dumps({arm: contexts[arm].to_json() for arm in arms}) + "\n")
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it died already (e.g. vLLM does not import): recorded below
        while True:
            try:
                event = output.events.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() - arm_started > timeout_s:
                    timed_out = True
                    proc.kill()
                continue
            if event is None:
                break
            kind = event.get("event")
            if kind == "arm" and event.get("arm") in arms:
                current = event["arm"]
                contexts[current] = contexts[current].started(event["started_at"])
            screen.event(current, event)
            if kind == "arm_done" and event.get("arm") == current:
                elapsed = time.monotonic() - arm_started
                documents[current] = _finish_record(
                    current, contexts[current], out_dir, elapsed, event
                )
                screen.finished(current, _verdict_text(documents[current]))
                later = arms[arms.index(current) + 1 :]
                current = later[0] if later else None
                arm_started = time.monotonic()
    except BaseException:
        proc.kill()
        raise
    finally:
        returncode = proc.wait()
        output.join()
    if current is not None and current not in documents:
        elapsed = time.monotonic() - arm_started
        reason = (
            f"timed out after {timeout_s:.0f} s and was killed"
            if timed_out
            else f"{_exit_text(returncode)} before writing its record"
        )
        documents[current] = _crash_record(
            current, contexts[current], out_dir, f"the {current} arm's process {reason}", elapsed
        )
        screen.finished(current, _verdict_text(documents[current]))
    return documents


def _exit_text(returncode: int) -> str:
    """How the arm's process ended, the signal named: SIGILL (an instruction this CPU refused)
    and SIGKILL (often the kernel's out-of-memory killer) each point somewhere else."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (status {returncode})"
    return f"exited with status {returncode}"


def _finish_record(
    arm: str, context: RunContext, out_dir: Path, elapsed: float, event: dict[str, Any]
) -> dict[str, Any]:
    """The final artifact of an arm the engine process finished: its log added, validated."""
    if event.get("outcome") != "written":
        what = f"the {arm} arm's process failed to write its document ({event.get('message')})"
        return _crash_record(arm, context, out_dir, what, elapsed)
    partial = out_dir / f".{arm}.partial.json"
    doc = json.loads(partial.read_text())
    doc["logs"] = [log_entry(out_dir, f"logs/{arm}.log")]
    doc["run"]["duration_s"] = round(max(doc["run"]["duration_s"], elapsed), 3)
    try:
        write_artifact(doc, out_dir / f"{arm}.json")
    except ArtifactInvalid as exc:
        what = f"the {arm} arm's document is invalid ({'; '.join(exc.violations)})"
        return _crash_record(arm, context, out_dir, what, elapsed)
    partial.unlink(missing_ok=True)
    return doc


def _crash_record(
    arm: str, context: RunContext, out_dir: Path, what: str, elapsed: float
) -> dict[str, Any]:
    """An `error` record for an arm that left no valid document; its figures are kept."""
    log_rel = f"logs/{arm}.log"
    log_path = out_dir / log_rel
    partial = out_dir / f".{arm}.partial.json"
    if partial.is_file():
        # The arm measured but its record did not validate: keep the figures for a human.
        kept = out_dir / f"{arm}.unvalidated.json"
        os.replace(partial, kept)
        what += f"; its figures, which failed validation, are kept in {kept.name}"
    doc = _crash_document(arm, context, what, log_path)
    doc["logs"] = [log_entry(out_dir, log_rel)] if log_path.is_file() else []
    doc["run"]["duration_s"] = round(elapsed, 3)
    return _write_crash_record(doc, out_dir / f"{arm}.json")


def _verdict_text(doc: dict[str, Any]) -> str:
    verdict = doc["verdict"]
    return verdict["status"] + (f" ({verdict['gate']})" if verdict.get("gate") else "")


def log_entry(out_dir: Path, rel: str) -> dict[str, Any]:
    path = out_dir / rel
    return {"path": rel, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def write_error_record(
    *,
    arm: str,
    context: RunContext,
    what: str,
    out_dir: Path,
    logs: list[str],
    environment: EngineFacts | None = None,
    error_type: str = "ArmProcessFailed",
    phase: str = "arm",
    duration_s: float = 0.0,
) -> dict[str, Any]:
    """Write ``<arm>.json`` as an `error` record saying ``what`` happened; return it.

    ``logs`` are paths relative to ``out_dir`` (missing ones are left out; the first one that
    exists gives the message its last lines). ``environment`` replaces this process's own where
    the run happened elsewhere (a container: see FACTS_FILE).
    """
    kept = [rel for rel in logs if (out_dir / rel).is_file()]
    tail_of = out_dir / kept[0] if kept else out_dir / "logs" / "missing.log"
    doc = _crash_document(
        arm, context, what, tail_of, environment=environment, error_type=error_type, phase=phase
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


def _crash_document(
    arm: str,
    context: RunContext,
    what: str,
    log_path: Path,
    *,
    environment: EngineFacts | None = None,
    error_type: str = "ArmProcessFailed",
    phase: str = "arm",
) -> dict:
    doc = record.base_document(
        arm=arm,
        context=context,
        environment=environment or context.environment or EngineFacts.here(),
        profile=context.resolve_profile(),
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
    doc["run"]["finished_at"] = utc_text()
    return doc


def _tail(path: Path, lines: int = 15) -> str:
    """The log's last lines, secrets masked (the record quotes them)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return redaction.redact("\n".join(text.splitlines()[-lines:]))


# --- child -------------------------------------------------------------------------------


def run_arms_in_this_process(arms: list[str], out_dir: Path) -> NoReturn:
    """Run the arms here, one after the other, each leaving `.<arm>.partial.json`.

    vLLM is imported once, before the first arm. An arm that fails is recorded as such (its
    document says how) and the next arm runs; the parent validates and finishes each record.
    """
    start_s = _seconds_since_spawn()
    # The machine's facts (nvidia-smi, the installed packages' metadata: 1.5-2.4 s of a GPU
    # arm's setup, docs/measured.md) are read while vLLM imports.
    machine = concurrent.futures.ThreadPoolExecutor(max_workers=1).submit(
        EngineFacts.here, variables=False
    )
    import_s = _import_engine()
    setup_started = time.perf_counter()
    # This process ends with os._exit below: each engine is torn down only when the next one
    # boots, and the last one never (docs/measured.md, §GPU hosts).
    defer_teardowns()
    # The parent sends the arms' contexts once it knows their records can be validated.
    line = sys.stdin.readline()
    if not line:
        os._exit(3)  # the parent refused the run (or is gone): nothing to do
    contexts = {arm: RunContext.from_json(text) for arm, text in json.loads(line).items()}
    # This environment's facts, as every arm records them: taken once, before any engine.
    environment = machine.result().with_variables_now()
    # The first arm's record carries what the process spent before it: its start, vLLM's
    # import, and the kit's setup (the collector's freeze, the contexts, the wait for the facts).
    first_phases = {
        "start": start_s,
        "import": import_s,
        "setup": time.perf_counter() - setup_started,
    }
    for index, arm in enumerate(arms):
        context = contexts[arm].started(utc_text()).with_environment(environment)
        progress.emit("arm", arm=arm, started_at=context.started_at)
        outcome, message = "written", None
        try:
            phases = first_phases if index == 0 else {}
            _run_one_arm(arm, context, out_dir, phases)
        except Exception as exc:  # noqa: BLE001 - e.g. the document could not be written
            traceback.print_exc()
            outcome, message = "failed", f"{type(exc).__name__}: {exc}"
        progress.emit("arm_done", arm=arm, outcome=outcome, message=message)
    # Every document is written and every engine shut down: skip the interpreter's teardown
    # of vLLM and torch, which has nothing left to write and takes seconds (docs/measured.md,
    # §Engine process).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _seconds_since_spawn() -> float:
    """Seconds since the parent started this process (0 where it did not say when)."""
    try:
        spawned = float(os.environ.pop(_SPAWNED_AT_ENV))
    except (KeyError, ValueError):
        return 0.0
    return max(0.0, time.monotonic() - spawned)


def _import_engine() -> float:
    """Import vLLM once for all arms; the seconds it took (the first arm records them).

    The modules an engine start needs (vLLM's top level is lazy), so that the import is
    counted once, here, rather than inside the first arm's geometry or boot.
    """
    progress.emit("phase", name="importing vLLM")
    engine_venvs.use_own_vllm_cache()
    if sys.pycache_prefix:
        # One line in the arm's log: where the imports' byte code is read from and written.
        print(f"[repro] Python's byte code: under {sys.pycache_prefix}", file=sys.stderr)
    started = time.perf_counter()
    # lazy: vllm, found only in an engine environment; and this import is the one timed
    import vllm  # noqa: F401
    from vllm import LLM  # noqa: F401
    from vllm.engine.arg_utils import EngineArgs  # noqa: F401

    seconds = time.perf_counter() - started

    freeze_long_lived_objects()  # the kit's cost, not vLLM's import: outside `seconds`
    return seconds


def _run_one_arm(arm: str, context: RunContext, out_dir: Path, phases: dict) -> None:
    """Run one arm and write `.<arm>.partial.json` (without its `logs` section).

    `context` carries this environment's facts (`RunContext.with_environment`)."""
    environment = context.environment or EngineFacts.here()
    profile = context.resolve_profile().with_overrides(context.overrides)
    doc = record.base_document(arm=arm, context=context, environment=environment, profile=profile)
    timer = PhaseTimer()
    for name, seconds in phases.items():
        timer.add(name, seconds)
    started = time.monotonic()
    phase = "arm"
    try:
        connector = connectors.Connector.from_json(context.connector)
        connectors.check_loadable(connector)
        result = ARM_RUNNERS[arm](profile, context.model_path, timer, connector=connector)
        phase = "grading"
        progress.emit("phase", name="grading")
        grading_started = time.perf_counter()
        verdict = _grade(arm, profile, result)
        record.fill_result(doc, result, verdict, context=context, environment=environment)
        if connector is not None:
            doc["connector"] = connectors.identity(connector)
            reference = result.reference
            doc["ladder"] = record.ladder_section(
                doc,
                reference,
                _grade(arm, profile, reference),
                context=context,
                environment=environment,
            )
        timer.add("grading", time.perf_counter() - grading_started)
        doc["run"]["phases_s"] = {k: round(v, 3) for k, v in timer.seconds.items()}
        _check_fault_active(doc, result)
    except NotEvidence as exc:
        doc["engine"] = record.engine_section(
            context=context, environment=environment, apc=None, control=None
        )
        doc["verdict"] = {"status": "inconclusive", "gate": exc.gate, "reason": str(exc)}
    except Exception as exc:  # noqa: BLE001 - any failure must still leave a record
        traceback.print_exc()
        doc["engine"] = record.engine_section(
            context=context, environment=environment, apc=None, control=None
        )
        doc["error"] = {"type": type(exc).__name__, "message": str(exc), "phase": phase}
        doc["verdict"] = {
            "status": "error",
            "gate": None,
            "reason": f"{type(exc).__name__} during {phase}: {exc}",
        }
    doc["run"]["finished_at"] = utc_text()
    doc["run"]["duration_s"] = round(time.monotonic() - started, 3)
    # The parent validates it: figures that fail validation are kept beside its error record.
    progress.emit("phase", name="writing the record")
    write_json_atomic(out_dir / f".{arm}.partial.json", doc)
    print(
        f"[repro] {arm}: {doc['verdict']['status']}"
        f"{' (' + doc['verdict']['gate'] + ')' if doc['verdict']['gate'] else ''}"
        f" - {doc['verdict']['reason']}"
    )


def _grade(arm: str, profile: Profile, result) -> grading.Verdict:
    """Upstream's rules on one APC run against its control (each rung of a ladder alike)."""
    return grading.grade(
        signal=profile.signal,
        waves=result.waves,
        engagement=grading.engagement_of(
            {name: c.as_dict() for name, c in result.apc.counters.items()},
            result.waves,
            grading.RULES_UPSTREAM,
        ),
        liveness=result.liveness,
        extra_noise=result.extra_noise,
        rules=grading.RULES_UPSTREAM,
        require_hits=grading.requires_hits(arm, grading.RULES_UPSTREAM),
    )


def _check_fault_active(doc: dict[str, Any], result) -> None:
    """An injected fault that never reached the engine would fake a positive control. The
    counts are this arm's engines' own (`repro.arms.common.fault_counts`)."""
    if not doc["fault_injection"]["enabled"]:
        return
    applied, unreadable = fault_counts(result)
    if unreadable:
        raise FiguresUnreadable(
            "engagement",
            f"the fault's count could not be read from the workers of {unreadable} engine(s); "
            f"whether the positive control ran is unknown",
        )
    doc["fault_injection"]["applied"] = applied
    if applied == 0:
        raise RuntimeError(
            "fault injection was requested but no restored state was perturbed; "
            "the positive control did not run"
        )
