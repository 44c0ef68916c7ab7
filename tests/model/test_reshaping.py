"""Channel pruning (ThinK) and value merging (D2O / MergingPress / CaM) as edits, on the bundled model, against
references built here without kvviz's edit code: a cache whose pruned key channels are zeroed, a cache from which the
merged slots are removed and whose targets hold the merged values by the formula, and the attention output written
out in float64 from the recorded query.

Tolerances. The what-if's edited step and a reference forward on a built cache differ only in summation order:
their logits within ε_z (tests/support/rounding.py), probabilities within (e^{2ε} − 1)·p. The isolated Δo of one head is
computed by kvviz in float64 from float32 keys and values, so against the test's float64 formula it differs by the
float32 scores' rounding: each weight by at most (e^{2Δs} − 1) with Δs ≤ √D·u·|s| (rescored_weight_rounding), the
output by that times Σ α|v| ≤ max‖v‖. ThinK's channel scores are means of squares of float32 entries (≤ 1024 terms):
relative (1024 + 64)·u; channels are compared where clear of the cut by twice that.
"""

from __future__ import annotations

import pytest
import torch

from kvviz import kv_cache
from kvviz.edit.parts import Merge, Pruning
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.policies.reshaping import merge_evicted, merging, think
from kvviz.session import Session
from kvviz.session_file import export_session, import_session
from kvviz.whatif import what_if
from tests.support.rounding import U, logit_rounding, probability_rounding, rescored_weight_rounding

PROMPT = "My cat is called Whiskers and my dog is called Rex. The cat sleeps on the red sofa. What is my cat called?"


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT, generate=3)


def reference_step(session: Session, at: int, tensors: list) -> torch.Tensor:
    """Float64 next-token probabilities ``(V,)`` of slot ``at``'s step on a cache built from ``tensors``."""
    slot, lm = session.transcript.slots[at], session.lm
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([[slot.id]]), position_ids=torch.tensor([[slot.position]]),
                       cache=kv_cache.build(lm.config, tensors), use_cache=True)
    return out.logits[0, -1].double()


def assert_probabilities(lm, result, logits: torch.Tensor) -> None:
    reference = torch.softmax(logits, -1)
    rel = probability_rounding(logit_rounding(lm.config, logits))
    for candidate in result.next_token.edited:
        assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel, abs=1e-12)


def test_pruned_channels_equal_zeroed_ones(lm, chat):
    at = len(chat) - 1
    generator = torch.Generator().manual_seed(0)
    channels = {(l, h): torch.randperm(lm.head_dim, generator=generator)[:16].tolist()
                for l in range(lm.layers) for h in range(lm.kv_heads)}
    slots = tuple(range(5, at - 2))
    edit = Edit(prunings=tuple(Pruning(l, h, tuple(c), slots) for (l, h), c in channels.items()))
    tensors = []
    for layer in range(lm.layers):
        keys, values = (t[:, :, :at].clone() for t in kv_cache.layer_kv(chat.cache, layer))
        for head in range(lm.kv_heads):
            keys[0, head, slots[0]: slots[-1] + 1, channels[layer, head]] = 0
        tensors.append((keys, values))
    result = what_if(chat, edit, at=at, topk=20)
    assert result.next_token.kl > 0 and float(result.heads["rho"].abs().max()) == 0  # nothing evicted
    assert_probabilities(lm, result, reference_step(chat, at, tensors))
    assert result.memory.full_bytes - result.memory.edited_bytes == lm.layers * lm.kv_heads * 16 * len(slots) * 4


