"""The kit as one small archive for a host without network: `python -m repro kit-archive`.

A bare GPU host needs the kit's code (`repro/`, with the committed needle checkpoints), its
schemas, and `containers/` (the bare-host wrapper and conditions, the patches and reverts), and
nothing else of a checkout: no examples, tests or docs. The archive is deterministic (sorted
members, fixed metadata, the gzip header of `repro.evidence.archive`), named after the kit's
source digest (`kit-digest`), so two builds of the same code are the same bytes and the host
can tell which code it runs. Unpack it with `tar -xzf`; then `containers/bare-host/red-green.sh`
or `PYTHONPATH=. python3 -m repro …` inside.
"""

from __future__ import annotations

import os
from pathlib import Path

from repro import KIT_SOURCE
from repro.core.atomicio import write_bytes_atomic
from repro.core.errors import ReproError
from repro.evidence.archive import gzip_bytes, tar_bytes
from repro.machine_facts import kit_source_sha256

KIT_DIRS = ("repro", "schemas", "containers")
KIT_FILES = ("pyproject.toml", "README.md")
_SKIP_PARTS = {"__pycache__"}


def kit_files(source: Path = KIT_SOURCE) -> dict[str, bytes]:
    """Archive path -> bytes of every file the archive holds."""
    files = {name: (source / name).read_bytes() for name in KIT_FILES}
    for folder in KIT_DIRS:
        for path in sorted((source / folder).rglob("*")):
            rel = path.relative_to(source)
            if path.is_file() and not _SKIP_PARTS & set(rel.parts) and path.suffix != ".pyc":
                files[rel.as_posix()] = path.read_bytes()
    return files


def write_kit_archive(out_dir: Path, source: Path = KIT_SOURCE) -> Path:
    """Write ``out_dir/repro-kit-<digest12>.tar.gz`` (mtime 0) and return its path."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ReproError(f"--out {out_dir} is a file; name the folder to write the archive into")
    resolved = out_dir.resolve()
    for folder in KIT_DIRS:
        # An archive inside what it archives would be packed into the next one.
        if resolved.is_relative_to((source / folder).resolve()):
            raise ReproError(
                f"--out {out_dir} is inside the kit's {folder}/, which the archive holds; "
                f"name a folder outside {', '.join(f'{d}/' for d in KIT_DIRS)}"
            )
    digest = kit_source_sha256(source / "repro")
    target = Path(out_dir) / f"repro-kit-{digest[:12]}.tar.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    files = kit_files(source)
    # Scripts stay runnable (containers/bare-host/red-green.sh); nothing else carries a mode.
    scripts = frozenset(p for p in files if os.access(source / p, os.X_OK))
    write_bytes_atomic(target, gzip_bytes(tar_bytes(files, mtime=0, executable=scripts)))
    return target
