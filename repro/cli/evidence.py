"""`python -m repro` commands for evidence that travels (added to `repro.cli`'s parser).

bundle        RUN_DIR… --out FILE.tar.gz   deterministic evidence bundle with manifest
verify        FILE.tar.gz                  check a bundle without extracting it
report        RUN_DIR|BUNDLE…              Markdown for the issue tracker
compare       A B                          two labs' runs side by side; 1 when verdicts differ
export-image  IMAGE --out FILE.tar         image archive + sha256 + archive record
import-image  FILE.tar                     check, load, re-check, tag, record
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repro.containers import docker_client, handoff
from repro.core.atomicio import write_text_atomic
from repro.core.errors import ReproError
from repro.core.output_paths import check_output
from repro.evidence import bundle, compare, report
from repro.evidence.verify import load_runs, verify_bundle


def add_parsers(sub: argparse._SubParsersAction) -> None:
    bundle = sub.add_parser("bundle", help="write a deterministic evidence bundle of run dirs")
    bundle.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    bundle.add_argument("--out", type=Path, required=True, help="FILE.tar.gz to write")
    bundle.add_argument("--force", action="store_true", help="replace an existing bundle")
    bundle.add_argument(
        "--created",
        default=None,
        help="creation time (RFC 3339); default SOURCE_DATE_EPOCH, else the newest artifact's "
        "finished time",
    )
    bundle.add_argument(
        "--images", type=Path, default=None, help="image records folder (default artifacts/images)"
    )

    verify = sub.add_parser("verify", help="verify a bundle (hashes, schemas, verdicts)")
    verify.add_argument("bundle", type=Path, metavar="FILE.tar.gz")

    report = sub.add_parser("report", help="Markdown report of runs or bundles")
    report.add_argument("inputs", nargs="+", type=Path, metavar="RUN_DIR|BUNDLE")
    report.add_argument("--out", type=Path, default=None, help="also write it to this file")
    report.add_argument("--force", action="store_true", help="replace an existing --out file")

    compare = sub.add_parser("compare", help="compare two runs (exit 1 when verdicts disagree)")
    compare.add_argument("a", type=Path, metavar="A")
    compare.add_argument("b", type=Path, metavar="B")
    compare.add_argument("--out", type=Path, default=None, help="also write it to this file")
    compare.add_argument("--force", action="store_true", help="replace an existing --out file")

    export = sub.add_parser("export-image", help="save an image with its sha256 and record")
    export.add_argument("image", metavar="IMAGE")
    export.add_argument("--out", type=Path, required=True, help="FILE.tar to write")
    export.add_argument(
        "--images", type=Path, default=None, help="build records folder (default artifacts/images)"
    )

    imp = sub.add_parser("import-image", help="load an image archive after checking it")
    imp.add_argument("archive", type=Path, metavar="FILE.tar")
    imp.add_argument("--record", type=Path, default=None, help="default FILE.tar.json")
    imp.add_argument(
        "--images", type=Path, default=None, help="import records folder (default artifacts/images)"
    )


def cmd_bundle(args: argparse.Namespace) -> int:
    kwargs = {"images_dir": args.images} if args.images else {}
    check_output(args.out, reads=args.run_dirs, force=args.force)
    # The bundle's .sha256 beside it is replaced with it: checked the same way.
    check_output(
        args.out.with_name(args.out.name + ".sha256"), reads=args.run_dirs, force=args.force
    )
    result = bundle.build_bundle(args.run_dirs, args.out, created=args.created, **kwargs)
    manifest = result.manifest
    print(
        f"[repro] bundle {result.path}: {result.bytes} bytes, sha256 {result.sha256}\n"
        f"        {len(manifest['files'])} files + MANIFEST.json, runs "
        f"{', '.join(r['label'] for r in manifest['runs'])}; created {manifest['created']} "
        f"(from {manifest['created_from']})"
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    result = verify_bundle(args.bundle)
    print(result.render())
    return 0 if result.ok else 1


def _emit(text: str, out: Path | None) -> None:
    sys.stdout.write(text)
    if out:
        try:
            write_text_atomic(out, text)
        except OSError as exc:
            raise ReproError(
                f"--out {out}: could not be written ({exc.strerror or exc}); the text above is "
                "complete: name a writable file to keep it"
            ) from exc
        print(f"[repro] written to {out}", file=sys.stderr)


def _check_out(args: argparse.Namespace, reads: list[Path]) -> None:
    """Refuse an --out that would overwrite or damage something, before any work."""
    if args.out is not None:
        check_output(args.out, reads=reads, force=args.force)


def cmd_report(args: argparse.Namespace) -> int:
    _check_out(args, args.inputs)
    _emit(report.render(load_runs(args.inputs)), args.out)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    _check_out(args, [args.a, args.b])
    result = compare.compare(compare.load_one(args.a), compare.load_one(args.b))
    _emit(result.markdown, args.out)
    return 0 if result.agree else 1


def cmd_export_image(args: argparse.Namespace) -> int:
    kwargs = {"images_dir": args.images} if args.images else {}
    out = handoff.export_image(
        docker_client(), args.image, args.out, log=lambda m: print(m, file=sys.stderr), **kwargs
    )
    print(
        f"[repro] exported {args.image} to {out.archive}: {out.bytes} bytes, sha256 "
        f"{out.sha256} in {out.seconds:.1f}s; record {out.record_path}"
    )
    return 0


def cmd_import_image(args: argparse.Namespace) -> int:
    kwargs = {"images_dir": args.images} if args.images else {}
    # The record is the user's input: refused by name before Docker is asked for anything.
    handoff.read_archive_record(args.archive, args.record)
    done = handoff.import_image(
        docker_client(),
        args.archive,
        record=args.record,
        log=lambda m: print(m, file=sys.stderr),
        **kwargs,
    )
    for line in done.checks:
        print(f"  ok  {line}")
    print(
        f"[repro] imported {done.image_id} in {done.seconds:.1f}s; import record {done.record_path}"
    )
    return 0


COMMANDS = {
    "bundle": cmd_bundle,
    "verify": cmd_verify,
    "report": cmd_report,
    "compare": cmd_compare,
    "export-image": cmd_export_image,
    "import-image": cmd_import_image,
}
