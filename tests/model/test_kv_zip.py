"""KVzip against a reference built here without kvviz's cache path: one no-cache forward of the context followed by
the reconstruction prompt (transformers' eager attention, its attention weights returned), whose rows of the repeated
tokens, restricted to the sinks, the repeated chunk and the repeat tokens and renormalised there (a softmax over a
subset of columns is the full softmax renormalised over it), maxed over rows and a group's query heads, are KVzip's
scores; then the budget shared by all layers and KV heads, as kvpress' ``KVzipPress`` removes ``int(n·L·KV·ratio)``.

Tolerance. kvviz scores on the cache (context cached, repeat as a second pass) where the reference runs one pass: the
attention logits of the two differ by the float32 rounding of the residual stream (tests/support/rounding.py's ε at the
scale of an attention logit, ≤ 30 here), and a weight renormalised over m ≤ 300 columns moves by at most
2·ε_logit + m·u relative; scores are compared to that. Kept sets are compared exactly in every slot clear of the
global threshold by twice that bound.
"""

from __future__ import annotations

import pytest
import torch

from kvviz.policies import KVZip
from kvviz.policies.base import Candidates, Ratio
from kvviz.policies.kvpress.presses import from_kvpress
from kvviz.session import Session
from tests.support.references import full_forward
from tests.support.rounding import residual_rounding

U = 2.0**-24
PROMPT = ("Mira keeps three keys: the red key opens the shed, the blue key opens the gate and the green key opens "
          "the attic. Her neighbour Tomas borrowed the blue key on Monday and returned it on Friday. Which key opens "
          "the attic, and who borrowed a key?")
OPENING = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
           "<|im_start|>user\n")  # SmolLM2's chat template before a user message
ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def prompt(make_chat, lm) -> Session:
    session = make_chat(PROMPT)
    return session


def encode(lm, text: str) -> list[int]:
    return lm.tokenizer.encode(text, add_special_tokens=False)


def reference_scores(lm, eager_model, ids: list[int], chunk: int, sinks: int = 4) -> torch.Tensor:
    """KVzip's scores ``(L, KV, n)`` by its definition, from no-cache forwards of ``ids`` + each chunk's prompt."""
    encode = lambda text: lm.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    prefix, n, groups = len(encode(OPENING)), len(ids), lm.heads // lm.kv_heads
    assert ids[:prefix] == encode(OPENING)
    scores = torch.zeros(lm.layers, lm.kv_heads, n, dtype=torch.float64)
    for start in range(prefix, n, chunk):
        stop = min(start + chunk, n)
        ask = (encode("\n\nRepeat the previous context exactly.") if start == prefix else
               encode("\n\nRepeat the part of the previous context exactly, starting with") + ids[start - 8: start])
        repeat = ask + encode(ASSISTANT) + ids[start: stop]
        attentions = full_forward(eager_model, ids + repeat, output_attentions=True).attentions
        columns = [*range(sinks), *range(start, stop), *range(n, n + len(repeat))]
        for layer, weights in enumerate(attentions):
            rows = weights[0, :, n:].double()[..., columns]  # (H, q, m)
            rows = rows / rows.sum(-1, keepdim=True)
            best = rows[..., sinks: sinks + stop - start].amax(1)  # (H, chunk)
            scores[layer, :, start: stop] = best.reshape(lm.kv_heads, groups, -1).amax(1)
    scores[..., :sinks] = float("inf")
    return scores


