"""A run's cache format: how a policy run stores the K/V it keeps, when it is not the model's own 16-bit cache.

Three formats implement it, each as a real implementation keeps its cache:

- :class:`~kvviz.schemes.kivi.Kivi` — KIVI's window: whole groups rounded as they leave the full-precision window;
- :class:`~kvviz.schemes.written.WrittenCache` — the engines' formats (int per token, FP8, NVFP4, …): each slot
  rounded once, when written; transformers' fp8 ``QuantizedCache`` is one of them;
- :class:`~kvviz.schemes.quanto.QuantoCache` — transformers' ``QuantizedCache`` (quanto, HQQ): a residual at full
  precision, flushed into the rounded part all together.

A run's timeline (kvviz.runs.timeline) and its compressed session ask the format what to do — which slots are rounded
before a step, how, whether a flush is due, how a pass writes its own K/V — and never which class it is, as
transformers' ``cache_utils`` asks a quantized layer to ``_quantize`` / ``_dequantize``. The defaults here are those
of a format that rounds nothing on a schedule and never flushes; each format overrides what it does.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError


class CacheFormat:
    """What a run's timeline asks of its cache format (see the module doc). Formats are frozen dataclasses: equal
    settings, equal formats."""

    kind: ClassVar[str]  # "kivi", "written" or "quanto": its key in a run's JSON document
    own: bool = False  # the passes after the first attend to their own K/V as the cache writes them (rounded)
    grouping: str = "blocks"  # "blocks": a slot is rounded once, never again; "shared": the whole prefix again
    per_slot: ClassVar[bool] = True  # a slot's rounding can be put back alone (a blame of rounded slots)

    @property
    def label(self) -> str:
        """The format in a sentence (a run's label, a chart's title)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """Its short name in a run's words."""
        return self.label

    def settings(self) -> dict:
        """Its settings as a run's JSON document writes them."""
        raise NotImplementedError

    def for_model(self, lm) -> CacheFormat:
        """This format resolved for ``lm`` (its quantizers, calibrated scales, layers kept exact), or refused in one
        line when ``lm`` cannot hold it."""
        return self

    def quantized_prefix(self, cached: int) -> int:
        """How many leading slots are rounded before a step when ``cached`` slots are cached (0: none on a
        schedule)."""
        return 0

    def edit(self, slots: range) -> Edit:
        """The rounding of ``slots`` as an :class:`~kvviz.edit.edit.Edit`."""
        return Edit()

    def after_first_pass(self, keys: torch.Tensor, values: torch.Tensor) -> CacheFormat:
        """This format once the first pass wrote ``keys`` and ``values`` ``(L, KV, n, D)`` (scales that span slots
        fixed from them); itself when none does."""
        return self

    def rounded(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """New keys and values ``(B, KV, q, D)`` of ``layer`` as the cache writes them (``own`` formats)."""
        raise NotImplementedError(f"{self.name} writes a pass's K/V as computed")

    def flush_due(self, residual: int | None, added: int) -> bool:
        """Whether a pass that added ``added`` slots to a full-precision residual of ``residual`` (None: nothing
        written yet) flushes it into the rounded part."""
        return False

    def flushed(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(KV, n, D)`` as one flush leaves them (formats that flush)."""
        raise NotImplementedError(f"{self.name} never flushes")

    @property
    def window_bits(self) -> tuple[int, int] | None:
        """The key and value bit-widths of slots rounded as they leave a full-precision window (KIVI: a slot × step
        grid of bit-widths shows when), or None for a format that rounds as it writes or flushes."""
        return None


def one_format(*formats: CacheFormat | None) -> CacheFormat | None:
    """The run's one cache format among the choices ``formats`` (None: not chosen), or None for the model's own cache;
    two chosen together are refused in one line (a run holds one cache)."""
    chosen = [each for each in formats if each is not None]
    if len(chosen) > 1:
        raise KvvizError(f"a run holds one cache: {' and '.join(each.name for each in chosen)} cannot be combined; "
                         "choose one")
    return chosen[0] if chosen else None
