"""Sparse selection (DeepSeek-V3.2's DSA: each query reads the top-k slots of a lightning indexer with a key cache of
its own), on a tiny random DeepSeek-V3.2 (kvviz.tiny_models: the MLA of tests/unit/test_latent_attention.py, each
query reading 12 slots chosen by an 8-head indexer) and GLM-5's ``glm_moe_dsa``.

The references are transformers' own eager DeepSeek-V3.2, nothing of kvviz involved: its indexer picks the top-k
under the mask it is given (the same mask as the attention: a slot hidden by the mask cannot be picked), so one
forward without cache and with a float 4D mask (0 allowed, −inf masked), each row seeing what its step saw, is what a
cache with those slots removed gives. (The cached chat, the recorded weights, the policies, blame and session files
pass the same oracles as every family: tests/unit/test_architectures.py.)

Tolerances as for MLA (tests/unit/test_latent_attention.py): logits within the model's logit rounding, probabilities
within (e^{2ε} − 1)·p, weights within the rounding of their scores, outputs' changes within 2·(n + R)·u of their size.
The read sets are compared exactly: the indexer's scores are the model's own (kvviz reads the tensor the indexer takes
its top-k of), and a tie would need two of them equal — none is in these chats (no pad token: a zeroed embedding row
would make them)."""

from __future__ import annotations

import pytest
import torch
import transformers

from kvviz import kv_cache
from kvviz.edit.edit import Edit
from kvviz.policies import H2O, StreamingLLM
from kvviz.recorder import read_mask
from kvviz.runs.compressed import RunSettings
from kvviz.tiny_sessions import tiny_pair
from kvviz.whatif import what_if
from kvviz.tiny_models import ARCHITECTURES
from tests.support.references import (assert_a_step_failing_in_the_last_layer_raises, causal_rows, masked_forward,
                                      removed_step, teacher_forced)
from tests.support.rounding import logit_rounding, probability_rounding, weight_rounding

TURNS = ["a = 3, b = 5. What is a + b?", "And a - b? Say it in words."]
TOPK = 12  # the tiny config's index_topk


@pytest.fixture(scope="module")
def dsa(tokenizer):
    return tiny_pair("deepseek_v32", tokenizer, TURNS)


def _picks(eager) -> tuple[list[torch.Tensor], list]:
    """Hooks on eager's indexers: each call's top-k indices ``(S, k)`` per layer (the eager model's own choice)."""
    picks: list[list[torch.Tensor]] = [[] for _ in eager.model.layers]
    hooks = [layer.self_attn.indexer.register_forward_hook(
        lambda _, __, out, index=index: picks[index].append(out[0].long())) for index, layer in
        enumerate(eager.model.layers)]
    return picks, hooks


def test_each_step_reads_what_transformers_indexer_picks_and_the_cache_holds_its_keys(dsa):
    """The session's passes replayed by eager on transformers' own cache: every row of every layer read the slots
    eager's indexer picked (exactly), fewer than the slots before it once more than 12 are cached; the cache holds one
    indexer key per slot beside the latent and the RoPE key, and the bytes count it."""
    lm, eager, session = dsa
    ids, n = session.transcript.ids, len(session)
    picks, hooks = _picks(eager)
    cache, start = transformers.DynamicCache(config=eager.config), 0
    try:
        for event in session.transcript.growth:
            with torch.no_grad():
                eager(input_ids=torch.tensor([ids[start:start + event.added]]), cache=cache, use_cache=True)
            start += event.added
    finally:
        for hook in hooks:
            hook.remove()
    for layer in range(lm.layers):
        recorded = read_mask(session.queries.reads.layer(layer)[0], n)  # (n, n)
        rows, begin = [], 0
        for chosen in picks[layer]:  # (S, k) per pass, over the slots cached then
            mask = torch.zeros(chosen.shape[0], n, dtype=torch.bool).scatter_(1, chosen, True)
            rows.append(mask & (torch.arange(n) <= torch.arange(begin, begin + len(chosen))[:, None]))
            begin += len(chosen)
        assert torch.equal(recorded, torch.cat(rows)), layer
    counts = recorded.sum(-1)
    assert counts[:TOPK].tolist() == list(range(1, TOPK + 1)) and set(counts[TOPK:].tolist()) == {TOPK}
    indexer = kv_cache.indexer_keys(session.cache, n)
    assert [tuple(k.shape) for k in indexer] == [(1, n, 16)] * lm.layers
    held = sum(t.numel() * 4 for layer in range(lm.layers) for t in session.layer_kv(layer))
    assert kv_cache.nbytes(session.cache) == held + lm.layers * n * 16 * 4


