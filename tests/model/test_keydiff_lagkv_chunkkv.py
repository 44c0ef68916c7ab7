"""KeyDiff, LagKV and ChunkKV against references written here from their papers' formulas (KeyDiff's and LagKV's in
float64), on the bundled model's cache: scores and kept sets per layer and KV head (the runs' modes are in
tests/model/test_policy_modes.py).

Tolerances. KeyDiff's score is a cosine of float32 vectors (D = 64): each unit vector, the anchor's mean and the dot
product carry O(D·u) relative rounding, u = 2⁻²⁴, so |Δ| ≤ 4·D·u ≈ 1.5e-5 (a cosine is at most 1). LagKV's cross
scores are softmaxes of standard deviations of min-max-normalised channels: a 64-channel standard deviation carries
≈ D·u relative rounding and a softmax over 128 slots 128·u more, so a score is within (D + 128)·u ≈ 1.1e-5 of itself
(relative); the cross scores are compared to 1e-5 absolute (they are below 1). LagKV's ranks are compared exactly in
every slot whose float64 score is further than twice that bound from every other in its partition (the test counts
them: most are).
"""

from __future__ import annotations

import pytest
import torch

from kvviz.policies import ChunkKV, KeyDiff, KeyNorm, LagKV
from kvviz.policies.base import Ratio
from kvviz.policies.base import Candidates
from kvviz.session import Session

RELATIVE = (64 + 128) * 2**-24  # a LagKV score's relative rounding: a 64-channel std, a softmax over 128 slots
PROMPT = " ".join(f"Crate {i} holds {['apples', 'nails', 'rope', 'salt', 'tea'][i % 5]} from dock {i % 7}."
                  for i in range(30)) + " Which crate holds tea from dock 3?"


@pytest.fixture(scope="module")
def prompt(make_chat, lm) -> Session:
    session = make_chat(PROMPT)
    return session


def candidates(session: Session, keep: int) -> Candidates:
    lm, at = session.lm, len(session)
    return Candidates(session, at, keep, torch.ones(lm.layers, lm.kv_heads, at, dtype=torch.bool))


def test_key_diff_scores_minus_the_cosine_to_the_mean_unit_key(prompt):
    lm = prompt.lm
    found = KeyDiff().score(candidates(prompt, 64))
    for layer in range(lm.layers):
        keys = prompt.layer_kv(layer)[0][:, : len(prompt)].double()  # (KV, n, D)
        anchor = (keys / keys.norm(dim=-1, keepdim=True)).mean(1, keepdim=True)
        cosine = (keys * anchor).sum(-1) / (keys.norm(dim=-1) * anchor.norm(dim=-1))
        assert torch.allclose(found[layer].double(), -cosine, rtol=0, atol=4 * 64 * 2**-24), layer


def lag_reference(keys: torch.Tensor, values: torch.Tensor, sinks: int, lag: int, cross: bool) -> torch.Tensor:
    """LagKV by its definition, one partition and channel at a time in float64: ``(n,)`` scores of one KV head's
    slots from its keys and values ``(n, D)``."""
    n = keys.shape[0]
    if n < sinks + 2 * lag:
        return torch.tensor([1.0] * min(sinks, n) + [i / (n - sinks) for i in range(max(n - sinks, 0))])
    parts = (n - sinks) // lag
    scores = [1.0] * sinks
    for p in range(parts - 1):
        spread = []
        for states in (keys, values):
            own = states[sinks + p * lag: sinks + (p + 1) * lag].double()
            ref = states[sinks + (p + 1) * lag: sinks + (p + 2) * lag].double()
            low, high = ref.min(0).values, ref.max(0).values
            spread.append(torch.softmax(((own - low) / (high - low)).std(-1), 0))
        score = (spread[0] + spread[1]) / 2
        scores += (score.tolist() if cross else [float(sorted(score.tolist()).index(s)) / lag for s in score.tolist()])
    return torch.tensor(scores + [1.0] * (n - len(scores)))


@pytest.mark.parametrize("sinks,lag", [(4, 32), (8, 48), (4, 128), (4, 400)])
def test_lag_kv_scores_follow_the_definition(prompt, sinks, lag):
    lm, n = prompt.lm, len(prompt)
    ranks = LagKV(sinks=sinks, lag=lag).score(candidates(prompt, 64))
    cross = LagKV(sinks=sinks, lag=lag, cross_scoring=True).score(candidates(prompt, 64))
    checked = total = 0
    for layer in range(lm.layers):
        keys, values = (t[:, :n] for t in prompt.layer_kv(layer))
        for head in range(lm.kv_heads):
            exact = lag_reference(keys[head], values[head], sinks, lag, cross=True)
            assert torch.allclose(cross[layer, head].double(), exact.double(), rtol=0, atol=1e-5), (layer, head)
            expected = lag_reference(keys[head], values[head], sinks, lag, cross=False)
            scored = (n - sinks) // lag - 1 if n >= sinks + 2 * lag else 0  # partitions with a next one
            for start in range(sinks, sinks + scored * lag, lag):
                part = exact[start: start + lag]
                order = part.argsort()
                gaps = (part[order][1:] - part[order][:-1]).abs()
                alone = torch.ones(lag, dtype=torch.bool)  # no neighbour within twice the rounding: its rank is exact
                alone[order[1:]] &= gaps > 2 * RELATIVE * part.max()
                alone[order[:-1]] &= gaps > 2 * RELATIVE * part.max()
                found, wanted = ranks[layer, head, start: start + lag].double(), expected[start: start + lag].double()
                assert torch.equal(found[alone], wanted[alone]), (layer, head, start)
                checked, total = checked + int(alone.sum()), total + lag
            if n < sinks + 2 * lag:  # too short: the sinks, then recency
                assert torch.allclose(ranks[layer, head].double(), expected.double(), atol=1e-7)
    assert checked >= 0.5 * total


