"""The what-if engine on the real bundled model, against independent references: physically removed caches run at
true positions, eager attention of the same pass, and the formulas of docs/math.md."""

from __future__ import annotations

import math

import pytest
import torch

from kvviz import kv_cache
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.policies import POLICIES
from kvviz.quant.quantizer import Quantizer
from kvviz.session import Session
from kvviz.whatif import what_if
from kvviz.whatif.step import EditedStepProbe
from tests.support.references import committed_eviction_gaps, removed_step
from tests.support.rounding import probability_rounding, residual_rounding, weight_rounding, worst_ratio


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat("Remember: a = 3 and b = 5. Answer in one word. What is a + b?", generate=12)


def _output_rounding(session: Session) -> float:
    """Bound on a difference of ‖Δo‖ at layer 0 computed by the closed form and by the real step: each output entry
    (a mix of layer-0 values, |o| ≤ max|v|) carries one layer's rounding, and a norm of d of them at most √d of it,
    for each of the two outputs in Δo (tests/support/rounding.py)."""
    values = session.layer_kv(0)[1]
    return 2 * 2 * math.sqrt(values.shape[-1]) * residual_rounding(session.lm.config, values, 1)


def test_empty_and_16_bit_edits_change_nothing(chat):
    for edit in (Edit(), Edit.quantize(range(len(chat) - 1), 16), Edit.evict([])):
        result = what_if(chat, edit, continuation=4)
        assert result.next_token.kl == 0.0 and result.next_token.tv == 0.0
        assert not result.next_token.top1_changed
        assert all(c.logit_delta == 0.0 for c in result.next_token.edited)
        assert max(map(max, result.heads["delta_propagated"].tolist())) == 0.0
        assert result.continuation.first_divergence is None
        assert result.memory.edited_bytes == result.memory.full_bytes


def test_full_run_is_the_sessions_own_step(chat, eps):
    result = what_if(chat, Edit())
    assert result.next_token.full[0].id == chat.pending
    reference = float(torch.softmax(chat.logits.double(), -1).max())
    assert result.next_token.full[0].prob == pytest.approx(reference, rel=probability_rounding(eps))


@pytest.mark.parametrize("evicted", [[5, 6, 7], list(range(20, 32)), [0]])
def test_removing_slots_equals_masking_them(chat, evicted, eps):
    at = len(chat) - 1
    reference = removed_step(chat, at, evicted)
    result = what_if(chat, Edit.evict(evicted), at=at, topk=50)
    for candidate in result.next_token.edited:
        expected = float(torch.softmax(reference.double(), -1)[candidate.id])
        assert candidate.prob == pytest.approx(expected, rel=probability_rounding(eps))
    top = [c.id for c in result.next_token.edited]
    assert top[:5] == torch.argsort(reference, descending=True)[:5].tolist()


def test_positions_are_not_renumbered_after_eviction(chat, eps):
    at, evicted = len(chat) - 1, list(range(10, 30))
    true_positions = removed_step(chat, at, evicted)
    renumbered = removed_step(chat, at, evicted, renumber=True)
    assert (true_positions - renumbered).abs().max().item() > 0.1  # renumbering would be visible
    edited = what_if(chat, Edit.evict(evicted), at=at, topk=5).next_token.edited
    reference = torch.softmax(true_positions.double(), -1)
    assert all(c.prob == pytest.approx(float(reference[c.id]), rel=probability_rounding(eps)) for c in edited)


def test_committed_eviction_runs_eight_greedy_steps_like_a_removed_cache(lm, eps):
    session, gaps = committed_eviction_gaps(lm, 8)
    assert max(gaps) <= eps, gaps
    assert [s.position for s in session.transcript.slots] == list(range(len(session)))


