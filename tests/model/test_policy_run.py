"""Policy runs on the bundled model against the oracles of docs/math.md §9: a budget above the cache changes nothing,
StreamingLLM is one masked no-cache forward, H2O a reference loop, prefill SnapKV the one-shot mask, blame's ends;
a user policy from a file; ``policy-run`` as a user runs it (``kvviz.cli.main`` in this process)."""

from __future__ import annotations

import json

import pytest
import torch

from kvviz import kv_cache
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.policies import H2O, SnapKV, StreamingLLM
from kvviz.policies.base import Policy
from kvviz.recorder import Probe, probing
from kvviz.runs.blame import blame, restore, units
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.schemes.kivi import Kivi
from kvviz.runs.policy_run import run_policy
from kvviz.session import Session
from kvviz.whatif import what_if
from tests.support.rounding import kl_rounding, logit_rounding, probability_rounding, zero_kl_rounding
from tests.support.cli import cli
from tests.support.references import forced_run
from tests.support.inputs import USER_POLICY

PROMPT = "My name is Zorblax and I live in the city of Quintara. I like green tea. What is my name?"


def _greedy(lm, steps):
    session = Session(lm)
    session.add_user_turn(PROMPT)
    tokens, logits = [], []
    for _ in range(steps):
        tokens.append(session.pending)
        session.step()
        logits.append(session.logits)
    return session, tokens, logits


def test_a_budget_above_the_cache_changes_nothing(lm, eps):
    _, tokens, logits = _greedy(lm, 12)
    _, policy_logits, _ = forced_run(lm, RunSettings(H2O(), 10_000, "both"), PROMPT, tokens)
    for full, policy in zip(logits, policy_logits):
        assert (full - policy).abs().max() <= logit_rounding(lm.config, full)
    result = run_policy(lm, [PROMPT], RunSettings(StreamingLLM(), 10_000), max_new_tokens=12)
    assert result.last.policy_ids == result.last.full_ids and result.last.divergence is None
    assert all(step.kl <= zero_kl_rounding(eps) and step.top1_agree for step in result.last.steps)


def test_streaming_llm_equals_one_masked_forward(lm, eager_model):
    """One no-cache forward of the whole sequence with a float 4D mask where each step's row sees sink + window (and
    itself) reproduces the incremental run, step by step (eager attention, nothing of kvviz involved)."""
    budget, steps = 20, 10
    _, tokens, _ = _greedy(lm, steps)
    run, logits, seen = forced_run(lm, RunSettings(StreamingLLM(), budget, "decode"), PROMPT, tokens)
    prompt = run.prompt_end[0]
    ids = run.session.transcript.ids[: prompt + steps]
    mask = torch.full((len(ids), len(ids)), float("-inf")).triu(1)  # the prompt: causal
    for step in range(steps):
        row, slot = prompt + step, prompt + step
        kept = list(range(4)) + list(range(slot - (budget - 4), slot))  # sinks + the most recent budget - 4
        mask[row] = float("-inf")
        mask[row, kept + [slot]] = 0
        assert seen[step][:, :, :slot].sum(-1).eq(budget).all()
        assert torch.equal(seen[step][0, 0, :slot].nonzero()[:, 0], torch.tensor(kept))
    with torch.no_grad():
        out = eager_model(input_ids=torch.tensor([ids]), attention_mask=mask[None, None], use_cache=False)
    for step in range(steps):
        reference = out.logits[0, prompt + step]
        assert (reference - logits[step]).abs().max() <= logit_rounding(lm.config, reference)


class _Masked(Probe):
    def __init__(self, visible):
        self.visible = visible  # (L, KV, n) or None

    def on_query(self, layer, query, key, value):
        if self.visible is None:
            return None
        return torch.nn.functional.pad(self.visible[layer], (0, key.shape[2] - self.visible.shape[-1]), value=True)[None]


