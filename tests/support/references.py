"""Independent references the tests compare with: a forward pass without cache, a step on a cache with the evicted
slots removed, transformers' own decoding, the session's own passes with eager attention."""

from __future__ import annotations

import pytest
import torch
from kvviz import kv_cache, recurrent
from kvviz.edit.edit import Edit
from kvviz.model import LoadedModel
from kvviz.session import Session
from tests.support.rounding import logit_rounding


def full_forward(model, ids: list[int], **kwargs):
    """One forward over ``ids`` without any cache."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False, **kwargs)


def greedy_tokens(lm: LoadedModel, text: str, steps: int) -> list[int]:
    """The ``steps`` tokens a plain session chooses greedily after the user message ``text`` (what a compressed run is
    then teacher-forced on)."""
    session = Session(lm)
    session.add_user_turn(text)
    tokens = []
    for _ in range(steps):
        tokens.append(session.pending)
        session.step()
    return tokens


def teacher_forced(lm: LoadedModel, settings, text: str, steps: int):
    """A compressed run (kvviz.runs.compressed, with ``settings``) of the user message ``text``, teacher-forced on the
    ``steps`` tokens a plain session chooses (:func:`greedy_tokens`): the run, those tokens, each step's logits
    ``(V,)`` and the slots each step saw (``run.seen`` then, bool ``(L, KV, n)``)."""
    tokens = greedy_tokens(lm, text, steps)
    run, logits, seen = forced_run(lm, settings, text, tokens)
    return run, tokens, logits, seen


def forced_run(lm: LoadedModel, settings, text: str, tokens: list[int]):
    """A compressed run of the user message ``text`` teacher-forced on ``tokens``: the run, each step's logits ``(V,)``
    and the slots each step saw (``run.seen`` then, bool ``(L, KV, n)``)."""
    from kvviz.runs.compressed import CompressedSession

    run = CompressedSession(lm, settings)
    run.add_turn(text)
    logits, seen = [], []
    for token in tokens:
        logits.append(run.step(token))
        seen.append(run.seen.clone())
    return run, logits, seen


def assert_rerotated_run_is_the_compacted_cache(lm: LoadedModel, text: str, budget: int = 20, steps: int = 8):
    """A re-rotated StreamingLLM run of ``text`` (teacher-forced, ``steps`` tokens) against
    :func:`compacted_rerotated_steps`: each step's logits within the logit rounding, and some key moved. Returns the
    run."""
    from kvviz.policies import StreamingLLM
    from kvviz.runs.compressed import RunSettings

    run, tokens, logits, _ = teacher_forced(lm, RunSettings(StreamingLLM(), budget, "decode", positions="rerotated"),
                                            text, steps)
    ids = run.session.transcript.ids[: run.prompt_end[0]]
    moved = False
    for step, (reference, moved_now) in enumerate(compacted_rerotated_steps(lm, ids, tokens, budget)):
        assert (reference - logits[step]).abs().max() <= logit_rounding(lm.config, reference), step
        moved |= moved_now
    assert moved
    return run


def assert_step_effects_are_what_ifs(session: Session, eager, edit: Edit) -> None:
    """"Where the edit matters" (each reply step re-run with ``edit``'s mask) against the what-if of each step: the KL
    within the KL rounding of the largest logit of any step (``eager``: the same weights, one forward without cache,
    for that scale), and the same edited top-1."""
    from kvviz.whatif import what_if
    from kvviz.whatif.steps import step_effects
    from tests.support.rounding import kl_rounding

    effects = step_effects(session, edit)
    assert len(effects.steps) > 3
    with torch.no_grad():  # the largest logit of any step: the scale of every step's rounding
        eps = logit_rounding(session.lm.config,
                             eager(input_ids=torch.tensor([session.transcript.ids])).logits.abs().max())
    for step in effects.steps:
        result = what_if(session, edit, at=step.slot)
        assert abs(step.kl - result.next_token.kl) <= 2 * kl_rounding(eps, result.next_token.kl), step.slot
        assert step.top1_edited == result.next_token.edited[0].id


def causal_rows(n: int, hidden_last: list[int] = ()) -> list[torch.Tensor]:
    """Each row's allowed slots, bool ``(n,)``, of a causal mask over ``n`` slots; the last row without the slots
    ``hidden_last`` (an eviction at the last step)."""
    rows = [torch.arange(n) <= row for row in range(n)]
    rows[-1][list(hidden_last)] = False
    return rows


def float_mask(rows: list[torch.Tensor]) -> torch.Tensor:
    """A float 4D mask ``(1, 1, n, n)`` from each row's allowed slots (bool ``(n,)`` each): 0 allowed, −inf hidden."""
    allowed = torch.stack(rows)
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]


