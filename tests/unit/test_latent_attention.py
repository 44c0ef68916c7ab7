"""Multi-head latent attention (DeepSeek-V3's MLA: one latent and one RoPE key cached per token, shared by every
head), on a tiny random DeepSeek-V3 (kvviz.tiny_models: a 256-wide latent, an 8-wide RoPE key, 8 heads with 24-wide
queries and 12-wide values). kvviz reads it in the absorbed form (kvviz/latent.py): one KV head of 264 channels.

The references are transformers' own eager DeepSeek-V3 attention, which expands the latent into per-head keys and
values, nothing of kvviz involved: one forward without cache and with a float 4D mask (0 allowed, −inf masked), each
row seeing what its step saw. (The cached chat, the recorded weights, the policies, blame and session files pass the
same oracles as every family: tests/unit/test_architectures.py.)

Tolerances: kvviz's scores are q̃·[c; r] (absorbed: W_UK applied to the query) where eager computes q·[W_UK c; r]: the
same sums in another order, so logits agree within the model's logit rounding ε_z, probabilities within
(e^{2ε} − 1)·p and weights within the rounding of their scores (tests/support/rounding.py). The attention outputs'
change is compared against eager's own float32 per-head outputs, two of them subtracted: each is a sum over the n
slots of values expanded from R latent channels, so within 2·(n + R)·u of the outputs' size (u = 2^-24; measured:
1.1·u)."""

from __future__ import annotations

import pytest
import torch

from kvviz.edit.edit import Edit
from kvviz.edit.parts import Pruning
from kvviz.errors import KvvizError
from kvviz.policies import H2O, StreamingLLM
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.schemes.kivi import Kivi
from kvviz.schemes.written import WrittenCache
from kvviz.tiny_sessions import tiny_pair
from kvviz.whatif import what_if
from tests.support.references import causal_rows, masked_forward, teacher_forced
from tests.support.rounding import logit_rounding, probability_rounding, weight_rounding

TURNS = ["a = 3, b = 5. What is a + b?", "And a - b? Say it in words."]
RANK, ROPE = 256, 8  # the tiny config's kv_lora_rank and qk_rope_head_dim


@pytest.fixture(scope="module")
def mla(tokenizer):
    return tiny_pair("deepseek_v3", tokenizer, TURNS)


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
    full = masked_forward(eager, ids, causal_rows(at + 1), heads=outputs)
    out = masked_forward(eager, ids, causal_rows(at + 1, evicted), attentions=True, heads=outputs)
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
    tol = 2 * (at + 1 + RANK) * 2**-24 * float(outputs[0][-1].norm(dim=-1).max())
    assert float(change.min()) > 10 * tol  # the eviction moves every head's output well past the rounding
    assert torch.allclose(isolated, change, rtol=0, atol=tol)


def test_head_scopes_prunings_and_run_formats_are_refused_and_change_nothing(mla):
    lm, _, session = mla
    at = len(session) - 1
    before = [t.clone() for t in session.layer_kv(0)]
    with pytest.raises(KvvizError, match="KV head 1 does not exist"):
        what_if(session, Edit.evict([3], heads=[1]), at=at)  # one latent per token: no head scope
    with pytest.raises(KvvizError, match="latent"):
        what_if(session, Edit(prunings=(Pruning(0, 0, (1, 2), (3,)),)), at=at)  # a latent channel is every head's
    with pytest.raises(KvvizError, match="latent"):
        CompressedSession(lm, RunSettings(StreamingLLM(), 20, "decode", cache_format=Kivi()))
    assert all(torch.equal(a, b) for a, b in zip(before, session.layer_kv(0)))
    assert what_if(session, Edit.quantize(range(at), 16), at=at).next_token.kl == 0  # 16 bits round nothing


@pytest.mark.parametrize("policy", [StreamingLLM(), H2O()], ids=["streaming_llm", "h2o"])
def test_a_policy_run_equals_one_masked_forward_step_by_step(mla, policy):
    """A decode-time run, teacher-forced, against one no-cache eager forward whose row of each step sees the step's
    kept tokens and itself. H2O decides from the attention the latent received (the absorbed weights, summed over
    the heads that share it)."""
    lm, eager, _ = mla
    budget, steps = 20, 8
    run, _, logits, seen = teacher_forced(lm, RunSettings(policy, budget, "decode"), TURNS[1], steps)
    prompt = run.prompt_end[0]
    ids = run.session.transcript.ids[: prompt + steps]
    layers = [causal_rows(len(ids)) for _ in range(lm.layers)]
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
    out = masked_forward(eager, ids, layers[0], layers=layers)
    for step in range(steps):
        reference = out.logits[0, prompt + step]
        assert (reference - logits[step]).abs().max() <= logit_rounding(lm.config, reference), step


