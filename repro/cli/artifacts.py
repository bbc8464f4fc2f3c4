"""`python -m repro` commands that check run artifacts (added to `repro.cli`'s parser).

validate    validate artifact files against the schema
kit-digest  this kit's source digest; with artifacts, whether they ran this code
kit-archive the kit as one small deterministic archive, for a host without network
"""

from __future__ import annotations

import argparse
from pathlib import Path

from repro.artifact import ArtifactInvalid, validate_artifact
from repro.core.jsonread import JSONUnreadable, read_json
from repro.machine_facts import kit_source_sha256


def add_parsers(sub: argparse._SubParsersAction) -> None:
    validate = sub.add_parser("validate", help="validate artifact files against the schema")
    validate.add_argument("files", nargs="+", type=Path)

    digest = sub.add_parser(
        "kit-digest",
        help="print this kit's source digest; with artifacts, say whether they ran this code",
    )
    digest.add_argument("files", nargs="*", type=Path, help="artifacts to compare (kit section)")

    archive = sub.add_parser(
        "kit-archive",
        help="write the kit's code, schemas and containers/ as one .tar.gz for a host without "
        "network",
    )
    archive.add_argument("--out", type=Path, required=True, help="folder to write it into")


def cmd_kit_archive(args: argparse.Namespace) -> int:
    from repro.kit_archive import write_kit_archive  # lazy: the evidence archive writer

    path = write_kit_archive(args.out)
    print(f"{path} ({path.stat().st_size / 2**20:.1f} MiB): tar -xzf it on the host", flush=True)
    return 0


def cmd_kit_digest(args: argparse.Namespace) -> int:
    mine = kit_source_sha256()
    print(mine)
    differ = 0
    for path in args.files:
        try:
            doc = read_json(path)
        except JSONUnreadable as exc:
            detail = str(exc).removeprefix(f"{path}: ")
            print(f"{path}: not a readable artifact ({detail}); expected a run's <arm>.json")
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
        elif not isinstance(recorded, str):
            print(f"{path}: kit.source_sha256 is {recorded!r}; expected a sha256 hex string")
            differ += 1
        else:
            print(f"{path}: ran other code ({recorded[:12]}…)")
            differ += 1
    return 1 if differ else 0


def cmd_validate(args: argparse.Namespace) -> int:
    bad = 0
    for path in args.files:  # one bad file does not stop the others from being checked
        try:
            validate_artifact(read_json(path))
            print(f"{path}: valid")
        except (ArtifactInvalid, JSONUnreadable) as exc:
            bad += 1
            print(f"{path}: INVALID\n{exc}")
        except RecursionError:
            bad += 1
            print(f"{path}: INVALID\nnested deeper than the schema check can follow")
    return 1 if bad else 0


COMMANDS = {
    "kit-archive": cmd_kit_archive,
    "kit-digest": cmd_kit_digest,
    "validate": cmd_validate,
}
