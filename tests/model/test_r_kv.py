"""R-KV (``r_kv``) on the bundled model against R-KV's published algorithm, written out here from its repository
(``R1KV.update_kv`` with ``compute_attention_scores`` and ``cal_similarity``; the serving loop's cadence): a
teacher-forced run whose cache is compressed back to the budget after every ``buffer`` decoded tokens once it holds
``budget + buffer`` slots. The reference keeps R-KV's own cache — per layer and KV head a list of slots in the order
``torch.topk`` left them, the window after them — and scores it from the run's recorded keys and queries (the numbers
R-KV's cache would hold); each step's kept set must equal the run's, per layer and KV head, and the scores R-KV ranks by
must equal kvviz's (float32: the same sums, in batches of another shape, rtol 1e-5)."""

from __future__ import annotations

import math

import pytest
import torch

from kvviz.errors import KvvizError
from kvviz.policies import POLICIES
from kvviz.policies.by_name import policy_named
from kvviz.policies.r_kv import RKV
from kvviz.runs.compressed import CompressedSession, RunSettings

PROMPT = ("List the steps to make tea, then explain why each step matters, then say which step people forget most "
          "often and why that happens.")
BUDGET, BUFFER, WINDOW, STEPS = 40, 12, 8, 40


def _similarity(keys: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """``cal_similarity`` (retain_direction="last") of keys ``(KV, m, D)`` → ``(KV, m)``."""
    m = keys.shape[1]
    k_norm = keys / (keys.norm(dim=-1, keepdim=True) + 1e-8)
    cos = k_norm @ k_norm.transpose(-1, -2)
    cos.masked_fill_(torch.eye(m, dtype=torch.bool)[None], 0.0)
    indices = torch.where(cos > threshold, torch.arange(m).view(1, 1, m), torch.zeros_like(cos, dtype=torch.long))
    cos.scatter_(-1, indices.max(dim=-1)[0].unsqueeze(-1), 0)
    return cos.mean(dim=-2).softmax(dim=-1)


def _final_scores(queries: torch.Tensor, keys: torch.Tensor, kernel: int = 7, mix: float = 0.1) -> torch.Tensor:
    """``R1KV._compute_scores``: queries ``(H, w, D)``, keys ``(KV, m, D)`` → ``(KV, m − w)``."""
    heads, window, dim = queries.shape
    kv = keys.shape[0]
    weights = queries.view(kv, heads // kv, window, dim) @ keys.unsqueeze(1).transpose(-1, -2) / math.sqrt(dim)
    weights = weights.max(dim=1).values  # compute_attention_scores, pooling="max"
    attn = torch.softmax(weights[:, -window:, :-window], dim=-1, dtype=torch.float32).mean(dim=-2)
    attn = torch.nn.functional.max_pool1d(attn, kernel_size=kernel, padding=kernel // 2, stride=1)
    return attn * mix - _similarity(keys)[:, :-window] * (1 - mix)


def test_r_kv_keeps_what_r_kvs_algorithm_keeps_step_by_step(lm):
    policy = RKV(window=WINDOW, buffer=BUFFER)
    run = CompressedSession(lm, RunSettings(policy, BUDGET, "after_steps", BUFFER))
    run.add_turn(PROMPT)
    prompt = len(run)
    caches = [[list(range(prompt)) for _ in range(lm.kv_heads)] for _ in range(lm.layers)]  # R-KV's, per head
    compressions = 0
    for step in range(STEPS):
        decision_due = step and step % BUFFER == 0 and len(caches[0][0]) >= BUDGET + BUFFER
        if decision_due:  # R-KV compacts every layer and head after the step that filled the buffer
            compressions += 1
            at = len(run)
            for layer in range(lm.layers):
                keys_all = run.session.layer_kv(layer)[0].float()  # (KV, n, D) as the run computed them
                queries = run.session.queries.layer(layer)[:, at - WINDOW:at].float()  # the last window's rows
                for head, order in enumerate(caches[layer]):
                    keys = keys_all[head : head + 1, order]  # (1, m, D) in R-KV's order
                    group = lm.heads // lm.kv_heads
                    final = _final_scores(queries[head * group:(head + 1) * group], keys)[0]
                    kept = final.topk(BUDGET - WINDOW).indices.tolist()
                    caches[layer][head] = [order[i] for i in kept] + order[-WINDOW:]
        run.step()  # the run decides before the step's pass (the same cache) and appends the step's slot
        for layer in range(lm.layers):
            for head in range(lm.kv_heads):
                caches[layer][head].append(len(run) - 1)
        seen = run.seen  # what the step saw besides its own slot
        for layer in range(lm.layers):
            for head in range(lm.kv_heads):
                expected = sorted(caches[layer][head][:-1])
                assert seen[layer, head].nonzero()[:, 0].tolist() == expected, (step, layer, head)
    assert compressions >= 2


def test_r_kv_runs_by_name_and_refuses_bad_parameters(lm):
    assert POLICIES["r_kv"] is RKV
    assert policy_named(POLICIES, "r_kv", {"buffer": "64", "mix": "0.07"}) == RKV(buffer=64, mix=0.07)
    for params, words in (({"kernel": "4"}, "odd"), ({"mix": "2"}, r"\[0, 1\]"), ({"buffer": "4"}, "window")):
        with pytest.raises(KvvizError, match=words):
            policy_named(POLICIES, "r_kv", params)