def _step_on(eager, session, at: int, tensors: list, heads: list):
    """Eager's decode step of slot ``at`` on a cache holding ``tensors`` (per layer the latent and the RoPE key
    ``(1, 1, at, ·)``, as transformers' cache holds them); ``heads`` receives layer 0's per-head outputs."""
    from kvviz import kv_cache

    attention = eager.model.layers[0].self_attn
    hook = attention.o_proj.register_forward_hook(
        lambda _, args, __: heads.append(args[0][0, -1].view(attention.num_heads, -1)))
    slot = session.transcript.slots[at]
    try:
        with torch.no_grad():
            return eager(input_ids=torch.tensor([[slot.id]]), position_ids=torch.tensor([[slot.position]]),
                         cache=kv_cache.build(eager.config, tensors), use_cache=True).logits[0, -1]
    finally:
        hook.remove()


def test_a_quantization_what_if_equals_the_model_on_a_latent_rounded_by_the_test(mla):
    """4-bit latents and 8-bit RoPE keys (int, per token), rounded by the test on the stored tensors, against eager
    on a cache holding them: the next token within the logit rounding, and each head's isolated Δo in layer 0 (§4's
    two terms, computed on the latent and projected by W_UV) equal to eager's own per-head change."""
    from kvviz import kv_cache
    from kvviz.quant.quantizer import Quantizer, fake_quantize

    lm, eager, session = mla
    at = len(session) - 1
    edit = Edit(key_bits=dict.fromkeys(range(at), 4), value_bits=dict.fromkeys(range(at), 8),
                keys=Quantizer("token"), values=Quantizer("token"))
    stored = [tuple(t[:, :, :at] for t in kv_cache.layer_kv(session.cache, layer)) for layer in range(lm.layers)]
    rounded = [(fake_quantize(c[0], 4, Quantizer("token"))[None], fake_quantize(r[0], 8, Quantizer("token"))[None])
               for c, r in stored]
    heads: list[torch.Tensor] = []
    full, logits = _step_on(eager, session, at, stored, heads), _step_on(eager, session, at, rounded, heads)
    result = what_if(session, edit, at=at, topk=20)
    reference = torch.softmax(logits.double(), -1)
    rel = probability_rounding(logit_rounding(lm.config, logits))
    for candidate in result.next_token.edited:
        assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel, abs=1e-12)
    change = (heads[1] - heads[0]).norm(dim=-1)  # (H,)
    tol = 2 * (at + 1 + RANK) * 2**-24 * float(heads[0].norm(dim=-1).max())  # as for evictions (module doc)
    assert float(change.min()) > 10 * tol and result.next_token.kl > 0
    assert torch.allclose(result.heads["delta_isolated"][0].float(), change, rtol=0, atol=tol)
    assert torch.equal(full, session.logits) or (full - session.logits).abs().max() <= logit_rounding(lm.config, full)
    assert result.memory.edited_bytes < result.memory.full_bytes / 4  # 4-bit latents, 8-bit RoPE keys


def _flash_mla_fp8(latent: torch.Tensor, tile: int = 128) -> torch.Tensor:
    """The latent ``(…, R)`` through FlashMLA's FP8 cache (``quantize_k_cache`` / ``dequantize_k_cache``, layout
    ``V32_FP8Sparse``, which vLLM's ``fp8_ds_mla`` stores), written here from that definition: per token and tile of
    128 channels, ``s = 2^⌈log₂ max(amax / 448, 10⁻⁴)⌉`` and ``x ≈ s · e4m3(x / s)``."""
    tiles = latent.float().unflatten(-1, (-1, tile))
    scale = torch.pow(2, torch.clamp_min(tiles.abs().amax(-1, keepdim=True) / 448.0, 1e-4).log2().ceil())
    return ((tiles / scale).to(torch.float8_e4m3fn).float() * scale).flatten(-2)


