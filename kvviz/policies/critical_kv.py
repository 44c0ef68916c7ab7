"""CriticalKV — Feng et al., "Identify Critical KV Cache in LLM Inference from an Output Perturbation Perspective"
(2025, arXiv:2502.03805).

A wrapper: another policy (``inner``, by name as for ChunkKV) scores the candidates, and the budget is chosen in two
stages. Stage 1 keeps the inner policy's best ``first_stage`` share of the budget outright; stage 2 ranks the rest
by the inner score rescaled by how much each slot's value can move the layer's output, ``(s_i + ε)·‖v_i W_O‖₁``
(the L1 norm of the value projected by its query head's slice of the output projection, averaged over the query
heads of the KV group). This is kvpress' ``CriticalKVPress``: stage 1 takes ``max(1, int(kept share · n ·
first_stage))`` slots (a slot count budget: ``int(budget · first_stage)``) and gives them the float32 maximum as
score; protected slots of the inner policy (``+inf``) score one above the layer's highest finite score first, as
kvpress pads a protected window. ``ties="topk"`` keeps among equal final scores what ``torch.topk`` keeps, as kvpress.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates, TopkTies, checked_scores, choice
from kvviz.policies.inner import inner_policy

INNER = ("snapkv", "key_norm", "key_diff", "cur", "expected_attention", "tova", "h2o", "observed_attention", "lag_kv",
         "streaming_llm", "kvpress:KnormPress", "kvpress:KeyDiffPress", "kvpress:CURPress", "kvpress:SnapKVPress")


@dataclass(frozen=True)
class CriticalKV(TopkTies):
    name = "critical_kv"

    inner: str = choice(*INNER)  # the first-stage scorer
    first_stage: float = 0.5  # share of the budget chosen by the inner score alone
    epsilon: float = 1e-4  # added to the inner score before the rescaling

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, high in (("first_stage", 1), ("epsilon", float("inf"))):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high:
                raise KvvizError(f"critical_kv's {name} must be a number from 0 to {high:g}, got {value!r}")

    def score(self, candidates: Candidates) -> torch.Tensor:
        lm = candidates.session.lm
        inner = checked_scores(inner_policy(self.inner), candidates)  # (L, KV, at)
        inner = torch.where(candidates.alive, inner, float("-inf"))
        top = torch.finfo(torch.float32).max
        scores = []
        for layer in range(lm.layers):
            own = inner[layer].clone()  # (KV, at)
            finite = own[own.isfinite()]
            own[own == float("inf")] = (float(finite.max()) if len(finite) else 0.0) + 1  # kvpress' padding
            first = self.first_stage_count(candidates)
            chosen = torch.topk(own, first, dim=-1, sorted=True).indices if first else None
            rescaled = (own + self.epsilon) * held_norms(candidates, layer)
            if chosen is not None:
                rescaled.scatter_(-1, chosen, top)
            scores.append(rescaled)
        return torch.stack(scores)

    def first_stage_count(self, candidates: Candidates) -> int:
        """Slots stage 1 keeps per layer and KV head (kvpress' ``selection_budget``)."""
        if self.first_stage == 0:
            return 0
        share = candidates.share
        count = int(share * candidates.at * self.first_stage) if share is not None else int(
            candidates.keep * self.first_stage)
        return min(max(1, count), candidates.at)


def held_norms(candidates: Candidates, layer: int) -> torch.Tensor:
    """:func:`output_l1` of ``layer``'s candidates, ``(KV, at)`` on the CPU. In a run, extended slot by slot from the
    run's earlier decisions (kept in ``candidates.scratch``): only new slots are projected, and a slot whose value
    changed since (a quantized run) is projected again with every slot after it."""
    module, values = candidates.module(layer), candidates.values(layer).float()  # (KV, at, D)
    if candidates.scratch is None:
        return output_l1(module, values).cpu()
    old_values, old = candidates.scratch.get(("critical_kv", layer), (values[:, :0], torch.zeros(values.shape[0], 0)))
    same = min(old_values.shape[1], values.shape[1])
    if not torch.equal(old_values[:, :same], values[:, :same]):
        same = 0
    norms = torch.cat([old[:, :same], output_l1(module, values[:, same:]).cpu()], 1)
    candidates.scratch[("critical_kv", layer)] = (values.clone(), norms)
    return norms


def output_l1(module: torch.nn.Module, values: torch.Tensor) -> torch.Tensor:
    """``‖v W_O^h‖₁`` for every slot, averaged over the query heads ``h`` of each KV group: ``(KV, n)`` from values
    ``(KV, n, D)`` and the attention module's ``o_proj`` (weight ``(hidden, H·D)``)."""
    heads, dim = module.config.num_attention_heads, values.shape[-1]
    groups = heads // values.shape[0]
    w_o = module.o_proj.weight.float().t().reshape(heads, dim, -1)  # (H, D, hidden)
    norms = torch.stack([(values[h // groups] @ w_o[h]).abs().sum(-1) for h in range(heads)])  # (H, n)
    return norms.reshape(values.shape[0], groups, -1).mean(1)