@pytest.mark.parametrize("back", [0, 9], ids=["last step", "9 steps back"])
def test_an_eviction_of_read_slots_brings_the_next_of_the_ranking_in_as_the_model_does(dsa, back):
    """Evicting 3 slots the step read (at the last step, and by time travel 9 steps back): the edited run's indexer
    picks 3 slots it did not read before (``admitted``), as eager's does under the mask — the next token equals
    eager's masked forward, the detail head's full and edited weights equal eager's weights without and with the mask
    (α′ = α/(1−ρ) does not: the admitted slots take mass), and layer 0's isolated change of each head's output (the
    full run's query on the edited cache, over what the indexer picks there) equals eager's own per-head change."""
    lm, eager, session = dsa
    at = len(session) - 1 - back
    read = read_mask(session.queries.reads.layer(0)[0, at], at + 1)
    evicted = read[:at].nonzero()[:, 0].tolist()[1:4]
    ids = session.transcript.ids[: at + 1]
    outputs: list[torch.Tensor] = []
    full = masked_forward(eager, ids, causal_rows(at + 1), attentions=True, heads=outputs)
    out = masked_forward(eager, ids, causal_rows(at + 1, evicted), attentions=True, heads=outputs)
    reference = torch.softmax(out.logits[0, -1].double(), -1)
    rel = probability_rounding(logit_rounding(lm.config, out.logits[0, -1]))
    tol = weight_rounding(lm.config, 0, session.queries.layer(0), lm.attention.keyed(*session.layer_kv(0)), lm.scaling)
    for head in (0, 5):
        result = what_if(session, Edit.evict(evicted), at=at, layer=0, head=head, topk=20)
        for candidate in result.next_token.edited:
            assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel)
        detail = result.detail
        admitted = [slot for slot, new in enumerate(detail.admitted) if new]
        assert len(admitted) == 3 and not set(admitted) & set(evicted)
        assert [not r for r in read.tolist()] == detail.unread
        edited = torch.tensor([v or 0.0 for v in detail.alpha_edited], dtype=torch.float64)
        assert torch.allclose(edited, out.attentions[0][0, head, -1].double(), rtol=tol, atol=1e-12)
        alpha = torch.tensor(detail.alpha_full, dtype=torch.float64)
        assert torch.allclose(alpha, full.attentions[0][0, head, -1].double(), rtol=tol, atol=1e-12)
        assert float(edited[admitted].sum()) > 1e-4  # α′ misses this mass
    change = (outputs[1][-1] - outputs[0][-1]).norm(dim=-1)  # (H,)
    tol = 2 * (at + 1 + lm.config.kv_lora_rank) * 2**-24 * float(outputs[0][-1].norm(dim=-1).max())
    assert float(change.min()) > 10 * tol
    assert torch.allclose(result.heads["delta_isolated"][0].float(), change, rtol=0, atol=tol)


def test_an_eviction_of_unread_slots_changes_nothing(dsa):
    """Slots the step did not read and the indexer would not pick: the edited run reads what the full run read, so
    its next token is the full run's to the bit."""
    lm, _, session = dsa
    at = len(session) - 1
    unread = [slot for slot in range(at) if all(
        not read_mask(session.queries.reads.layer(layer)[0, at], at + 1)[slot] for layer in range(lm.layers))]
    result = what_if(session, Edit.evict(unread[:1]), at=at)
    assert result.next_token.kl == 0 and float(result.heads["rho"].max()) == 0