@pytest.mark.parametrize("rule", ["average", "add"])
def test_a_merged_cache_equals_removed_sources_and_merged_values(lm, chat, rule):
    at = len(chat) - 1
    pairs = [(8, 9, 0.5), (10, 9, 0.25), (20, 30, 0.8)]  # (source, target, weight), in every layer and KV head
    edit = Edit(merges=tuple(Merge(l, h, s, t, w) for l in range(lm.layers) for h in range(lm.kv_heads)
                             for s, t, w in pairs), merge_rule=rule)
    keep = [s for s in range(at) if s not in (8, 10, 20)]
    tensors = []
    for layer in range(lm.layers):
        keys, values = (t[:, :, :at].clone().double() for t in kv_cache.layer_kv(chat.cache, layer))
        merged = values.clone()
        for target in (9, 30):
            sources = [(s, w) for s, t, w in pairs if t == target]
            total = values[:, :, target] + sum(w * values[:, :, s] for s, w in sources)
            merged[:, :, target] = total / (1 + sum(w for _, w in sources)) if rule == "average" else total
        tensors.append((keys[:, :, keep].float(), merged[:, :, keep].float()))
    result = what_if(chat, edit, at=at, topk=20)
    assert float(result.heads["rho"].min()) > 0  # the merged slots leave every head
    assert_probabilities(lm, result, reference_step(chat, at, tensors))


def test_the_split_of_a_pruned_and_merged_head_is_the_formula(lm, chat):
    at, layer, head = len(chat) - 1, 6, 4
    kv = head // (lm.heads // lm.kv_heads)
    edit = Edit(prunings=(Pruning(layer, kv, (1, 2, 3, 40), tuple(range(at))),),
                merges=(Merge(layer, kv, 12, 13, 0.7), Merge(layer, kv, 14, 13, 0.3)))
    result = what_if(chat, edit, at=at, layer=layer, head=head)
    query = chat.queries.layer(layer)[head, at].double()  # the step's recorded post-RoPE query (D,)
    keys, values = (t[kv, : at + 1].double() for t in chat.layer_kv(layer))
    alpha = torch.softmax(keys @ query * lm.scaling, -1)
    pruned, merged = keys.clone(), values.clone()
    pruned[:at, [1, 2, 3, 40]] = 0
    merged[13] = (values[13] + 0.7 * values[12] + 0.3 * values[14]) / 2.0
    scores = pruned @ query * lm.scaling
    scores[[12, 14]] = float("-inf")
    alpha_hat = torch.softmax(scores, -1)
    weight, content = (alpha_hat - alpha) @ values, alpha_hat @ (merged - values)
    bound = rescored_weight_rounding(query, keys, lm.scaling) * float(values.norm(dim=-1).max()) + 1e-9
    detail = result.detail
    for found, exact in ((detail.weight_term, weight), (detail.content_term, content),
                         (detail.delta_isolated, weight + content)):
        assert torch.allclose(torch.tensor(found, dtype=torch.float64), exact, rtol=0, atol=bound)
    assert float(content.norm()) > 0 and float(weight.norm()) > 0


def test_commit_and_undo_of_prunings_and_merges(lm):
    session, other = Session(lm), Session(lm)
    for one in (session, other):
        one.add_user_turn(PROMPT)
    at = len(session) - 1
    before = [tuple(t.clone() for t in session.layer_kv(layer)) for layer in range(lm.layers)]
    edit = Edit(prunings=(Pruning(3, 1, (0, 7), tuple(range(10))),), merges=(Merge(2, 0, 5, 6, 1.0),))
    session.commit(edit)
    keys, values = session.layer_kv(3)
    assert bool((keys[1, :10][:, [0, 7]] == 0).all()) and torch.equal(keys[0], before[3][0][0])
    assert torch.equal(session.layer_kv(2)[1][0, 6], (before[2][1][0, 6] + before[2][1][0, 5]) / 2)
    hidden = session.commits.hidden(at + 1, at + 1)
    assert bool(hidden[2, 0, 5]) and not bool(hidden[2, 1, 5]) and int(hidden.sum()) == 1
    session.step()  # the next step runs on the edited cache: what the what-if of the edit shows for it
    other.step()
    expected = what_if(other, edit, at=at + 1, topk=20)
    probabilities = torch.softmax(session.logits.double(), -1)
    for candidate in expected.next_token.edited:
        assert candidate.prob == pytest.approx(float(probabilities[candidate.id]), abs=1e-12,
                                               rel=probability_rounding(logit_rounding(lm.config, session.logits)))
    session.undo()
    for layer in range(lm.layers):
        for now, old in zip(session.layer_kv(layer), before[layer]):
            assert torch.equal(now[:, :at + 1], old[:, :at + 1])