def test_quantization_error_grows_as_bits_shrink(chat):
    before = len(chat) - 1
    results = {bits: what_if(chat, Edit.quantize(range(before), bits)) for bits in (8, 4, 2)}
    kl = [results[b].next_token.kl for b in (8, 4, 2)]
    assert 0 < kl[0] < kl[1] < kl[2]
    sizes = [results[b].memory.edited_bytes for b in (8, 4, 2)]
    assert results[8].memory.full_bytes > sizes[0] > sizes[1] > sizes[2]
    split = results[4]  # the two terms of docs/math.md §4 add up to the isolated change (float32 sums) ...
    total = [w + c for w, c in zip(split.detail.weight_term, split.detail.content_term)]
    assert total == pytest.approx(split.detail.delta_isolated, abs=1e-9)
    # ... which at layer 0 (same query, same own K/V) is the change the real SDPA output shows
    isolated, propagated = (split.heads[name][0].tolist() for name in ("delta_isolated", "delta_propagated"))
    assert isolated == pytest.approx(propagated, abs=_output_rounding(chat))
    assert min(split.heads["content_term"].tolist()[0]) > 0 and min(split.heads["weight_term"].tolist()[0]) > 0


def test_layer_zero_isolated_equals_propagated_and_detail_weights(chat):
    result = what_if(chat, Edit.evict([3, 4, 5, 12]), layer=0, head=4)
    isolated, propagated = (result.heads[name][0].tolist() for name in ("delta_isolated", "delta_propagated"))
    assert isolated == pytest.approx(propagated, abs=_output_rounding(chat))
    detail = result.detail
    assert detail.slots == list(range(len(chat)))
    assert detail.alpha_renorm[3] is None and detail.alpha_edited[12] is None
    rho = result.heads["rho"].tolist()[0][4]
    layer0 = weight_rounding(chat.lm.config, 0, chat.queries.layer(0), chat.layer_kv(0)[0], chat.lm.scaling)
    assert rho == pytest.approx(sum(detail.alpha_full[s] for s in (3, 4, 5, 12)), abs=1e-12)
    for full, renorm, used in zip(detail.alpha_full, detail.alpha_renorm, detail.alpha_edited):
        if renorm is not None:
            assert renorm == pytest.approx(full / (1 - rho), abs=1e-12)
            assert used == pytest.approx(renorm, rel=layer0)  # same query at layer 0: α′ is what the run used
    assert sum(v for v in detail.alpha_edited if v is not None) == pytest.approx(1.0, abs=1e-9)
    # deeper layers see changed queries, so the propagated effect differs from the isolated one
    deep = (result.heads["delta_isolated"][20] - result.heads["delta_propagated"][20]).abs().tolist()
    assert max(deep) > 1e-4


def test_scoped_eviction_touches_only_its_layers_and_heads(chat):
    result = what_if(chat, Edit.evict(range(5, 25), layers=[10], heads=[1]))
    rho = result.heads["rho"]
    assert bool((rho[:10] == 0).all()) and bool((rho[11:] == 0).all())
    assert bool((rho[10, 3:6] > 0).all()) and bool((rho[10, :3] == 0).all()) and bool((rho[10, 6:] == 0).all())
    assert max(map(max, result.heads["delta_propagated"].tolist()[:10])) == 0.0  # layers before 10 are untouched
    assert result.next_token.kl > 0


UNEVEN = {"pyramid_kv": "layers", "ada_kv": "heads", "kv_zip": "layers and heads"}