@pytest.mark.parametrize("policy", [StreamingLLM(), H2O()], ids=["streaming_llm", "h2o"])
def test_a_policy_run_equals_one_masked_forward_step_by_step(dsa, policy):
    """A decode-time run, teacher-forced, against one no-cache eager forward whose row of each step sees the step's
    kept tokens and itself in each layer: eager's indexer then picks its 12 among the kept ones, as the run's did.
    H2O decides from the attention each latent received, over the slots each step read."""
    lm, eager, _ = dsa
    budget, steps = 20, 8
    run, _, logits, seen = teacher_forced(lm, RunSettings(policy, budget, "decode"), TURNS[1], steps)
    prompt = run.prompt_end[0]
    ids = run.session.transcript.ids[: prompt + steps]
    layers = [causal_rows(len(ids)) for _ in range(lm.layers)]
    for step in range(steps):
        slot = prompt + step
        kept = seen[step][:, 0, :slot]  # (L, slot)
        assert kept.sum(-1).tolist() == [min(budget, slot)] * lm.layers, step
        for layer, rows in enumerate(layers):
            rows[slot] = torch.zeros(len(ids), dtype=torch.bool)
            rows[slot][kept[layer].nonzero()[:, 0].tolist() + [slot]] = True
    out = masked_forward(eager, ids, layers[0], layers=layers)
    for step in range(steps):
        reference = out.logits[0, prompt + step]
        assert (reference - logits[step]).abs().max() <= logit_rounding(lm.config, reference), step


def test_a_quantization_what_if_rounds_the_latent_and_keeps_the_indexer_keys(dsa):
    """4-bit latents (int, per token) rounded by the test on the stored tensors, the RoPE keys and the indexer keys
    as computed (kvviz rounds what attention reads; the indexer's keys are its own cache): eager's step on a cache
    holding them gives the next token, within the logit rounding."""
    from kvviz.quant.quantizer import Quantizer, fake_quantize

    lm, eager, session = dsa
    at = len(session) - 1
    stored = [tuple(t[:, :, :at] for t in kv_cache.layer_kv(session.cache, layer)) for layer in range(lm.layers)]
    rounded = [(fake_quantize(c[0], 4, Quantizer("token"))[None], r) for c, r in stored]
    slot = session.transcript.slots[at]
    with torch.no_grad():
        logits = eager(input_ids=torch.tensor([[slot.id]]), position_ids=torch.tensor([[slot.position]]),
                       cache=kv_cache.build(eager.config, rounded, kv_cache.indexer_keys(session.cache, at)),
                       use_cache=True).logits[0, -1]
    result = what_if(session, Edit(key_bits=dict.fromkeys(range(at), 4), keys=Quantizer("token")), at=at, topk=20)
    reference = torch.softmax(logits.double(), -1)
    rel = probability_rounding(logit_rounding(lm.config, logits))
    assert result.next_token.kl > 0
    for candidate in result.next_token.edited:
        assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel, abs=1e-12)


def test_a_failed_pass_leaves_the_indexer_keys_as_they_were(tokenizer):
    """A decode step that fails in its last layer (after the indexers below it stored their keys) leaves the session
    as it was: as many indexer keys as slots, and the next step gives the logits of a session that never failed."""
    lm, _, session = tiny_pair("deepseek_v32", tokenizer, TURNS[:1], new_tokens=3)
    _, _, twin = tiny_pair("deepseek_v32", tokenizer, TURNS[:1], new_tokens=3)
    assert_a_step_failing_in_the_last_layer_raises(lm, session)
    assert [k.shape[1] for k in kv_cache.indexer_keys(session.cache, 10**6)] == [len(session)] * lm.layers
    session.step(), twin.step()
    assert torch.equal(session.logits, twin.logits)


