"""Pure attention math on tensors (docs/math.md §2–§5). No model, no cache objects: tensors in, tensors out.

Shapes: ``H`` query heads, ``KV`` key/value heads (GQA: query head ``h`` reads KV head ``h // (H // KV)``),
``n`` visible slots, ``D`` head dim. Scores and weights are computed in float32 (or float64 if given).

Rows are slots: of ``q`` query rows over ``n`` slots, row ``i`` is the slot ``n - q + i``. A sliding ``window`` ``w``
lets it see the slots ``j`` with ``(n - q + i) − j < w`` (transformers' rule), and a soft-cap ``c`` maps each score
``s`` to ``c·tanh(s/c)`` (Gemma 2) before the mask and the softmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvviz.errors import KvvizError


def kv_head_of(head: int, heads: int, kv_heads: int) -> int:
    """The KV head that query head ``head`` reads (transformers' ``repeat_kv`` order)."""
    return head // (heads // kv_heads)


def expand_kv(tensor: torch.Tensor, heads: int, dim: int = 0) -> torch.Tensor:
    """``(KV, n, D)`` → ``(H, n, D)`` by repeating each KV head for its group of query heads; the KV axis is ``dim``
    (e.g. 1 for a per-layer mask ``(L, KV, n)``)."""
    return tensor.repeat_interleave(heads // tensor.shape[dim], dim=dim)


def causal_mask(q_len: int, n: int, device: torch.device | str | None = None, window: int | None = None) -> torch.Tensor:
    """Boolean ``(q, n)``, True where query row ``i`` — the slot ``n - q + i`` — may attend: slots ``0..n-q+i``, and
    within a sliding ``window`` only the last ``window`` of them."""
    ones = torch.ones(q_len, n, dtype=torch.bool, device=device)
    mask = ones.tril(n - q_len)
    return mask if window is None else mask & ~ones.tril(n - q_len - window)


Window = int | None | Sequence[int | None]  # one window, or one per index of the leading (layer) axis


def _allowed(q_len: int, n: int, window: Window, device: torch.device) -> torch.Tensor | None:
    """The causal-and-window mask ``(q, n)`` or, for one window per layer, ``(L, 1, q, n)``; None when a single row
    sees every slot."""
    if window is not None and not isinstance(window, int) and all(w is None for w in window):
        window = None
    if window is None or isinstance(window, int):
        return causal_mask(q_len, n, device, window) if q_len > 1 or window is not None and window < n else None
    return torch.stack([causal_mask(q_len, n, device, w) for w in window])[:, None]


def _float(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.dtype == torch.float64 else tensor.float()


def scores(query: torch.Tensor, keys: torch.Tensor, scaling: float, softcap: float | None = None) -> torch.Tensor:
    """``s = q·kᵀ · scaling`` (then ``c·tanh(s/c)`` with a ``softcap`` ``c``): query ``(..., H, q, D)``, keys
    ``(..., KV, n, D)`` → ``(..., H, q, n)``, leading dimensions (e.g. layers) batched.

    Computed per KV group (``(KV, G·q, D) @ (KV, D, n)``) so the keys are never copied ``G`` times."""
    *lead, heads, q_len, dim = query.shape
    kv = keys.shape[-3]
    grouped = _float(query).reshape(*lead, kv, heads // kv * q_len, dim) @ _float(keys).transpose(-1, -2)
    s = grouped.reshape(*lead, heads, q_len, -1).mul_(scaling)  # the product is new: scaled in place
    return s if softcap is None else torch.tanh(s / softcap) * softcap


def causal_weights(
    query: torch.Tensor, keys: torch.Tensor, scaling: float, evicted: torch.Tensor | None = None,
    dtype: torch.dtype | None = None, softcap: float | None = None, window: Window = None,
) -> torch.Tensor:
    """Softmax weights ``(H, q, n)`` where query row ``i`` is the slot ``n - q + i`` and sees slots ``0..n-q+i``
    (the last ``window`` of them in a sliding-window layer), except those ``evicted`` (bool ``(KV, n)``, per KV head).
    ``dtype`` (e.g. float64) for the softmax."""
    return visible_softmax(scores(query, keys, scaling, softcap), evicted, dtype, window, own=True)


def visible_softmax(
    s: torch.Tensor, evicted: torch.Tensor | None = None, dtype: torch.dtype | None = None, window: Window = None,
    own: bool = False, sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax of scores ``(..., H, q, n)`` over the slots row ``i`` sees (causal: ``0..n-q+i``; the last ``window``
    of them, one window or one per index of the leading axis), except those ``evicted`` (bool ``(..., KV, n)`` per
    KV head, or ``(..., KV, q, n)`` per KV head and row); leading dimensions (e.g. layers) batched. ``own``: ``s``
    may be overwritten (the caller made it for this); otherwise it is left as it was (masked on a copy).

    ``sink``: learned sink logits ``(..., H)`` (gpt-oss): one more term ``exp(σ_h)`` in each row's denominator, a
    column with no value, so the weights over slots sum to ``1 − α_sink`` (docs/math.md §3)."""
    own = own or (dtype is not None and s.dtype != dtype)  # a conversion is a copy of our own
    s = s if dtype is None else s.to(dtype)
    *lead, heads, q_len, n = s.shape
    masks = []
    allowed = _allowed(q_len, n, window, s.device)
    if allowed is not None:  # row i must not see slots after n - q + i, nor those its window left behind
        masks.append((s, ~allowed))
    if evicted is not None and evicted.dim() == s.dim():  # per KV head and row: (..., KV, q, n)
        kv = evicted.shape[-3]
        masks.append((s.view(*lead, kv, heads // kv, q_len, n), evicted[..., None, :, :]))
    elif evicted is not None:  # per KV group: (..., KV, G, q, n), without copying the mask per query head
        kv = evicted.shape[-2]
        masks.append((s.view(*lead, kv, heads // kv, q_len, n), evicted[..., None, None, :]))
    if masks and not own:
        s = s.clone()  # one copy, masked in place below (the views above are remade on it)
        return visible_softmax(s, evicted, None, window, own=True, sink=sink)
    for view, mask in masks:
        view.masked_fill_(mask, float("-inf"))
    return sink_softmax(s, sink)


def sink_softmax(s: torch.Tensor, sink: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax of masked scores ``(..., H, q, n)`` over the last axis, with a learned ``sink`` logit ``(..., H)`` as
    one more term of each denominator (none: the plain softmax): ``α_j = exp(s_j) / (Σ_k exp(s_k) + exp(σ_h))``. A
    row with every slot masked gives zeros (all its mass on the sink)."""
    if sink is None:
        return torch.softmax(s, dim=-1)
    total = torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), sink.to(s)[..., None, None])  # slots and sink
    return torch.exp(s - total)


def sink_mass(alpha: torch.Tensor) -> torch.Tensor:
    """The mass a learned sink took: ``α_sink = 1 − Σ_j α_j`` of weights ``(..., n)`` → ``(...)`` (0 without a
    sink, up to rounding)."""
    return 1 - alpha.sum(-1)


def evicted_mass(alpha: torch.Tensor, evicted: torch.Tensor) -> torch.Tensor:
    """``ρ = Σ_{e∈E} α_e`` over the last axis. ``alpha`` ``(..., n)``, ``evicted`` bool ``(..., n)`` → ``(...)``."""
    return (alpha * evicted).sum(-1)


def _check_mass(rho: torch.Tensor) -> None:
    if bool((rho >= 1).any()):
        raise KvvizError("the edit evicts every slot a head can see (ρ = 1); keep at least one slot")


def renormalized(alpha: torch.Tensor, evicted: torch.Tensor) -> torch.Tensor:
    """``α′_j = α_j / (1 − ρ)`` for retained ``j`` and 0 for evicted ones (docs/math.md §3). Refuses ``ρ = 1``."""
    rho = evicted_mass(alpha, evicted)
    _check_mass(rho)
    return alpha.masked_fill(evicted, 0.0) / (1 - rho)[..., None]


def output(alpha: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``o = Σ_j α_j v_j``: ``alpha`` ``(..., H, n)``, ``values`` ``(..., KV, n, D)`` → ``(..., H, D)``, leading
    dimensions (e.g. layers) batched; ``alpha`` ``(n,)`` with ``values`` ``(n, D)`` → ``(D,)``.

    GQA (``KV < H``) is computed per KV group, so values are never copied per query head. Computed in the values'
    precision (float64 values keep everything in float64)."""
    values = _float(values)
    alpha = _float(alpha).to(values.dtype)
    if alpha.dim() == 1:
        return alpha @ values
    *lead, heads, n = alpha.shape
    kv, dim = values.shape[-3], values.shape[-1]
    return (alpha.reshape(*lead, kv, heads // kv, n) @ values).reshape(*lead, heads, dim)


def evicted_output(o: torch.Tensor, alpha: torch.Tensor, values: torch.Tensor, evicted: torch.Tensor) -> torch.Tensor:
    """Closed form ``o′ = (o − Σ_{e∈E} α_e v_e) / (1 − ρ)`` (docs/math.md §3); shapes as in :func:`output`. Refuses ``ρ = 1``."""
    rho = evicted_mass(alpha, evicted)
    _check_mass(rho)
    return (o - output(alpha * evicted, values)) / (1 - rho)[..., None]


def evicted_change(o: torch.Tensor, alpha: torch.Tensor, values: torch.Tensor, evicted: torch.Tensor,
                   rho: torch.Tensor) -> torch.Tensor:
    """``o′ − o = (ρ o − Σ_{e∈E} α_e v_e) / (1 − ρ)``: :func:`evicted_output` minus ``o`` without subtracting ``o`` back,
    with ``ρ`` ``(..., H)`` measured already (ρ < 1: the caller checks); other shapes as in :func:`output`."""
    return (o * rho[..., None] - output(alpha * evicted, values)) / (1 - rho)[..., None]


def quantization_split(
    alpha: torch.Tensor, alpha_hat: torch.Tensor, values: torch.Tensor, value_error: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact split of ``ô − o`` (docs/math.md §4): ``(Σ (α̂−α) v, Σ α̂ ε^V)`` — weight perturbation, value content — with
    ``ε^V = v̂ − v`` the error of the values.

    ``alpha``, ``alpha_hat`` ``(..., H, n)``; ``values``, ``value_error`` ``(..., KV, n, D)`` → two ``(..., H, D)``
    (shapes as in :func:`output`).
    """
    return output(_float(alpha_hat) - _float(alpha), values), output(alpha_hat, value_error)