def masked_forward(eager, ids: list[int], rows: list[torch.Tensor], attentions: bool = False,
                   heads: list | None = None, layers: list[list[torch.Tensor]] | None = None):
    """Eager's forward without cache under the rows' mask (``layers``: each layer's own rows instead, given to its
    attention by a pre-hook); ``heads`` receives layer 0's per-head attention outputs ``(n, H, Dv)`` (the input of
    its ``o_proj``)."""
    hooks = []
    if heads is not None:
        attention = eager.model.layers[0].self_attn
        hooks.append(attention.o_proj.register_forward_hook(
            lambda _, args, __: heads.append(args[0][0].view(len(ids), attention.num_heads, -1))))
    for layer, own in enumerate(layers or []):
        mask = float_mask(own)
        hooks.append(eager.model.layers[layer].self_attn.register_forward_pre_hook(
            lambda _, args, kwargs, mask=mask: (args, {**kwargs, "attention_mask": mask}), with_kwargs=True))
    try:
        with torch.no_grad():
            return eager(input_ids=torch.tensor([ids]), attention_mask=float_mask(rows), use_cache=False,
                         output_attentions=attentions)
    finally:
        for hook in hooks:
            hook.remove()


def assert_a_step_failing_in_the_last_layer_raises(lm: LoadedModel, session: Session) -> None:
    """A decode step of ``session`` that fails in the model's last attention layer (after the layers below it ran)
    raises; the hook that fails it is removed afterwards."""
    failing = lm.attention_modules[-1].register_forward_pre_hook(lambda *_: (_ for _ in ()).throw(RuntimeError("x")))
    try:
        with pytest.raises(RuntimeError):
            session.step()
    finally:
        failing.remove()


