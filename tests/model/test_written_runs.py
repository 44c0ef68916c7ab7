"""Per-slot schemes as a run's cache (kvviz.schemes.written): each slot rounded once, when it is written, the scales
that span slots fixed by the first pass — against references built here: each decode step of the run equals a step
on a cache holding the run's own computed K/V rounded by the test (torchao's NVFP4 with the prompt's tensor scale as
a static one; the per-token-head loop), the first step equals the what-if of the same scheme on a plain chat, and a
sweep over schemes runs and opens its worst case.

Tolerances. A run's step and the test's step run the same model on the same stored K/V with the same batch shape;
their logits may still differ by the float32 rounding of two summation orders (the live cache against a rebuilt
one): ε_z (tests/support/rounding.py). The first step against the what-if: the same bound on the KL, as
kl_rounding(ε, KL). Against transformers' fp8 cache: the prompt's K/V of the two prefills agree up to the float32
rounding of two batch shapes, so a value at an FP8 rounding boundary may land a code away: logits within ε_z, the
same greedy tokens, and the stored states equal for all but 0.1 % of the elements.
"""

from __future__ import annotations

import pytest
import torch

from kvviz import kv_cache
from kvviz.errors import KvvizError
from kvviz.schemes.catalogue import Scheme
from kvviz.schemes.written import run_cache
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.runs.policy_run import run_policy
from kvviz.whatif import what_if
from kvviz.schemes.compare import scheme_edits
from tests.support import torchao_reference as ao
from tests.support.rounding import kl_rounding

PROMPT = "My cat is called Whiskers and my dog is called Rex. What is my cat called?"


def rounded(name: str, x: torch.Tensor, first: torch.Tensor, value: bool) -> torch.Tensor:
    """``x`` ``(KV, n, D)`` of one layer as the test rounds it for scheme ``name`` written slot by slot; ``first``
    the same layer's K (or V) of the first pass, which fixes NVFP4's tensor scale."""
    rows = x.reshape(-1, x.shape[-1])
    if name == "nvfp4":
        _, tensor, _ = ao._torchao()
        scale = first.abs().amax() / (448 * 6)
        return tensor.to_nvfp4(rows.contiguous(), per_tensor_scale=scale).dequantize(torch.float32).view(x.shape)
    bits = 4 if value and name.startswith("k8v4") or name.startswith("int4") else 8
    scale = (x.abs().amax(-1, keepdim=True) / (2 ** (bits - 1) - 1)).clamp(min=torch.finfo(torch.float32).tiny)
    return torch.round(x / scale) * scale


@pytest.mark.parametrize("name", ["nvfp4", "int4-token-head", "k8v4-token-head+skip-first2"])
def test_each_step_is_a_step_on_the_tests_own_rounding_of_what_the_run_computed(lm, eps, name):
    run = CompressedSession(lm, RunSettings(cache_format=run_cache(name)))
    run.add_turn(PROMPT)
    prompt = len(run)
    exact = Scheme(name).exact_layers((None,) * lm.layers)
    for _ in range(4):
        logits = run.step()
        at = len(run) - 1
        keys, values = run.timeline.originals  # (L, KV, at, D): every earlier slot as computed
        assert keys.shape[2] == at
        tensors = []
        for layer in range(lm.layers):
            k, v = keys[layer], values[layer]
            if layer not in exact:
                k = rounded(name, k, keys[layer, :, :prompt], False)
                v = rounded(name, v, values[layer, :, :prompt], True)
            tensors.append((k[None], v[None]))
        slot = run.session.transcript.slots[at]
        with torch.no_grad():
            out = lm.model(input_ids=torch.tensor([[slot.id]]), position_ids=torch.tensor([[slot.position]]),
                           cache=kv_cache.build(lm.config, tensors), use_cache=True)
        assert float((out.logits[0, -1].float() - logits).abs().max()) <= eps


@pytest.mark.parametrize("name", ["nvfp4", "fp8-e4m3-head", "mxfp4"])
def test_the_first_step_is_the_what_if_of_the_same_scheme(lm, make_chat, eps, name):
    result = run_policy(lm, [PROMPT], RunSettings(cache_format=run_cache(name)), 2).last
    first = result.steps[0]  # the first decode step: every prompt slot rounded, the scales the prompt's own
    chat = make_chat(PROMPT, steps=1)
    at = first.slot
    assert chat.transcript.slots[at].id == result.full_ids[0]
    edit = scheme_edits(chat, [Scheme(name)], at)[0]
    kl = what_if(chat, edit, at).next_token.kl
    assert kl > 0 and abs(first.kl - kl) <= kl_rounding(eps, kl)


