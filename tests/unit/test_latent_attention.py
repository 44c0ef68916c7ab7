"""Multi-head latent attention (DeepSeek-V3's MLA: one latent and one RoPE key cached per token, shared by every
head), on a tiny random DeepSeek-V3 (kvviz.tiny_models: a 32-wide latent, an 8-wide RoPE key, 8 heads with 24-wide
queries and 12-wide values). kvviz reads it in the absorbed form (kvviz/latent.py): one KV head of 40 channels.

The references are transformers' own eager DeepSeek-V3 attention, which expands the latent into per-head keys and
values, nothing of kvviz involved: one forward without cache and with a float 4D mask (0 allowed, −inf masked), each
row seeing what its step saw. (The cached chat, the recorded weights, the policies, blame and session files pass the
same oracles as every family: tests/unit/test_architectures.py.)

Tolerances: kvviz's scores are q̃·[c; r] (absorbed: W_UK applied to the query) where eager computes q·[W_UK c; r]: the
same sums in another order, so logits agree within the model's logit rounding ε_z, probabilities within
(e^{2ε} − 1)·p and weights within the rounding of their scores (tests/support/rounding.py). The attention outputs'
change is compared in float32 against eager's own per-head outputs: within 2^-20 of their size (two float32
outputs of ~40 terms each, subtracted)."""

from __future__ import annotations

import pytest
import torch

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.policies import H2O, StreamingLLM
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.schemes.written import WrittenCache
from kvviz.tiny_models import tiny_pair
from kvviz.whatif import what_if
from tests.support.references import greedy_tokens
from tests.support.rounding import logit_rounding, probability_rounding, weight_rounding

TURNS = ["a = 3, b = 5. What is a + b?", "And a - b? Say it in words."]
RANK, ROPE = 32, 8  # the tiny config's kv_lora_rank and qk_rope_head_dim


@pytest.fixture(scope="module")
def mla(tokenizer):
    return tiny_pair("deepseek_v3", tokenizer, TURNS)


def _mask(rows: list[torch.Tensor]) -> torch.Tensor:
    """A float 4D mask ``(1, 1, n, n)`` from each row's allowed slots (bool ``(n,)`` each): 0 allowed, −inf hidden."""
    allowed = torch.stack(rows)
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]


def _causal_rows(n: int) -> list[torch.Tensor]:
    return [torch.arange(n) <= row for row in range(n)]


def _eager(eager, ids: list[int], rows: list[torch.Tensor], attentions: bool = False, heads: list | None = None,
           layers: list[list[torch.Tensor]] | None = None):
    """Eager's forward without cache under the rows' mask (``layers``: each layer's own rows instead, given to its
    attention by a pre-hook); ``heads`` receives layer 0's per-head attention outputs ``(n, H, Dv)`` (the input of
    its ``o_proj``)."""
    hooks = []
    if heads is not None:
        attention = eager.model.layers[0].self_attn
        hooks.append(attention.o_proj.register_forward_hook(
            lambda _, args, __: heads.append(args[0][0].view(len(ids), attention.num_heads, -1))))
    for layer, own in enumerate(layers or []):
        mask = _mask(own)
        hooks.append(eager.model.layers[layer].self_attn.register_forward_pre_hook(
            lambda _, args, kwargs, mask=mask: (args, {**kwargs, "attention_mask": mask}), with_kwargs=True))
    try:
        with torch.no_grad():
            return eager(input_ids=torch.tensor([ids]), attention_mask=_mask(rows), use_cache=False,
                         output_attentions=attentions)
    finally:
        for hook in hooks:
            hook.remove()


def test_the_cache_is_one_latent_and_one_rope_key_per_token_and_the_bytes_count_them(mla):
    lm, _, session = mla
    n = len(session)
    keys, values = session.layer_kv(0)
    assert (lm.kv_heads, lm.head_dim, keys.shape, values.shape) == (1, RANK + ROPE, (1, n, RANK), (1, n, ROPE))
    at = n - 1
    memory = what_if(session, Edit.evict([3]), at=at).memory
    assert memory.full_bytes == at * lm.layers * (RANK + ROPE) * 4  # float32: not 2 × heads × head_dim per token
    assert memory.edited_bytes == (at - 1) * lm.layers * (RANK + ROPE) * 4
    assert lm.bytes_per_slot == lm.layers * 4 * (RANK + ROPE + lm.heads * (RANK + ROPE))  # K/V and the queries