@pytest.mark.parametrize("chunk", [2048, 40])
def test_kv_zip_scores_are_the_reconstruction_attention(lm, eager_model, prompt, chunk):
    n = len(prompt) - 1
    found = KVZip(chunk=chunk).decision(prompt, Ratio(0.5), n)
    reference = reference_scores(lm, eager_model, prompt.transcript.ids[:n], chunk)
    bound = 2 * residual_rounding(lm.config, 30.0) + 300 * U
    finite = reference.isfinite()
    assert torch.allclose(found.scores[finite].double(), reference[finite], rtol=bound, atol=1e-9)
    assert bool((found.scores[~finite] == float("inf")).all())
    # the budget: int(n·L·KV·ratio) removed wherever the lowest scores are, the template's opening (score 0) first
    removed = int(n * lm.layers * lm.kv_heads * 0.5)
    assert int(found.evicted.sum()) == removed
    threshold = reference.flatten().sort().values[removed - 1]
    clear = (reference - threshold).abs() > 2 * bound * threshold
    assert torch.equal(found.evicted[clear], (reference <= threshold)[clear])
    assert int(clear.sum()) > 0.95 * reference.numel()
    assert not bool(found.evicted[..., :4].any())


def test_kv_zip_layerwise_keeps_the_same_count_in_every_layer(prompt):
    n = len(prompt) - 1
    lm = prompt.lm
    decision = KVZip(layerwise=True).decision(prompt, Ratio(0.75), n)
    per_layer = decision.evicted.sum((1, 2))
    assert per_layer.tolist() == [int(lm.kv_heads * n * 0.75)] * lm.layers
    assert len(set(decision.evicted.sum(-1).flatten().tolist())) > 1  # shared unevenly by the KV heads
    counted = KVZip().decision(prompt, 30, n)  # a slot count: 30 · L · KV kept in all
    assert int((~counted.evicted).sum()) == 30 * lm.layers * lm.kv_heads


def test_kv_zip_plus_normalises_rows_by_hidden_norm_and_columns_by_value_output(lm, eager_model, prompt):
    n = len(prompt) - 1
    everything = torch.ones(lm.layers, lm.kv_heads, n, dtype=torch.bool)
    plain, plus = (KVZip(plus=flag).score(Candidates(prompt, n, n // 2, everything)) for flag in (False, True))
    ids = prompt.transcript.ids[:n]
    prefix = len(lm.tokenizer.encode(OPENING, add_special_tokens=False))
    repeat = [*encode(lm, "\n\nRepeat the previous context exactly."), *encode(lm, ASSISTANT), *ids[prefix:]]
    out = full_forward(eager_model, ids + repeat, output_attentions=True, output_hidden_states=True)
    layer, groups = 5, lm.heads // lm.kv_heads
    module = eager_model.model.layers[layer]
    hidden = module.input_layernorm(out.hidden_states[layer][0, n:]).double()  # (q, hidden): the attention's input
    columns = [*range(4), *range(prefix, n), *range(n, n + len(repeat))]
    weights = out.attentions[layer][0, :, n:].double()[..., columns]
    weights = weights / weights.sum(-1, keepdim=True) / hidden.norm(dim=-1)[:, None]
    w_o = module.self_attn.o_proj.weight.double()
    for head in range(lm.heads):
        v = prompt.layer_kv(layer)[1][head // groups, :n].double()
        out_norm = (v @ w_o[:, head * lm.head_dim: (head + 1) * lm.head_dim].t()).norm(dim=-1)  # (n,)
        weights[head, :, 4: 4 + n - prefix] *= out_norm[prefix:]
    best = weights[:, :, 4: 4 + n - prefix].amax(1).reshape(lm.kv_heads, groups, -1).amax(1)
    assert torch.allclose(plus[layer, :, prefix:].double(), best, rtol=1e-3, atol=0)
    assert not torch.allclose(plus[layer, :, prefix:], plain[layer, :, prefix:], rtol=0.1)


def test_kv_zip_names_its_cost_and_maps_from_kvpress(lm, prompt):
    n = len(prompt) - 1
    ids = prompt.transcript.ids[:n]
    prefix = len(lm.tokenizer.encode(OPENING, add_special_tokens=False))
    assert KVZip().cost(lm.tokenizer, ids) == n - prefix + len(encode(lm, "\n\nRepeat the previous context exactly.")) \
        + len(encode(lm, ASSISTANT))
    press = from_kvpress("KVzipPress", n_sink=2, layerwise=True, compression_ratio=0.5)
    assert press.policy == KVZip(sinks=2, layerwise=True) and press.ratio.ratio == 0.5
