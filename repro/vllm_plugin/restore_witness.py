"""Witness of what the engine restored: where each restored Mamba/GDN state came from.

The arms grade outputs; a small model may not show a bad state in its answer. This module
records a fact about the engine's own bookkeeping instead. For every request that resumes
from a prefix-cache hit it says what the restored recurrent state really is:

- the position the state was computed up to, against the resume position the engine
  assumed (``num_computed_tokens``). A mismatch is the cold-race lane: a chunk ended
  mid-block and its state was cached as the state at the block boundary;
- whether the state was computed over draft tokens that speculative decoding then
  rejected (the multi-turn / EAGLE lane);
- whether it was computed over other tokens than the resuming request's prefix (a state
  left in a block by another sequence: what a resume without the Mamba state reads).

How. The temporal (SSM / linear-attention) state is moved between blocks only by byte
copies, so its content identifies it. Wrapping ``mamba_utils.preprocess_mamba``, which the
V1 model runner calls once per step before the forward pass in "align" mode:

1. after the call, note which block columns this step's forward will write, and the
   position each will hold: the running column ``curr`` holds the state after the step's
   last non-draft token, ``curr + j`` after draft token j (vLLM's spec-decode layout), and
   (vLLM 0.32) a prefill checkpoint column the state at its checkpoint;
2. fingerprint those blocks once the forward has written them, and remember each
   fingerprint's origin (position, prefix tokens, and whether its drafts were accepted:
   a continuing request's new ``num_computed_tokens`` says how many were). Where the
   step has an align postprocess (``mamba_utils.postprocess_mamba_align_gpu``, with
   speculative decoding), the fingerprints are taken right before it: it copies states
   between columns, and a copy's destination must carry its source's fingerprint, not be
   credited with what the forward wrote there. Otherwise they are taken at the next call;
3. at a restore, fingerprint the block the engine reads, ``(num_computed - 1) // B``, and
   look its origin up. A fingerprint never seen is ``unwitnessed``, never ``valid``; a
   block of zeros is the state over 0 tokens.

A fingerprint (`repro.vllm_plugin.state_fingerprint`) is exact, so a copy has the
fingerprint of its source on any platform.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from .hit_lengths import HITS, SEEN
from .hit_lengths import install as install_hit_hooks
from .mamba_batch import RunningColumns, mamba_layers, restoring_requests
from .prefill_checkpoints import install as install_checkpoint_hook
from .state_fingerprint import ZEROS, BlockFingerprints

logger = logging.getLogger("vllm.repro_kit")

METHOD = "repro_kit_witness"

# What a restore read, by kind. `valid`: the state at the resume point, over the request's
# own prefix. The rest name the lane whose defect they are.
VALID = "valid"
STALE_POSITION = "stale-position"  # cold-race lane
REJECTED_DRAFTS = "rejected-drafts"  # multi-turn / EAGLE lane
ATTENTION_SHORT = "attention-short"  # resumed past the tokens attention's blocks hold
FOREIGN_TOKENS = "foreign-tokens"  # a state of another sequence (e.g. resumed without it)
UNWITNESSED = "unwitnessed"  # a state the witness never saw written
KINDS = (VALID, STALE_POSITION, REJECTED_DRAFTS, FOREIGN_TOKENS, ATTENTION_SHORT, UNWITNESSED)

# Origins kept (oldest dropped first); an arm writes a few tens of thousands.
MAX_ORIGINS = 1_000_000


@dataclass(frozen=True)
class Origin:
    position: int  # tokens the state was computed over
    prefix: int | None  # hash of those tokens (None: not known to the worker yet)
    draft: bool  # computed over at least one draft token
    rejected: bool | None  # a draft among them was rejected (None: never learnt)


# A block of zeros holds the state before any token: vLLM allocates the state tensors
# zeroed, and a sequence with no initial state starts from zeros. A restore that reads one
# reads a state over 0 tokens (a never-written block copied in, for one).
ZERO_STATE = Origin(position=0, prefix=None, draft=False, rejected=None)


@dataclass
class Write:
    """A block this step's forward writes, and what it will hold."""

    req_id: str
    block_id: int
    position: int
    prefix: int | None
    drafts: int  # draft tokens among the `position` tokens