def test_h2o_equals_a_reference_loop(lm):
    """The reference keeps every attention row it ever computed and sums them from scratch before each step; its own
    loop picks the recent window and the heavy hitters per layer and KV head."""
    budget, steps = 24, 8
    _, tokens, _ = _greedy(lm, steps)
    run, logits, seen = forced_run(lm, RunSettings(H2O(), budget, "decode"), PROMPT, tokens)
    ids = run.session.transcript.ids[: run.prompt_end[0]]
    layers, kv, group = lm.layers, lm.kv_heads, lm.heads // lm.kv_heads
    rows = []  # per forward: (L, H, q, n) weights
    with torch.no_grad(), probing(_Masked(None)):
        out = lm.model(input_ids=torch.tensor([ids]), use_cache=True, output_attentions=True)
    cache, rows = out.past_key_values, [torch.stack([a[0] for a in out.attentions])]
    alive = torch.ones(layers, kv, len(ids), dtype=torch.bool)
    for step in range(steps):
        n = len(ids) + step
        total = torch.zeros(layers, kv, n, dtype=torch.float64)
        for weights in rows:  # from scratch
            summed = weights.double().sum(2).view(layers, kv, group, -1).sum(2)
            total[:, :, : summed.shape[-1]] += summed
        recent = int(budget * 0.5)
        for layer in range(layers):
            for head in range(kv):
                candidates = [s for s in range(n) if alive[layer, head, s]]
                if len(candidates) <= budget:
                    continue
                protected = set(range(n - recent, n))
                others = sorted((s for s in candidates if s not in protected),
                                key=lambda s: (-float(total[layer, head, s]), s))
                keep = protected | set(others[: budget - recent])
                for s in candidates:
                    alive[layer, head, s] = s in keep
        assert torch.equal(alive, seen[step][:, :, :n]), f"step {step}"
        with torch.no_grad(), probing(_Masked(alive)):
            out = lm.model(input_ids=torch.tensor([[tokens[step]]]), position_ids=torch.tensor([[n]]),
                           cache=cache, use_cache=True, output_attentions=True)
        rows.append(torch.stack([a[0] for a in out.attentions]))
        alive = torch.nn.functional.pad(alive, (0, 1), value=True)
        assert (out.logits[0, -1] - logits[step]).abs().max() <= logit_rounding(lm.config, out.logits[0, -1])


def test_prefill_snapkv_equals_the_one_shot_mask(make_chat, lm):
    budget = 20
    run = CompressedSession(lm, RunSettings(SnapKV(), budget, "prefill"))
    run.add_turn(PROMPT)
    session = make_chat(PROMPT)
    session.step()
    at = run.prompt_end[0]
    one_shot = SnapKV().edit(session, budget, at=at).evicted_mask(at, lm.layers, lm.kv_heads)
    assert torch.equal(run.timeline.hidden(at, at), one_shot)
    assert bool(one_shot.any())


