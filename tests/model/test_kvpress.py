"""kvpress' presses on the bundled model: each press's convention against a reference written here from kvpress' own
formulas (mean over the window's rows, average pooling, mean over a group's heads, the window or the last token padded
above every score, ``topk``) in prefill mode, ``policy-run --policy kvpress:…`` reporting the kept sets, and sweep
cases naming presses with kvpress ratios."""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.policies import (ChunkKV, KeyNorm, ObservedAttention, RandomPolicy, TOVA)
from kvviz.policies.base import Candidates
from kvviz.policies.base import Ratio
from kvviz.policies.kvpress.presses import from_kvpress
from kvviz.policies.pyramid_kv import kvpress_pyramid
from kvviz.runs.compressed import CompressedSession, RunSettings
from tests.support.cli import cli
from tests.support.rounding import kl_rounding

PROMPT = ("Ledger of the harbour: the Aurora came in at dawn with salt, the Bellwether at noon with rope, the "
          "Cormorant at dusk with lamp oil, and the Dunlin at midnight with nothing at all. What did the Bellwether "
          "carry?")


@pytest.fixture(scope="module")
def prompt(make_chat, lm):
    """The prompt prefilled, compressed by nothing: (session, n)."""
    session = make_chat(PROMPT)
    return session, len(session)


def kept_by(lm, policy, ratio: float) -> torch.Tensor:
    """Bool (L, KV, n): what a prefill-mode run of ``policy`` at kvpress' ``ratio`` keeps of the prompt."""
    run = CompressedSession(lm, RunSettings(policy, Ratio(ratio), "prefill"))
    run.add_turn(PROMPT)
    return run.alive()


def window_attention(session, n: int, window: int) -> torch.Tensor:
    """(L, H, window, n) float64: the attention of the last ``window`` prompt queries (kvpress' window attention)."""
    return torch.stack([session.weights(layer, n - window, n)[..., :n].double() for layer in range(session.lm.layers)])


def topk_kept(scores: torch.Tensor, budgets: list[int]) -> torch.Tensor:
    """Bool (L, KV, n): per layer the ``budgets[layer]`` best of ``scores`` (L, KV, n), as kvpress' topk keeps."""
    kept = torch.zeros(scores.shape, dtype=torch.bool)
    for layer, budget in enumerate(budgets):
        kept[layer].scatter_(-1, scores[layer].topk(budget, dim=-1).indices, True)
    return kept


def assert_same_up_to_ties(kept: torch.Tensor, reference: torch.Tensor, scores: torch.Tensor) -> None:
    """Equal, except where the slots swapped have scores equal to float32 rounding: kvpress averages where kvviz
    sums, ≤ 60 float32 roundings (u = 6e-8) apart, 3.6e-6 relative; 1e-5 here."""
    for layer, head in (kept != reference).any(-1).nonzero().tolist():
        row = scores[layer, head]
        ours, theirs = kept[layer, head] & ~reference[layer, head], reference[layer, head] & ~kept[layer, head]
        assert int(ours.sum()) == int(theirs.sum()), (layer, head)
        assert torch.allclose(row[ours].max(), row[theirs].min(), rtol=1e-5), (layer, head)


