"""Other decoder architectures, as tiny randomly initialised models built from their transformers configs (no
download): the same oracles as the bundled model, and a clear refusal for attention kvviz cannot reproduce yet."""

from __future__ import annotations

import pytest
import torch
import transformers

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError, ModelLoadError
from kvviz.model import load_model
from kvviz.policies import POLICIES
from kvviz.runs.compressed import RunSettings
from kvviz.runs.policy_run import run_policy
from kvviz.session_file import export_session, import_session
from kvviz.whatif import what_if
from tests.support.references import removed_step
from kvviz.tiny_models import ARCHITECTURES, tiny
from kvviz.tiny_sessions import tiny_pair
from tests.support.rounding import logit_rounding, probability_rounding, weight_rounding, worst_ratio

TURNS = ["a = 3, b = 5. What is a + b?", "And a - b?"]


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def model(request, tokenizer):
    """A tiny model of the architecture through kvviz, and the same weights with transformers' eager attention."""
    return tiny_pair(request.param, tokenizer, TURNS)


def test_the_second_turn_on_the_cache_equals_a_forward_without_cache(model):
    lm, eager, session = model
    with torch.no_grad():
        out = eager(input_ids=torch.tensor([session.transcript.ids]), use_cache=False)
    assert (out.logits[0, -1] - session.logits).abs().max() <= logit_rounding(lm.config, out.logits[0, -1])


def test_recorded_weights_equal_eager_attention(model):
    """Eager attention replays the session's forward passes (the same prefills and decode steps on transformers' own
    cache, whose sliding-window layers keep only their window's last slots) and returns its weights; kvviz recomputes
    them from the recorded queries and cached keys."""
    lm, eager, session = model
    ids, n = session.transcript.ids, len(session)
    rows = [torch.zeros(lm.heads, 0, n) for _ in range(lm.layers)]
    cache, start = transformers.DynamicCache(config=eager.config), 0
    for event in session.transcript.growth:
        with torch.no_grad():
            out = eager(input_ids=torch.tensor([ids[start : start + event.added]]), cache=cache, use_cache=True,
                        output_attentions=True)
        end = start + event.added
        for layer, weights in enumerate(out.attentions):  # over the last slots up to `end`
            placed = torch.nn.functional.pad(weights[0], (end - weights.shape[-1], n - end))
            rows[layer] = torch.cat([rows[layer], placed], 1)
        start = end
    # each layer's weights to the rounding its scores carry from the layers below (tests/support/rounding.py)
    for layer in range(lm.layers):
        queries, keys = session.queries.layer(layer), lm.attention.keyed(*session.layer_kv(layer))  # MLA: both
        rel = weight_rounding(lm.config, layer, queries, keys, lm.scaling)
        assert worst_ratio(session.weights(layer), rows[layer], rel, absolute=1e-12) <= 1, layer
    assert lm.heads // lm.kv_heads != 3


def test_a_what_if_eviction_equals_a_removed_cache_and_16_bits_change_nothing(model):
    lm, _, session = model
    at = len(session) - 1
    evicted = [3, 4, 5, 20]
    removed = removed_step(session, at, evicted)
    reference = torch.softmax(removed.double(), -1)
    result = what_if(session, Edit.evict(evicted), at=at, topk=20)
    rel = probability_rounding(logit_rounding(lm.config, removed))
    for candidate in result.next_token.edited:
        assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel)
    assert what_if(session, Edit.quantize(range(at), 16), at=at).next_token.kl == 0
    assert result.heads["rho"].shape == (lm.layers, lm.heads)


LATENT_REFUSED = {"expected_attention", "kv_zip", "r_kv"}  # whole RoPE keys, or whole keys compared (docs/models.md)