class Witness:
    """The per-process witness state (one per worker)."""

    def __init__(self) -> None:
        self.origins: dict[int, Origin] = {}
        self.pending: list[Write] = []
        # Writes fingerprinted before a postprocess, with their fingerprints (a device
        # tensor: read at the next harvest, so taking them adds no wait for the device).
        self.taken: list[tuple[list[Write], Any]] = []
        self.events: list[dict[str, Any]] = []
        self.totals = dict.fromkeys(KINDS, 0)
        self.steps = 0
        # Time spent in the witness in this process: its cost, measured where it is paid.
        self.seconds = 0.0
        self.fingerprints = BlockFingerprints()
        # This step's batch order, requests and group, for the checkpoint hook.
        self.step_batch: tuple[list[str], dict[str, Any], int] | None = None
        self.step_checkpoints: set[tuple[str, int]] = set()

    # -- bookkeeping ------------------------------------------------------------------------
    def take(self, state) -> None:
        """Fingerprint the blocks the step's forward wrote, before the align postprocess
        copies states between columns (their origins are remembered at the harvest)."""
        pending, self.pending = self.pending, []
        if pending:
            ids = [w.block_id for w in pending]
            self.taken.append((pending, self.fingerprints.sample(state, ids)))

    def harvest(self, state, requests: dict[str, Any], overwritten: set[int]) -> None:
        """Remember the origins of the blocks the last step wrote: those fingerprinted
        before its postprocess, then the rest, fingerprinted now.

        `overwritten`: blocks this step's input handling has already written over (zeroed
        or copied into) before this call; what they hold now is not what the forward wrote.
        A block fingerprinted before the postprocess needs no such care.
        """
        taken, self.taken = self.taken, []
        for writes, prints in taken:
            self._remember(writes, prints.tolist(), requests)
        pending, self.pending = self.pending, []
        pending = [w for w in pending if w.block_id not in overwritten]
        if pending:
            prints = self.fingerprints.of(state, [w.block_id for w in pending])
            self._remember(pending, prints, requests)

    def _remember(self, writes: list[Write], prints: list[int], requests: dict[str, Any]):
        for write, fp in zip(writes, prints, strict=True):
            _trace(
                step=self.steps,
                write=write.req_id,
                block=write.block_id,
                position=write.position,
                drafts=write.drafts,
                fp=fp,
            )
            rejected = None
            if write.drafts:
                req = requests.get(write.req_id)
                if req is not None:
                    # The request's new resume point says how many drafts were accepted.
                    rejected = write.position > req.num_computed_tokens
            self.origins.pop(fp, None)  # re-inserted last: the newest origin survives a trim
            self.origins[fp] = Origin(
                position=write.position,
                prefix=write.prefix,
                draft=write.drafts > 0,
                rejected=rejected,
            )
        while len(self.origins) > MAX_ORIGINS:
            self.origins.pop(next(iter(self.origins)))

    def judge(self, req_id: str, resume: int, prefix: int | None, fp: int) -> dict[str, Any]:
        origin = ZERO_STATE if fp == ZEROS else self.origins.get(fp)
        event: dict[str, Any] = {"request": req_id, "resume": resume}
        hit = HITS.pop(req_id, None)
        if hit is not None and hit[1] is not None:
            event["attention_covers"] = hit[1]
        if origin is None:
            kind = UNWITNESSED
        else:
            event["state_position"] = origin.position
            event["draft_state"] = origin.draft
            if origin.rejected:
                kind = REJECTED_DRAFTS
            elif origin.position != resume:
                kind = STALE_POSITION
            elif prefix is not None and origin.prefix is not None and origin.prefix != prefix:
                kind = FOREIGN_TOKENS
            elif event.get("attention_covers", resume) < resume:
                kind = ATTENTION_SHORT
            else:
                kind = VALID
        event["kind"] = kind
        _trace(
            step=self.steps,
            judge=req_id,
            fp=fp,
            **{k: v for k, v in event.items() if k != "request"},
        )
        self.totals[kind] += 1
        self.events.append(event)
        return event

    def drain(self) -> dict[str, Any]:
        events, self.events = self.events, []
        return {
            "events": events,
            "totals": dict(self.totals),
            "steps": self.steps,
            "seconds": self.seconds,
        }


WITNESS = Witness()

# A file to trace every write and judgement into (JSON lines), for whoever doubts a record.
TRACE_ENV = "REPRO_WITNESS_TRACE"


_TRACE_PATH = os.environ.get(TRACE_ENV)


def _trace(**fields: Any) -> None:
    if _TRACE_PATH:
        with open(f"{_TRACE_PATH}.{os.getpid()}", "a", encoding="utf-8") as out:
            out.write(json.dumps(fields) + "\n")


# Tokens before a state that its key covers: the arms' prompts share long manuals and differ
# near their ends, and a state of another sequence at the same position differs there too.
KEY_TOKENS = 64


def known_tokens(req_state: Any) -> list[int]:
    return list(req_state.prompt_token_ids or ()) + list(req_state.output_token_ids or ())


