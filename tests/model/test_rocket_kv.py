"""RocketKV (``rocket_kv``) on the bundled model against RocketKV's algorithm written out here from its repository
(NVlabs/RocketKV, ``pipeline/inf_stream_llm/inf_llm/attention/rocket.py``, ``rocket_forward``), nothing of kvviz's in
the reference: transformers' eager model prefills the prompt and gives its attention weights; the first stage (its
SnapKV branch) picks the slots kept per layer and KV head from them, which the test gathers into a cache of its own;
then every decode step runs through an attention function registered by the test that is the repository's hybrid
sparse attention branch (sign-flipped keys, chunk maxima, the r largest query channels, the scaled approximate
softmax, top-k, exact attention over the picks).

Compared: the slots kept after the prompt and the slots each step read, per layer and KV head (exactly: the same
scores up to float32 rounding pick the same slots unless two are within that rounding, none is here), and each step's
logits within the model's logit rounding (tests/support/rounding.py)."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from transformers import AttentionInterface

from kvviz.policies.rocket_kv import RocketKV, budgets
from kvviz.runs.from_names import from_names
from tests.support.references import forced_run, greedy_tokens
from tests.support.rounding import logit_rounding

PROMPT = ("My cat is called Whiskers and my dog is called Rex. They live with me in a small house by the river, "
          "and every morning they watch the boats. What is my cat called?")
WINDOW, KERNEL, BUDGET, TOPK, RATIO, STEPS = 8, 7, 24, 12, 4.0, 8


def repository_snapkv(attentions: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The first stage as RocketKV's code runs it on one layer's prompt weights ``(1, H, n, n)`` → the kept slots
    ``(KV, BUDGET)``, ascending."""
    n = attentions.shape[-1]
    window = min(WINDOW, n)
    score = attentions[:, :, -window:, :-window].sum(dim=-2)
    score = score.view(1, kv_heads, -1, n - window).sum(dim=2)
    score = torch.nn.functional.max_pool1d(score, kernel_size=KERNEL, padding=KERNEL // 2, stride=1)
    indices = score.topk(BUDGET - window, dim=-1).indices.sort().values
    return torch.cat([indices[0], torch.arange(n - window, n).expand(kv_heads, -1)], dim=-1)


def repository_hybrid_sparse(picks: list, module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             **kwargs):
    """The second stage, RocketKV's decode branch, as an attention function: query ``(1, H, 1, D)``, key/value
    ``(1, KV, n, D)``; appends the indices it read ``(KV, k)`` to ``picks``."""
    batch, heads, length, dim = query.shape
    kv_heads, n = key.shape[1], key.shape[2]
    q = query.view(batch, kv_heads, -1, length, dim)
    k, v = key.unsqueeze(2), value.unsqueeze(2)
    sign = (q.sum(dim=2, keepdim=True) > 0) + (~(q.sum(dim=2, keepdim=True) > 0)) * -1
    max_key, positive_query = k * sign, q * sign
    chunk = math.ceil(math.sqrt(RATIO))
    chunk = chunk if chunk <= RATIO else 1
    padding = chunk - ((n - 1) % chunk + 1)
    max_key = torch.cat([max_key, torch.ones(*max_key.shape[:3], padding, dim) * torch.finfo(max_key.dtype).min], -2)
    chunk_max = max_key.reshape(*max_key.shape[:3], max_key.shape[3] // chunk, chunk, dim).amax(dim=-2)
    r = int(dim * chunk / RATIO)
    magnitude = torch.abs(q)
    channels = torch.topk(magnitude.mean(dim=2, keepdim=True), r, dim=-1).indices

    def gather(t: torch.Tensor, axis: int, index: torch.Tensor) -> torch.Tensor:
        axis += (axis < 0) * t.ndim
        return t.gather(axis, index.expand(*t.shape[:axis], index.shape[axis], *t.shape[axis + 1:]))

    q_hat, k_hat = gather(positive_query, -1, channels), gather(chunk_max, -1, channels)
    scores = q_hat @ k_hat.transpose(-1, -2)
    scores = scores.unsqueeze(-1).repeat(1, 1, 1, 1, 1, chunk).reshape(*scores.shape[:4], -1)[..., :n]
    scale = torch.sqrt(dim * torch.abs(q_hat).sum(dim=-1, keepdim=True) / magnitude.sum(dim=-1, keepdim=True))
    approximate = torch.softmax(scores / scale, dim=-1)
    top = torch.topk(approximate.mean(dim=2, keepdim=True), min(TOPK, n), dim=-1).indices
    picks.append(top[0, :, 0, 0])
    chosen = top[..., 0, :, None]
    weights = torch.softmax((q @ gather(k, -2, chosen).transpose(-1, -2)) / dim**0.5, dim=-1)
    output = weights @ gather(v, -2, chosen)
    return output.view(batch, heads, length, dim).permute(0, 2, 1, 3), None


def test_rocket_kv_keeps_and_reads_what_rocketkvs_algorithm_does_step_by_step(lm, eager_model):
    settings = from_names("rocket_kv", {"window": WINDOW, "kernel": KERNEL, "topk": TOPK, "compression_ratio": RATIO},
                          budget=BUDGET)
    assert (settings.mode, settings.reads, settings.reader.compression_ratio) == ("prefill", TOPK, RATIO)
    tokens = greedy_tokens(lm, PROMPT, STEPS)
    run, logits, seen = forced_run(lm, settings, PROMPT, tokens)
    n = run.prompt_end[0]
    ids = run.session.transcript.ids
    cache = transformers.DynamicCache(config=eager_model.config)
    with torch.no_grad():
        out = eager_model(input_ids=torch.tensor([ids[:n]]), cache=cache, use_cache=True, output_attentions=True)
    kept = [repository_snapkv(weights, lm.kv_heads) for weights in out.attentions]  # (KV, BUDGET) per layer
    ours = ~run.timeline.hidden(n + 10**6, n)  # what the prompt's compression kept, (L, KV, n)
    for layer in range(lm.layers):
        expected = torch.zeros(lm.kv_heads, n, dtype=torch.bool).scatter_(1, kept[layer], True)
        assert torch.equal(ours[layer], expected), layer
    for layer, entry in enumerate(cache.layers):  # the compressed cache, RocketKV's: the kept slots gathered
        index = kept[layer][None, :, :, None]
        entry.keys = entry.keys.gather(2, index.expand(-1, -1, -1, entry.keys.shape[-1]))
        entry.values = entry.values.gather(2, index.expand(-1, -1, -1, entry.values.shape[-1]))
    picks: list[torch.Tensor] = []
    AttentionInterface.register("rocket_reference", lambda *a, **k: repository_hybrid_sparse(picks, *a, **k))
    eager_model.set_attn_implementation("rocket_reference")
    try:
        for step in range(STEPS):
            slot = n + step
            with torch.no_grad():
                reference = eager_model(input_ids=torch.tensor([[ids[slot]]]), position_ids=torch.tensor([[slot]]),
                                        cache=cache, use_cache=True).logits[0, -1].float()
            assert (reference - logits[step]).abs().max() <= logit_rounding(lm.config, reference), step
            for layer in range(lm.layers):
                order = torch.cat([kept[layer], torch.arange(n, slot + 1).expand(lm.kv_heads, -1)], dim=-1)
                read = torch.zeros(lm.kv_heads, slot + 1, dtype=torch.bool).scatter_(
                    1, order.gather(1, picks[step * lm.layers + layer]), True)
                assert torch.equal(seen[step][layer, :, :slot], read[:, :slot]), (step, layer)
    finally:
        eager_model.set_attn_implementation("eager")


def test_rocketkvs_budgets_from_its_token_budget():
    """RocketKV's pipeline derives its three numbers from one token budget (``infllm_utils.compress``): at a 256-token
    budget over a 16,000-token sequence with 128 new tokens, the exponent is min(0.2 + log2(62.5)·0.06, 0.8)."""
    ratio = 16000 / 256
    capacity = int(16000 / ratio ** (0.2 + math.log2(ratio) * 0.06))
    assert budgets(256, 16000, 128) == (capacity - 128, 128, capacity / 256)
    assert RocketKV().reader.compression_ratio == 4.0
    with pytest.raises(Exception, match="at least 16"):
        budgets(8, 1000, 10)


def test_rocket_kv_by_name_in_a_sweep_and_its_refusals(lm, tmp_path):
    """A sweep of ``rocket_kv`` (mode prefill, as RocketKV runs) writes its rows, each the policy run of the library;
    another mode is refused in one line (the first stage compresses the prompt only)."""
    import json

    from kvviz.errors import KvvizError
    from kvviz.runs.policy_run import run_policy
    from tests.support.cli import cli

    with pytest.raises(KvvizError, match="rocket_kv compresses the prompt once \\(prefill\\).*give mode prefill"):
        from_names("rocket_kv", budget=24, mode="decode")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "cat", "turns": [PROMPT]}) + "\n")
    done = cli("sweep", "--prompts", str(prompts), "--policy", "rocket_kv", "--budget", "24", "--mode", "prefill",
               "--max-new-tokens", "4", "--out", str(tmp_path / "out"), "--no-progress")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    library = run_policy(lm, [PROMPT], from_names("rocket_kv", budget=24), 4).last
    assert [row["policy"] for row in rows] == ["rocket_kv"] and rows[0]["policy_text"] == library.policy_text
    refused = cli("sweep", "--prompts", str(prompts), "--policy", "rocket_kv", "--budget", "24",
                  "--out", str(tmp_path / "no"), "--no-progress")
    assert refused.returncode != 0 and "give mode prefill, not decode" in refused.stderr
