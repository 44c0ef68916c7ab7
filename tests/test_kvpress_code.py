"""kvpress' own code in kvviz: presses written here in kvpress' ``ScorerPress`` shape run through
``from_kvpress(PressClass)`` in a prefill-mode policy run, and keep exactly what the native kvviz policy keeps — one
that scores keys alone, and one that recomputes the window's queries from the recorded hidden states (with the module
and the position embeddings kvpress passes) and scores by their attention."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from kvviz.errors import KvvizError
from kvviz.policies import KeyNorm, Policy
from kvviz.policies.base import Candidates, Ratio
from kvviz.policies.kvpress.presses import from_kvpress
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.session import Session
from tests.support.rounding import rescored_weight_rounding

PROMPT = "Ann keeps bees, Bob keeps goats and Cy keeps ducks. Who keeps goats? Answer with the name."
WINDOW = 8


@dataclass
class NormPress:  # kvpress' KnormPress, in its shape
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return -keys.norm(dim=-1)


@dataclass
class WindowPress:  # the last WINDOW queries' attention, recomputed from hidden states as kvpress' SnapKV does
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        bsz, q_len, _ = hidden_states.shape
        heads, dim = module.config.num_attention_heads, module.head_dim
        query = module.q_proj(hidden_states).view(bsz, q_len, heads, dim).transpose(1, 2)
        cos, sin = kwargs["position_embeddings"]
        query, _ = apply_rotary_pos_emb(query, query, cos, sin)
        query = query[:, :, -WINDOW:]
        groups = heads // keys.shape[1]
        weights = query @ repeat_kv(keys, groups).transpose(2, 3) / math.sqrt(dim)
        weights += torch.triu(torch.full_like(weights, float("-inf")), diagonal=q_len - WINDOW + 1)
        weights = weights.softmax(-1)  # (1, H, WINDOW, at)
        return weights.sum(2).view(bsz, keys.shape[1], groups, q_len).sum(2)


@dataclass(frozen=True)
class Window(Policy):  # the native counterpart: the same attention from the recorded queries
    name = "window"

    def score(self, candidates: Candidates) -> torch.Tensor:
        return candidates.attention(slice(candidates.at - WINDOW, candidates.at))


def kept(lm, policy) -> torch.Tensor:
    run = CompressedSession(lm, RunSettings(policy, Ratio(0.5), "prefill"))
    run.add_turn(PROMPT)
    return run.alive()


def test_a_press_that_scores_keys_keeps_what_key_norm_keeps(lm):
    press = from_kvpress(NormPress, compression_ratio=0.5)
    assert press.ratio.ratio == 0.5 and press.policy.settings() == {"press": "NormPress"}
    assert torch.equal(kept(lm, press.policy), kept(lm, KeyNorm()))


def test_a_press_that_reads_hidden_states_scores_the_recorded_attention(lm):
    """WindowPress recomputes the window's queries from the hidden states with the module's q_proj and the rotary
    embedding kvpress passes: bit for bit the queries the model computed (the same operations on the same tensors),
    so its scores are the recorded attention's up to the softmax's rounding (tests/support/rounding.py), and its kept sets
    are Window's wherever no two scores are closer than that."""
    ours = from_kvpress(WindowPress()).policy
    run = CompressedSession(lm, RunSettings(ours, Ratio(0.5), "prefill"))
    run.add_turn(PROMPT)
    at = len(run)
    candidates = Candidates(run.session, at, at // 2, torch.ones(lm.layers, lm.kv_heads, at, dtype=torch.bool),
                            hidden=run.hidden)
    theirs, native = ours.score(candidates), Window().score(candidates)
    for layer in range(lm.layers):
        queries = run.session.queries.layer(layer)[:, at - WINDOW: at]
        bound = rescored_weight_rounding(queries, run.session.layer_kv(layer)[0], lm.attention.scaling)
        assert bool(((theirs[layer] - native[layer]).abs() <= bound * native[layer] + 1e-12).all()), layer
    assert torch.equal(kept(lm, ours), kept(lm, Window()))


def test_hidden_states_are_recorded_only_in_runs_of_policies_that_read_them(lm):
    assert CompressedSession(lm, RunSettings(KeyNorm(), 8, "prefill")).hidden is None
    session = Session(lm)
    session.add_user_turn(PROMPT)
    with pytest.raises(KvvizError, match="records in policy runs only"):
        from_kvpress(WindowPress()).policy.edit(session, 0.5)
    with pytest.raises(KvvizError, match="no exact kvviz counterpart"):
        from_kvpress(type("Thing", (), {"score": None}))  # no score method: not a press in kvpress' shape