def test_a_sweep_over_schemes_runs_and_its_worst_case_opens_as_a_run(lm, tmp_path):
    from kvviz.sweeps import SweepSpec, records, run_sweep
    from kvviz.sweeps.cases import case_of, run_settings
    from kvviz.policies.user import available

    names = ("fp8-e4m3-tensor-unit", "nvfp4", "int4-token-head")  # on a built-in set (its first key-value prompt)
    spec = SweepSpec("builtin:kv", ("streaming_llm",), (64,), max_new_tokens=4, limit=1, schemes=names)
    rows = records(run_sweep(spec, tmp_path / "out", progress=False))
    assert [r["scheme"] for r in rows] == list(names) and len({r["prompt_id"] for r in rows}) == 1
    worst = max(rows, key=lambda r: r["kl_mean"])
    case = case_of(worst)
    settings = run_settings(case, available())
    assert settings.cache_format is not None and settings.cache_format.scheme == worst["scheme"]
    again = run_policy(lm, list(case.prompt.turns), settings, case.max_new_tokens).last
    assert again.policy_text == worst["policy_text"]


def test_transformers_fp8_quantized_cache_as_a_run_steps_as_transformers(lm, eps, monkeypatch):
    """``quantized-fp8`` against ``QuantizedCache(backend="fp8")`` driven through the same model, teacher-forced on
    its greedy tokens: the prompt (attending to its fresh K/V), decode steps (each attending to its own K/V rounded
    with the per-layer scale the first pass froze), a second turn's prompt (rounded before it attends), and the
    states both caches hold; the attention view's weights of the last step equal eager attention of that pass."""
    from transformers import QuantizedCache

    from tests.support.references import AttentionSpy
    from tests.support.rounding import weight_rounding, worst_ratio

    run = CompressedSession(lm, RunSettings(cache_format=run_cache("quantized-fp8")))
    assert run.settings.cache_format.own and "QuantizedCache (fp8)" in run.settings.label
    cache = QuantizedCache(backend="fp8", config=lm.model.config)

    def theirs(ids: list[int], start: int) -> torch.Tensor:
        with torch.no_grad():
            return lm.model(input_ids=torch.tensor([ids]), position_ids=torch.arange(start, start + len(ids))[None],
                            cache=cache, use_cache=True).logits[0, -1].float()

    run.add_turn(PROMPT)
    logits = theirs(run.session.transcript.ids, 0)
    assert float((run.session.logits - logits).abs().max()) <= eps
    for _ in range(5):
        token = int(logits.argmax())
        ours = run.step(token)
        logits = theirs([token], len(run) - 1)
        assert float((ours - logits).abs().max()) <= eps and int(ours.argmax()) == int(logits.argmax())
    start = len(run)
    run.add_turn("And what is my dog called?")
    logits = theirs(run.session.transcript.ids[start:], start)
    assert float((run.session.logits - logits).abs().max()) <= eps
    spy = AttentionSpy(lm.model, monkeypatch)
    token = int(logits.argmax())
    ours = run.step(token)
    monkeypatch.undo()
    logits = theirs([token], len(run) - 1)
    assert float((ours - logits).abs().max()) <= eps
    n = len(run)
    for layer in (0, 14, lm.layers - 1):
        own = cache.layers[layer]
        for quantized, live in zip((own._quantized_keys, own._quantized_values), run.session.layer_kv(layer)):
            state = own._dequantize(quantized)[0]  # (KV, n, D)
            assert state.shape == live[:, :n].shape
            assert float((state == live[:, :n]).float().mean()) > 0.999
        keys = run.timeline.keys_at(layer, n - 1, n)  # what the last step saw: its own key rounded too
        assert torch.equal(keys, run.session.layer_kv(layer)[0][:, :n])
        assert not torch.equal(keys[:, -1], run.timeline.original_kv(layer, n)[0][:, -1])
        rel = weight_rounding(lm.config, layer, run.session.queries.layer(layer), keys, lm.scaling)
        row = run.session.weights(layer)[:, n - 1, :n]
        assert worst_ratio(row, spy.passes[-1][layer][0, :, 0], rel) <= 1