def per_head_masked_forward(eager, ids: list[int], seen: list[torch.Tensor], prompt: int,
                            layers: list[int] | None = None) -> torch.Tensor:
    """Reference for a run whose steps saw different slots per layer and KV head: one forward of ``eager`` without
    cache over ``ids``, each attention layer (``layers``: the decoder layers kvviz's layers are, default all) given a
    float 4D mask ``(1, H, n, n)`` by a pre-hook — causal, and the row of step ``s`` (slot ``prompt + s``) seeing the
    slots ``seen[s]`` (bool ``(L, KV, ≥ slot)``) and itself. Returns the logits ``(n, V)`` float32."""
    n, kv_heads = len(ids), seen[0].shape[1]
    modules = [getattr(layer, "self_attn", None) for layer in eager.model.layers]  # a recurrent layer has none
    layers = list(range(len(modules))) if layers is None else layers
    hooks = []
    for ours, index in enumerate(layers):
        rows = [torch.ones(n, n, dtype=torch.bool).tril() for _ in range(kv_heads)]
        for step, kept in enumerate(seen):
            slot = prompt + step
            for head in range(kv_heads):
                rows[head][slot, :slot] = kept[ours, head, :slot]
        heads = eager.config.num_attention_heads // kv_heads
        mask = torch.stack([torch.zeros(n, n).masked_fill(~r, float("-inf")) for r in rows])
        mask = mask.repeat_interleave(heads, 0)[None]  # (1, H, n, n)
        hooks.append(modules[index].register_forward_pre_hook(
            lambda _, args, kwargs, mask=mask: (args, {**kwargs, "attention_mask": mask}), with_kwargs=True))
    try:
        with torch.no_grad():
            return eager(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    finally:
        for hook in hooks:
            hook.remove()


def removed_step(session: Session, at: int, evicted: list[int], renumber: bool = False) -> torch.Tensor:
    """Reference: the float32 logits ``(V,)`` of slot ``at``'s step on a cache from which ``evicted`` slots were
    physically removed, at the slot's true position (or, with ``renumber``, at the count of slots kept)."""
    if recurrent.linear_layers(session.lm.config) and not renumber:
        return masked_step(session, at, evicted)
    keep = [s for s in range(at) if s not in evicted]
    tensors = [tuple(t[:, :, keep] for t in kv_cache.layer_kv(session.cache, layer)) for layer in range(session.lm.layers)]
    indexed = kv_cache.indexer_keys(session.cache, at)  # DSA: the indexer's keys of the slots kept, as a cache holds them
    indexed = None if indexed is None else [keys[:, keep] for keys in indexed]
    slot, device = session.transcript.slots[at], session.lm.device
    position = len(keep) if renumber else slot.position
    with torch.no_grad():
        out = session.lm.model(input_ids=torch.tensor([[slot.id]], device=device),
                               position_ids=torch.tensor([[position]], device=device),
                               cache=kv_cache.build(session.lm.config, tensors, indexed), use_cache=True)
    return out.logits[0, -1].float()


def masked_step(session: Session, at: int, evicted: list[int]) -> torch.Tensor:
    """Reference: the float32 logits ``(V,)`` of slot ``at``'s step from one forward without cache over slots
    ``0..at``, the row of slot ``at`` masked (−inf) at the ``evicted`` slots in every KV layer (a float 4D mask; a
    hybrid model's recurrent layers get none: they see every token, as they do in the session)."""
    lm = session.lm
    ids = [slot.id for slot in session.transcript.slots[: at + 1]]
    positions = [slot.position for slot in session.transcript.slots[: at + 1]]
    mask = torch.full((at + 1, at + 1), float("-inf")).triu(1)
    mask[at, evicted] = float("-inf")
    masks = dict.fromkeys(("full_attention", "sliding_attention", "indexed_attention"), mask[None, None])
    if recurrent.linear_layers(lm.config):
        masks["linear_attention"] = None
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([positions]), attention_mask=masks,
                       use_cache=False)
    return out.logits[0, -1].float()


def assert_what_if_is_the_stored_cache(session: Session, result, tensors: list) -> None:
    """``result`` (a what-if of slot ``result.at``'s step) against that step run on a cache holding ``tensors`` (per
    layer ``(1, KV, at, D)`` K/V, as the test stored them): the same logits up to the summation order, so each
    edited top-k probability within (e^{2ε} − 1)·p of the reference's (tests/support/rounding.py); and §4's two terms add up
    to the isolated change of the detail head (float64 sums of float32 terms: rtol 1e-6)."""
    from tests.support.rounding import probability_rounding

    slot, lm = session.transcript.slots[result.at], session.lm
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([[slot.id]]), position_ids=torch.tensor([[slot.position]]),
                       cache=kv_cache.build(lm.config, tensors), use_cache=True)
    logits = out.logits[0, -1].double()
    probabilities = torch.softmax(logits, -1)
    rel = probability_rounding(logit_rounding(lm.config, logits))
    for candidate in result.next_token.edited:
        assert candidate.prob == pytest.approx(float(probabilities[candidate.id]), rel=rel, abs=1e-12)
    detail = result.detail
    total = torch.tensor(detail.weight_term) + torch.tensor(detail.content_term)
    assert torch.allclose(total, torch.tensor(detail.delta_isolated), rtol=1e-6, atol=1e-9)


def committed_eviction_gaps(lm: LoadedModel, steps: int) -> tuple[Session, list[float]]:
    """One turn, an eviction of slots 20..29 committed, then ``steps`` decode steps; per step, the max |Δ logit| of the
    session against the same steps on a cache with those slots physically removed (true positions)."""
    session = Session(lm)
    session.add_user_turn("The secret word is mango. Repeat the secret word twice.")
    evicted, before = list(range(20, 30)), len(session)
    kept = [s for s in range(before) if s not in evicted]
    reference = kv_cache.build(lm.config, [tuple(t[:, :, kept] for t in kv_cache.layer_kv(session.cache, layer))
                                           for layer in range(lm.layers)])
    session.commit(Edit.evict(evicted))
    gaps = []
    for _ in range(steps):
        token, position = session.pending, session.transcript.next_position
        session.step()
        with torch.no_grad():
            out = lm.model(input_ids=torch.tensor([[token]], device=lm.device),
                           position_ids=torch.tensor([[position]], device=lm.device), cache=reference, use_cache=True)
        gaps.append((out.logits[0, -1].float() - session.logits.float().to(lm.device)).abs().max().item())
    return session, gaps


