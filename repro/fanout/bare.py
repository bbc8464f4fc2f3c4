"""`matrix --executor bare`: the matrix on a host with no Docker and no network.

    python -m repro matrix --executor bare --parts SET_DIR [--parts SET_DIR ...] \
        [--extra-wheels DIR] [--device cuda] [--gpus-per-cell N] --conditions FILE --out DIR

Each `--parts` folder is one install set (`python -m repro.installset build`), carried to the
host. A condition runs on the set whose vLLM release it names, installed once per (set, patch
set) into a reused tree (`repro.venv.host_tree`, `python -m repro host-install`), with this host's
python. Every tree the cells need is made or reused before the first cell starts; then the
cells run, each `python -m repro run` with the tree on PYTHONPATH: one after another with
every GPU, or with `--gpus-per-cell N` floor(GPUs / N) at a time, each on its own N GPUs
(`repro.fanout.gpu_slices`). Everything else is the local matrix's: a finished cell with the
same content hash is kept, so when the machine goes away mid-way, the same command on a new
one (the parts carried again, the matrix directory brought back) installs the trees again
and runs only what did not finish. A condition with no set, or whose tree cannot be made, gets
`error` records naming why; the other cells still run.
"""

from __future__ import annotations

import importlib.util
import queue
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from repro.core.errors import ReproError
from repro.fanout import cell, gpu_slices
from repro.fanout.conditions import BadCondition, Condition
from repro.venv import host_tree


class BareOptionsError(ReproError):
    """`--executor bare` without what it needs, or with sets it cannot tell apart."""


@dataclass(frozen=True)
class BareOptions:
    sets: dict[str, Path]  # vLLM release -> its install set's folder
    extra_wheels: tuple[Path, ...] = ()
    trees: Path | None = None
    device: str | None = None


def options_from_args(args) -> BareOptions:
    if not args.parts:
        raise BareOptionsError(
            "--executor bare needs --parts SET_DIR (an install set from `python -m "
            "repro.installset build`), once per vLLM release the conditions name"
        )
    sets: dict[str, Path] = {}
    for folder in args.parts:
        version = host_tree.TreeSpec(folder).root_requirement()["version"]
        if version in sets:
            raise BareOptionsError(
                f"--parts {sets[version]} and --parts {folder} are both vLLM {version}; give "
                f"one set per release"
            )
        sets[version] = folder
    return BareOptions(
        sets=sets,
        extra_wheels=host_tree.extra_wheels_in(args.extra_wheels),
        trees=args.trees,
        device=args.device,
    )


def install_set_of(item: Condition, options: BareOptions) -> Path:
    """The set a condition's engine is installed from (a pr: condition's: its base's);
    refused when none was carried."""
    source = item.installed_from()
    if source.ref.kind != "release":
        raise BareOptionsError(
            f"{item.vllm} is installed from main commit {source.ref.value}: a bare host runs "
            f"vLLM releases from carried install sets; build the set from that commit's CUDA "
            f"lock (python -m repro cuda-lock, then python -m repro.installset build --lock "
            f"LOCK) and name the release it holds, or run it with --executor slurm"
        )
    if source.ref.value in options.sets:
        return options.sets[source.ref.value]
    carried = ", ".join(f"{v} ({p})" for v, p in options.sets.items())
    raise BareOptionsError(
        f"no install set of vLLM {source.ref.value} was given (--parts holds {carried}); build "
        f"one where PyPI is reachable (python -m repro.installset build --vllm "
        f"{source.ref.value} --python X.Y --for-host FREEZE --out DIR) and carry it"
    )


def tree_spec(item: Condition, options: BareOptions) -> host_tree.TreeSpec:
    patches = item.installed_from().patches
    return host_tree.TreeSpec(install_set_of(item, options), tuple(patches), options.extra_wheels)


def dry_run(
    items: list[Condition | BadCondition],
    out_dir: Path,
    options: BareOptions,
    finished: set[str],
    slicing: gpu_slices.Slicing | None = None,
) -> str:
    """Each condition's set and tree (made or reused), without making anything; ``finished``
    names the cells a run would keep, ``slicing`` how many run at once on which GPUs."""
    root = options.trees or host_tree.default_root()
    lines = [f"# matrix {out_dir}: {len(items)} condition(s) on this host; nothing made"]
    if slicing is not None:
        lines.append(f"# {slicing.describe()}")
    for item in items:
        if isinstance(item, BadCondition):
            lines.append(f"#   {item.name}: error ({item.problem})")
            continue
        try:
            spec = tree_spec(item, options)
            tree = host_tree.tree_path(spec, root)
        except ReproError as exc:
            lines.append(f"#   {item.name}: error ({exc})")
            continue
        state = "reused" if host_tree.read_marker(tree) else "made"
        what = "kept (finished, same content hash)" if item.name in finished else "run"
        patches = ", ".join(p.name for p in item.patches) or "no patches"
        lines.append(
            f"#   {item.name}: {what}; set {spec.parts} ({patches}); tree {tree} ({state}); "
            f"arms {', '.join(item.arms)}"
        )
    return "\n".join(lines)