def test_fp8_ds_mla_equals_flash_mlas_rounding_and_counts_its_bytes(mla, tokenizer):
    """The scheme rounds the latent as FlashMLA does (two tiles of 128 in the tiny latent, each with its own
    power-of-two scale) and leaves the RoPE key: the next token equals eager on a cache the test rounded itself, and
    the bytes are the engine's per token and layer — R FP8 codes, one float32 scale per tile, the RoPE key at the
    model's dtype (vLLM's 656 bytes for R = 512, P = 64 in bf16)."""
    from kvviz import kv_cache
    from kvviz.schemes.catalogue import Scheme, schemes
    from kvviz.schemes.compare import compare_schemes, scheme_edits

    lm, eager, session = mla
    at = len(session) - 1
    stored = [tuple(t[:, :, :at] for t in kv_cache.layer_kv(session.cache, layer)) for layer in range(lm.layers)]
    rounded = [(_flash_mla_fp8(c), r) for c, r in stored]
    assert not torch.equal(rounded[0][0], stored[0][0])
    logits = _step_on(eager, session, at, rounded, [])
    (edit,) = scheme_edits(session, [Scheme("fp8-ds-mla")], at)
    result = what_if(session, edit, at=at, topk=20)
    reference = torch.softmax(logits.double(), -1)
    rel = probability_rounding(logit_rounding(lm.config, logits))
    for candidate in result.next_token.edited:
        assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel, abs=1e-12)
    assert result.memory.edited_bytes == at * lm.layers * (RANK + RANK // 128 * 4 + ROPE * 4)
    (row,) = compare_schemes(session, schemes(["fp8-ds-mla"]), at)
    assert row.kl == pytest.approx(result.next_token.kl, rel=1e-9) and row.kl > 0
    llama = tiny_pair("llama", tokenizer, [])[2]
    llama.add_user_turn("a = 3")
    with pytest.raises(KvvizError, match="latent cache"):
        compare_schemes(llama, schemes(["fp8-ds-mla"]))


def test_the_command_line_and_the_notebook_widget_run_on_a_latent_model(mla, tokenizer, tmp_path):
    """``whatif`` from a saved tiny DeepSeek-V3 folder (an eviction and the fp8-ds-mla scheme), and the widget's
    clicks — an eviction, then bits on a selected token — each equal to ``what_if`` on the same session."""
    import json

    from kvviz.notebook import widget
    from kvviz.tiny_models import tiny
    from tests.support.cli import cli

    tiny("deepseek_v3").save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    for extra in (["--evict", "3,5"], ["--scheme", "fp8-ds-mla"]):
        done = cli("whatif", "--model", str(tmp_path), "--turn", TURNS[0], "--max-new-tokens", "3", "--json", *extra)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["next_token"]["kl"] > 0
    lm, _, session = mla
    w = widget(session)
    w.set_state({"request": {"kind": "evict", "slot": 4, "n": 1}})
    assert w.kl == what_if(session, Edit.evict([4])).next_token.kl and not w.error
    w.set_state({"request": {"kind": "clear", "n": 2}})
    w.set_state({"request": {"kind": "select", "slot": 6, "n": 3}})
    w.set_state({"request": {"kind": "bits", "bits": 4, "n": 4}})
    assert w.kl == what_if(session, Edit.quantize([6], 4)).next_token.kl > 0 and not w.error


def test_a_rerotated_run_moves_only_the_rope_key(mla):
    """Re-rotated positions on a latent cache: the RoPE key alone carries the position, so a re-rotated StreamingLLM
    run turns the kept RoPE keys by the position change and leaves the latents; the reference compacts transformers'
    own cache and moves the RoPE keys with the model's own rotary embedding (tests/support/references.py)."""
    from tests.support.references import compacted_rerotated_steps

    lm, _, _ = mla
    budget, steps = 20, 8
    run, tokens, logits, _ = teacher_forced(lm, RunSettings(StreamingLLM(), budget, "decode", positions="rerotated"),
                                            TURNS[1], steps)
    ids = run.session.transcript.ids[: run.prompt_end[0]]
    moved = False
    session, prompt = run.session, run.prompt_end[0]
    queries, keys = session.queries.layer(0), lm.attention.keyed(*session.layer_kv(0))
    tol = weight_rounding(lm.config, 0, queries, keys, lm.scaling)
    steps_seen = compacted_rerotated_steps(lm, ids, tokens, budget, attentions=True)
    for step, (reference, moved_now, kept, weights) in enumerate(steps_seen):
        assert (reference - logits[step]).abs().max() <= logit_rounding(lm.config, reference), step
        moved |= moved_now
        slot = prompt + step  # the attention view scores each step's RoPE keys where that step had them placed
        shown = session.weights(0, slot, slot + 1)[:, 0, kept + [slot]]
        assert torch.allclose(shown, weights.float(), rtol=tol, atol=1e-12), step
    assert moved


def test_a_run_on_an_fp8_ds_mla_cache_steps_on_the_tests_own_rounding(mla):
    """fp8-ds-mla as a run's cache, each token's latent rounded once when written (as vLLM writes it): every decode
    step equals eager's step on a cache holding the run's own computed latents rounded by FlashMLA's rule (written
    in this test) and its RoPE keys as computed. Same model, same stored tensors, another cache object: ε_z."""
    lm, eager, _ = mla
    run = CompressedSession(lm, RunSettings(cache_format=WrittenCache("fp8-ds-mla")))
    run.add_turn(TURNS[0])
    for _ in range(4):
        logits = run.step()
        at = len(run) - 1
        latents, ropes = run.timeline.originals  # (L, 1, at, ·): every earlier slot as computed
        assert latents.shape[2] == at
        tensors = [(_flash_mla_fp8(c)[None], r[None]) for c, r in zip(latents, ropes)]
        reference = _step_on(eager, run.session, at, tensors, [])
        assert (reference - logits).abs().max() <= logit_rounding(lm.config, reference)
    assert not torch.equal(tensors[0][0], latents[0][None])  # the latents were rounded


RELATIVES = ["DeepseekV2Config", "Glm4MoeLiteConfig", "MiniCPM3Config", "YoutuConfig", "AXK1Config"]
LATENT = dict(num_key_value_heads=8, kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16,
              v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
              moe_intermediate_size=32, first_k_dense_replace=1, pad_token_id=None, bos_token_id=None,
              eos_token_id=None)  # what a config of each takes; a field a config lacks is kept as an attribute


@pytest.mark.parametrize("kind", RELATIVES)
def test_the_other_latent_attention_families_pass_the_same_oracles(tokenizer, kind):
    """Other transformers models whose attention is DeepSeek's MLA with its ``expand_kv`` (``deepseek_v2``,
    ``glm4_moe_lite``, ``minicpm3``, ``youtu``, ``axk1``): the cached chat equals a forward without cache, and an
    eviction what-if equals the step on a cache with the latents physically removed
    (tests/support/references.removed_step)."""
    from tests.support.references import removed_step

    lm, eager, session = tiny_pair(kind, tokenizer, TURNS, **LATENT)
    assert lm.attention.latent is not None and lm.kv_heads == 1
    with torch.no_grad():
        out = eager(input_ids=torch.tensor([session.transcript.ids]), use_cache=False)
    assert (out.logits[0, -1] - session.logits).abs().max() <= logit_rounding(lm.config, out.logits[0, -1])
    at = len(session) - 1
    removed = removed_step(session, at, [3, 4, 5, 20])
    reference = torch.softmax(removed.double(), -1)
    rel = probability_rounding(logit_rounding(lm.config, removed))
    for candidate in what_if(session, Edit.evict([3, 4, 5, 20]), at=at, topk=20).next_token.edited:
        assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel)


