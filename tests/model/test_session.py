"""The session on the real bundled model, against a full no-cache forward with transformers' eager attention."""

from __future__ import annotations

import copy

import pytest
import torch

from kvviz.attention_math import causal_weights, kv_head_of
from kvviz.errors import KvvizError
from kvviz.sampling import Sampling
from kvviz.session import Session
from tests.support.references import AttentionSpy, full_forward
from tests.support.rounding import logit_rounding, weight_rounding, worst_ratio


class InputCounter:
    """Counts the tokens that go through the embedding layer (what the model really processed)."""

    def __init__(self, model):
        self.lengths: list[int] = []
        self.handle = model.get_input_embeddings().register_forward_hook(
            lambda _m, args, _out: self.lengths.append(args[0].shape[1])
        )

    def close(self) -> None:
        self.handle.remove()


def test_second_turn_prefills_only_new_tokens_and_matches_full_forward(lm, eager_model):
    session = Session(lm)
    session.add_user_turn("My name is Ada and I like tea.")
    session.generate(8)
    cached_before = len(session)
    counter = InputCounter(lm.model)
    try:
        delta = session.add_user_turn("What is my name?")
    finally:
        counter.close()
    assert counter.lengths == [len(delta)], "history must not be recomputed"
    assert len(session) == cached_before + len(delta)
    assert session.transcript.ids[:cached_before] == session.transcript.ids[: len(session) - len(delta)]
    reference = full_forward(eager_model, session.transcript.ids).logits[0, -1]
    assert (reference - session.logits).abs().max().item() <= logit_rounding(lm.config, reference)
    rendered = lm.tokenizer.apply_chat_template(session.messages, add_generation_prompt=True, return_dict=False)
    assert rendered == session.transcript.ids


def test_each_decode_step_matches_last_row_of_full_forward(lm, eager_model):
    session = Session(lm)
    session.add_user_turn("Count from one to twenty.")
    for _ in range(10):
        token = session.step()
        reference = full_forward(eager_model, session.transcript.ids).logits[0, -1]
        assert (reference - session.logits).abs().max().item() <= logit_rounding(lm.config, reference)
        assert token.id == int(reference.argmax())  # greedy: the reference picks the same token
    assert [e.kind for e in session.transcript.growth] == ["prefill"] + ["decode"] * 10


def test_recomputed_weights_equal_eager_output_attentions(lm, eager_model, monkeypatch):
    spy = AttentionSpy(lm.model, monkeypatch)
    session = Session(lm)
    session.add_user_turn("The cat sat on the mat because")
    prefill_length = len(session)
    for _ in range(4):
        session.step()
    monkeypatch.undo()
    assert len(spy.passes) == 5
    n = len(session)
    for layer in (0, 7, 15, 29):  # each weight to its own rounding bound (tests/support/rounding.py)
        ours = session.weights(layer)  # (H, n, n) from recorded queries + cached keys, computed now
        rel = weight_rounding(lm.config, layer, session.queries.layer(layer), session.layer_kv(layer)[0], lm.scaling)
        prefill = spy.passes[0][layer][0]  # (H, prefill_length, prefill_length) from the prefill pass itself
        assert worst_ratio(ours[:, :prefill_length, :prefill_length], prefill, rel) <= 1
        for step, attentions in enumerate(spy.passes[1:]):
            slot = prefill_length + step
            decode = attentions[layer][0, :, 0]  # (H, slot + 1) from that decode pass
            assert worst_ratio(ours[:, slot, : slot + 1], decode, rel) <= 1
        for head in (0, 4, 8):
            row = session.attention_row(layer, head, n - 1)
            assert worst_ratio(row, spy.passes[-1][layer][0, head, 0], rel) <= 1
    # and against an independent no-cache eager forward
    attentions = full_forward(eager_model, session.transcript.ids, output_attentions=True).attentions
    for layer in (0, 7, 15, 29):
        rel = weight_rounding(lm.config, layer, session.queries.layer(layer), session.layer_kv(layer)[0], lm.scaling)
        assert session.weights(layer).shape == attentions[layer][0].shape == (lm.heads, n, n)
        assert worst_ratio(session.weights(layer), attentions[layer][0], rel) <= 1


