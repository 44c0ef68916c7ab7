"""Mixed precision across layers and KV heads: a budget of bits shared by the model's (layer, KV head) pairs by a rule
(docs/math.md §4) — the allocation a mixed-precision KV cache makes (KVTuner, per-layer bit-widths; KIVI's keys are
the hard part, so the rule looks at the keys).

- ``uniform``: every pair at the same width, the budget's (an average that is a supported width).
- ``keyerror``: every pair starts at the lowest width; while the budget allows, the pair whose keys currently lose
  the most — ``‖K − Q_b(K)‖_F`` over the slots before the step, keys as the edit's key quantizer stores them — gets
  the next width (ties: the lower layer, then the lower KV head). The budget is an average width over the pairs:
  ``Σ b_{ℓ,h} ≤ average · L · KV``.

The result is an :class:`~kvviz.edit.edit.Edit`'s ``head_widths``: the width of every quantized slot of that layer and KV
head, keys and values alike.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch

from kvviz.errors import KvvizError
from kvviz.quant.quantizer import Quantizer, fake_quantize

RULES = ("uniform", "keyerror")
WIDTHS = (2, 3, 4, 8)  # the ladder a pair climbs (16: not quantized, never chosen)


def key_errors(cached: Sequence[torch.Tensor], keys: Quantizer) -> dict[int, torch.Tensor]:
    """Per width of :data:`WIDTHS`, each (layer, KV head)'s key error ``(L, KV)`` float64: the Frobenius norm of
    ``Q_b(K) − K`` over the cached keys, ``cached[layer]`` ``(KV, n, D)`` at slots ``0..n-1``, as ``keys`` quantizes
    them."""
    errors = {width: torch.zeros(len(cached), cached[0].shape[0], dtype=torch.float64) for width in WIDTHS}
    for layer, layer_keys in enumerate(cached):
        layer_keys = layer_keys.float()
        positions = torch.arange(layer_keys.shape[1])
        for width in WIDTHS:
            rounded = fake_quantize(layer_keys, width, keys, layer, positions)  # positions: for pre-RoPE keys
            errors[width][layer] = (rounded - layer_keys).double().square().sum((1, 2)).sqrt()
    return errors


def allocate(cached: Sequence[torch.Tensor], average: float, rule: str, keys: Quantizer
             ) -> tuple[tuple[int, ...], ...]:
    """The width of each (layer, KV head) under ``rule`` with ``average`` bits per pair on average (see the module
    doc), for the cached keys ``cached[layer]`` ``(KV, n, D)`` at slots ``0..n-1``; refuses an unknown rule, an
    average below the lowest width and a uniform average that is no width."""
    layers, kv_heads = len(cached), cached[0].shape[0]
    if rule not in RULES:
        raise KvvizError(f"the allocation rule is one of {', '.join(RULES)}, not {rule!r}")
    if not WIDTHS[0] <= average <= WIDTHS[-1]:
        raise KvvizError(f"an average of {average} bits is outside the widths {WIDTHS[0]}..{WIDTHS[-1]}")
    if rule == "uniform":
        if average not in WIDTHS:
            raise KvvizError(f"a uniform allocation needs a width ({', '.join(map(str, WIDTHS))}), not {average}")
        return ((int(average),) * kv_heads,) * layers
    errors = key_errors(cached, keys)
    widths = [[WIDTHS[0]] * kv_heads for _ in range(layers)]
    spare = average * layers * kv_heads - WIDTHS[0] * layers * kv_heads
    queue = [(-float(errors[WIDTHS[0]][layer, head]), layer, head) for layer in range(layers) for head in range(kv_heads)]
    heapq.heapify(queue)
    while queue:
        _, layer, head = heapq.heappop(queue)
        rung = WIDTHS.index(widths[layer][head])
        if rung + 1 == len(WIDTHS) or WIDTHS[rung + 1] - WIDTHS[rung] > spare:
            continue  # at the top, or the next width does not fit: the others may still climb
        spare -= WIDTHS[rung + 1] - WIDTHS[rung]
        widths[layer][head] = WIDTHS[rung + 1]
        heapq.heappush(queue, (-float(errors[WIDTHS[rung + 1]][layer, head]), layer, head))
    return tuple(tuple(row) for row in widths)
