"""Python-only patch overlays on an installed vLLM (`--patch FILE`).

The seed cross-verified fix PRs by hand-porting them onto one vLLM tree; `--patch` does the
same to an engine environment's installed `vllm` package. A patch is read in full first
(repro.venv.unified_diff): only changes to the text of `.py` files inside the `vllm` package are
accepted (compiled kernels cannot be patched in place; binary sections, mode changes,
symlinks, renames, copies and paths that leave the tree are refused, naming the line), and
a patch that does not apply is refused before anything is changed, naming the failing hunks.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from repro.venv import unified_diff
from repro.core.atomicio import sha256_file, write_json_atomic
from repro.core.errors import PatchError

# Written beside the patched `vllm` package, so any run that imports it can record the
# patches it runs on, whether vLLM lives in a venv or in a plain target directory.
RECORD_NAME = "repro-patches.json"


def targets(patch: Path) -> list[str]:
    """The files ``patch`` changes, relative to the directory it is applied in."""
    return sorted({name for section in unified_diff.parse(patch) for name in section.paths})


def check_python_only(patch: Path) -> None:
    """Refuse ``patch`` unless it is a unified diff of Python files inside the vllm package."""
    patch = Path(patch)
    for section in unified_diff.parse(patch):
        for name, line in section.named():
            if not name.endswith(".py"):
                raise PatchError(
                    f"{patch}: line {line}: touches non-Python files [{name!r}]; only "
                    f"Python-only diffs can be applied to an installed vLLM"
                )
            if name.split("/", 1)[0] != "vllm":
                raise PatchError(
                    f"{patch}: line {line}: touches files outside the vllm package [{name!r}] "
                    f"(after `patch -p1` strips the a/ or b/); paths must look like "
                    f"a/vllm/... as in a vLLM pull request's diff"
                )


def check_site(site_packages: Path) -> None:
    """Refuse a --site that does not hold a vllm package (before anything is tried there)."""
    site = Path(site_packages)
    if not site.is_dir():
        raise PatchError(
            f"--site {site} is not a directory; give the directory that holds the vllm "
            f"package (site-packages or a pip --target)"
        )
    if not (site / "vllm").is_dir():
        raise PatchError(
            f"--site {site} holds no vllm package (no {site / 'vllm'}); give the directory "
            f"that holds it (site-packages or a pip --target)"
        )


def check_applies(patch: Path, site_packages: Path) -> list[str]:
    """Refuse ``patch`` unless it applies cleanly in ``site_packages`` (a dry run, nothing
    changed); return the `patch` command that would apply it."""
    patch = Path(patch).resolve()
    check_python_only(patch)
    tool = shutil.which("patch")
    if tool is None:
        raise PatchError("the `patch` program is needed to apply --patch files; install it")
    base = [tool, "-p1", "--forward", "--batch", "-d", str(site_packages), "-i", str(patch)]
    dry = subprocess.run([*base, "--dry-run"], capture_output=True, text=True)
    if dry.returncode != 0:
        raise PatchError(_describe_failure(patch, dry.stdout + dry.stderr))
    return base


def apply_patch(patch: Path, site_packages: Path) -> dict[str, str]:
    """Apply `patch` (paths a/vllm/...) inside `site_packages`; refuse it whole on failure."""
    patch = Path(patch).resolve()
    base = check_applies(patch, site_packages)
    real = subprocess.run(base, capture_output=True, text=True)
    if real.returncode != 0:
        raise PatchError(_describe_failure(patch, real.stdout + real.stderr))
    applied = {"path": patch.name, "sha256": sha256_file(patch)}
    record = Path(site_packages) / RECORD_NAME
    previous = json.loads(record.read_text()) if record.is_file() else []

    write_json_atomic(record, [*previous, applied])
    return applied


def apply_patches(patches: list[Path], site_packages: Path) -> list[dict[str, str]]:
    """Apply every patch in order, or none: all of them are first applied, in order, to a
    scratch copy of the files they touch, so a later patch that fails (or that only fails
    after an earlier one) leaves the site as it was."""
    patches = [Path(p).resolve() for p in patches]
    for patch in patches:
        check_python_only(patch)
    check_site(site_packages)
    with tempfile.TemporaryDirectory(prefix="repro-patch-") as scratch:
        for patch in patches:
            for name in targets(patch):
                source, copy = Path(site_packages) / name, Path(scratch) / name
                if source.is_file() and not copy.exists():
                    copy.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, copy)
        for patch in patches:
            base = check_applies(patch, Path(scratch))
            trial = subprocess.run(base, capture_output=True, text=True)
            if trial.returncode != 0:
                raise PatchError(_describe_failure(patch, trial.stdout + trial.stderr))
    return [apply_patch(patch, site_packages) for patch in patches]


def applied_patches() -> list[dict[str, str]]:
    """Patches the kit applied to the `vllm` this interpreter imports (without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return []
    record = Path(list(spec.submodule_search_locations)[0]).parent / RECORD_NAME
    return json.loads(record.read_text()) if record.is_file() else []


def _describe_failure(patch: Path, output: str) -> str:
    """Name each failing hunk with its file and header, from patch's own report."""
    sections = unified_diff.parse(patch)
    failures = []
    current = None
    for line in output.splitlines():
        m = re.match(r"(?:checking|patching) file (\S+)", line)
        if m:
            current = m.group(1)
        m = re.match(r"Hunk #(\d+) FAILED at (\d+)", line)
        if m:
            number = int(m.group(1))
            header = _hunk_header(sections, current, number)
            failures.append(f"{current}: hunk #{number} {header}")
        if "can't find file" in line or "No file to patch" in line:
            failures.append(f"{current or '?'}: file not found in the installed vLLM")
        if "Reversed (or previously applied) patch detected" in line:
            failures.append(f"{current}: already applied (or reversed)")
    listed = "\n  ".join(failures) if failures else output.strip()[-2000:]
    return (
        f"patch {patch.name} does not apply to the installed vLLM:\n  {listed}\n"
        f"port it to this vLLM release (or pick the release it was made for with --vllm)"
    )


def _hunk_header(sections: list[unified_diff.FileDiff], filename: str | None, number: int) -> str:
    for section in sections:
        if filename in section.paths and 0 < number <= len(section.hunks):
            return section.hunks[number - 1].header
    return ""