def assert_steps_as_transformers(lm: LoadedModel, settings, prompt: str):
    """A run with ``settings`` as its cache against transformers' ``QuantizedCache`` of the same backend and
    settings (a :class:`kvviz.schemes.quanto.QuantoCache`), teacher-forced on the reference's greedy tokens across
    flushes: logits within ε_z (the K/V the two caches receive agree up to the forward passes' float32 rounding), the
    same greedy tokens, the same cache state for all but 0.1 % of the elements (a value at a rounding boundary may
    land a code away), and the timeline's rebuild of the live cache. Returns the run."""
    from transformers import QuantizedCache

    from kvviz.runs.compressed import CompressedSession, RunSettings
    from tests.support.rounding import logit_rounding

    run = CompressedSession(lm, RunSettings(cache_format=settings))
    run.add_turn(prompt)
    ids, n = run.session.transcript.ids, len(run.session)
    cache = QuantizedCache(backend=settings.backend, config=lm.model.config, nbits=settings.nbits,
                           axis_key=settings.axis_key, axis_value=settings.axis_value,
                           q_group_size=settings.q_group_size, residual_length=settings.residual_length)
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True).logits[0, -1].float()
    eps = logit_rounding(lm.config, logits)
    assert float((run.session.logits - logits).abs().max()) <= eps
    for step in range(2 * settings.residual_length + 3):  # across flushes
        token = int(logits.argmax())
        ours = run.step(token)
        with torch.no_grad():
            logits = lm.model(input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[n + step]]), cache=cache,
                              use_cache=True).logits[0, -1].float()
        assert float((ours - logits).abs().max()) <= eps, step
        assert int(ours.argmax()) == int(logits.argmax()), step
    for layer in (0, 7, lm.layers - 1):  # the same cache state: transformers' quantized part and residual
        own = cache.layers[layer]
        rest = [own.keys, own.values] if own.keys.dim() == 4 else [own.keys.new_zeros(1, lm.kv_heads, 0, 64)] * 2
        for theirs, quantized, live in zip(rest, (own._quantized_keys, own._quantized_values),
                                           run.session.layer_kv(layer)):
            state = torch.cat([own._dequantize(quantized), theirs], 2)[0]  # (KV, n, D)
            assert state.shape == live[:, : len(run.session)].shape
            close = (state - live[:, : state.shape[1]]).abs() <= 1e-5 * state.abs().clamp(min=1)
            assert float(close.float().mean()) > 0.999  # a rare value at a rounding boundary may land a step away
    timeline = run.session.commits
    for layer in (0, lm.layers - 1):  # the timeline rebuilds the live cache from the K/V as computed
        rebuilt = timeline.flushed_kv(layer, len(timeline.at) - 1, len(run.session))
        assert all(torch.equal(a, b[:, : len(run.session)]) for a, b in zip(rebuilt, run.session.layer_kv(layer)))
    return run


class AttentionSpy:
    """Asks the session's own forward passes for eager ``output_attentions`` and keeps them (per pass)."""

    def __init__(self, model, monkeypatch):
        self.passes: list[tuple] = []
        forward = model.forward

        def spying_forward(*args, **kwargs):
            out = forward(*args, output_attentions=True, **kwargs)
            self.passes.append(out.attentions)
            return out

        monkeypatch.setattr(model, "forward", spying_forward)


FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_GROUPS = {"head": (1, 2), "channel": 1, "tensor": (0, 1, 2)}  # the dims a scale spans, besides "token"'s last