def test_think_keeps_the_channels_its_formula_keeps(lm, chat):
    at = len(chat) - 1
    prunings = think(chat, 0.25, window=16, at=at)
    assert len(prunings) == lm.layers * lm.kv_heads and {len(p.channels) for p in prunings} == {16}
    bound, clear = (1024 + 64) * U, 0
    groups = lm.heads // lm.kv_heads
    for pruning in prunings:
        queries = chat.queries.layer(pruning.layer)[:, at - 16: at].double()  # (H, 16, D)
        q = (queries ** 2).mean(1).reshape(lm.kv_heads, groups, -1).mean(1)[pruning.head]
        k = (chat.layer_kv(pruning.layer)[0][pruning.head, :at].double() ** 2).mean(0)
        score = q * k
        cut = score.sort().values[15]
        sure = (score - cut).abs() > 2 * bound * cut
        assert set(pruning.channels) & set(sure.nonzero()[:, 0].tolist()) == set(
            (score <= cut).logical_and(sure).nonzero()[:, 0].tolist())
        assert pruning.slots == tuple(range(at))
        clear += int(sure.sum())
    assert clear > 0.95 * len(prunings) * lm.head_dim


def test_merging_folds_each_slot_into_its_most_similar_kept_key(lm, chat):
    at = len(chat) - 1
    evicted = torch.zeros(lm.layers, lm.kv_heads, at, dtype=torch.bool)
    evicted[:, :, 10:20] = True
    merges = merging(chat, evicted, at, threshold=0.1)
    for merge in merges[:: max(1, len(merges) // 50)]:
        keys, values = (t[merge.head, :at].double() for t in chat.layer_kv(merge.layer))
        unit = keys / keys.norm(dim=-1, keepdim=True)
        similarity = unit @ unit[merge.source]
        similarity[10:20] = float("-inf")
        assert merge.target == int(similarity.argmax()) and float(similarity.max()) >= 0.1
        own, target = values[merge.source].norm(), values[merge.target].norm()
        # kvviz works in float32: the dot product and the two norms of D terms each carry at most D·u of their size,
        # so the cosine is within 3·D·u absolutely (relative to it: ÷ cos), the norms' ratio within 4·D·u
        d, cosine = lm.head_dim, float(similarity.max())
        rel = 3 * d * U / cosine + 4 * d * U
        assert merge.weight == pytest.approx(float(cosine * own / (own + target + 1e-6)), rel=rel)
    assert {m.source for m in merges} <= set(range(10, 20))
    edit = merge_evicted(chat, Edit.evict(range(10, 20)), at)
    assert edit.evictions == Edit.evict(range(10, 20)).evictions and len(edit.merges) >= len(merges)


def test_session_files_keep_prunings_and_merges(make_chat, lm):
    from kvviz.edit.draft import EditDraft

    session = make_chat(PROMPT)
    committed = Edit(prunings=(Pruning(0, 2, (3, 4), (1, 2, 3)),), merges=(Merge(1, 1, 7, 8, 0.5),), merge_rule="add")
    session.commit(committed)
    session.generate(2)
    draft = EditDraft.from_edit(Edit(merges=(Merge(4, 0, 2, 3, 0.25),), prunings=(Pruning(5, 0, (9,), (4,)),)))
    document = export_session(session, draft)
    restored, restored_draft, _ = import_session(lm, document)
    assert restored.commits.stack == session.commits.stack
    assert restored_draft.edit() == draft.edit()
    assert torch.equal(restored.logits, session.logits)


@pytest.mark.parametrize("edit, words", [
    (lambda: Edit(merges=(Merge(0, 0, 5, 6, 1.0),), evictions=Edit.evict([6]).evictions), "a merge needs a kept target"),
    (lambda: Edit(prunings=(Pruning(0, 0, (64,), (1,)),)), "channel 64 does not exist"),
    (lambda: Edit(merges=(Merge(0, 9, 5, 6, 1.0),)), "KV head 9 does not exist"),
    (lambda: Edit(merges=(Merge(0, 0, 5, 5, 1.0),)), "cannot be merged into itself"),
    (lambda: Edit(merges=(Merge(0, 0, 5, 6, -1.0),)), "weight must be a finite non-negative number"),
    (lambda: Edit(prunings=(Pruning(0, 0, (1,), (9999,)),)), "is not in the cache before slot"),
    (lambda: Edit(merges=(Merge(0, 0, 5, 6, 1.0),), merge_rule="max"), "merge rule must be one of"),
])
def test_bad_prunings_and_merges_are_refused_and_change_nothing(make_chat, lm, edit, words):
    session = make_chat(PROMPT)
    before = [t.clone() for t in session.layer_kv(0)]
    with pytest.raises(KvvizError, match=words):
        session.commit(edit())
    assert not session.commits.stack and all(torch.equal(a, b) for a, b in zip(session.layer_kv(0), before))


def test_a_run_that_prunes_and_merges_at_the_prompt_steps_as_the_what_if_of_that_edit(lm):
    from dataclasses import replace

    from kvviz.policies import KeyNorm
    from kvviz.runs.compressed import CompressedSession, RunSettings
    from kvviz.edit.reshape import Reshape

    run = CompressedSession(lm, RunSettings(KeyNorm(), 24, "prefill", reshape=Reshape(think=0.25, merge=True)))
    run.add_turn(PROMPT)
    n = len(run)
    logits = run.step()
    plain = Session(lm)  # the same prompt and first token, unedited, and the same edit as a what-if of that step
    plain.add_user_turn(PROMPT)
    plain.step()
    evicted = KeyNorm().decision(plain, 24, n).evicted
    edit = replace(Edit.from_evicted(evicted), merges=merging(plain, evicted, n), prunings=think(plain, 0.25, 32, n))
    result = what_if(plain, edit, at=n, topk=20)
    assert len(edit.merges) > 0
    rel = probability_rounding(logit_rounding(lm.config, logits))
    probabilities = torch.softmax(logits.double(), -1)
    for candidate in result.next_token.edited:
        assert candidate.prob == pytest.approx(float(probabilities[candidate.id]), rel=rel, abs=1e-12)


def test_a_two_turn_run_merges_in_rounds_and_its_timeline_rebuilds_the_live_cache(lm):
    from kvviz.policies import SnapKV
    from kvviz.runs.compressed import RunSettings
    from kvviz.runs.policy_run import run_policy
    from kvviz.runs.report import document
    from kvviz.edit.reshape import Reshape

    result = run_policy(lm, [PROMPT, "And what is my dog called?"],
                        RunSettings(SnapKV(), 24, "both", reshape=Reshape(think=0.25, merge=True)), max_new_tokens=4)
    session = result.last.forced.session
    timeline, n = session.commits, len(session) - 1
    assert [sorted({m.round for m in part.merges}) for _, part in timeline.parts] == [[0], [1]]
    whole = timeline.edit_at(n)  # every commit's prunings and merges, from the K/V as computed
    for layer in range(lm.layers):
        rebuilt = whole.quantized(*timeline.original_kv(layer, n), layer)
        assert all(torch.equal(a, b[:, :n]) for a, b in zip(rebuilt, session.layer_kv(layer)))  # the live cache
    report = document(result)["reshape"]
    assert report["merge"] and len(report["prompts"]) == 2 and len(report["prompts"][0]["pruned"]) == lm.layers
    with pytest.raises(KvvizError, match="merging folds what a prompt's compression evicts"):
        RunSettings(SnapKV(), 24, "decode", reshape=Reshape(merge=True))