def test_a_what_if_at_a_step_of_a_quantized_fp8_run_replays_that_step(lm, eps, monkeypatch):
    """The what-if's unedited run of a decode step (and of the second turn's first step) rebuilds the cache as it
    stood and rounds the step's own K/V as the run's cache did: the run's logits within ε_z; its continuation stores
    the next token's K/V as the run did."""
    from kvviz.edit.edit import Edit
    from kvviz.whatif import full_step as full_step_module
    from kvviz.whatif.continuation import greedy
    from kvviz.whatif.full_step import kept_full_step

    run = CompressedSession(lm, RunSettings(cache_format=run_cache("quantized-fp8")))
    run.add_turn(PROMPT)
    seen = {}
    for _ in range(3):
        at = len(run)
        seen[at] = run.step().clone()
    run.add_turn("And my dog?")
    at = len(run)
    seen[at] = run.step().clone()
    for at, logits in seen.items():
        full, _ = run.timeline.step_edits(at, Edit())
        replay = kept_full_step(run.session, at, full, None)
        assert replay.writes is not None
        assert float((replay.logits - logits).abs().max()) <= eps, at
    first = min(seen)  # the what-if's continuations from a step go on as the run did: each new slot rounded
    caches = []
    monkeypatch.setattr(full_step_module, "greedy", lambda session, cache, *rest: caches.append(cache) or greedy(
        session, cache, *rest))
    follow = what_if(run.session, Edit(), first, continuation=2).continuation
    assert follow.full_ids == follow.edited_ids == run.session.transcript.ids[first + 1:first + 3]
    keys = kv_cache.layer_kv(caches[0], 0)[0][0, :, first + 1]  # layer 0: the next token's key, as the run stored it
    assert torch.equal(keys, run.session.layer_kv(0)[0][:, first + 1])
    plain = CompressedSession(lm, RunSettings(cache_format=run_cache("fp8-e4m3-tensor")))  # own K/V as computed
    plain.add_turn(PROMPT)
    at, logits = len(plain), plain.step()
    assert plain.timeline.writes(at) is None
    assert float((logits - seen[at]).abs().max()) > eps  # the own slot's rounding is seen


@pytest.mark.parametrize("name, own", [("nvfp4", False), ("quantized-fp8", True)])
def test_blame_puts_rounded_slots_back_at_full_precision(lm, eps, name, own):
    """Blame of a written run's step restores rounded slots: each row's KL equals a step the test runs on a cache it
    builds from the run's K/V as computed, rounded by the run's own rounding except the restored slots (the step's
    own K/V as the run stored them); everything back is the step on the K/V as computed."""
    from kvviz.runs.blame import blame, restore
    from kvviz.whatif.full_step import prefix_kv
    from kvviz.whatif.metrics import kl_divergence

    result = run_policy(lm, [PROMPT], RunSettings(cache_format=run_cache(name)), 6)
    ranked = blame(result, step=3, limit=4)
    assert ranked.of == "rounded" and len(ranked.rows) == 4
    run = result.last
    session, at = run.forced.session, ranked.slot
    stored = prefix_kv(session, at, session.commits.edit_at(at))
    computed = prefix_kv(session, at)
    writes = session.commits.writes(at)
    assert (writes is not None) == own

    def kl_of(back: set[int]) -> float:
        tensors = []
        for layer, ((sk, sv), (k, v)) in enumerate(zip(stored, computed)):
            keep = torch.tensor([s in back for s in range(at)])[None, :, None]
            tensors.append((torch.where(keep, k, sk)[None], torch.where(keep, v, sv)[None]))
        slot = session.transcript.slots[at]
        cache = kv_cache.over([(k.clone(), v.clone()) for k, v in
                               [(torch.cat([k, k[:, :, :1]], 2), torch.cat([v, v[:, :, :1]], 2)) for k, v in tensors]],
                              at, written=writes)
        with torch.no_grad():
            logits = lm.model(input_ids=torch.tensor([[slot.id]]), position_ids=torch.tensor([[slot.position]]),
                              cache=cache, use_cache=True).logits[0, -1].float()
        return float(kl_divergence(run.full_logits[ranked.step + 1], logits[None])[0])

    nothing = kl_of(set())
    assert nothing > 0 and abs(ranked.kl - nothing) <= kl_rounding(eps, nothing)
    everything = kl_of(set(range(at)))
    assert abs(ranked.kl_all_restored - everything) <= kl_rounding(eps, everything)
    for row in ranked.rows:
        expected = kl_of(set(row.slots))
        assert abs(row.kl_after_restore - expected) <= kl_rounding(eps, expected), row
    together = restore(result, ranked.rows[0].slots + ranked.rows[1].slots, step=3, of="rounded")
    expected = kl_of(set(together.slots))
    assert abs(together.kl_after_restore - expected) <= kl_rounding(eps, expected)
    with pytest.raises(KvvizError, match="evicts nothing"):
        blame(result, step=3, of="evicted")
