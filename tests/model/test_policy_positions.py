"""Re-rotated positions (StreamingLLM's positions within the cache) against a reference that compacts the cache
physically and moves the keys with transformers' own RoPE functions (docs/math.md §9)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.policies import H2O, StreamingLLM
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.schemes.kivi import Kivi
from kvviz.whatif import what_if
from tests.support.rounding import kl_rounding, logit_rounding, probability_rounding

PROMPT = "My name is Zorblax and I live in the city of Quintara. I like green tea. What is my name?"


def _moved(model, keys: torch.Tensor, old: list[int], new: list[int]) -> torch.Tensor:
    """Keys ``(1, KV, n, D)`` computed at positions ``old`` moved to ``new``: undo RoPE at ``old`` (the rotation by
    −old), then apply it at ``new`` — transformers' rotary embedding and ``apply_rotary_pos_emb``."""
    rotary = model.model.rotary_emb
    cos, sin = rotary(keys, torch.tensor([old]))
    _, unrotated = apply_rotary_pos_emb(keys, keys, cos, -sin)
    cos, sin = rotary(keys, torch.tensor([new]))
    _, moved = apply_rotary_pos_emb(unrotated, unrotated, cos, sin)
    return moved


def test_rerotated_streaming_llm_equals_a_compacted_cache(make_chat, lm, eps):
    budget, steps = 20, 10
    plain = make_chat(PROMPT)
    tokens = []
    for _ in range(steps):
        tokens.append(plain.pending)
        plain.step()
    run = CompressedSession(lm, RunSettings(StreamingLLM(), budget, "decode", positions="rerotated"))
    run.add_turn(PROMPT)
    logits = [run.step(token) for token in tokens]

    ids = run.session.transcript.ids[: run.prompt_end[0]]
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([ids]), use_cache=True)
    layers = [(out.past_key_values.layers[l].keys, out.past_key_values.layers[l].values) for l in range(lm.layers)]
    computed_at = list(range(len(ids)))  # per slot: the position its key was computed at
    kept = list(range(len(ids)))
    for step, token in enumerate(tokens):
        if len(kept) > budget:
            kept = kept[:4] + kept[-(budget - 4):]
        cache = DynamicCache(config=lm.model.config)
        for layer, (keys, values) in enumerate(layers):
            moved = _moved(lm.model, keys[:, :, kept], [computed_at[s] for s in kept], list(range(len(kept))))
            cache.update(moved, values[:, :, kept], layer)
        with torch.no_grad():
            step_out = lm.model(input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[len(kept)]]),
                                cache=cache, use_cache=True)
        reference = step_out.logits[0, -1]
        assert (reference - logits[step]).abs().max() <= logit_rounding(lm.config, reference), step
        for layer in range(lm.layers):
            new = step_out.past_key_values.layers[layer]
            keys, values = layers[layer]
            layers[layer] = (torch.cat([keys, new.keys[:, :, -1:]], 2), torch.cat([values, new.values[:, :, -1:]], 2))
        computed_at.append(len(kept))
        kept.append(len(computed_at) - 1)
    # time travel: a step's what-if, taken at the end, sees the keys where they were then
    slot = run.prompt_end[0] + 6
    result = what_if(run.session, Edit(), at=slot, topk=3)
    probs = torch.softmax(logits[6].double(), -1)
    assert result.next_token.full[0].prob == pytest.approx(float(probs.max()), rel=probability_rounding(eps))


def test_rerotated_positions_are_refused_where_they_make_no_sense(lm):
    for settings in (dict(policy=H2O(), budget=16), dict(policy=StreamingLLM(), budget=16, cache_format=Kivi()),
                     dict(policy=None, budget=None, cache_format=Kivi())):
        with pytest.raises(KvvizError, match="re-rotated positions need"):
            RunSettings(**settings, positions="rerotated")


def test_blame_of_a_rerotated_run_sees_each_step_as_it_stood(lm, eps):
    from kvviz.runs.blame import blame
    from kvviz.runs.policy_run import run_policy

    result = run_policy(lm, [PROMPT], RunSettings(StreamingLLM(), 24, "decode", positions="rerotated"), 8)
    for step in (0, 3, len(result.last.steps) - 1):
        ranked = blame(result, step=step, limit=4)
        assert abs(ranked.kl - result.last.steps[step].kl) <= kl_rounding(eps, ranked.kl), step
