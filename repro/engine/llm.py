"""The one place that talks to vLLM's `LLM`: boot, geometry, generate, counters.

Everything vLLM-version-specific that the arms need is read here, so the arms and the grading
see plain data (`Completion`, `Counters`, `Geometry`). vLLM is imported lazily: the host-side
kit (noxfile, containers, reports) imports this package without an engine environment.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

from repro import progress, vllm_plugin
from repro.core.errors import EngineBootError, FiguresUnreadable, GeometryUnsupported
from repro.core.vocabulary import FAULT_ENV
from repro.engine import model_inspection, plugin_path, process_vars
from repro.engine.counters import COUNTER_NAMES, Counters
from repro.engine.stats_tap import SchedulerStatsTap
from repro.vllm_plugin import restore_witness, worker_facts

# With the engine core in another process its statistics arrive asynchronously and lag
# generate(): read until this many consecutive snapshots agree.
SETTLE_READS = 3
SETTLE_INTERVAL_S = 0.05
SETTLE_TIMEOUT_S = 10.0
# Upstream waits this long for the liveness probe's hits to show before calling them zero.
LIVENESS_POLL_S = 30.0


# Boot errors that mean "this block geometry cannot run the arm", not "the engine is broken".
_GEOMETRY_BOOT_ERRORS = (
    re.compile(r"block.?size.*must be\s*<=\s*max_num_batched_tokens", re.I),
    re.compile(r"max_num_batched_tokens.*smaller than.*block.?size", re.I),
)


@dataclass(frozen=True)
class Geometry:
    """Block sizes as the booted engine sees them."""

    mamba_block_size: int
    cache_block_size: int
    max_num_batched_tokens: int


@dataclass(frozen=True)
class Completion:
    """One request's result, reduced to what the arms grade."""

    text: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    num_cached_tokens: int
    # Log-probabilities at the first generated position: token id -> logprob (top-k plus the
    # sampled token, as vLLM returns them).
    first_logprobs: dict[int, float]
    # What the engine restored for this request from the prefix cache, one entry per restore
    # (`repro.vllm_plugin.restore_witness`); None where no witness could report.
    restores: tuple[dict[str, Any], ...] | None = ()
    # What the kit's probe connector saw the scheduler do for this request
    # (`repro.vllm_plugin.probe_connector`); None where no probe was attached.
    connector: dict[str, Any] | None = None
    # The same at every generated position, in order (the first is `first_logprobs`): the
    # needle profiles' answer log-prob line reads them (`repro.answer_logprob`).
    answer_logprobs: tuple[dict[int, float], ...] = ()

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int = 8
    # Stop strings (upstream's answers stop at the first newline).
    stop: tuple[str, ...] = ()


