"""``python -m repro.installset build|verify|install``.

``verify`` and ``install`` run on a bare host: this file imports only the standard library at
module level, and ``build``'s modules (uv, packaging, jsonschema, rich) only when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from repro.core.errors import ReproError
from repro.installset import BadInstallInput


def _path(text: str) -> Path:
    """A path argument; an empty one would mean the current folder, which no one means."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty; name a folder")
    return Path(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m repro.installset",
        description="Offline install sets: vLLM plus the wheels a host lacks, in checked parts.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="resolve, download and pack a set (needs PyPI and uv)")
    b.add_argument("--vllm", metavar="VERSION", help="vLLM release, e.g. 0.26.0")
    b.add_argument("--python", help="the host's Python, X.Y or X.Y.Z (3.12)")
    b.add_argument("--for-host", type=Path, metavar="FREEZE", help="its `pip list --format=freeze`")
    b.add_argument("--lock", type=Path, help="ship a wheel lock's install-set wheels instead")
    b.add_argument("--wheels-from", type=Path, help="with --lock: link wheels from this folder")
    b.add_argument("--out", required=True, type=_path, help="output folder (parts + manifest.json)")
    b.add_argument("--part-size", default="55MiB", help="size of each part (default 55MiB)")
    b.add_argument("--platform", action="append", metavar="TAG", help="newest tag the host runs")
    b.add_argument("--index-url", help="package index (default https://pypi.org/simple)")
    b.add_argument("--exclude", action="append", default=[], metavar="NAME", help="leave it out")
    b.add_argument("--include-optional", action="store_true", help="ship VLLM_OPTIONAL's too")
    b.add_argument("--exclude-newer", metavar="DATE", help="ignore uploads after DATE (uv)")
    b.add_argument("--uv", metavar="PATH", help="the uv binary (default: on PATH or pip's uv)")
    for name, text in [("verify", "check the parts"), ("install", "verify, then pip-install")]:
        c = sub.add_parser(name, help=f"{text} (standard library + pip)")
        c.add_argument("--parts", required=True, type=_path, help="folder with manifest.json")
    c.add_argument("--target", required=True, type=_path, help="new or empty folder to install to")
    c.add_argument("--replace", action="store_true", help="swap out a TARGET this kit installed")
    return parser


def _build(args: argparse.Namespace) -> None:
    from repro.installset.build import build_from_lock, build_vllm, parse_size
    from repro.installset.host import DEFAULT_PLATFORM, Target
    from repro.installset.resolve import VLLM_OPTIONAL

    size = parse_size(args.part_size)
    if args.lock:
        if args.vllm or args.python or args.for_host:
            raise BadInstallInput("--lock replaces --vllm, --python and --for-host")
        build_from_lock(args.lock, args.out, part_size=size, wheels_from=args.wheels_from)
        return
    if not (args.vllm and args.python and args.for_host):
        raise BadInstallInput("build needs --vllm, --python and --for-host (or --lock)")
    exclude = {} if args.include_optional else dict(VLLM_OPTIONAL)
    exclude.update({name: "left out with --exclude" for name in args.exclude})
    target = Target.create(args.python, args.platform or [DEFAULT_PLATFORM])
    build_vllm(
        args.vllm,
        args.for_host,
        args.out,
        target,
        part_size=size,
        exclude=exclude,
        index_url=args.index_url,
        uv=args.uv,
        exclude_newer=args.exclude_newer,
    )


def main(argv: list[str] | None = None) -> int:
    """Exit 0, 1 (a check failed: a damaged or forged set, a damaged install) or 2 (bad input:
    argparse's own exit code too). A refusal is its message; REPRO_DEBUG=1 adds the traceback."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            _build(args)
        elif args.command == "verify":
            from repro.installset.install import verify

            checked = verify(args.parts)
            wheels = len(checked.manifest["wheels"])
            print(
                f"ok: {len(checked.parts)} part(s), {wheels} wheel(s) and SHA256SUMS match "
                f"{args.parts / 'manifest.json'}"
            )
        else:
            from repro.installset.install import install

            install(args.parts, args.target, replace=args.replace)
    except ReproError as exc:
        if os.environ.get("REPRO_DEBUG") == "1":
            raise
        print(f"error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
