"""Per-slot schemes as a run's cache (kvviz.quant.written): each slot rounded once, when it is written, the scales
that span slots fixed by the first pass — against references built here: each decode step of the run equals a step
on a cache holding the run's own computed K/V rounded by the test (torchao's NVFP4 with the prompt's tensor scale as
a static one; the per-token-head loop), the first step equals the what-if of the same scheme on a plain chat, and a
sweep over schemes runs and opens its worst case.

Tolerances. A run's step and the test's step run the same model on the same stored K/V with the same batch shape;
their logits may still differ by the float32 rounding of two summation orders (the live cache against a rebuilt
one): ε_z (tests/support/rounding.py). The first step against the what-if: the same bound on the KL, as
kl_rounding(ε, KL).
"""

from __future__ import annotations

import json

import pytest
import torch

from kvviz import kv_cache
from kvviz.errors import KvvizError
from kvviz.quant.catalogue import Scheme
from kvviz.quant.written import run_cache
from kvviz.quant.written import WrittenCache
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.runs.policy_run import run_policy
from kvviz.whatif import what_if
from kvviz.whatif.compare_schemes import scheme_edits
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


@pytest.mark.numeric
@pytest.mark.parametrize("name", ["nvfp4", "int4-token-head", "k8v4-token-head+skip-first2"])
def test_each_step_is_a_step_on_the_tests_own_rounding_of_what_the_run_computed(lm, eps, name):
    run = CompressedSession(lm, RunSettings(**run_cache(name)))
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


@pytest.mark.numeric
@pytest.mark.parametrize("name", ["nvfp4", "fp8-e4m3-head", "mxfp4"])
def test_the_first_step_is_the_what_if_of_the_same_scheme(lm, make_chat, eps, name):
    result = run_policy(lm, [PROMPT], RunSettings(**run_cache(name)), 2).last
    first = result.steps[0]  # the first decode step: every prompt slot rounded, the scales the prompt's own
    chat = make_chat(PROMPT, steps=1)
    at = first.slot
    assert chat.transcript.slots[at].id == result.full_ids[0]
    edit = scheme_edits(chat, [Scheme(name)], at)[0]
    kl = what_if(chat, edit, at).next_token.kl
    assert kl > 0 and abs(first.kl - kl) <= kl_rounding(eps, kl)


def test_a_later_value_past_the_first_passs_range_saturates():
    """The fixed scales are static ones: NVFP4's tensor scale from the first pass; a block later 10× as large reads
    back at most 6 · 448 · g."""
    written = WrittenCache("nvfp4")
    first = torch.randn(2, 3, 5, 64)  # (L, KV, n, D)
    template = Scheme("nvfp4").edit([1], 1)
    fixed = WrittenCache("nvfp4", template).fixed(first, first)
    assert written.grouping == "blocks" and fixed.first_pass is False
    g = float(first[0].abs().amax()) / (448 * 6)
    assert fixed.template.keys.scales[0] == pytest.approx((g, g, g), rel=1e-6)
    later = torch.randn(3, 4, 64) * 10 * float(first.abs().amax())
    out = fixed.edit(range(4)).quantized(later, later, 0)[0]
    assert float(out.abs().max()) <= 6 * 448 * fixed.template.keys.scales[0][0] * (1 + 1e-6)
    assert float(later.abs().max()) > 6 * 448 * fixed.template.keys.scales[0][0]


def test_a_sweep_over_schemes_runs_and_its_worst_case_opens_as_a_run(lm, tmp_path):
    from kvviz.sweeps import SweepSpec, records, run_sweep
    from kvviz.sweeps.cases import case_of, run_settings
    from kvviz.policies.user import available

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "cat", "prompt": PROMPT, "expected": "Whiskers"}) + "\n")
    names = ("fp8-e4m3-tensor-unit", "nvfp4", "int4-token-head")
    spec = SweepSpec(str(prompts), ("streaming_llm",), (64,), max_new_tokens=4, schemes=names)
    rows = records(run_sweep(spec, tmp_path / "out", progress=False))
    assert [r["scheme"] for r in rows] == list(names)
    worst = max(rows, key=lambda r: r["kl_mean"])
    case = case_of(worst)
    settings = run_settings(case, available())
    assert settings.written is not None and settings.written.scheme == worst["scheme"]
    again = run_policy(lm, list(case.prompt.turns), settings, case.max_new_tokens).last
    assert again.policy_text == worst["policy_text"]


@pytest.mark.parametrize("name, message", [
    ("int2-channel", "not a cache a run writes slot by slot"),
    ("mix3-keyerror", "not a cache a run writes slot by slot"),
    ("int4-token+outliers4", "not a cache a run writes slot by slot"),
])
def test_schemes_whose_scales_span_slots_are_refused_in_one_line(name, message):
    with pytest.raises(KvvizError, match=message) as refusal:
        run_cache(name)
    assert "\n" not in str(refusal.value)


def test_a_written_cache_runs_alone():
    from kvviz.quant.kivi import Kivi

    with pytest.raises(KvvizError, match="cache runs alone"):
        RunSettings(kivi=Kivi(), written=WrittenCache("nvfp4"))


def test_the_page_runs_a_cache_format(lm):
    """The Policy run tab's *Cache format*: an NVFP4 cache alone, its run the same as the library's; with KIVI on as
    well, refused in one line and the run shown stays."""
    from tests.support.app_test import assert_clean, open_view, start

    app = start()
    app.chat_input[0].set_value(PROMPT).run()
    open_view(app, "Policy run")
    next(s for s in app.selectbox if s.label == "Policy").select("(none: a quantized cache only)")
    next(s for s in app.selectbox if s.label == "Cache format").select("nvfp4")
    next(n for n in app.number_input if n.label == "New tokens per turn").set_value(4)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    shown = app.session_state["policy_run"]
    assert shown.settings.written == WrittenCache("nvfp4")
    alone = run_policy(lm, [PROMPT], RunSettings(written=WrittenCache("nvfp4")), 4).last
    assert shown.last.policy_text == alone.policy_text
    next(c for c in app.checkbox if c.label == "KIVI quantization").check().run()
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert any("cache runs alone" in w.value for w in app.warning)
    assert app.session_state["policy_run"] is shown