def prefix_key(
    known: list[int], length: int, drafts: list[int] | tuple[int, ...] = ()
) -> int | None:
    """Key of a sequence's first `length` tokens (the last `len(drafts)` of them drafts): its
    last KEY_TOKENS tokens and its length. None where the worker does not hold them all yet
    (outputs can lag a step)."""
    base = length - len(drafts)
    if base > len(known) or base < 0:
        return None
    tail = known[max(0, base - KEY_TOKENS) : base] + list(drafts)
    return hash((length, tuple(tail[-KEY_TOKENS:])))


def _temporal_state(kv_cache_config: Any, forward_context: dict[str, Any]):
    """The first Mamba layer's temporal state tensor and its group (block table) id."""
    for gid, block_size, _name, states in mamba_layers(kv_cache_config, forward_context):
        return gid, block_size, states[-1]
    return None


def _wrap(original):
    sig = inspect.signature(original)

    @functools.wraps(original)
    def preprocess_mamba(*args, **kwargs):
        started = time.perf_counter()
        bound = sig.bind(*args, **kwargs).arguments
        try:
            before = _before(bound)
        except Exception as exc:  # noqa: BLE001 - a witness must never stop the engine
            disable(exc)
            WITNESS.seconds += time.perf_counter() - started
            return original(*args, **kwargs)
        middle = time.perf_counter()
        result = original(*args, **kwargs)
        resumed = time.perf_counter()
        try:
            _after(bound, before)
        except Exception as exc:  # noqa: BLE001
            disable(exc)
        WITNESS.seconds += (middle - started) + (time.perf_counter() - resumed)
        return result

    preprocess_mamba.repro_witness_wrapper = True  # type: ignore[attr-defined]
    return preprocess_mamba


_BROKEN: list[str] = []


def disable(exc: BaseException) -> None:
    if not _BROKEN:
        logger.warning("repro witness: stopped after an error: %r", exc)
    _BROKEN.append(repr(exc))


def _wrap_postprocess(original):
    @functools.wraps(original)
    def postprocess_mamba_align_gpu(*args, **kwargs):
        started = time.perf_counter()
        try:
            _before_postprocess(kwargs)
        except Exception as exc:  # noqa: BLE001 - a witness must never stop the engine
            disable(exc)
        WITNESS.seconds += time.perf_counter() - started
        return original(*args, **kwargs)

    postprocess_mamba_align_gpu.repro_witness_wrapper = True  # type: ignore[attr-defined]
    return postprocess_mamba_align_gpu


def _before_postprocess(kwargs: dict[str, Any]) -> None:
    """Fingerprint the forward's writes before the postprocess copies into any of them."""
    if _BROKEN or not WITNESS.pending:
        return
    found = _temporal_state(kwargs["kv_cache_config"], kwargs["forward_context"])
    if found is not None:
        WITNESS.take(found[2])


def _overwritten(sched: Any) -> set[int]:
    """Blocks the model runner zeroed or copied into for this step before preprocess_mamba
    (vLLM 0.32: freshly allocated blocks, copy-on-write of partial hits)."""
    blocks = set(getattr(sched, "new_block_ids_to_zero", None) or ())
    blocks.update(int(copy[1]) for copy in getattr(sched, "kv_cache_block_copies", None) or ())
    return blocks


def _before(bound: dict[str, Any]):
    """Harvest the last step's writes, then judge this step's restores (before the copy)."""
    if _BROKEN:
        return None
    found = _temporal_state(bound["kv_cache_config"], bound["forward_context"])
    if found is None:
        return None
    gid, block_size, state = found
    requests = bound["requests"]
    columns = RunningColumns(bound)
    WITNESS.harvest(state, requests, _overwritten(bound["scheduler_output"]))
    WITNESS.steps += 1
    restoring = restoring_requests(bound, columns)
    sources = []
    for rid in restoring:
        req = requests[rid]
        col = (req.num_computed_tokens - 1) // block_size
        block_ids = req.block_ids[gid]
        if col < len(block_ids):
            sources.append((rid, req, block_ids[col]))
    prints = WITNESS.fingerprints.of(state, [block for _, _, block in sources])
    for (rid, req, block), fp in zip(sources, prints, strict=True):
        resume = req.num_computed_tokens
        _trace(step=WITNESS.steps, restore=rid, block=block, table=list(req.block_ids[gid]))
        WITNESS.judge(rid, resume, prefix_key(known_tokens(req), resume), fp)
    return gid, columns