def test_every_policy_runs(model):
    lm, _, session = model
    for name, policy in POLICIES.items():
        if lm.attention.latent is not None and name in LATENT_REFUSED:
            with pytest.raises(KvvizError, match="latent"):
                policy().edit(session, 0.5)
            continue
        edit = policy().edit(session, 0.5)
        kl = what_if(session, edit).next_token.kl  # an eviction changes the next token's odds; no eviction, exactly not
        assert (kl > 0) == bool(edit.evictions), (name, kl, edit.evictions)
    result = run_policy(lm, TURNS[:1], RunSettings(POLICIES["h2o"](), 12, "decode"), max_new_tokens=4)
    assert all(step.visible == pytest.approx(12) for step in result.last.steps)


def test_blame_nothing_back_is_the_runs_own_step(model):
    """Blame's variants replace the model's mask with their own: restoring nothing gives the run's own KL at each
    step, also where sliding windows hide slots (they once saw past the window: KL 1.77 against the run's 0.995)."""
    from kvviz.runs.blame import blame
    from tests.support.rounding import kl_rounding

    lm, _, _ = model
    result = run_policy(lm, ["Tell me a long story about a cat and a dog and a bird who live in a house."],
                        RunSettings(POLICIES["h2o"](), 12, "decode"), max_new_tokens=6)
    eps = logit_rounding(lm.model.config, result.last.full_logits)
    for step in range(len(result.last.steps)):
        kl = result.last.record(step).kl
        assert abs(blame(result, step=step).kl - kl) <= 2 * kl_rounding(eps, kl), step  # both sides rounded


def test_export_then_import_gives_identical_logits(model):
    lm, _, session = model
    restored, _, _ = import_session(lm, export_session(session))
    assert restored.transcript.ids == session.transcript.ids
    assert torch.equal(restored.logits, session.logits)


@pytest.mark.parametrize("kind, overrides, words", [
    ("FalconH1Config", dict(num_key_value_heads=2, head_dim=16, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8,
                            mamba_n_groups=1, mamba_d_state=16),
     "hybrid layers"),  # attention and Mamba side by side in every layer
    ("Gemma3TextConfig", dict(num_key_value_heads=1, head_dim=16, sliding_window=16, use_bidirectional_attention=True),
     "bidirectional attention"),
    ("GlmMoeDsaConfig", dict(**ARCHITECTURES["deepseek_v32"][1], indexer_types=["full", "shared", "full"]),
     r"indexed attention \(shared-selection\) layers"),  # GLM-5's top-k reused by the next layer
])
def test_attention_kvviz_cannot_reproduce_is_refused_in_one_line(tokenizer, tmp_path, kind, overrides, words):
    model = tiny(kind, **overrides)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=words) as caught:
        load_model(tmp_path)
    assert "\n" not in str(caught.value) and "not loaded" in str(caught.value)


def test_a_saved_tiny_model_loads_from_its_folder(tokenizer, tmp_path):
    model = tiny("qwen3")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    lm = load_model(tmp_path)
    assert (lm.layers, lm.heads, lm.kv_heads, lm.head_dim) == (3, 8, 4, 16)
    assert lm.scaling == pytest.approx(16**-0.5)


def test_every_family_loads_by_name_as_a_tiny_model_and_an_unknown_one_is_one_line():
    """``tiny:KIND`` (the app's model switch through KVVIZ_MODELS, ``--model`` on the command line): the seeded tiny
    model of that family with the bundled tokenizer — the same weights as :func:`kvviz.tiny_models.tiny` gives."""
    from kvviz.model import model_source

    for kind in ARCHITECTURES:
        lm = load_model(f"tiny:{kind}")
        assert lm.config.model_type == tiny(kind).config.model_type and lm.tokenizer.chat_template
        assert torch.equal(lm.model.lm_head.weight, tiny(kind).lm_head.weight)
    for refused in (lambda: load_model("tiny:mamba"), lambda: model_source("tiny:mamba")):
        with pytest.raises(ModelLoadError, match="no tiny model 'mamba'; choose one of tiny:llama") as caught:
            refused()
        assert "\n" not in str(caught.value)