def test_an_eviction_removes_the_latent_for_every_head_as_a_masked_forward(mla):
    """Evicting a token hides its latent from all 8 heads: the next token equals eager's forward with those columns
    masked in the last row; in layer 0 (whose query the eviction cannot move) α′ = α/(1−ρ) equals eager's masked
    weights for every head, and the isolated change of each head's output equals eager's own per-head outputs'
    change — which needs W_UV applied to the latent's average (kvviz.latent.Latent.project)."""
    lm, eager, session = mla
    at = len(session) - 1
    evicted = [1, 2, at - 20, at - 5, at - 2]
    ids = session.transcript.ids[: at + 1]
    outputs: list[torch.Tensor] = []
    full = _eager(eager, ids, _causal_rows(at + 1), heads=outputs)
    rows = _causal_rows(at + 1)
    rows[-1] = rows[-1].clone()
    rows[-1][evicted] = False
    out = _eager(eager, ids, rows, attentions=True, heads=outputs)
    reference = torch.softmax(out.logits[0, -1].double(), -1)
    rel = probability_rounding(logit_rounding(lm.config, out.logits[0, -1]))
    queries, keys = session.queries.layer(0), lm.attention.keyed(*session.layer_kv(0))
    tol = weight_rounding(lm.config, 0, queries, keys, lm.scaling)
    change = (outputs[1][-1] - outputs[0][-1]).norm(dim=-1)  # (H,): eager's layer-0 per-head output change
    assert full.logits.shape[1] == at + 1
    for head in range(lm.heads):
        result = what_if(session, Edit.evict(evicted), at=at, layer=0, head=head, topk=20)
        for candidate in result.next_token.edited:
            assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel)
        renorm = torch.tensor([0.0 if v is None else v for v in result.detail.alpha_renorm], dtype=torch.float64)
        assert torch.allclose(renorm, out.attentions[0][0, head, -1].double(), rtol=tol, atol=1e-12), head
    isolated = result.heads["delta_isolated"][0].float()
    size = float(outputs[0][-1].norm(dim=-1).max())
    assert float(change.min()) > 1e3 * 2**-20 * size  # the eviction moves every head's output
    assert torch.allclose(isolated, change, rtol=0, atol=2**-20 * size * 40)


def test_scopes_and_rewrites_of_the_latent_are_refused_and_change_nothing(mla):
    lm, _, session = mla
    at = len(session) - 1
    before = [t.clone() for t in session.layer_kv(0)]
    with pytest.raises(KvvizError, match="KV head 1 does not exist"):
        what_if(session, Edit.evict([3], heads=[1]), at=at)  # one latent per token: no head scope
    with pytest.raises(KvvizError, match="latent"):
        what_if(session, Edit.quantize(range(at), 4), at=at)
    with pytest.raises(KvvizError, match="latent"):
        CompressedSession(lm, RunSettings(StreamingLLM(), 20, "decode", positions="rerotated"))
    with pytest.raises(KvvizError, match="latent"):
        CompressedSession(lm, RunSettings(StreamingLLM(), 20, "decode", cache_format=WrittenCache("int4-token")))
    assert all(torch.equal(a, b) for a, b in zip(before, session.layer_kv(0)))
    assert what_if(session, Edit.quantize(range(at), 16), at=at).next_token.kl == 0  # 16 bits round nothing


@pytest.mark.parametrize("policy", [StreamingLLM(), H2O()], ids=["streaming_llm", "h2o"])
def test_a_policy_run_equals_one_masked_forward_step_by_step(mla, policy):
    """A decode-time run, teacher-forced, against one no-cache eager forward whose row of each step sees the step's
    kept tokens and itself. H2O decides from the attention the latent received (the absorbed weights, summed over
    the heads that share it)."""
    lm, eager, _ = mla
    budget, steps = 20, 8
    tokens = greedy_tokens(lm, TURNS[1], steps)
    run = CompressedSession(lm, RunSettings(policy, budget, "decode"))
    run.add_turn(TURNS[1])
    logits, seen = [], []
    for token in tokens:
        logits.append(run.step(token))
        seen.append(run.seen.clone())
    prompt = run.prompt_end[0]
    ids = run.session.transcript.ids[: prompt + steps]
    layers = [_causal_rows(len(ids)) for _ in range(lm.layers)]
    differs = False
    for step in range(steps):
        slot = prompt + step
        kept = seen[step][:, 0, :slot]  # (L, slot): one kept set per layer (one KV head: all heads alike)
        assert kept.sum(-1).tolist() == [min(budget, slot)] * lm.layers, step
        differs |= not torch.equal(kept, kept[:1].expand_as(kept))
        for layer, rows in enumerate(layers):
            rows[slot] = torch.zeros(len(ids), dtype=torch.bool)
            rows[slot][kept[layer].nonzero()[:, 0].tolist() + [slot]] = True
    assert differs == (policy.name == "h2o")  # H2O keeps what each layer's attention chose: the masks differ
    out = _eager(eager, ids, layers[0], layers=layers)
    for step in range(steps):
        reference = out.logits[0, prompt + step]
        assert (reference - logits[step]).abs().max() <= logit_rounding(lm.config, reference), step