def _after(bound: dict[str, Any], before) -> None:
    """Note which blocks this step's forward writes, and what each will hold."""
    if before is None or _BROKEN:
        return
    gid, columns = before
    WITNESS.step_checkpoints = set()
    sched = bound["scheduler_output"]
    spec = getattr(sched, "scheduled_spec_decode_tokens", None) or {}
    requests = bound["requests"]
    WITNESS.step_batch = (list(bound["input_batch"].req_ids), requests, gid)
    for rid in bound["input_batch"].req_ids:
        curr = columns.get(rid)
        if curr is None:
            continue
        req = requests[rid]
        block_ids = req.block_ids[gid]
        drafts = [t for t in spec.get(rid, ()) if t is not None and t >= 0]
        run_pos = req.num_computed_tokens + sched.num_scheduled_tokens[rid] - len(drafts)
        known = known_tokens(req)
        for j in range(len(drafts) + 1):
            if curr + j >= len(block_ids):
                break
            WITNESS.pending.append(
                Write(
                    req_id=rid,
                    block_id=block_ids[curr + j],
                    position=run_pos + j,
                    prefix=prefix_key(known, run_pos + j, drafts[:j]),
                    drafts=j,
                )
            )


def _install_postprocess(mamba_utils: Any) -> bool:
    """Wrap the align-mode postprocess (vLLM 0.26 to 0.32: keyword-only, called by the V1
    model runner with speculative decoding). Without it, or with other parameters, the
    witness fingerprints the forward's writes at the next preprocess, as before."""
    original = getattr(mamba_utils, "postprocess_mamba_align_gpu", None)
    if original is None:
        return False
    params = inspect.signature(original).parameters
    needed = ("kv_cache_config", "forward_context")
    if any(n not in params or params[n].kind is not inspect.Parameter.KEYWORD_ONLY for n in needed):
        return False
    if not getattr(original, "repro_witness_wrapper", False):
        mamba_utils.postprocess_mamba_align_gpu = _wrap_postprocess(original)
    return True


def _record_checkpoints(rows: list[int], offsets: list[int], cols: list[int]) -> None:
    """vLLM 0.32's prefill checkpoints: this step's forward also writes the state at
    `num_computed + offset` into column `col` of batch row `row`."""
    if WITNESS.step_batch is None:
        return
    req_ids, requests, gid = WITNESS.step_batch
    for row, offset, col in zip(rows, offsets, cols, strict=True):
        if col < 0 or offset <= 0 or row >= len(req_ids):
            continue
        req = requests[req_ids[row]]
        block_ids = req.block_ids[gid]
        if col >= len(block_ids):
            continue
        position = req.num_computed_tokens + offset
        if (req_ids[row], col) in WITNESS.step_checkpoints:
            continue  # one builder per KV-cache group: the same checkpoint again
        WITNESS.step_checkpoints.add((req_ids[row], col))
        key = prefix_key(known_tokens(req), position)
        WITNESS.pending.append(Write(req_ids[row], block_ids[col], position, key, drafts=0))


def witness_report(worker: Any) -> dict[str, Any]:
    """The restores judged since the last call (`collective_rpc(METHOD)`)."""
    report = WITNESS.drain()
    report["installed"] = list(INSTALLED)
    # Hit lengths are seen only where the scheduler runs in this worker's process.
    report["hit_lengths"] = bool(SEEN)
    report["broken"] = _BROKEN[:1]
    return report


INSTALLED: list[str] = []


def install() -> str | None:
    """Wrap ``preprocess_mamba`` and give the workers `METHOD`. Returns what it could not
    do (a reason), or None when the witness is live."""
    # lazy: vllm, found only in an engine environment
    from vllm.v1.worker import mamba_utils
    from vllm.v1.worker.worker_base import WorkerBase

    setattr(WorkerBase, METHOD, witness_report)
    original = getattr(mamba_utils, "preprocess_mamba", None)
    if original is None:
        reason = "this vLLM has no mamba_utils.preprocess_mamba"
    else:
        params = inspect.signature(original).parameters
        missing = [
            n
            for n in (
                "scheduler_output",
                "kv_cache_config",
                "input_batch",
                "requests",
                "forward_context",
            )
            if n not in params
        ]
        reason = f"preprocess_mamba has no {missing}" if missing else None
    if reason is not None:
        INSTALLED[:] = [f"unsupported: {reason}"]
        return reason
    if not getattr(original, "repro_witness_wrapper", False):
        mamba_utils.preprocess_mamba = _wrap(original)
    hooks = ["preprocess_mamba"]
    if _install_postprocess(mamba_utils):
        hooks.append("postprocess_mamba_align_gpu")
    if install_checkpoint_hook(_record_checkpoints, disable):
        hooks.append("prefill checkpoints")
    hooks += [f"KVCacheManager.{name}" for name in install_hit_hooks()]
    INSTALLED[:] = hooks
    return None