def rope_moved(model, keys: torch.Tensor, old: list[int], new: list[int]) -> torch.Tensor:
    """Keys ``(1, KV, n, D)`` computed at positions ``old`` moved to ``new``: undo RoPE at ``old`` (the rotation by
    −old), then apply it at ``new`` — transformers' rotary embedding and ``apply_rotary_pos_emb`` (with YaRN, whose
    cos and sin carry an attention factor, the factor divided out of the unrotated key)."""
    import sys

    apply_rotary_pos_emb = sys.modules[type(model).__module__].apply_rotary_pos_emb  # the model's own (gpt-oss: half)
    rotary = model.model.rotary_emb
    cos, sin = rotary(keys, torch.tensor([old]))
    _, unrotated = apply_rotary_pos_emb(keys, keys, cos, -sin)
    unrotated = unrotated / rotary.attention_scaling**2  # YaRN scales cos and sin: once in the key, once just now
    cos, sin = rotary(keys, torch.tensor([new]))
    return apply_rotary_pos_emb(unrotated, unrotated, cos, sin)[1]


def compacted_rerotated_steps(lm: LoadedModel, ids: list[int], tokens: list[int], budget: int, sinks: int = 4,
                              attentions: bool = False):
    """StreamingLLM with re-rotated positions the plain way: the prompt ``ids``' K/V computed by the model, then
    before each step the kept slots (``sinks`` first and the most recent) physically compacted into a new cache,
    their keys (a latent cache's RoPE keys) moved to the positions ``0..k-1`` of their order with the model's own
    RoPE — in the layers whose attention applies RoPE (transformers' ``use_rope``; a NoPE layer's keys stay as they
    are) — and the step's token at position ``k`` (a hybrid's recurrent layers stepping on as they do in the model). Yields each step's logits ``(V,)`` and whether any key moved (with ``attentions``, also the
    step's kept slots and layer 0's weights ``(H, k + 1)`` over them and itself)."""
    from transformers import DynamicCache

    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([ids]), use_cache=True)
    decoder = recurrent.kv_layers(lm.config)  # a hybrid's recurrent layers carry their own state from step to step
    linear = {index: out.past_key_values.layers[index] for index in recurrent.linear_layers(lm.config)}
    layers = [(out.past_key_values.layers[i].keys, out.past_key_values.layers[i].values) for i in decoder]
    uses_rope = [bool(getattr(module, "use_rope", True)) for module in lm.attention_modules]
    part = 0 if lm.attention.latent is None else 1  # latent attention: the RoPE key, held as the values, moves
    computed_at, kept = list(range(len(ids))), list(range(len(ids)))  # per slot: the position its key was computed at
    for token in tokens:
        if len(kept) > budget:
            kept = kept[:sinks] + kept[-(budget - sinks):]
        cache, old = DynamicCache(config=lm.model.config), [computed_at[s] for s in kept]
        recurrent.place(cache, linear)
        for layer, (keys, values) in enumerate(layers):
            pair = [keys[:, :, kept], values[:, :, kept]]
            if uses_rope[layer]:
                pair[part] = rope_moved(lm.model, pair[part], old, list(range(len(kept))))
            cache.update(*pair, decoder[layer])
        with torch.no_grad():
            step_out = lm.model(input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[len(kept)]]),
                                cache=cache, use_cache=True, output_attentions=attentions)
        moved = old != list(range(len(kept)))
        yield (step_out.logits[0, -1], moved, list(kept), step_out.attentions[0][0, :, -1]) if attentions else (
            step_out.logits[0, -1], moved)
        for layer in range(lm.layers):
            new = step_out.past_key_values.layers[decoder[layer]]
            keys, values = layers[layer]
            layers[layer] = (torch.cat([keys, new.keys[:, :, -1:]], 2), torch.cat([values, new.values[:, :, -1:]], 2))
        computed_at.append(len(kept))
        kept.append(len(computed_at) - 1)


def fp8_round_trip(x: torch.Tensor, fmt: str, axis: str) -> torch.Tensor:
    """``x`` ``(KV, n, D)`` through an FP8 cache: per group ``scale = amax / max``, torch's cast, back."""
    dtype = FP8_DTYPES[fmt]
    dims = -1 if axis == "token" else FP8_GROUPS[axis]
    scale = x.abs().amax(dims, keepdim=True) / torch.finfo(dtype).max
    return (x / scale).to(dtype).float() * scale