class Engine:
    """A booted vLLM engine, used as a context manager so it is always shut down.

    `settings` are `LLM(...)` keyword arguments. Keys in `optional_settings` are passed only
    when the installed vLLM knows them (defaults that gate caching differ between releases);
    `applied_settings` records what was really passed.
    """

    def __init__(
        self,
        *,
        model: str,
        settings: dict[str, Any],
        optional_settings: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        expected_mamba_block_size: int | None = None,
    ) -> None:
        self.model = model
        self.settings = dict(settings)
        self.optional_settings = dict(optional_settings or {})
        self.env = dict(env or {})
        # B as derived from vLLM's configuration before boot (repro.engine.config), which
        # the booted engine must confirm (see `geometry`).
        self.expected_mamba_block_size = expected_mamba_block_size
        self.applied_settings: dict[str, Any] = {}
        self.dropped_settings: list[str] = []
        self.boot_seconds: float | None = None
        self.shutdown_seconds: float | None = None
        self._prior_teardown_seconds = 0.0
        self._llm = None
        self._fault_baseline: list[int] | None = None
        # Restored states the fault perturbed in this engine ("applied"), or that its workers'
        # count could not be read ("unreadable"), filled at shutdown, in place: the count
        # lives with the model runner (in this process, or in worker processes that die with
        # the engine), so it is read from the workers at boot and before shutdown.
        self.fault_count: dict[str, Any] = {}
        self._waves = 0
        # The restore witness as the workers report it: hooks installed, failures, totals.
        self.witness_status: dict[str, Any] = {}
        # Where the counters come from (repro.engine.stats_tap) and, at the last read, how far
        # vLLM's own metrics fell behind them; updated in place at every read.
        self.counter_read: dict[str, Any] = {"source": "vllm-metrics"}
        self._tap: SchedulerStatsTap | None = None
        self._label = "APC" if self.settings.get("enable_prefix_caching") else "control"

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Engine:
        # Defaults only: a variable the user set (VLLM_ENABLE_V1_MULTIPROCESSING=1, an NCCL
        # switch) is kept, and the artifact's environment records what ran.
        process_vars.apply_defaults(self.env)
        model_inspection.inspect_in_this_process()
        # Where the kit is not pip-installed, vLLM's engine-core and worker processes find
        # the plugin through an entry point the kit puts on their path (repro.engine.plugin_path).
        plugin_path.expose_entry_point()
        # lazy: vllm, found only in an engine environment
        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs

        # vLLM loads the kit's plugin through its `vllm.general_plugins` entry point, which
        # exists only where the kit is pip-installed. On a bare GPU host the kit runs from a
        # tree on PYTHONPATH: register it here too (idempotent), so --inject-fault works there
        # (the engine core runs in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0).

        vllm_plugin.register()

        applied, self.dropped_settings = resolve_settings(
            self.settings, self.optional_settings, EngineArgs
        )
        self.applied_settings = applied
        # A deferred teardown frees the previous engine's memory before this one sizes its own.
        self._prior_teardown_seconds = finish_deferred_teardown()
        progress.emit("phase", name=f"booting the {self._label} engine")
        started = time.perf_counter()
        try:
            self._llm = LLM(model=self.model, **applied)
        except Exception as exc:  # noqa: BLE001 - every boot failure is classified below
            text = f"{type(exc).__name__}: {exc}"
            if any(p.search(text) for p in _GEOMETRY_BOOT_ERRORS):
                raise GeometryUnsupported(f"engine refused the block geometry: {text}") from exc
            raise EngineBootError(f"engine failed to start: {text}") from exc
        self.boot_seconds = time.perf_counter() - started
        self._tap = SchedulerStatsTap.attach(self._llm.llm_engine)
        if self._tap is not None:
            self.counter_read["source"] = "scheduler-stats"
        if os.environ.get(FAULT_ENV):
            # Each worker's count at boot: an in-process worker's count runs on over engines.
            self._fault_baseline = self._worker_fault_counts()
        progress.emit("phase", name=f"{self._label} run")
        return self

    def __exit__(self, *exc_info: object) -> None:
        started = time.perf_counter()
        if self._llm is not None and os.environ.get(FAULT_ENV):
            self._count_faults()
        if self._llm is None:
            return
        deferred = _TEARDOWN["deferred"] and self.in_process
        # Everything the arm reads from this engine is read by now. Deferred, its teardown
        # waits for the next boot, and the process's last engine is never torn down (its
        # os._exit); the engine is then referenced from `_TEARDOWN` alone.
        _TEARDOWN["pending"], self._llm = self._llm, None
        if not deferred:
            finish_deferred_teardown()
        # A phase of its own in the record: on a GPU it is seconds between two engines. With
        # teardowns deferred it holds the previous engine's teardown, done before this boot.
        self.shutdown_seconds = time.perf_counter() - started + self._prior_teardown_seconds

    @property
    def llm(self):
        if self._llm is None:
            raise RuntimeError("engine is not running (use `with Engine(...) as engine:`)")
        return self._llm

    # -- facts -----------------------------------------------------------------------------
    def geometry(self) -> Geometry:
        """Mamba block size B from the KV-cache groups whose spec is a MambaSpec.

        Raises GeometryUnsupported when there is not exactly one Mamba block size, or when
        the scheduler's block size differs from it (upstream's cross-invariant: the arms size
        prompts in B and the cache hashes blocks of cache_config.block_size).
        """
        if self.in_process:
            # lazy: vllm, found only in an engine environment
            from vllm.v1.kv_cache_interface import MambaSpec

            vllm_config = self.llm.llm_engine.vllm_config
            kv_cache_config = self._scheduler().kv_cache_config
            mamba_sizes = {
                group.kv_cache_spec.block_size
                for group in kv_cache_config.kv_cache_groups
                if isinstance(group.kv_cache_spec, MambaSpec)
            }
            cache_block_size = vllm_config.cache_config.block_size
            budget = vllm_config.scheduler_config.max_num_batched_tokens
        else:
            mamba_sizes, cache_block_size, budget = self._worker_geometry()
        if len(mamba_sizes) != 1:
            raise GeometryUnsupported(
                f"expected exactly one Mamba block size among the KV-cache groups, "
                f"found {sorted(mamba_sizes)}; is this a hybrid-Mamba model?"
            )
        (mamba_block_size,) = mamba_sizes
        expected = self.expected_mamba_block_size
        if expected is not None and mamba_block_size != expected:
            raise GeometryUnsupported(
                f"the booted engine's Mamba block size is {mamba_block_size}, but vLLM's "
                f"configuration gave {expected} before boot, and the token budget "
                f"({budget}) was sized from that; the arm's geometry does not hold"
            )
        if mamba_block_size != cache_block_size:
            raise GeometryUnsupported(
                f"Mamba block size {mamba_block_size} differs from the scheduler's "
                f"cache_config.block_size {cache_block_size}; the arms' prompt sizing "
                f"assumes they are equal"
            )
        return Geometry(mamba_block_size, cache_block_size, budget)

    @property
    def in_process(self) -> bool:
        """Whether the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
        return getattr(self.llm.llm_engine.engine_core, "engine_core", None) is not None

    def worker_facts(self) -> list[dict[str, Any]]:
        """Each worker's figures (`repro.vllm_plugin.worker_facts`), by `collective_rpc`.

        Raises FiguresUnreadable (gate geometry) where a worker cannot answer: the plugin
        did not load there (VLLM_PLUGINS leaving it out, say), or this vLLM has no such RPC.
        """
        try:
            facts = list(self.llm.collective_rpc(worker_facts.METHOD))
        except Exception as exc:  # noqa: BLE001 - every failure is named below
            raise FiguresUnreadable(
                "geometry",
                f"the engine's workers did not report their figures ({type(exc).__name__}: "
                f"{exc}); with the engine core in another process the kit's plugin must load "
                f"there (VLLM_PLUGINS, where set, must name repro_kit)",
            ) from exc
        if not facts or not all(isinstance(f, dict) for f in facts):
            raise FiguresUnreadable("geometry", f"the workers answered {facts!r}")
        return facts

    def _worker_fault_counts(self) -> list[int] | None:
        """Each rank's fault count, None where a worker cannot report it."""
        try:
            return [int(f["fault_applied"]) for f in self.worker_facts()]
        except (FiguresUnreadable, KeyError, TypeError, ValueError):
            return None

    def _count_faults(self) -> None:
        """This engine's fault count, read from its workers before they shut down."""
        now = self._worker_fault_counts()
        base = self._fault_baseline
        if now is None or base is None or len(now) != len(base):
            self.fault_count["unreadable"] = True
            return
        # Every rank perturbs its own shard of the state: the fault reached a request only
        # where it reached every rank.
        self.fault_count["applied"] = min(n - b for n, b in zip(now, base, strict=True))

    def _worker_geometry(self) -> tuple[set[int], int, int]:
        """Mamba block sizes, cache block size and budget as the workers run them; every
        rank must agree."""
        facts = self.worker_facts()
        views = {
            (tuple(f["mamba_block_sizes"]), f["cache_block_size"], f["max_num_batched_tokens"])
            for f in facts
        }
        if len(views) != 1:
            raise GeometryUnsupported(f"the workers disagree on the block geometry: {facts}")
        ((mamba_sizes, cache_block_size, budget),) = views
        return set(mamba_sizes), cache_block_size, budget

    def _scheduler(self):
        core = self.llm.llm_engine.engine_core
        inner = getattr(core, "engine_core", None)
        if inner is None:
            raise RuntimeError(
                "geometry is read from the in-process engine core; "
                "set VLLM_ENABLE_V1_MULTIPROCESSING=0"
            )
        return inner.scheduler

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` as a prompt, special tokens included (as vLLM encodes a text prompt
        and upstream sizes its manuals)."""
        return len(self.llm.get_tokenizer().encode(text))

    # -- work ------------------------------------------------------------------------------
    def generate(self, prompts: list[str | list[int]], sampling: Sampling) -> list[Completion]:
        """Greedy generation; a prompt is text or, to resend exact tokens, a list of ids."""
        # lazy: vllm, found only in an engine environment
        from vllm import SamplingParams

        params = SamplingParams(
            temperature=0.0,
            max_tokens=sampling.max_tokens,
            min_tokens=sampling.min_tokens,
            ignore_eos=sampling.ignore_eos,
            logprobs=sampling.logprobs,
            stop=list(sampling.stop) or None,
        )
        batch = [p if isinstance(p, str) else {"prompt_token_ids": list(p)} for p in prompts]
        self._waves += 1
        progress.emit("wave", run=self._label, index=self._waves, requests=len(batch))
        outputs = self.llm.generate(batch, params, use_tqdm=_progress_bar(self.llm))
        restores = self._restores()
        probe = _probe_records()
        return [
            _completion(
                out,
                None if restores is None else _own(restores, out.request_id),
                connector=probe(out.request_id) if probe else None,
            )
            for out in outputs
        ]

    def _restores(self) -> list[dict[str, Any]] | None:
        """The restores the witness judged since the last call (rank 0's: every rank
        restores the same blocks), or None where it cannot report."""
        try:
            reports = list(self.llm.collective_rpc(restore_witness.METHOD))
        except Exception as exc:  # noqa: BLE001 - named in the record, never a zero
            self.witness_status = {"installed": [], "broken": [f"{type(exc).__name__}: {exc}"]}
            return None
        first = reports[0] if reports and isinstance(reports[0], dict) else {}
        self.witness_status = {
            "installed": list(first.get("installed") or []),
            "broken": list(first.get("broken") or []),
            "totals": dict(first.get("totals") or {}),
            "hit_lengths": bool(first.get("hit_lengths")),
            "seconds": float(first.get("seconds") or 0.0),
        }
        if (
            self.witness_status["broken"]
            or "preprocess_mamba" not in self.witness_status["installed"]
        ):
            return None
        return list(first.get("events") or [])

    def counters(self) -> Counters:
        """Counter totals: every step's scheduler statistics, summed (`repro.engine.stats_tap`),
        or vLLM's own metrics where no tap attaches (`counter_read` says which). In process,
        one read, as upstream's: the engine hands over its statistics inside step(), in this
        thread, so nothing moves them between reads. With the engine core in another
        process: read until SETTLE_READS consecutive snapshots agree."""
        if self.in_process:
            return self._read_counters()
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        last, same = None, 0
        while True:
            current = self._read_counters()
            same = same + 1 if current == last else 1
            last = current
            if same >= SETTLE_READS or time.monotonic() > deadline:
                return current
            time.sleep(SETTLE_INTERVAL_S)

    def counters_moved(
        self, baseline: Counters, field_name: str, timeout_s: float = LIVENESS_POLL_S
    ) -> Counters:
        """Counter totals once `field_name` has moved past `baseline`, or after `timeout_s`.

        Upstream's settled delta: aggregation can lag generate(), so a zero read at once may
        be a late one; a delta still zero after the wait is a real zero. With the engine core
        in this process the first read is final: the engine records its statistics inside
        step(), in this thread, and no step() runs while the arm waits. (On an H200 with
        async scheduling vLLM 0.26.0's own counters stayed at 0 / 0 through the whole 30 s:
        they drop the statistics of steps without outputs, which the tap keeps.)
        """
        if self.in_process:
            return self.counters()
        deadline = time.monotonic() + timeout_s
        current = self.counters()
        while getattr(current - baseline, field_name) <= 0 and time.monotonic() < deadline:
            time.sleep(1.0)
            current = self.counters()
        return current

    def _read_counters(self) -> Counters:
        totals = dict.fromkeys(COUNTER_NAMES, 0)
        by_metric = {metric: key for key, metric in COUNTER_NAMES.items()}
        found = set()
        for metric in self.llm.get_metrics():
            key = by_metric.get(metric.name)
            if key is not None and hasattr(metric, "value"):
                totals[key] += int(metric.value)
                found.add(key)
        if "prefix_cache_queries" not in found:
            # Not a zero: no figure at all (stat loggers off, or stats that never reached
            # this process from the engine core).
            raise FiguresUnreadable(
                "engagement", "vLLM's metrics hold no prefix-cache counters; none can be read"
            )
        metrics = Counters(**totals)
        if self._tap is None:
            return metrics
        tapped = self._tap.totals  # immutable: the tap replaces it at each step
        self.counter_read["steps"] = self._tap.steps
        self.counter_read["missed_by_vllm_metrics"] = (tapped - metrics).as_dict()
        return tapped


# Engine teardowns deferred to the next boot (`defer_teardowns`), and the engine waiting.
_TEARDOWN: dict[str, Any] = {"deferred": False, "pending": None}


def defer_teardowns() -> None:
    """From now on, tear each in-process engine down only when the next one boots.

    For a process that ends with `os._exit` once its records are written (the runner's arm
    child): the last engine's teardown, seconds on a GPU, then never runs, and the exit frees
    its memory. Engines with processes of their own (a multiprocess executor) are still torn
    down at once, so that none outlives the run.
    """
    _TEARDOWN["deferred"] = True


def finish_deferred_teardown() -> float:
    """Tear down the engine left waiting, if any; the seconds it took. Every teardown is
    this call: at the engine's exit, or deferred to the next boot."""
    llm, _TEARDOWN["pending"] = _TEARDOWN["pending"], None
    if llm is None:
        return 0.0
    started = time.perf_counter()
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - shutting down a half-dead engine must not mask
        pass
    del llm  # the last reference: the collection below frees the engine
    freeze_long_lived_objects()
    return time.perf_counter() - started


def freeze_long_lived_objects() -> None:
    """Collect, then keep every survivor out of the collector's later passes.

    After vLLM's import, and after an engine's shutdown, the heap holds some 600,000 objects
    that live as long as the process (modules, torch's and vLLM's registries). Each full
    collection walks them all, about a third of a second here, and a boot runs several.
    Frozen, they are skipped. vLLM's engine shutdown unfreezes before it collects (so that a
    dead engine's memory is found), hence a freeze again after each engine; vLLM's server and
    engine core freeze their heaps the same way after start-up (`freeze_gc_heap`).
    """
    gc.collect()
    gc.freeze()


def resolve_settings(
    settings: dict[str, Any], optional_settings: dict[str, Any], engine_args_cls
) -> tuple[dict[str, Any], list[str]]:
    """`LLM(...)` keyword arguments: `settings`, plus each optional setting this vLLM knows.

    Returns the arguments and the optional keys left out (defaults that gate caching differ
    between releases; the artifact records both).
    """
    known = {f.name for f in dataclasses.fields(engine_args_cls)}
    applied = dict(settings)
    dropped = []
    for key, value in optional_settings.items():
        if key in known:
            applied[key] = value
        else:
            dropped.append(key)
    return applied, dropped


def _progress_bar(llm) -> Any:
    """What to pass as `use_tqdm`: a bar that reports finished requests to the display.

    vLLM takes a tqdm factory there in the releases whose signature says so; elsewhere the
    kit passes False (no bar in the log, and the display counts whole waves only).
    """
    annotation = inspect.signature(type(llm).generate).parameters["use_tqdm"].annotation
    if "Callable" not in str(annotation) or not progress.enabled():
        return False
    # lazy: tqdm comes with vLLM, in the engine environment only
    from tqdm import tqdm

    class _Reporting(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["file"] = _NullFile()
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            progress.emit("done", requests=int(self.n))
            return shown

    def bar(*args: Any, **kwargs: Any) -> tqdm:
        # vLLM also wraps the prompts it renders (an iterable, "Rendering prompts"); only the
        # bar it advances per finished request (no iterable) is reported.
        if args or "iterable" in kwargs:
            return tqdm(*args, **{**kwargs, "disable": True})
        return _Reporting(*args, **kwargs)

    return bar


class _NullFile:
    """Where the reporting bar draws itself: nowhere (the display shows the counts)."""

    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


def _own(restores: list[dict[str, Any]], request_id: str) -> tuple[dict[str, Any], ...]:
    """The restores of one request: the engine core's id is the front end's, or the front
    end's with a suffix it adds (``<id>-<random>``)."""
    return tuple(
        r
        for r in restores
        if r["request"] == request_id or r["request"].startswith(request_id + "-")
    )


def _probe_records():
    """The probe connector's reader, where the probe is loaded in this process."""
    module = sys.modules.get("repro.vllm_plugin.probe_connector")
    return getattr(module, "take", None)


def _completion(
    output,
    restores: tuple[dict[str, Any], ...] | None = (),
    *,
    connector: dict[str, Any] | None = None,
) -> Completion:
    sample = output.outputs[0]
    positions = tuple(_position_logprobs(p) for p in sample.logprobs or ())
    return Completion(
        text=sample.text,
        prompt_token_ids=tuple(output.prompt_token_ids or ()),
        token_ids=tuple(sample.token_ids),
        num_cached_tokens=int(output.num_cached_tokens or 0),
        first_logprobs=positions[0] if positions else {},
        restores=restores,
        connector=connector,
        answer_logprobs=positions,
    )


def _position_logprobs(position) -> dict[int, float]:
    """One generated position's token id -> logprob (-inf for a non-finite one)."""
    found: dict[int, float] = {}
    for token_id, logprob in (position or {}).items():
        value = getattr(logprob, "logprob", logprob)
        found[int(token_id)] = float(value) if math.isfinite(value) else -math.inf
    return found