def test_gqa_mapping_groups_consecutive_query_heads(lm, monkeypatch):
    assert (lm.heads, lm.kv_heads) == (9, 3)
    assert [kv_head_of(h, 9, 3) for h in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    spy = AttentionSpy(lm.model, monkeypatch)
    session = Session(lm)
    session.add_user_turn("Grouped query attention shares keys.")
    monkeypatch.undo()
    eager = spy.passes[0][5][0]
    keys, _ = session.layer_kv(5)
    queries = session.queries.layer(5)
    for head in range(lm.heads):
        right = causal_weights(queries[head : head + 1], keys[kv_head_of(head, 9, 3)][None], lm.scaling)[0]
        assert worst_ratio(right, eager[head], weight_rounding(lm.config, 5, queries, keys, lm.scaling)) <= 1
        wrong = causal_weights(queries[head : head + 1], keys[head % 3][None], lm.scaling)[0]
        if head % 3 != kv_head_of(head, 9, 3):
            assert (wrong - eager[head]).abs().max().item() > 1e-3  # the interleaved mapping would be wrong


def test_seed_worked_example_raw_ids(lm):
    """docs/math.md §1's example: history x1..x3, query q1 q2, then two generated tokens: lengths 3 → 5 → 6 → 7."""
    session = Session(lm)
    session.add_ids([504, 2524, 314])
    assert len(session) == 3
    session.add_ids([5248, 28])
    assert len(session) == 5
    assert session.transcript.segments() == ["history"] * 3 + ["query"] * 2
    first = session.pending
    session.step()
    assert len(session) == 6 and session.transcript.ids[-1] == first
    assert session.transcript.segments() == ["history"] * 3 + ["query"] * 2 + ["generated"]
    session.step()
    assert len(session) == 7
    assert session.transcript.segments() == ["history"] * 3 + ["query"] * 2 + ["generated"] * 2
    assert [e.length for e in session.transcript.growth] == [3, 5, 6, 7]
    assert [s.position for s in session.transcript.slots] == list(range(7))
    assert session.pending is not None and session.pending_token().id == session.pending  # pending, not cached
    assert session.cache.get_seq_length() == 7 == session.queries.length


def test_interleaved_sessions_equal_sequential_ones(lm):
    def run_alone(prompt: str) -> tuple[list[int], torch.Tensor]:
        session = Session(lm)
        session.add_user_turn(prompt)
        session.generate(6)
        return session.transcript.ids, session.weights(3)

    prompts = ["Name a colour.", "Give me a number between 1 and 9."]
    alone = [run_alone(p) for p in prompts]
    a, b = Session(lm), Session(lm)
    a.add_user_turn(prompts[0])
    b.add_user_turn(prompts[1])
    streams = [a.stream(6), b.stream(6)]
    for _ in range(6):
        for stream in streams:
            next(stream, None)
    for session, (ids, weights) in zip((a, b), alone):
        assert session.transcript.ids == ids
        assert torch.equal(session.weights(3), weights)


def test_refused_turns_change_nothing(lm):
    session = Session(lm)
    session.add_user_turn("Hello")
    session.generate(3)
    before = (list(session.transcript.slots), len(session.transcript.growth), session.cache.get_seq_length(),
              session.pending, [dict(t) for t in session.turns])
    for bad in ("", "   \n", "word " * 9000):
        with pytest.raises(KvvizError):
            session.add_user_turn(bad)
    with pytest.raises(KvvizError):
        session.add_ids([lm.model.config.vocab_size])
    after = (list(session.transcript.slots), len(session.transcript.growth), session.cache.get_seq_length(),
             session.pending, [dict(t) for t in session.turns])
    assert after == before


def test_failed_forward_leaves_cache_and_transcript_intact(lm, monkeypatch):
    import kvviz.prefill as prefill_module
    from kvviz.recorder import QueryRecorder

    session = Session(lm)
    session.add_user_turn("Hello there")
    length, ids = len(session), session.transcript.ids

    class Failing(QueryRecorder):
        def on_query(self, layer, query, key, value):
            if layer == 12:
                raise RuntimeError("boom")
            return super().on_query(layer, query, key, value)

    monkeypatch.setattr(prefill_module, "QueryRecorder", Failing)
    with pytest.raises(RuntimeError):
        session.step()
    monkeypatch.undo()
    assert len(session) == length and session.transcript.ids == ids
    assert all(layer.keys.shape[2] == length for layer in session.cache.layers)
    assert session.queries.length == length
    session.step()  # and the session goes on normally, writing over the failed pass's slots
    assert len(session) == length + 1
    fresh = Session(lm)
    fresh.add_user_turn("Hello there")
    fresh.step()
    assert torch.equal(session.logits, fresh.logits) and session.pending == fresh.pending


def test_stream_stops_at_end_of_turn_and_reports_pending(lm):
    session = Session(lm)
    session.add_user_turn("Reply with just the word yes.")
    tokens = list(session.stream(50))
    assert tokens and session.turn_ended
    assert session.pending in lm.stop_ids  # <|im_end|> was chosen but is not in the cache
    assert session.transcript.ids[-1] not in lm.stop_ids
    assert session.reply == lm.tokenizer.decode([t.id for t in tokens], skip_special_tokens=True)
    assert list(session.stream(5)) == []


def test_the_reply_reads_as_the_cache_holds_it_after_any_order_of_calls(lm):
    """One rule (Session.reply): the turn's generated slots, decoded, then the pending token once a stream has
    yielded it. Every order of three calls among step / stream / generate / force, each order branching off a copy
    of the session before it; the oracle is the transcript's generated slots and this test's own account of what was
    yielded."""
    forced = lm.tokenizer.encode(" the")[0]

    def call(session: Session, name: str, yielded_pending: bool) -> bool:
        if name == "step":
            session.step()
            return False
        if name == "force":
            session.force(forced)
            return yielded_pending
        yielded = list(session.stream(2)) if name == "stream" else []
        if name == "generate":
            session.generate(1, on_token=yielded.append)
        return yielded_pending or (bool(yielded) and yielded[-1].id == session.pending)

    def check(session: Session, yielded_pending: bool, order: tuple[str, ...]) -> None:
        generated = [slot_id for slot_id, segment in zip(session.transcript.ids, session.transcript.segments())
                     if segment == "generated"]
        expected = [i for i in generated + [session.pending] * yielded_pending if i not in lm.stop_ids]
        assert session.reply == lm.tokenizer.decode(expected, skip_special_tokens=True), order
        assert session.conversation()[-1]["assistant"] == session.reply, order

    root = Session(lm)
    root.add_user_turn("Describe a lighthouse in one sentence.")
    frontier, checked = [((), root, False)], 0
    while frontier:
        order, session, yielded_pending = frontier.pop()
        for name in ("step", "stream", "generate", "force"):
            branch = copy.deepcopy(session, memo={id(lm): lm})
            shown = call(branch, name, yielded_pending)
            check(branch, shown, order + (name,))
            checked += 1
            if len(order) < 2:
                frontier.append((order + (name,), branch, shown))
    assert checked == 4 + 16 + 64


def test_seeded_sampling_is_reproducible(lm):
    def sample(seed: int) -> list[int]:
        session = Session(lm, Sampling(temperature=1.0, top_p=0.9, seed=seed))
        session.add_user_turn("Tell me a story.")
        session.generate(8)
        return session.transcript.ids

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
    with pytest.raises(KvvizError):
        Sampling(top_p=0)


def test_recorded_state_stays_near_kv_cache_size(lm):
    session = Session(lm)
    session.add_user_turn("word " * 1500)
    memory = session.memory()
    assert memory.recorded_bytes <= 2.0 * memory.kv_bytes


def test_a_forward_pass_reports_its_layers_as_they_run(lm):
    session, seen = Session(lm), []
    session.on_layer = lambda done, layers: seen.append((done, layers))
    session.add_user_turn("Hello there.")
    assert seen == [(layer, lm.layers) for layer in range(lm.layers)]