def _kivi_reference(keys: torch.Tensor, values: torch.Tensor, quantized: int, group: int, key_bits: int,
                    value_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys per (KV head, channel) over each group of slots, values per (KV head, slot) over the channels, for the
    first ``quantized`` slots of ``(KV, n, D)`` tensors (asymmetric min/max round to nearest)."""
    def round_trip(x, dim, bits):
        low, high = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
        scale = ((high - low) / (2**bits - 1)).clamp_min(torch.finfo(torch.float32).tiny)
        return ((x - low) / scale).round() * scale + low

    keys, values = keys.clone(), values.clone()
    for block in range(0, quantized, group):
        keys[:, block : block + group] = round_trip(keys[:, block : block + group], 1, key_bits)
    values[:, :quantized] = round_trip(values[:, :quantized], -1, value_bits)
    return keys, values


def test_kivi_quantizes_whole_groups_before_the_step_that_first_sees_them(lm):
    kivi = Kivi(key_bits=2, value_bits=4, group=8, residual=8)
    run = CompressedSession(lm, RunSettings(None, None, cache_format=kivi))
    run.add_turn(PROMPT)
    for _ in range(9):  # covers steps before which a new group left the window, and steps where none did
        logits = run.step()
        slot = len(run) - 1  # the step just run; slot slots were cached before it
        assert run.timeline.quantized[run.timeline.index(slot)] == (slot - 8) // 8 * 8
    quantized = (slot - 8) // 8 * 8
    orig = [run.timeline.original_kv(layer, slot) for layer in range(lm.layers)]
    reference = [_kivi_reference(k, v, quantized, 8, 2, 4) for k, v in orig]
    live_k, live_v = run.session.layer_kv(3)
    assert torch.allclose(live_k[:, :slot], reference[3][0], atol=1e-6)
    assert torch.allclose(live_v[:, :slot], reference[3][1], atol=1e-6)
    assert torch.equal(live_k[:, quantized:slot], orig[3][0][:, quantized:])  # the recent slots at full precision
    # the last step's logits came from the quantized cache: one plain decode step on the reference's K/V
    cache = kv_cache.build(lm.config, [(k[None], v[None]) for k, v in reference])
    token = run.session.transcript.slots[slot]
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([[token.id]]), position_ids=torch.tensor([[token.position]]),
                       cache=cache, use_cache=True)
    assert (out.logits[0, -1] - logits).abs().max() <= logit_rounding(lm.config, out.logits[0, -1])


@pytest.fixture(scope="module")
def h2o_run(lm):
    return run_policy(lm, [PROMPT], RunSettings(H2O(), 24, "decode"), max_new_tokens=12)


def test_a_steps_what_if_sees_the_policy_cache_as_it_stood(lm, h2o_run, eps):
    """Time travel: the what-if of step 3, taken after the whole run, re-runs it on the cache as it stood then."""
    run = h2o_run.last
    step = run.steps[3]
    _, logits, _ = forced_run(lm, RunSettings(H2O(), 24, "decode"), PROMPT, run.full_ids[:4])
    result = what_if(run.forced.session, Edit(), at=step.slot, topk=5)
    probs = torch.softmax(logits[3].double(), -1)
    assert result.next_token.full[0].id == step.policy_top1
    for candidate in result.next_token.full:
        assert candidate.prob == pytest.approx(float(probs[candidate.id]), rel=probability_rounding(eps))


def test_blame_restoring_all_gives_zero_and_none_the_policy_kl(lm, h2o_run, eps):
    """Step 0 is the first step after the prompt was compressed: with every slot back its cache is the full one."""
    ranked = blame(h2o_run, step=0)
    assert len(ranked.rows) == min(32, len(units(h2o_run.last, h2o_run.last.forced.session.commits.hidden(
        ranked.slot, ranked.slot), "slot")))
    # batched variants round differently from the run's single decode step (tests/support/rounding.py; measured 1.3e-5
    # nats of 4.92 with 34 variants on the lent cache, 4e-12 with every slot back)
    assert abs(ranked.kl - h2o_run.last.steps[0].kl) <= kl_rounding(eps, ranked.kl)
    assert ranked.kl_all_restored <= zero_kl_rounding(eps)
    hidden = h2o_run.last.forced.session.commits.hidden(ranked.slot, ranked.slot)
    everything = hidden.any(0).any(0).nonzero()[:, 0].tolist()
    assert restore(h2o_run, everything, step=0).kl_after_restore <= zero_kl_rounding(eps)
    assert abs(restore(h2o_run, [], step=0).kl_after_restore - ranked.kl) <= kl_rounding(eps, ranked.kl)
    words = blame(h2o_run, step=0, unit="word", limit=8)
    assert all(r.slots == list(range(r.slots[0], r.slots[-1] + 1)) for r in words.rows)
    assert {s for r in words.rows for s in r.slots} <= set(everything) and len(words.rows) <= 8
    best = ranked.rows[0]
    # a batch of another size rounds differently (measured 3e-9 here)
    again = restore(h2o_run, best.slots, step=0).kl_after_restore
    assert abs(again - best.kl_after_restore) <= kl_rounding(eps, best.kl_after_restore)
    later = blame(h2o_run, step=4)  # the run's own slots 54.. were written on the compressed cache
    assert abs(later.kl - h2o_run.last.steps[4].kl) <= kl_rounding(eps, later.kl) and later.kl_all_restored > 0


def test_eviction_log_matches_the_timeline(lm, h2o_run):
    run = h2o_run.last
    records = h2o_run.evictions()
    assert records and all(0 <= r["step"] < len(run.steps) for r in records)
    # what each step saw, as the run measured it then, rebuilt from the log alone
    for step in run.steps:
        hidden = torch.zeros(lm.layers, lm.kv_heads, step.slot, dtype=torch.bool)
        for r in records:
            if r["step"] <= step.step:
                hidden[slice(None) if r["layer"] is None else r["layer"],
                       slice(None) if r["kv_head"] is None else r["kv_head"], r["slot"]] = True
        assert float((~hidden).float().sum(-1).mean()) == pytest.approx(step.visible)
    steps = h2o_run.eviction_steps()
    every = lambda index: slice(None) if index is None else index  # noqa: E731
    for r in records:
        assert bool((steps[every(r["layer"]), every(r["kv_head"]), r["slot"]] == r["step"]).all())
    assert len({(r["layer"], r["kv_head"], r["slot"]) for r in records}) == len(records)


def test_user_policies_run_and_bad_ones_are_refused_in_one_line(make_chat, lm, tmp_path):
    from kvviz.policies.user import available, load

    path = tmp_path / "mine.py"
    path.write_text(USER_POLICY)
    classes = available(f"{path}")
    assert {"newest", "wrong_shape", "raises"} <= set(classes)
    run = CompressedSession(lm, RunSettings(classes["newest"](), 16, "decode"))
    run.add_turn(PROMPT)
    run.step()
    assert int(run.seen.sum(-1).max()) == 16
    session = make_chat(PROMPT)
    before = (len(session), session.version)
    for name, words in (("wrong_shape", "returned scores of shape (5,)"), ("raises", "failed: RuntimeError: boom")):
        with pytest.raises(KvvizError, match="^policy " + name) as caught:
            classes[name]().edit(session, 8)
        assert words in str(caught.value) and "\n" not in str(caught.value)
    assert (len(session), session.version) == before
    for bad in ("no_such_module:Thing", str(tmp_path / "missing.py"), f"{path}:Nothing", "kvviz.edit.edit:Edit"):
        with pytest.raises(KvvizError, match="^KVVIZ_POLICIES: "):
            load(bad)
    assert issubclass(classes["newest"], Policy)


def test_policy_run_cli_json(tmp_path, monkeypatch):
    path = tmp_path / "mine.py"
    path.write_text(USER_POLICY)
    monkeypatch.setenv("KVVIZ_POLICIES", f"{path}:Newest")
    out = cli("policy-run", "--turn", PROMPT, "--policy", "newest", "--budget", "16", "--max-new-tokens", "6", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    for key in ("model", "policy", "params", "budget", "mode", "positions", "prompt_ids", "full", "policy_run",
                "divergence", "steps", "evictions", "blame"):
        assert key in doc
    assert doc["policy"] == "newest" and doc["params"] == {"bonus": 1.0} and doc["positions"] == "original"
    assert len(doc["full"]["ids"]) == len(doc["steps"]) == 6  # one step per reply token, the prefill's row first
    assert doc["steps"][0]["step"] == -1 and doc["steps"][0]["visible"] == len(doc["prompt_ids"]) - 1
    assert all(s["visible"] == 16 for s in doc["steps"][1:])
    assert {"slot", "step", "layer", "kv_head"} <= set(doc["evictions"][0])
    monkeypatch.setenv("KVVIZ_POLICIES", "no_such_module:Thing")
    out = cli("policy-run", "--turn", "hi", "--policy", "h2o", "--budget", "8")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "KVVIZ_POLICIES" in out.stderr


@pytest.mark.parametrize("name", ["policy-name", "policy-instruction", "policy-follow-up"])
def test_policy_demos_go_wrong_and_blame_the_evicted_words(lm, name):
    from kvviz.scenarios import SCENARIOS, Scenario, run_policy_scenario

    scenario = Scenario(**json.loads((SCENARIOS / f"{name}.json").read_text()))
    result, ranked = run_policy_scenario(lm, scenario)
    run = result.turns[ranked.turn]
    assert run.changed and run.divergence == ranked.step
    best = ranked.rows[0]
    slots = run.forced.session.transcript.slots
    assert "".join(slots[s].text for s in best.slots) == scenario.policy_run["expect_blame"]
    assert best.top1_restored and best.kl_after_restore < ranked.kl / 10


def test_the_follow_up_demo_fails_only_on_the_follow_up(lm):
    """The engineer's story: H2O gives the first turn's reply unchanged (so the follow-up's history differs only by
    what H2O evicted), and the follow-up goes wrong — the full cache names the secret word, H2O's does not."""
    from kvviz.scenarios import SCENARIOS, Scenario, run_policy_scenario

    scenario = Scenario(**json.loads((SCENARIOS / "policy-follow-up.json").read_text()))
    result, ranked = run_policy_scenario(lm, scenario)
    first, follow_up = result.turns
    assert first.full_ids == first.policy_ids and first.divergence is None
    assert ranked.turn == 1 and "mango" in follow_up.full_text.lower() and "mango" not in follow_up.policy_text.lower()


def test_kivi_runs_with_eviction_and_the_timeline_names_when_each_group_was_quantized(lm):
    kivi = Kivi(key_bits=4, value_bits=4, group=8, residual=8)
    result = run_policy(lm, [PROMPT], RunSettings(StreamingLLM(), 40, "decode", cache_format=kivi), max_new_tokens=10)
    run = result.last
    steps = result.quantized_steps()
    for step in range(len(run.steps)):  # before step s the cache held prompt_end + s slots
        expected = kivi.quantized_prefix(run.prompt_end + step)
        assert int((steps <= step).sum()) == expected
    assert result.evictions() and int((steps == 0).sum()) == kivi.quantized_prefix(run.prompt_end)  # after the prompt
    assert not bool((steps == -1).any())  # one turn: nothing before it


@pytest.mark.parametrize("policy, budget, mode, only", [
    (H2O(recent_fraction=1.0), 8, "decode", True), (H2O(), 8, "decode", False),
    (SnapKV(window=16, window_kept="all"), 12, "prefill", True), (SnapKV(window=16), 12, "prefill", False),
    ("tova-keep-last", 1, "decode", True)])
def test_the_forecast_before_a_run_is_what_the_run_then_does(lm, policy, budget, mode, only):
    """:func:`~kvviz.runs.forecast.first_compression` says, before a run, whether its budget holds only what the
    policy protects; the run's own record (every decision kept only protected slots, or none did) agrees."""
    from kvviz.policies import POLICIES
    from kvviz.runs.forecast import first_compression

    policy = POLICIES["tova"](keep_last=True) if policy == "tova-keep-last" else policy
    turns = ["My secret word is mango. Remember it and tell nobody."]
    settings = RunSettings(policy, budget, mode)
    forecast = first_compression(lm, turns, settings)
    result = run_policy(lm, turns, settings, 4)
    assert forecast.keep == budget and forecast.at == result.last.prompt_end
    held, decisions = result.recency_only(0)
    assert decisions >= 1 and forecast.recency_only is only and held == (decisions if only else 0)


def test_a_budget_spent_on_the_protected_window_is_reported_as_recency_only(lm):
    """SnapKV's 64-slot window (kvpress' default) over a prompt of a few dozen slots at ratio 0.5: every kept slot is
    protected, and what was kept is exactly the most recent slots in every layer and KV head; an 8-slot window
    leaves the scores room to choose, and nothing is reported."""
    from kvviz.policies.base import Ratio
    from kvviz.policies.kvpress.presses import from_kvpress

    prompt = ["My secret word is mango. Remember it and tell nobody."]
    press = from_kvpress("SnapKVPress").policy  # window 64, the whole window kept (kvpress)
    wide = run_policy(lm, prompt, RunSettings(press, Ratio(0.5), "prefill"), 3)
    assert wide.recency_only(0) == (1, 1)
    run = wide.last
    kept = run.forced.visible_to(run.prompt_end)[..., :run.prompt_end]  # (L, KV, n)
    count = int(kept[0, 0].sum())
    assert bool((kept.sum(-1) == count).all()) and bool(kept[..., -count:].all())  # the newest `count`, everywhere
    narrow = run_policy(lm, prompt, RunSettings(from_kvpress("SnapKVPress", window_size=8).policy, Ratio(0.5),
                                                "prefill"), 3)
    assert narrow.recency_only(0) == (0, 1)