def test_every_policy_keeps_its_budget_and_spares_the_current_token(chat):
    at = len(chat) - 1
    edits = {}
    for name, policy in POLICIES.items():
        for budget in (16, 0.5):
            edit = policy().edit(chat, budget, at)
            kept = 16 if budget == 16 else round(0.5 * at)
            mask = edit.evicted_mask(at + 1, chat.lm.layers, chat.lm.kv_heads)
            counts = (~mask[:, :, :at]).sum(-1)  # (L, KV)
            if name in UNEVEN:  # budgets shared unevenly between layers / KV heads: the budget on average
                assert abs(counts.float().mean() - kept) <= 0.5 and bool((counts >= 1).all()), name
            elif name == "chunk_kv":  # whole chunks of 20, max(1, int(chunks·kept/at)) of them, alike in a layer
                chunks = -(-at // 20)
                whole = {20 * k + r for k in range(chunks + 1) for r in (0, at % 20)} - {0}
                assert set(counts.flatten().tolist()) <= whole and bool((counts == counts[:, :1]).all()), name
            else:
                assert bool((counts == kept).all()), name
            assert not bool(mask[:, :, at].any())
            edits[name, budget] = mask
        result = what_if(chat, edit, at=at)  # half the cache or more evicted: every head loses some attention
        assert bool((result.heads["rho"] > 0).all()) and result.next_token.kl > 0, name
    for name in ("h2o", "snapkv", "key_norm"):
        mask = edits[name, 16]
        assert any(not torch.equal(mask[layer, 0], mask[layer, h])
                   for layer in range(chat.lm.layers) for h in range(chat.lm.kv_heads)), name
    assert torch.equal(edits["streaming_llm", 16][0, 0, :4], torch.zeros(4, dtype=torch.bool))  # sinks kept
    pyramid = (~edits["pyramid_kv", 16][:, :, :at]).sum(-1)  # falling layer by layer, the same in a layer's heads
    assert bool((pyramid[:-1, 0] >= pyramid[1:, 0]).all()) and pyramid[0, 0] > pyramid[-1, 0]
    ada = (~edits["ada_kv", 16][:, :, :at]).sum(-1)  # each layer keeps 16 per KV head in all, not evenly
    assert bool((ada.sum(-1) == 16 * chat.lm.kv_heads).all()) and bool((ada != 16).any())
    assert bool((ada >= int(16 * 0.2)).all())


def test_refused_edits_leave_the_session_untouched(chat):
    snapshot = [t.clone() for layer in range(chat.lm.layers) for t in kv_cache.layer_kv(chat.cache, layer)]
    slots = list(chat.transcript.slots)
    for edit, at in ((Edit.evict([len(chat) - 1]), None), (Edit.evict([3]), 2), (Edit.evict([3], heads=[7]), None),
                     (Edit.quantize([1], 4, keys=Quantizer("token", 48)), None)):
        with pytest.raises(KvvizError):
            what_if(chat, edit, at=at)
    with pytest.raises(KvvizError):
        chat.commit(Edit.evict([len(chat) + 3]))
    with pytest.raises(KvvizError):
        chat.undo()
    after = [t for layer in range(chat.lm.layers) for t in kv_cache.layer_kv(chat.cache, layer)]
    assert all(torch.equal(a, b) for a, b in zip(snapshot, after))
    assert chat.transcript.slots == slots and not chat.commits.stack


def test_commit_then_undo_restores_the_cache_exactly(lm, monkeypatch):
    from tests.support.references import AttentionSpy

    session = Session(lm)
    session.add_user_turn("Paris is the capital of France. What is the capital of France?")
    snapshot = [t.clone() for layer in range(lm.layers) for t in kv_cache.layer_kv(session.cache, layer)]
    session.commit(Edit.quantize(range(10), 2).merged(Edit.evict([12, 13])))
    spy = AttentionSpy(lm.model, monkeypatch)
    session.step()
    monkeypatch.undo()
    slot = len(session) - 1
    for layer in (0, 9, 29):  # the new row's weights, recomputed under the committed edit, equal what the pass used
        rel = weight_rounding(lm.config, layer, session.queries.layer(layer), session.layer_kv(layer)[0], lm.scaling)
        assert worst_ratio(session.weights(layer, slot, slot + 1)[:, 0], spy.passes[0][layer][0, :, 0], rel) <= 1
    assert session.weights(0, slot, slot + 1)[:, 0, 12].abs().max() == 0  # evicted
    session.undo()
    restored = [t[:, :, : len(snapshot[0][0, 0])] for layer in range(lm.layers) for t in kv_cache.layer_kv(session.cache, layer)]
    assert all(torch.equal(a, b) for a, b in zip(snapshot, restored))


def test_a_sink_layer_is_recomputed_directly_and_agrees_with_the_closed_form(chat, monkeypatch):
    """Where ρ rounds to 1 the closed form would divide by 0; that layer is recomputed from scores instead. Forced
    here on a normal layer, both must give the same isolated change."""
    from kvviz.whatif import step

    edit = Edit.evict([3, 4, 5, 12])
    closed = what_if(chat, edit)

    class Sink(step.EditedStepProbe):
        def _evicted(self):
            rho, self.rho = self.rho, self.rho.clone()
            self.rho[7] = 1.0  # as if a head of layer 7 sat on an attention sink
            try:
                return super()._evicted()
            finally:
                self.rho = rho

    monkeypatch.setattr(step, "EditedStepProbe", Sink)
    direct, closed = what_if(chat, edit).heads["delta_isolated"].tolist(), closed.heads["delta_isolated"].tolist()
    assert direct[7] == pytest.approx(closed[7], rel=1e-4, abs=1e-6)
    assert direct[6] == closed[6]
    assert max(closed[7]) > 1e-4


def _in_a_row_equal_fresh(session: Session, edits: list[Edit]) -> None:
    for edit in edits:
        kept = what_if(session, edit).to_dict()
        session.memo.clear()
        fresh = what_if(session, edit).to_dict()
        assert kept == fresh, edit
        what_if(session, edits[0])  # leave the kept cache quantized by another edit before the next one


def test_edits_in_a_row_equal_fresh_runs(chat):
    """The edited runs reuse one cache per step, quantized in place and restored where the next edit differs. Any
    order of edits must give bit for bit what a first run (nothing kept) gives: checked on a sequence that quantizes,
    narrows, evicts, widens, quantizes a scattered set and comes back to the start."""
    at = len(chat) - 1
    _in_a_row_equal_fresh(chat, [
        Edit.quantize(range(at), 4), Edit.quantize(range(5, 20), 2), Edit.evict([3, 7]), Edit.quantize(range(at), 3, 8),
        Edit.quantize([1, 4, 9, 30], 2).merged(Edit.evict([2])), Edit.quantize(range(at), 4), Edit()])


def test_per_token_quantization_rewrites_only_the_slots_that_changed(chat, monkeypatch):
    """Values (and keys quantized per token) have scales of their own per slot: after a finished run, the next edit
    with the same quantizer rewrites only the slots whose bit-width changed, and still gives bit for bit what a first
    run gives (per channel, every slot is written again: one slot more or less moves every channel's scale)."""
    at = len(chat) - 1
    per_token = Quantizer("token", 16)
    mixed = Edit(key_bits={s: 2 + 2 * (s % 2) for s in range(at)}, value_bits={s: 4 - 2 * (s % 3 == 0) for s in range(at)})
    _in_a_row_equal_fresh(chat, [Edit.quantize(range(at), 4), Edit.quantize(range(1, at), 4), mixed,
                                 Edit.quantize(range(0, at, 2), 4, 2), Edit.quantize(range(at), 4, keys=per_token)])
    written = []
    real = Edit.quantize_
    monkeypatch.setattr(Edit, "quantize_", lambda self, *a, **k: (written.append(self), real(self, *a, **k)))
    chat.memo.clear()
    for edit in (Edit.quantize(range(at), 4), Edit.quantize(range(1, at), 4), Edit.quantize(range(1, at), 2, 4)):
        what_if(chat, edit)
    assert [len(e.value_bits) for e in written] == [at, 0, 0]  # the values of slots 1.. were already at 4 bits
    assert [len(e.key_bits) for e in written] == [at, at - 1, at - 1]  # per channel: written again


def test_a_kept_quantization_is_reused_only_when_it_is_the_same(chat, monkeypatch):
    """Clicks on a quantized history (e.g. evicting chip after chip) reuse the cache the last run quantized, and
    give bit for bit what a first run gives; a change of slots, bit-width or quantizer quantizes again."""
    at = len(chat) - 1
    token_keys = Quantizer("token", 16)

    def edit(slots, bits, evicted=(), **settings):
        return Edit.evict(list(evicted)).merged(Edit.quantize(slots, bits, **settings))

    steps = [  # (edit, whether its run must quantize)
        (edit(range(at), 4), True), (edit(range(at), 4), False),
        (edit(range(at), 4, [3, 7]), True),  # masked runs keep a cache of their own
        (edit(range(at), 4, [3, 8]), False),
        (edit(range(at), 3, [3, 8]), True),  # same slots, another bit-width
        (edit(range(at), 3, [3, 8], keys=token_keys), True),  # another quantizer
        (edit(range(1, at), 3, [3, 8], keys=token_keys), True),  # other slots
        (edit(range(1, at), 3, [3], keys=token_keys), False),
        (edit(range(at), 4), False),  # the unmasked run's cache still holds it
    ]
    fresh = []
    for change, _ in steps:
        chat.memo.clear()
        fresh.append(what_if(chat, change).to_dict())
    chat.memo.clear()
    calls = []
    real = Edit.quantize_
    monkeypatch.setattr(Edit, "quantize_", lambda self, *args, **kwargs: (calls.append(1), real(self, *args, **kwargs)))
    for (change, quantizes), expected in zip(steps, fresh):
        calls.clear()
        assert what_if(chat, change).to_dict() == expected, change
        assert bool(calls) == quantizes, change


def test_a_run_that_failed_midway_is_not_reused(chat, monkeypatch):
    """A what-if that stops after quantizing some layers leaves a half-quantized cache: the same edit next time must
    quantize again (and give what a first run gives)."""
    at = len(chat) - 1
    edit = Edit.quantize(range(at), 4)
    chat.memo.clear()
    expected = what_if(chat, edit).to_dict()
    chat.memo.clear()
    real = Edit.quantize_

    def failing(self, keys, values, source):  # (L·KV, at, D): quantizes the first layers' rows, then stops
        half = lambda t: t[: len(t) // 2]  # noqa: E731
        real(self, half(keys), half(values), source=tuple(map(half, source)))
        raise RuntimeError("stopped midway")

    monkeypatch.setattr(Edit, "quantize_", failing)
    with pytest.raises(RuntimeError):
        what_if(chat, edit)
    monkeypatch.undo()
    assert what_if(chat, edit).to_dict() == expected


def test_an_eviction_borrows_the_full_runs_cache_and_gives_it_back(chat, monkeypatch):
    """Evictions change no K/V, so their runs use the full run's own cache (no copy) and put its own slot back —
    also after a run that failed midway; the full run's continuation and the next runs are then unchanged."""
    at = len(chat) - 1
    chat.memo.clear()
    first = what_if(chat, Edit.evict([4]), continuation=3).to_dict()
    (step,) = chat.memo.entries("full_steps").values()
    before = tuple(t.clone() for t in step.buffers)
    expected = [what_if(chat, Edit.evict(slots), continuation=3).to_dict() for slots in ([2, 9], [at - 1])]
    monkeypatch.setattr(EditedStepProbe, "on_query", lambda self, layer, *args: 1 / 0 if layer == 10 else None)
    with pytest.raises(ZeroDivisionError):
        what_if(chat, Edit.evict([5]))
    monkeypatch.undo()
    assert step.scratch is None
    assert all(torch.equal(a, b) for a, b in zip(before, step.buffers))
    assert what_if(chat, Edit.evict([4]), continuation=3).to_dict() == first
    assert [what_if(chat, Edit.evict(slots), continuation=3).to_dict() for slots in ([2, 9], [at - 1])] == expected


def test_edits_in_a_row_on_a_committed_quantization(lm):
    """The same after a committed 4-bit edit, whose original K/V the edited runs must start from."""
    session = Session(lm)
    session.add_user_turn("Remember: a = 3 and b = 5. What is a + b?")
    session.commit(Edit.quantize(range(4, 16), 4))
    session.generate(3)
    at = len(session) - 1
    _in_a_row_equal_fresh(session, [Edit.quantize(range(at), 2), Edit.evict([6]), Edit(), Edit.quantize(range(10), 8)])
    unchanged = what_if(session, Edit())  # the committed edit on the originals, as the full run has it
    assert unchanged.next_token.kl == 0.0 and max(map(max, unchanged.heads["delta_propagated"].tolist())) == 0.0
