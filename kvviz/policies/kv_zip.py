"""KVzip — Kim et al., "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction" (2025,
arXiv:2505.23416).

A slot matters if the model needs it to *repeat the context*. Extra forward passes feed, on top of the cache,
"Repeat the previous context exactly." (later chunks: "…starting with" and the previous chunk's last 8 tokens), the
chat template's assistant opening and the context again, ``chunk`` tokens at a time; a slot's score per layer and KV
head is the largest attention any repeated token of its group's query heads pays it, the softmax taken over the
sinks, the chunk being repeated and the repeat tokens themselves (causal among them). KVzip+ (``plus``) divides each
row by the repeat token's hidden-state norm and multiplies each column by ``‖v W_O‖₂``. The first ``sinks`` slots
are protected; slots of the chat template's opening (system prompt, user header: ``skip_template``) are not repeated
and score 0. The budget is shared by all layers and KV heads (``layerwise=False``: the lowest scores go, wherever
they are; ``layerwise=True``: each layer keeps the same count, shared by its KV heads).

Cost: one forward pass of about the context's length (plus ~15 tokens per chunk) over the whole cache, every time
the policy decides — once in prefill mode (:meth:`KVZip.cost`, shown by the app's Policies tab); in decode mode, before every step. This is kvpress'
``KVzipPress`` (its removal count ``int(n·L·KV·ratio)`` under a ratio budget); a slot-count budget keeps
``budget·L·KV`` in all. In a decode-mode run the repeated context is every candidate's token, evicted ones included,
and the repeat passes see the cache as the run left it.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache

import torch

from kvviz import kv_cache
from kvviz.errors import KvvizError
from kvviz.hidden_log import HiddenLog, recording
from kvviz.policies.base import Candidates, Policy, protect
from kvviz.recorder import Probe, probing

FIRST = "\n\nRepeat the previous context exactly."
LATER = "\n\nRepeat the part of the previous context exactly, starting with"
OVERLAP = 8  # tokens of the previous chunk a later chunk's prompt starts with


@dataclass(frozen=True)
class KVZip(Policy):
    name = "kv_zip"

    sinks: int = 4  # first slots always kept
    chunk: int = 2048  # context tokens repeated per pass
    layerwise: bool = False  # the same count kept in every layer (else one budget over all layers)
    plus: bool = False  # KVzip+ normalisation
    skip_template: bool = True  # the chat template's opening is not repeated (scores 0), as kvpress

    def __post_init__(self) -> None:
        for name, low in (("sinks", 0), ("chunk", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise KvvizError(f"kv_zip's {name} must be an integer ≥ {low}, got {value!r}")

    def protected(self, at: int, keep: int) -> int:
        return min(self.sinks, at)

    def score(self, candidates: Candidates) -> torch.Tensor:
        session, at = candidates.session, candidates.at
        lm = session.lm
        if lm.attention.latent is not None:
            raise KvvizError("kv_zip scores the model's own keys in its repeat pass; on latent attention (MLA) that "
                             "pass is not built yet")
        scores = torch.zeros(lm.layers, lm.kv_heads, at)
        ids = session.transcript.ids[:at]
        position = session.transcript.slots[at - 1].position + 1
        cached = [tuple(t[:, :, :at] for t in kv_cache.layer_kv(session.cache, layer)) for layer in range(lm.layers)]
        alive = candidates.alive.to(lm.device)
        for start, stop, repeat in self.passes(lm.tokenizer, ids):
            probe = _Repeat(start, stop, min(self.sinks, start), alive, scores, lm.scaling)
            log = HiddenLog(lm.layers)
            if self.plus:
                probe.hidden, probe.modules = log, lm.attention_modules
            with torch.no_grad(), probing(probe), recording(lm, log) if self.plus else nullcontext():
                lm.model(input_ids=torch.tensor([repeat], device=lm.device),
                         position_ids=torch.arange(position, position + len(repeat), device=lm.device)[None],
                         cache=kv_cache.build(lm.model.config, cached), use_cache=True, logits_to_keep=1)
        return protect(scores, slice(0, min(self.sinks, at)))

    def passes(self, tokenizer, ids: list[int]) -> list[tuple[int, int, list[int]]]:
        """Each reconstruction pass over the context ``ids``: the slots ``start..stop`` it repeats and the ids it
        feeds (the chat template's opening is left out with ``skip_template``)."""
        opening, suffix = template_parts(tokenizer)
        prefix = len(opening) if self.skip_template and ids[: len(opening)] == opening else 0
        starts = list(range(prefix, len(ids), self.chunk))
        first, later = (tokenizer.encode(t, add_special_tokens=False) for t in (FIRST, LATER))
        return [(s, min(s + self.chunk, len(ids)), (first if s == prefix else later + ids[max(prefix, s - OVERLAP): s])
                 + suffix + ids[s: s + self.chunk]) for s in starts]

    def cost(self, tokenizer, ids: list[int]) -> int:
        """Tokens the reconstruction passes feed for the context ``ids`` (one decision)."""
        return sum(len(repeat) for *_, repeat in self.passes(tokenizer, ids))

    def extra_tokens(self, session, at: int) -> int:
        return self.cost(session.lm.tokenizer, session.transcript.ids[:at])

    def budgets(self, candidates: Candidates, scores: torch.Tensor) -> torch.Tensor:
        alive = scores > float("-inf")  # (L, KV, at)
        groups = [scores[layer: layer + 1] for layer in range(scores.shape[0])] if self.layerwise else [scores]
        removed = []
        for group in groups:
            count = int((group > float("-inf")).sum())
            ratio = getattr(candidates.share, "ratio", None)
            pruned = int(count * ratio) if ratio is not None else max(
                count - candidates.keep * group.shape[0] * group.shape[1], 0)
            flat = torch.zeros(group.numel(), dtype=torch.bool)
            flat[torch.topk(-group.flatten().nan_to_num(neginf=float("inf")), pruned).indices] = True  # candidates only
            removed.append(flat.view(group.shape))
        return (alive & ~torch.cat(removed)).sum(-1)


class _Repeat(Probe):
    """Scores one reconstruction pass: per layer, the attention of the repeated tokens to the slots ``start..stop``
    (softmax over the sinks, those slots and the repeated tokens), maxed over rows and a group's query heads."""

    def __init__(self, start: int, stop: int, sinks: int, alive: torch.Tensor, scores: torch.Tensor, scaling: float):
        self.start, self.stop, self.sinks = start, stop, sinks
        self.alive, self.scores, self.scaling = alive, scores, scaling
        self.hidden: HiddenLog | None = None  # KVzip+: the repeat tokens' attention inputs, recorded as they pass
        self.modules: list[torch.nn.Module] = []

    def on_query(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor | None:
        rows, n = query.shape[2], key.shape[2]
        at = n - rows
        heads, groups = query.shape[1], key.shape[1]
        columns = torch.cat([torch.arange(self.sinks), torch.arange(self.start, self.stop), torch.arange(at, n)])
        columns = columns.to(key.device)
        logits = query[0].reshape(groups, heads // groups, rows, -1).float() @ key[0][:, columns].float().transpose(
            -1, -2)[:, None]  # (KV, G, q, m)
        logits.mul_(self.scaling)[..., -rows:].masked_fill_(
            torch.ones(rows, rows, dtype=torch.bool, device=key.device).triu(1), float("-inf"))  # causal among them
        alive = self.alive[layer]
        if not bool(alive.all()):
            logits[..., :-rows].masked_fill_(~alive[:, columns[:-rows]][:, None, None], float("-inf"))
        chunk = slice(self.sinks, self.sinks + self.stop - self.start)
        weights = torch.softmax(logits, -1)[..., chunk]
        if self.hidden is not None:  # KVzip+: rows over the repeat token's hidden norm, columns times ‖v W_O‖
            weights = weights / self.hidden.layer(layer)[-rows:].float().norm(dim=-1)[:, None]
            weights = weights * value_output_norm(self.modules[layer], value[0][:, columns[chunk]].float())[..., None, :]
        own = weights.amax((1, 2))  # (KV, chunk): the largest weight over rows and the group's query heads
        self.scores[layer, :, self.start: self.stop] = own.cpu()
        return None if bool(alive.all()) else torch.cat(
            [alive, torch.ones(groups, rows, dtype=torch.bool, device=key.device)], -1)[None]


def value_output_norm(module: torch.nn.Module, values: torch.Tensor) -> torch.Tensor:
    """``‖v W_O^h‖₂`` per query head of each group: ``(KV, G, n)`` from values ``(KV, n, D)``."""
    groups = values.shape[0]
    heads = module.config.num_attention_heads
    w_o = module.o_proj.weight.float().reshape(-1, groups, heads // groups, values.shape[-1])  # (hidden, KV, G, D)
    return torch.einsum("jhgi,hti->hgtj", w_o, values).norm(dim=-1)


@lru_cache(maxsize=8)
def _template(tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if tokenizer.chat_template is None:
        return (), tuple(tokenizer.encode("\n", add_special_tokens=False))
    dummy = "dummy context"
    separator = "\n" + "#" * len(dummy)
    text = tokenizer.apply_chat_template([{"role": "user", "content": dummy + separator}], add_generation_prompt=True,
                                         tokenize=False, enable_thinking=False)
    context, suffix = text.split(separator)
    opening = context.split(dummy)[0]
    return (tuple(tokenizer.encode(opening, add_special_tokens=False)),
            tuple(tokenizer.encode(suffix, add_special_tokens=False)))


def template_parts(tokenizer) -> tuple[list[int], list[int]]:
    """The chat template's opening before a user message's text and its assistant opening after it, as ids (how
    kvpress' KVzipPress finds them: a dummy message rendered and split)."""
    opening, suffix = _template(tokenizer)
    return list(opening), list(suffix)
