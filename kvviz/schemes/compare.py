"""Several quantization schemes (:mod:`kvviz.schemes.catalogue`) at the same step, side by side: one what-if each."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvviz.schemes.calibration import CALIBRATION_TEXT, calibrate
from kvviz.errors import KvvizError
from kvviz.edit.check import check_edit
from kvviz.edit.edit import Edit
from kvviz.quant.allocation import allocate
from kvviz.quant.quantizer import saturated
from kvviz.rope import no_rope_layers, rope_frequencies
from kvviz.schemes.catalogue import MIX_KEYS, Scheme
from kvviz.session import Session
from kvviz.spelling import spell
from kvviz.whatif.step import WhatIf, what_if


@dataclass(frozen=True)
class SchemeRow:
    """What one scheme does to the step of slot ``at``: KL (nats) and total variation of the next-token
    distribution, whether the top-1 token changes (``top1`` full → edited), the cache's bytes as the scheme stores
    them, and the quantization split of docs/math.md §4 over all layers and query heads: ``delta_o`` is the
    Frobenius norm of the isolated output changes ``Δo`` ``(L, H, D)``, ``weight_term`` and ``content_term`` those
    of its two terms (``Δo`` = weight term + content term, as vectors); ``quantized``: the slots it rounds;
    ``saturated``: the elements (keys and values) past a static scale's range, clipped (0 for dynamic scales);
    ``ratio``: the 16-bit cache's bytes over ``bytes`` (every scale and zero point counted), beside ``nominal``, 16
    over the bits per element the format's name promises (NVFP4: 4×, while its block scales make it ~3.56×)."""

    scheme: str
    label: str
    kl: float
    tv: float
    top1_changed: bool
    top1: str
    bytes: int
    full_bytes: int
    delta_o: float
    weight_term: float
    content_term: float
    quantized: int
    saturated: int = 0
    ratio: float = 1.0
    nominal: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)


def scheme_row(scheme: Scheme, result: WhatIf, saturated: int = 0) -> SchemeRow:
    """The row of one scheme's what-if result (``saturated``: see :class:`SchemeRow`)."""
    nt, edit = result.next_token, result.edit
    frobenius = lambda name: float(result.heads[name].double().square().sum().sqrt())  # noqa: E731
    return SchemeRow(scheme.name, scheme.label, nt.kl, nt.tv, nt.top1_changed,
                     f"{spell(nt.full[0].text)} → {spell(nt.edited[0].text)}", result.memory.edited_bytes,
                     result.memory.full_bytes, frobenius("delta_isolated"), frobenius("weight_term"),
                     frobenius("content_term"), len(set(edit.key_bits) | set(edit.value_bits)), saturated,
                     result.memory.fp16_bytes / result.memory.edited_bytes, 16 / scheme.nominal_bits)


def compare_schemes(session: Session, schemes: list[Scheme], at: int | None = None, topk: int = 5,
                    calibration_text: str = CALIBRATION_TEXT) -> list[SchemeRow]:
    """One :class:`SchemeRow` per scheme at the step of slot ``at`` (default: the newest); the session is never
    modified; static FP8 schemes take their scales from ``calibration_text``. A scheme the model cannot take is
    refused (:class:`~kvviz.errors.KvvizError`) before any is run."""
    at = len(session) - 1 if at is None else at
    edits = scheme_edits(session, schemes, at, calibration_text)
    lm = session.lm
    for edit in edits:
        check_edit(lm, session.transcript, edit, at)
    return [scheme_row(scheme, what_if(session, edit, at, topk=topk), clipped(session, edit, at))
            for scheme, edit in zip(schemes, edits)]


def scheme_edits(session: Session, schemes: list[Scheme], at: int, calibration_text: str = CALIBRATION_TEXT
                 ) -> list[Edit]:
    """Each scheme's :class:`Edit` before the step of slot ``at``, with what the session supplies: the growth log
    (quanto), a calibration on ``calibration_text`` (static FP8), the RoPE frequencies (``+prerope``), the widths
    per layer and KV head (``mix``) and the layers' sliding windows (``+skip`` rules)."""
    latent = [s.name for s in schemes if s.family == "dsmla"]
    if latent and session.lm.attention.latent is None:
        raise KvvizError(f"{latent[0]} stores a latent cache (multi-head latent attention, DeepSeek); this model "
                         "caches keys and values per KV head")
    passes = [event.added for event in session.transcript.growth]
    calibration = calibrate(session.lm, calibration_text) if any(s.static for s in schemes) else None
    rope = rope_frequencies(session.lm) if any(s.pre_rope for s in schemes) else None
    no_rope = no_rope_layers(session.lm)
    keys = [session.commits.step_kv(layer, at)[0] for layer in range(session.lm.layers)] if any(
        s.family == "mix" for s in schemes) else None  # (KV, at, D) per layer, as the step sees them
    windows = session.lm.attention.windows or (None,) * session.lm.layers
    edits = []
    for scheme in schemes:
        widths = allocate(keys, *scheme.mix, MIX_KEYS) if scheme.family == "mix" else None
        edits.append(scheme.edit(passes, at, calibration, rope, widths, windows, no_rope))
    return edits


def clipped(session: Session, edit: Edit, at: int) -> int:
    """Elements of the slots ``edit`` quantizes (keys and values, every layer) that its static scales clip."""
    if edit.keys.scales is None and edit.values.scales is None:
        return 0
    count = 0
    for layer in range(session.lm.layers):
        keys, values = session.commits.step_kv(layer, at)
        count += saturated(keys[:, sorted(edit.key_bits)], edit.keys, layer)
        count += saturated(values[:, sorted(edit.value_bits)], edit.values, layer)
    return count
