"""Whether an edit fits a session's cache: :meth:`Edit.validate` (slots, scopes, quantizers against the model's shape)
and, for keys rounded before RoPE, that the keys and the frequencies are those the quantizer assumes."""

from __future__ import annotations

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.model import LoadedModel
from kvviz.transcript import Transcript


def check_edit(lm: LoadedModel, transcript: Transcript, edit: Edit, at: int) -> None:
    """Refuse ``edit`` before the step of slot ``at`` where it does not fit (:class:`KvvizError`, one line)."""
    edit.validate(at, lm.layers, lm.kv_heads, lm.geometry.cached_widths)
    if lm.attention.latent is not None and (edit.head_widths is not None or edit.reshapes):
        raise KvvizError("this model caches one latent per token (MLA): widths per head, pruned channels and merged "
                         "values are not built on the latent yet")
    if lm.attention.latent is not None and edit.keys.rope is not None and edit.key_bits:
        raise KvvizError("this model's keys are latents (MLA), which carry no RoPE: round them as stored")
    if edit.keys.rope is None or not edit.key_bits:  # nothing rounded before RoPE
        return
    if transcript.renumbered is not None or any(s.position != s.slot for s in transcript.slots[:at]):
        raise KvvizError("keys are quantized before RoPE only where each cached key sits at its slot's position; this "
                         "cache was re-rotated to other positions")
    from kvviz.rope import no_rope_layers, rope_frequencies

    if edit.keys.rope != rope_frequencies(lm):
        raise KvvizError("the pre-RoPE keys' frequencies are not this model's RoPE: take the model's own")
    if edit.keys.no_rope != no_rope_layers(lm):
        nope = ", ".join(map(str, no_rope_layers(lm))) or "none"
        raise KvvizError(f"the pre-RoPE keys' layers without RoPE are not this model's ({nope}): take the model's own "
                         "(kvviz.rope.pre_rope)")