def test_glm5s_sparse_attention_passes_the_same_oracles(tokenizer):
    """GLM-5 (``glm_moe_dsa``: the same MLA and indexer, every layer running its own): the cached chat equals a
    forward without cache, and an eviction of read slots equals the step on a cache with the latents and the indexer
    keys physically removed (tests/support/references.removed_step)."""
    # GLM's own names for 4 experts; a 32-wide latent: at 256, transformers' own GLM differs from itself between its
    # cached chat and its forward without cache (12 rows of these turns pick other slots, logits 0.45 apart), and
    # kvviz equals its cached chat (1e-5)
    lm, eager, session = tiny_pair("GlmMoeDsaConfig", tokenizer, TURNS, **{**ARCHITECTURES["deepseek_v32"][1],
                                   "kv_lora_rank": 32}, n_routed_experts=4, first_k_dense_replace=1)
    assert lm.attention.reads == TOPK
    with torch.no_grad():
        out = eager(input_ids=torch.tensor([session.transcript.ids]), use_cache=False)
    assert (out.logits[0, -1] - session.logits).abs().max() <= logit_rounding(lm.config, out.logits[0, -1])
    at = len(session) - 1
    evicted = read_mask(session.queries.reads.layer(0)[0, at], at + 1)[:at].nonzero()[:, 0].tolist()[:3]
    removed = removed_step(session, at, evicted)
    reference = torch.softmax(removed.double(), -1)
    rel = probability_rounding(logit_rounding(lm.config, removed))
    result = what_if(session, Edit.evict(evicted), at=at, topk=20)
    assert any(result.detail.admitted)
    for candidate in result.next_token.edited:
        assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel)


def test_a_rerotated_run_is_refused_in_one_line(dsa):
    """Re-rotated positions would have to turn each kept slot's indexer key as well as its RoPE key."""
    from kvviz.errors import KvvizError
    from kvviz.runs.compressed import CompressedSession

    lm, _, _ = dsa
    with pytest.raises(KvvizError, match="re-rotating them is not built yet: use original positions"):
        CompressedSession(lm, RunSettings(StreamingLLM(), 20, "decode", positions="rerotated"))


def test_the_command_line_and_the_notebook_widget_run_on_a_sparse_model(dsa, tokenizer, tmp_path):
    """``whatif`` from a saved tiny DeepSeek-V3.2 folder reports which slots the step did not read and which the
    edited step read anew; the widget's strip rows mark the unread slots, and its click on a read slot equals
    ``what_if`` on the same session."""
    import json

    from kvviz.notebook import widget
    from kvviz.tiny_models import tiny
    from tests.support.cli import cli

    tiny("deepseek_v32").save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    done = cli("whatif", "--model", str(tmp_path), "--turn", TURNS[0], "--max-new-tokens", "3", "--json", "--evict",
               "3,5")
    assert done.returncode == 0, done.stderr
    detail = json.loads(done.stdout)["detail"]
    assert sum(not unread for unread in detail["unread"]) == TOPK and len(detail["admitted"]) == len(detail["unread"])
    _, _, session = dsa
    at = len(session) - 1
    read = session.read_set(0, at)
    w = widget(session)
    assert [bool(row[-1]) for row in w.chips] == (~read).tolist()
    slot = int(read.nonzero()[0, 0])
    w.set_state({"request": {"kind": "evict", "slot": slot, "n": 1}})
    assert w.kl == what_if(session, Edit.evict([slot])).next_token.kl > 0 and not w.error


def test_each_slot_gets_its_indexer_score_and_rank_as_the_reason(dsa):
    """The what-if's detail carries the full step's indexer scores in its layer: the slots it read are the 12 of
    highest score, and each chip's reason line says a slot's score, its rank and whether it was read."""
    from kvviz.view_data import index_reasons

    lm, _, session = dsa
    at = len(session) - 1
    for layer in range(lm.layers):
        detail = what_if(session, Edit(), at=at, layer=layer).detail
        top = sorted(range(at + 1), key=lambda slot: -detail.index_scores[slot])[:TOPK]
        assert sorted(top) == [slot for slot, unread in enumerate(detail.unread) if not unread]
        assert session.read_set(layer, at).tolist() == [not unread for unread in detail.unread]
    reasons = index_reasons(detail.index_scores, detail.unread)
    first, last = top[0], sorted(range(at + 1), key=lambda slot: -detail.index_scores[slot])[-1]
    assert reasons[first] == f"indexer score {detail.index_scores[first]:.4g}, rank 1 of {at + 1}: read"
    lowest = detail.index_scores[top[-1]]
    assert reasons[last] == (f"indexer score {detail.index_scores[last]:.4g}, rank {at + 1} of {at + 1}: not read (the "
                             f"step read the 12 of highest score, down to {lowest:.4g})")


