"""The restore witness: its judgement of one restore, and the line a record re-derives.

The engine-side bookkeeping (`repro.vllm_plugin.restore_witness`) is driven here with real
torch state tensors and plain request objects; the engine tests (test_repro_tiny.py,
test_bare_host.py, test_reverts.py) check it inside vLLM.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from repro import witness

torch = pytest.importorskip("torch")


@pytest.fixture()
def fresh():
    from repro.vllm_plugin import hit_lengths, restore_witness

    hit_lengths.HITS.clear()
    return restore_witness, restore_witness.Witness()


def state(blocks: int = 6) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(blocks, 4, 8, generator=gen)


def request(tokens: int) -> SimpleNamespace:
    return SimpleNamespace(num_computed_tokens=tokens)


def write(module, block: int, position: int, drafts: int = 0, prefix: int | None = 7):
    return module.Write("r0", block, position, prefix, drafts)


def test_a_copy_has_its_sources_fingerprint_and_any_change_gives_another():
    from repro.vllm_plugin.state_fingerprint import BlockFingerprints

    s = state()
    prints = BlockFingerprints()
    s[3] = s[1]
    a, b, c = prints.of(s, [1, 3, 2])
    assert a == b != c
    s[3, 2, 5] += 1e-6
    assert prints.of(s, [3]) != [a]
    # bf16 states (the GPU's) fingerprint the same way.
    h = s.to(torch.bfloat16)
    h[4] = h[0]
    assert prints.of(h, [0])[0] == prints.of(h, [4])[0]


def test_a_restore_is_judged_by_where_its_state_came_from(fresh):
    module, w = fresh
    s = state()
    w.pending = [
        write(module, 0, 160),  # a state at the block boundary
        write(module, 1, 8),  # a chunk end inside the block
        write(module, 2, 170, drafts=2),  # over two drafts, the request then at 168
    ]
    w.harvest(s, {"r0": request(168)}, overwritten=set())
    fp = w.fingerprints.of(s, [0, 1, 2, 3])
    assert w.judge("a", 160, 7, fp[0])["kind"] == "valid"
    stale = w.judge("b", 160, 7, fp[1])
    assert (stale["kind"], stale["state_position"]) == ("stale-position", 8)
    assert w.judge("c", 170, 7, fp[2])["kind"] == "rejected-drafts"
    assert w.judge("d", 160, 7, fp[3])["kind"] == "unwitnessed"  # never seen written
    assert w.judge("e", 160, 9, fp[0])["kind"] == "foreign-tokens"  # another sequence's
    assert w.drain()["totals"] == {
        "valid": 1,
        "stale-position": 1,
        "rejected-drafts": 1,
        "foreign-tokens": 1,
        "attention-short": 0,
        "unwitnessed": 1,
    }


def test_accepted_drafts_are_not_tainted_and_a_finished_request_leaves_them_unknown(fresh):
    module, w = fresh
    s = state()
    w.pending = [write(module, 0, 161, drafts=1), write(module, 1, 162, drafts=2)]
    w.harvest(s, {"r0": request(161)}, overwritten=set())
    fp = w.fingerprints.of(s, [0, 1])
    assert w.judge("a", 161, 7, fp[0])["kind"] == "valid"
    assert w.judge("b", 162, 7, fp[1])["kind"] == "rejected-drafts"
    w.pending = [write(module, 2, 163, drafts=1)]
    w.harvest(s, {}, overwritten=set())  # the request finished: acceptance never learnt
    assert w.origins[w.fingerprints.of(s, [2])[0]].rejected is None


def test_blocks_written_over_before_the_harvest_are_not_attributed(fresh):
    """vLLM 0.32 zeroes fresh blocks and copies partial hits into them before the step's
    preprocess: such a block no longer holds what the last forward wrote."""
    module, w = fresh
    s = state()
    w.pending = [write(module, 3, 207, drafts=2)]
    w.harvest(s, {"r0": request(205)}, overwritten={3})
    assert w.origins == {}


def test_a_copy_made_by_the_postprocess_carries_its_sources_origin(fresh):
    """The align postprocess copies states between columns after the forward: fingerprinted
    before it, the running column's new content resolves to where it was first written."""
    module, w = fresh
    s = state()
    # An earlier step wrote block 4 with a state over a draft that was then rejected.
    w.pending = [write(module, 4, 161, drafts=1)]
    w.take(s)
    w.harvest(s, {"r0": request(160)}, overwritten=set())
    # This step's forward writes the running column (block 0) at the boundary, 320 ...
    w.pending = [write(module, 0, 320)]
    w.take(s)
    s[0] = s[4]  # ... and the postprocess then copies block 4 into it.
    w.harvest(s, {"r0": request(320)}, overwritten={0})  # fingerprinted already: kept
    event = w.judge("a", 320, 7, w.fingerprints.of(s, [0])[0])
    assert (event["kind"], event["state_position"]) == ("rejected-drafts", 161)
    assert w.origins[w.fingerprints.sample(state(), [0]).tolist()[0]].position == 320


