"""Multi-head latent attention (MLA: DeepSeek-V2 / V3, Kimi K2, GLM-5) as kvviz reads it (docs/math.md §2).

An MLA layer caches, per token, one latent ``c`` (``kv_lora_rank`` wide, after its norm) and one RoPE key ``r``
(``qk_rope_head_dim`` wide, rotated), shared by every head — transformers' cache holds them as the layer's "keys"
and "values". Head ``h`` expands them: its key is ``[W_UK_h c ; r]`` and its value ``W_UV_h c`` (``kv_b_proj``).
kvviz works in the *absorbed* form that MLA decode kernels use (vLLM, FlashMLA): the recorded query of head ``h`` is
``q̃_h = [W_UK_hᵀ q_nope_h ; q_rope_h]``, so its score with slot ``j`` is ``q̃_h · [c_j ; r_j]`` — the same number as
``q_h · k_{h,j}`` up to float rounding — and its output ``W_UV_h Σ_j α_j c_j``. The cache is then one KV head of
``kv_lora_rank + qk_rope_head_dim`` channels read by all query heads: an eviction removes a token's latent for every
head at once, as the model's cache can only do.

The model's attention module expands the latent before it calls the attention function, which then sees the
expanded per-head keys only; :func:`install` makes each MLA module report the latent it expanded (a context
variable, so concurrent forwards on other threads never see it), and :func:`stored` reads it in the attention
function.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

import torch

_stored: ContextVar[tuple[torch.Tensor, torch.Tensor] | None] = ContextVar("kvviz_latent", default=None)


@dataclass(frozen=True, eq=False)
class Latent:
    """The value up-projections of every MLA layer, ``up_values`` ``(L, H, Dv, R)`` (``W_UV``), ``R`` the latent's
    width: what turns the averaged latents into the heads' outputs (the key side, ``W_UK``, is absorbed into each
    recorded query by :func:`absorbed`)."""

    up_values: torch.Tensor

    def project(self, outputs: torch.Tensor) -> torch.Tensor:
        """Per-head outputs in latent space ``(L, H, R)`` (``Σ α c``) → as the model's heads give them
        ``(L, H, Dv)`` (``W_UV_h`` applied), in the outputs' precision."""
        return torch.einsum("lhr,lhvr->lhv", outputs, self.up_values.to(outputs))


def absorbed(module: torch.nn.Module, query: torch.Tensor) -> torch.Tensor:
    """An MLA module's query ``(B, H, q, nope + rope)`` as transformers computes it (RoPE applied) → the absorbed
    query ``(B, H, q, R + rope)``: ``[W_UK_hᵀ q_nope ; q_rope]`` per head."""
    nope = module.qk_nope_head_dim
    up = module.kv_b_proj.weight.view(module.num_heads, nope + module.v_head_dim, -1)[:, :nope]  # (H, nope, R)
    return torch.cat((torch.einsum("bhqd,hdr->bhqr", query[..., :nope], up.to(query.dtype)), query[..., nope:]), dim=-1)


def read(modules: list[torch.nn.Module]) -> Latent | None:
    """The :class:`Latent` of a model's attention ``modules`` (None: not MLA). Refuses (``ValueError``) modules whose
    latent kvviz cannot read (no ``expand_kv``, as transformers' DeepSeek-V3 attention has)."""
    if not all(hasattr(m, "kv_b_proj") for m in modules):
        return None
    if not all(callable(getattr(m, "expand_kv", None)) for m in modules):
        raise ValueError("latent attention without transformers' expand_kv")
    ups = [m.kv_b_proj.weight.detach().float().view(m.num_heads, m.qk_nope_head_dim + m.v_head_dim, -1)
           for m in modules]  # (H, nope + Dv, R) each: W_UK's rows, then W_UV's
    return Latent(torch.stack([up[:, m.qk_nope_head_dim:] for up, m in zip(ups, modules)]))


def install(modules: list[torch.nn.Module]) -> None:
    """Make each MLA module report the latent and RoPE key it expands (idempotent): its ``expand_kv`` sets them for
    the attention call that follows (:func:`stored`)."""
    for module in modules:
        if getattr(module, "_kvviz_reports", False):
            continue
        expand = module.expand_kv

        def reporting(kv_nope: torch.Tensor, k_rot: torch.Tensor, expand=expand):
            _stored.set((kv_nope, k_rot))
            return expand(kv_nope, k_rot)

        module.expand_kv, module._kvviz_reports = reporting, True


def stored() -> tuple[torch.Tensor, torch.Tensor] | None:
    """The latent ``(B, 1, n, R)`` and RoPE key ``(B, 1, n, rope)`` the current MLA attention call expanded (the
    whole cache after this step's update), once: a later call of another layer sets its own."""
    found = _stored.get()
    _stored.set(None)
    return found