def test_blame_puts_each_unread_slot_into_the_read_set_as_the_model_would_read_it(dsa):
    """Blame of an H2O run's step, ``of="unread"``: each row's KL is the step of eager's forward (each row seeing
    what its step saw, per layer) whose indexer's top-k of that row gets the slot added (a hook on eager's indexer,
    nothing of kvviz's): the slot read beside the 12 in every layer. Nothing read anew gives the run's own KL."""
    from kvviz.runs.blame import blame, restorable, restore
    from kvviz.runs.policy_run import run_policy
    from kvviz.whatif.metrics import kl_divergence
    from tests.support.rounding import kl_rounding

    lm, eager, _ = dsa
    result = run_policy(lm, TURNS[1:], RunSettings(H2O(), 20, "decode"), max_new_tokens=6)
    assert restorable(result) == ["evicted", "unread"]
    run, step = result.last, 4
    ranked = blame(result, step=step, of="unread", limit=4)
    at, session = ranked.slot, run.forced.session
    full = run.full_logits[step + 1]
    eps = logit_rounding(lm.config, full)
    assert abs(ranked.kl - run.record(step).kl) <= 2 * kl_rounding(eps, ranked.kl)
    ids = session.transcript.ids[: at + 1]
    layers = [[run.forced.visible_to(slot)[layer, 0].tolist() + [True] + [False] * (at - slot) for slot in
               range(at + 1)] for layer in range(lm.layers)]
    layers = [[torch.tensor(row) for row in rows] for rows in layers]

    def forced(slots: list[int]) -> float:
        def hook(_, __, out):
            extra = out[..., :1].repeat(1, 1, len(slots))
            extra[0, at] = torch.tensor(slots, dtype=out.dtype)
            return torch.cat([out, extra], -1)

        hooks = [layer.self_attn.indexer.register_forward_hook(hook) for layer in eager.model.layers]
        try:
            logits = masked_forward(eager, ids, layers[0], layers=layers).logits[0, at]
        finally:
            for handle in hooks:
                handle.remove()
        return float(kl_divergence(full, logits))

    assert len(ranked.rows) == 4 and ranked.of == "unread"
    for row in ranked.rows:
        reference = forced(row.slots)
        assert abs(row.kl_after_restore - reference) <= 2 * kl_rounding(eps, reference), row
    together = sorted(s for row in ranked.rows[:2] for s in row.slots)
    reference = forced(together)
    assert abs(restore(result, together, step=step, of="unread").kl_after_restore - reference) <= \
        2 * kl_rounding(eps, reference)


def test_h2o_accumulates_the_attention_each_step_gave_over_what_it_read(dsa):
    """H2O's running sum (the attention each slot received) adds each step's weights over the slots it read: the sum
    of the session's recorded weights (which are over the read sets), to float32 rounding (each weight within a
    relative 2^-20 of its recomputation, at most 1 per row)."""
    from kvviz.runs.compressed import CompressedSession

    lm, _, _ = dsa
    run = CompressedSession(lm, RunSettings(H2O(), 20, "decode"))
    run.add_turn(TURNS[1])
    for _ in range(6):
        run.step()
    n = len(run.session)
    for layer in range(lm.layers):
        received = run.session.weights(layer).double().sum((0, 1))[:n]  # (n,): all query heads share the latent
        assert torch.allclose(run.running[layer, 0, :n], received, rtol=0, atol=n * 2**-20), layer