def run_bare(
    p,
    *,
    options: BareOptions,
    kit_source: Path,
    arm_timeout_s,
    slicing: gpu_slices.Slicing | None = None,
    log=print,
) -> None:
    """Make or reuse each tree the cells need, then run the cells: one after another with
    every GPU, or with ``slicing`` as many at once as it has slices, each on its own (see the
    module's text)."""
    ready = prepare_trees(p, options, kit_source=kit_source, log=log)

    def one(item: Condition, tree: Path, gpus: tuple[str, ...] | None) -> None:
        started = time.monotonic()
        on = f" on GPU(s) {','.join(gpus)}" if gpus else ""
        log(f"[matrix] {item.name}: running on {tree.name}{on}")
        docs = cell.run_cell(
            item,
            p.out_dir / item.name,
            kit_source=kit_source,
            arm_timeout_s=arm_timeout_s,
            engine_python=Path(sys.executable),
            engine_path=tree,
            device=options.device,
            gpu_variables=gpu_slices.cell_variables(gpus, slicing.host) if gpus else None,
            log=log,
        )
        states = ", ".join(f"{a} {d['verdict']['status']}" for a, d in docs.items())
        log(f"[matrix] {item.name}: {states} ({time.monotonic() - started:.0f}s)")

    if slicing is None:
        for item, tree in ready:
            one(item, tree, None)
    else:
        log(f"[matrix] {slicing.describe()}")
        given: dict[str, tuple[str, ...]] = {}
        free: queue.SimpleQueue[tuple[str, ...]] = queue.SimpleQueue()
        for gpus in slicing.slices:
            free.put(gpus)

        def on_a_free_slice(job: tuple[Condition, Path]) -> None:
            # One worker per slice, each holding at most one: a slice is always free here.
            gpus = free.get()
            given[job[0].name] = gpus
            try:
                one(*job, gpus)
            finally:
                free.put(gpus)

        with ThreadPoolExecutor(max_workers=len(slicing.slices)) as pool:
            # list(): a cell's unforeseen exception surfaces here, after the others finished.
            list(pool.map(on_a_free_slice, ready))
        p.gpus = slicing.record({i.name: given[i.name] for i, _ in ready if i.name in given})
    borrow_validation(ready[0][1] if ready else None, options)


def prepare_trees(
    p, options: BareOptions, *, kit_source: Path, log=print
) -> list[tuple[Condition, Path]]:
    """Each cell to run with its tree, made or reused once per (set, patch set) before any
    cell starts (two cells never install one tree together); a condition with no tree, or
    from the conditions file's errors, gets its `error` records now."""
    ready: list[tuple[Condition, Path]] = []
    trees: dict[Path, dict] = {}  # one record per tree, as matrix.json's environments
    for item in p.to_run:
        cell_dir = p.out_dir / item.name
        started = time.monotonic()
        if isinstance(item, BadCondition):
            cell.run_cell(item, cell_dir, kit_source=kit_source, log=log)
            continue
        try:
            tree, state = host_tree.ensure_tree(
                tree_spec(item, options), root=options.trees, log=log
            )
        except (ReproError, OSError) as exc:
            p.environments.append(_tree_record(item, None, f"{type(exc).__name__}: {exc}", started))
            cell.fail_without_engine(
                item,
                cell_dir,
                "tree on this host",
                exc,
                phase="host-install",
                engine=_describe_install(item),
            )
            log(f"[matrix] {item.name}: error (no tree: {exc})")
            continue
        if tree in trees:
            trees[tree]["cells"].append(item.name)
        else:
            trees[tree] = _tree_record(item, tree, state, started)
            p.environments.append(trees[tree])
            log(f"[matrix] tree {tree.name}: {state}")
        ready.append((item, tree))
    return ready


def _describe_install(item: Condition) -> str:
    source = item.installed_from()
    patches = ", ".join(p.name for p in source.patches)
    return f"the vLLM {source.ref.value} install set" + (f" with {patches}" if patches else "")


def _tree_record(item: Condition, tree: Path | None, state: str, started: float) -> dict:
    record = {
        "vllm": item.vllm,
        "patches": [pt.name for pt in item.patches],
        "cells": [item.name],
        "state": state if tree else "error",
        "seconds": round(time.monotonic() - started, 3),
    }
    if tree:
        record["tree"] = str(tree)
    else:
        record["error"] = state
    return record


def borrow_validation(tree: Path | None, options: BareOptions) -> None:
    """Let this process validate matrix.json where the host lacks jsonschema: from a tree,
    after the host's own packages (appended, so nothing the host has is shadowed)."""
    if importlib.util.find_spec("jsonschema") is not None:
        return
    if tree is None:  # every cell was kept: the tree of any set, made or reused now
        item_set = next(iter(options.sets.values()))
        spec = host_tree.TreeSpec(item_set, (), options.extra_wheels)
        tree, _ = host_tree.ensure_tree(spec, root=options.trees)
    sys.path.append(str(tree))