def kvpress_snapkv_scores(session, n: int, window: int, kernel: int) -> torch.Tensor:
    """kvpress' SnapKVPress.score: the window's rows averaged, average-pooled (zero padding), a group's heads
    averaged, the window padded with the maximum + 1."""
    lm = session.lm
    votes = window_attention(session, n, window)[..., : n - window].mean(2)  # (L, H, n − window)
    pooled = torch.nn.functional.avg_pool1d(votes, kernel, stride=1, padding=kernel // 2)
    grouped = pooled.view(lm.layers, lm.kv_heads, lm.heads // lm.kv_heads, -1).mean(2)
    top = grouped.amax((1, 2), keepdim=True) + 1
    return torch.cat([grouped, top.expand(lm.layers, lm.kv_heads, window)], -1)


@pytest.mark.parametrize("ratio", [0.5, 0.75])
def test_snapkv_and_pyramid_kv_as_kvpress_computes_them(lm, prompt, ratio):
    session, n = prompt
    scores = kvpress_snapkv_scores(session, n, 16, 5)
    n_kept = max(1, int(n * (1 - ratio)))
    snap = kept_by(lm, from_kvpress("SnapKVPress", window_size=16).policy, ratio)
    assert_same_up_to_ties(snap, topk_kept(scores, [n_kept] * lm.layers), scores)
    assert bool(snap[..., n - 16:].all())  # the window is always kept
    budgets = kvpress_pyramid(n, n * (1 - ratio), 16, 20, lm.layers)
    pyramid = kept_by(lm, from_kvpress("PyramidKVPress", window_size=16).policy, ratio)
    assert_same_up_to_ties(pyramid, topk_kept(scores, budgets), scores)
    assert pyramid.sum(-1)[:, 0].tolist() == budgets


def test_tova_observed_attention_random_and_key_norm_as_kvpress_computes_them(lm, prompt):
    session, n = prompt
    ratio, n_kept = 0.5, max(1, int(n * 0.5))
    heads, group = lm.kv_heads, lm.heads // lm.kv_heads
    last = window_attention(session, n, 1)[:, :, 0, : n - 1].mean(1, keepdim=True)  # (L, 1, n − 1)
    tova = torch.cat([last, last.amax((1, 2), keepdim=True) + 1], -1).expand(lm.layers, heads, n)
    assert_same_up_to_ties(kept_by(lm, TOVA(keep_last=True), ratio), topk_kept(tova, [n_kept] * lm.layers), tova)
    alone = kept_by(lm, TOVA(keep_last=True), 0.99)  # one slot kept: the last token, whatever its attention
    assert bool(alone[..., n - 1].all()) and int(alone.sum()) == lm.layers * heads
    everything = window_attention(session, n, n)  # (L, H, n, n): every prompt row
    observed = (everything.sum(2) / torch.arange(n, 0, -1)).view(lm.layers, heads, group, n).mean(2)
    assert_same_up_to_ties(kept_by(lm, ObservedAttention(), ratio), topk_kept(observed, [n_kept] * lm.layers),
                           observed)
    draw = torch.rand(1, heads, n, generator=torch.Generator().manual_seed(7)).expand(lm.layers, heads, n)
    assert torch.equal(kept_by(lm, RandomPolicy(seed=7, per_head=True), ratio), topk_kept(draw, [n_kept] * lm.layers))
    norms = -torch.stack([torch.linalg.vector_norm(session.layer_kv(layer)[0][:, :n], dim=-1)
                          for layer in range(lm.layers)])
    assert torch.equal(kept_by(lm, KeyNorm(ties="topk"), ratio), topk_kept(norms, [n_kept] * lm.layers))


def test_policy_run_names_a_press_and_reports_the_kept_sets(tmp_path):
    command = ["policy-run", "--turn", PROMPT, "--policy", "kvpress:SnapKVPress",
               "--param", "window_size=16", "--ratio", "0.5", "--max-new-tokens", "2", "--json"]
    done = cli(*command)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["mode"] == "prefill" and doc["policy"] == "snapkv" and doc["params"]["pooling"] == "avg"
    n = len(doc["prompt_ids"])
    kept = doc["kept_after_prompt"]
    assert len(kept) == 30 and all(len(heads) == 3 for heads in kept)
    assert all(len(slots) == int(n * 0.5) and slots[-16:] == list(range(n - 16, n)) for l in kept for slots in l)
    refused = cli(*command[:-1], "--budget", "8")
    assert refused.returncode != 0 and "give --budget or --ratio, not both" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_sweep_cases_name_presses_with_kvpress_ratios(lm, eps, tmp_path):
    """A sweep over ``kvpress:NAME`` at ``--ratio R``: each row equals the policy run of the press's kvviz policy at
    that Ratio (run here on its own: the KL to the rounding of another batch shape, tests/support/rounding.py), and a row
    opens again as the same case."""
    from kvviz.runs.policy_run import run_policy
    from kvviz.sweeps import SweepSpec, run_sweep
    from kvviz.sweeps.cases import case_of

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "cats", "prompt": "Tom has two cats, Rex and Max. Name his cats."}) + "\n")
    spec = SweepSpec(str(prompts), ("kvpress:SnapKVPress", "kvpress:AdaKVPress"), (Ratio(0.5),), "prefill",
                     max_new_tokens=4)
    table = run_sweep(spec, tmp_path / "out", progress=False)
    assert len(table) == 2 and list(table["ratio"]) == [0.5, 0.5]
    for row, press in zip(table.to_dict("records"), (from_kvpress("SnapKVPress"),
                                                      from_kvpress("AdaKVPress", press="SnapKVPress"))):
        alone = run_policy(lm, [json.loads(row["turns"])[0]], RunSettings(press.policy, Ratio(0.5), "prefill"), 4)
        kl_max = max(step.kl for step in alone.last.records)
        assert abs(row["kl_max"] - kl_max) <= kl_rounding(eps, kl_max) and row["policy_text"] == alone.last.policy_text
        case = case_of(row)
        assert isinstance(case.budget, Ratio) and case.budget.ratio == 0.5 and case.policy == row["policy"]


def test_snapkv_in_kvpress_scale_and_the_wrappers_over_it(lm, prompt):
    """``votes="mean"`` gives kvpress' SnapKV scores themselves (the window padded at the layer's maximum + 1 once a
    wrapper pads it), and ChunkKV over it keeps the chunks kvpress' ChunkKVPress keeps by those scores."""
    session, n = prompt
    n -= 1  # a one-shot decision before the newest slot
    reference = kvpress_snapkv_scores(session, n, 16, 5)  # (L, KV, n) float64
    policy = from_kvpress("SnapKVPress", window_size=16).policy
    alive = torch.ones(lm.layers, lm.kv_heads, n, dtype=torch.bool)
    scores = policy.score(Candidates(session, n, n // 2, alive)).double()
    before = slice(0, n - 16)
    assert torch.allclose(scores[..., before], reference[..., before], rtol=1e-5, atol=1e-9)  # float32 sums, ≤ 1e-5
    assert bool((scores[..., n - 16:] == float("inf")).all())
    chunk = ChunkKV(inner="kvpress:SnapKVPress", chunk=20)  # SnapKV at kvpress' 64-slot window: recompute its scale
    wide = kvpress_snapkv_scores(session, n, 64, 5).sum(1)  # (L, n): summed over the KV heads, as ChunkKVPress
    starts = list(range(0, n, 20))
    kept = chunk.decision(session, Ratio(0.5), n).evicted.logical_not()[:, 0]  # (L, n): alike in every KV head
    for layer in range(lm.layers):
        means = torch.stack([wide[layer, s: s + 20].mean() for s in starts])
        chosen = sorted({s // 20 for s in kept[layer].nonzero()[:, 0].tolist()})
        others = [c for c in range(len(starts)) if c not in chosen]
        assert len(chosen) == max(1, int(len(starts) * 0.5)), layer  # the best chunks; equal means are ties
        assert float(means[chosen].min()) >= float(means[others].max()) * (1 - 1e-5), layer