def test_a_block_of_zeros_is_the_state_over_no_token(fresh):
    """A never-written block (vLLM allocates states zeroed) copied where a state at the
    boundary belongs: whatever was credited to it, it is a state at 0."""
    from repro.vllm_plugin.state_fingerprint import ZEROS

    module, w = fresh
    s = state()
    s[5] = 0
    assert w.fingerprints.of(s, [5]) == [ZEROS]
    assert w.fingerprints.of(torch.zeros(2, 3, 3, dtype=torch.bfloat16), [1]) == [ZEROS]
    w.pending = [write(module, 5, 160)]  # credited before the witness took prints first
    w.harvest(s, {}, overwritten=set())
    event = w.judge("a", 160, 7, ZEROS)
    assert (event["kind"], event["state_position"]) == ("stale-position", 0)


def test_the_postprocess_wrapper_fingerprints_first_and_never_stops_the_engine(monkeypatch):
    from repro.vllm_plugin import restore_witness as module

    s = state()
    w = module.Witness()
    monkeypatch.setattr(module, "WITNESS", w)
    monkeypatch.setattr(module, "_BROKEN", [])
    monkeypatch.setattr(module, "_temporal_state", lambda config, context: (0, 160, s))
    calls = []

    def postprocess_mamba_align_gpu(*, bufs, kv_cache_config, forward_context):
        calls.append(list(w.taken))
        s[0] = s[4]

    fake = SimpleNamespace(postprocess_mamba_align_gpu=postprocess_mamba_align_gpu)
    assert module._install_postprocess(fake)
    assert module._install_postprocess(fake)  # idempotent: wrapped once
    wrapped = fake.postprocess_mamba_align_gpu
    assert wrapped.__wrapped__ is postprocess_mamba_align_gpu
    written = s[0].clone()
    w.pending = [write(module, 0, 320)]
    wrapped(bufs=None, kv_cache_config=None, forward_context={})
    assert len(calls[0]) == 1 and w.pending == []  # taken before the copy ran
    w.harvest(s, {}, overwritten=set())
    assert w.origins[w.fingerprints.of(written[None], [0])[0]].position == 320
    assert w.seconds > 0
    # A failure stops the witness, never the postprocess.
    monkeypatch.setattr(module, "_temporal_state", lambda config, context: 1 / 0)
    w.pending = [write(module, 1, 480)]
    wrapped(bufs=None, kv_cache_config=None, forward_context={})
    assert len(calls) == 2 and module._BROKEN
    # A release whose postprocess takes other parameters keeps the harvest at preprocess.
    assert not module._install_postprocess(SimpleNamespace(postprocess_mamba_align_gpu=len))
    assert not module._install_postprocess(SimpleNamespace())


def test_a_hit_past_attentions_blocks_is_the_hit_length_lane(fresh):
    from repro.vllm_plugin import hit_lengths

    module, w = fresh
    s = state()
    w.pending = [write(module, 0, 320)]
    w.harvest(s, {}, overwritten=set())
    hit_lengths.HITS["a"] = (320, 160)
    event = w.judge("a", 320, 7, w.fingerprints.of(s, [0])[0])
    assert (event["kind"], event["attention_covers"]) == ("attention-short", 160)


def rows(*restores, cached: int = 160) -> list[dict]:
    return [{"num_cached_tokens": cached, "restores": list(r)} for r in restores]


def test_the_summary_counts_each_lane_and_never_calls_an_unjudged_hit_valid():
    records = rows(
        [{"kind": "stale-position", "resume": 160}],
        [{"kind": "stale-position", "resume": 160}],
        [{"kind": "valid", "resume": 160}],
        [{"kind": "unwitnessed", "resume": 160}],
        [],  # read the cache, no restore judged
    ) + [{"num_cached_tokens": 0}]
    summary = witness.summarize("live", records)
    assert (summary.restores, summary.invalid, summary.unwitnessed) == (4, 2, 1)
    assert summary.by_lane == {"cold-race": 2}
    assert summary.unjudged_hits == 1 and not summary.complete
    assert witness.line(summary) == (
        "witness: 2 restores of mid-block states (cold-race lane) (not judged: 1 restores of "
        "states it never saw written, 1 cache hits with no restore judged)"
    )
    assert witness.headline("clean", summary).startswith(
        "clean, but the engine restored 2 invalid states"
    )
    assert witness.headline("corrupted", summary) == "corrupted"


def test_a_witness_that_could_not_judge_reports_no_figure():
    summary = witness.summarize("unsupported: no preprocess_mamba", rows([]))
    assert summary.restores == 0 and not summary.complete
    assert "cannot say what was restored" in witness.line(summary)
    assert witness.headline("clean", summary) == "clean"
    assert witness.engine_status({}).startswith("unreadable")
    assert witness.engine_status({"installed": ["preprocess_mamba"], "broken": ["x"]}) == (
        "broken: x"
    )
    assert witness.engine_status({"installed": ["preprocess_mamba"]}) == "live"


def test_a_record_from_before_the_witness_has_no_line():
    assert witness.from_document({"figures": {"waves": []}}) is None
