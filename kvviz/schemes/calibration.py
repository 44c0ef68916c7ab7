"""Static FP8 scales, calibrated before serving as the engines' are (docs/math.md §4).

vLLM reads one ``k_scale`` / ``v_scale`` per layer (or per KV head) from a checkpoint calibrated offline: a tool such as
llm-compressor runs calibration samples through the model and keeps ``scale = max|x| / max(format)`` over the keys and
values its cache received. Without calibrated scales vLLM uses 1.0. kvviz does the same on one calibration text: the
text is prefilled as a user turn (chat template and system prompt included, as calibration samples are), and each
layer's and KV head's largest |k| and |v| over the slots give the scales. A conversation whose K/V reach past the
calibrated range saturates at ``scale · max(format)``: the difference between static and dynamic scales.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from kvviz.errors import KvvizError
from kvviz.model import LoadedModel
from kvviz.quant.quantizer import FORMATS, Quantizer

CALIBRATION_TEXT = (
    "Summarise the following notes for a colleague. The museum opens at nine on weekdays and at ten on Sundays; "
    "tickets cost 12 euros, 6 for students. The north wing holds maps from 1500 to 1800, the south wing a collection "
    "of clocks. Guided tours in English, French and German start every hour; the last one leaves at four."
)
STATIC = ("head", "tensor", "unit")  # calibrated per KV head, calibrated per layer, 1.0 everywhere (vLLM's default)


@dataclass(frozen=True)
class Calibration:
    """The largest magnitudes a calibration text left in the cache: ``key_amax`` and ``value_amax`` ``(L, KV)``
    float32 (max |x| over a layer's slots and channels, per KV head)."""

    text: str
    key_amax: torch.Tensor
    value_amax: torch.Tensor

    def quantizers(self, fmt: str, axis: str) -> tuple[Quantizer, Quantizer]:
        """FP8 quantizers for keys and values with static scales: ``axis`` ``head`` (one per layer and KV head),
        ``tensor`` (one per layer, over its KV heads) or ``unit`` (1.0 everywhere, what vLLM uses without calibrated
        scales; the calibration is not read)."""
        if FORMATS.get(fmt) is None:
            raise KvvizError(f"static scales are for FP8 (e4m3 or e5m2), not {fmt!r}")
        if axis not in STATIC:
            raise KvvizError(f"static scales are per KV head ('head'), per layer ('tensor') or 1.0 ('unit'), not {axis!r}")
        top = torch.finfo(FORMATS[fmt]).max
        tables = []
        for amax in (self.key_amax, self.value_amax):
            if axis == "unit":
                scale = torch.ones_like(amax)
            else:
                peak = amax if axis == "head" else amax.amax(1, keepdim=True).expand_as(amax)
                scale = (peak / top).clamp_min(torch.finfo(torch.float32).tiny)
            tables.append(tuple(tuple(row) for row in scale.tolist()))
        quantizer_axis = "head" if axis == "head" else "tensor"
        return tuple(Quantizer(quantizer_axis, format=fmt, scales=table) for table in tables)


def calibrate(lm: LoadedModel, text: str = CALIBRATION_TEXT) -> Calibration:
    """The calibration of ``lm`` on ``text`` (memoized per model and text; a few hundred tokens take well under a
    second)."""
    if not isinstance(text, str) or not text.strip():
        raise KvvizError("the calibration text is empty; give a text whose K/V set the scales")
    return _calibrate(lm, text)


@lru_cache(maxsize=4)
def _calibrate(lm: LoadedModel, text: str) -> Calibration:
    from kvviz.session import Session

    session = Session(lm)
    session.add_user_turn(text)
    peaks = [[kv.float().abs().amax((1, 2)) for kv in session.layer_kv(layer)] for layer in range(lm.layers)]
    keys, values = (torch.stack([p[i] for p in peaks]).cpu() for i in (0, 1))
    session.release("calibrated")
    return Calibration(text, keys, values)