def test_policy_runs_batched_in_lockstep_equal_the_runs_one_by_one(mla):
    """Sweeps decode several runs as one batch (kvviz.runs.lockstep: the sessions' latents and RoPE keys as rows of
    shared buffers of their own widths): the same tokens, evictions and KLs as the runs one by one, to the rounding of
    two kernel shapes (tests/model/test_lockstep.py argues it)."""
    from kvviz.policies import H2O
    from kvviz.runs.policy_run import run_policies
    from tests.support.rounding import kl_rounding

    lm = mla[0]
    settings = [RunSettings(H2O(), 16, "decode"), RunSettings(StreamingLLM(), 16, "decode")]
    rows = []
    hook = lm.model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        batched = run_policies(lm, TURNS[:1], settings, 6)
    finally:
        hook.remove()
    assert max(rows) > 1  # it did batch
    alone = run_policies(lm, TURNS[:1], settings, 6, batch=False)
    for ours, reference in zip(batched, alone, strict=True):
        turn, ref = ours.turns[0], reference.turns[0]
        assert (turn.full_ids, turn.policy_ids) == (ref.full_ids, ref.policy_ids)
        assert torch.equal(turn.forced.timeline.evicted_at, ref.forced.timeline.evicted_at)
        eps = logit_rounding(lm.config, ref.full_logits)
        for step, other in zip(turn.records, ref.records, strict=True):
            assert abs(step.kl - other.kl) <= kl_rounding(eps, other.kl)


def test_the_channel_view_shows_the_latent_as_keys_and_the_rope_key_as_values(mla):
    """The channel view of a latent cache: the key map is the latent's channels (it carries no RoPE: no "before
    RoPE" map), the value map the RoPE key's, and the per-channel errors are the latent's."""
    from kvviz.channels import channels, outliers_by_layer

    lm, _, session = mla
    at = len(session) - 1
    view = channels(session, 1, 0, at, bits=4)
    latent, rope = (t[0, :at].float().abs() for t in session.layer_kv(1))
    assert view.keys_pre is None and torch.equal(view.keys, latent) and torch.equal(view.values, rope)
    assert view.errors and all(error.shape == (RANK,) for error in view.errors.values())
    assert len(outliers_by_layer(session, at)) == lm.layers


def test_where_an_eviction_matters_is_each_steps_what_if(mla):
    """"Where the edit matters" re-runs the reply's steps in batched passes (a mask per row): on a latent cache each
    step's KL equals the what-if of that step, to the KL rounding of two kernel shapes (tests/support/rounding.py)."""
    from tests.support.references import assert_step_effects_are_what_ifs

    _, eager, session = mla
    assert_step_effects_are_what_ifs(session, eager, Edit.evict([3, 4, 5]))