@pytest.mark.parametrize("chunk, ratio", [(20, 0.5), (16, 0.7), (50, 0.25)])
def test_chunk_kv_keeps_whole_chunks_by_their_mean_summed_score(prompt, chunk, ratio):
    """Per layer: minus the key norms summed over the KV heads, averaged per chunk of ``chunk`` slots (the last one
    shorter); the best ``max(1, int(chunks·(1 − ratio)))`` chunks kept whole, in every KV head."""
    lm, n = prompt.lm, len(prompt)
    decision = ChunkKV(inner="key_norm", chunk=chunk).decision(prompt, Ratio(ratio), n - 1)
    at = n - 1
    for layer in range(lm.layers):
        keys = prompt.layer_kv(layer)[0][:, :at]
        total = (-torch.linalg.vector_norm(keys, dim=-1, dtype=torch.float32)).sum(0)  # (at,) over the KV heads
        chunks = [list(range(s, min(s + chunk, at))) for s in range(0, at, chunk)]
        means = [float(total[c].mean()) for c in chunks]
        count = max(1, int(len(chunks) * (1 - ratio)))
        best = sorted(range(len(chunks)), key=lambda i: -means[i])[:count]
        kept = {slot for i in best for slot in chunks[i]}
        for head in range(lm.kv_heads):
            assert {s for s in range(at) if not decision.evicted[layer, head, s]} == kept, (layer, head)
        assert int(decision.budgets[layer, 0]) == len(kept)


def test_chunk_kv_under_one_chunk_is_its_inner_policy(prompt):
    n = len(prompt)
    few = ChunkKV(inner="key_norm", chunk=n + 5).edit(prompt, 0.5, n - 1)
    assert few == KeyNorm().edit(prompt, 0.5, n - 1)


def test_expected_attention_follows_its_formula_from_the_models_own_pre_rope_queries(lm):
    """The reference takes the pre-RoPE queries from the model itself (a hook on q_proj during the prefill) and
    transformers' rotary embedding for the future positions, all in float64; kvviz rotates its recorded post-RoPE
    queries back. Each score is a softmax weight (times ‖v‖) whose exponent carries float32 rounding of D-term dot
    products and D×D products (≈ 3·D·u·|exponent| ≤ 1e-4 here), so the scores agree to 1e-4 relative."""
    from kvviz.policies import ExpectedAttention

    captured: dict[int, torch.Tensor] = {}

    def hook(index: int):
        def keep(module, args, out) -> None:  # returns None: the forward goes on with its own output
            captured.setdefault(index, out[0].detach().double())
        return keep

    hooks = [layer.self_attn.q_proj.register_forward_hook(hook(i)) for i, layer in enumerate(lm.model.model.layers)]
    try:
        session = Session(lm)
        session.add_user_turn(PROMPT)
    finally:
        for hook in hooks:
            hook.remove()
    at, sinks, future, d = len(session), 4, 64, lm.head_dim
    policy = ExpectedAttention(future=future, sinks=sinks)
    ours = policy.score(candidates(session, 64))
    rotary = lm.model.model.rotary_emb
    cos, sin = (t[0].double() for t in rotary(captured[0][None].float(), torch.arange(at, at + future)[None]))
    half = d // 2
    swap = torch.zeros(d, d, dtype=torch.float64)
    swap[half:, :half], swap[:half, half:] = torch.eye(half), -torch.eye(half)
    rotation = (cos[:, None] * torch.eye(d, dtype=torch.float64) + sin[:, None] * swap).mean(0)
    groups = lm.heads // lm.kv_heads
    for layer in range(lm.layers):
        queries = captured[layer][sinks:at].view(at - sinks, lm.heads, d).transpose(0, 1)  # (H, m, D) pre-RoPE
        mean = queries.mean(1)
        cov = torch.einsum("hsi,hsj->hij", queries - mean[:, None], queries - mean[:, None]) / (at - sinks)
        mean, cov = mean @ rotation.T, rotation @ cov @ rotation.T
        keys, values = (t[:, sinks:at].double() for t in session.layer_kv(layer))
        keys = keys.repeat_interleave(groups, 0)  # (H, n, D)
        exponent = (keys @ mean[..., None])[..., 0] / d ** 0.5 + torch.einsum("hni,hij,hnj->hn", keys, cov, keys) / d / 2
        score = exponent.softmax(-1).view(lm.kv_heads, groups, -1).mean(1) * values.norm(dim=-1)
        assert torch.allclose(ours[layer, :, sinks:].double(), score, rtol=1e-4, atol=0), layer
        assert bool((ours[layer, :, :sinks] > ours[layer, :, sinks:].max()).all())  # the sinks stay
