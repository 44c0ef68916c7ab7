"""kvpress' own code in kvviz: a press object — one of kvpress' own, or a user's ``BasePress`` / ``ScorerPress``
subclass — run unchanged through kvpress' seam, ``compress(module, hidden_states, keys, values, attentions, kwargs)``,
layer by layer, as kvpress' forward hook calls it after a prompt's forward pass.

kvpress 0.5.5's hook reads ``past_key_values`` and ``cache_position`` from the attention's arguments, which
transformers renamed or dropped after 5.2; kvviz does not use the hook. It calls ``compress`` itself with what the hook
would pass: the layer's attention ``module`` (``rotary_emb`` attached for the call, as kvpress' ``__call__`` does),
``hidden_states`` ``(1, at, hidden)`` (the attention's input, after the layer's norm), the cached ``keys`` / ``values``
``(1, KV, at, D)`` post-RoPE, ``attentions`` None as under kvpress' default sdpa attention (``eager=True``: the weights
``(1, H, at, at)`` eager attention would give, from the recorded queries), and ``kwargs`` with ``hidden_states``,
``position_embeddings`` (the rotary ``cos, sin`` ``(1, at, D)``), ``position_ids``, ``cache_position`` and
``attention_mask`` None.

What comes back is read as kvpress' cache would hold it: keys and values of fewer slots are the kept ones (found row by
row: each returned row must equal one input slot's key and value); ``module.masked_key_indices`` (AdaKV's head-wise
eviction) are evicted. A press that returns other contents (merged or pruned) is refused naming the edits kvviz makes
instead. A class with kvpress' ``score`` method and no ``compress`` (kvpress' ``ScorerPress`` shape, written without
importing kvpress) is compressed as ``ScorerPress.compress`` does: ``scores.topk(int(at·(1 − ratio)))``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import sys
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from kvviz.errors import USER_CODE_ERRORS, KvvizError, failure
from kvviz.hidden_log import HiddenLog, recording
from kvviz.policies.base import Candidates, Policy, Ratio
from kvviz.policies.decision import Decision
from kvviz.policies.kvpress.mirror import advance, hook_ready, matched, mirror_of


def kvpress():
    """The ``kvpress`` package (0.5.5, installed by the setup), with its global attention patch undone."""
    try:
        import kvpress as package
    except ImportError as exc:
        raise KvvizError(f"kvpress is not installed here ({exc}); bash scripts/setup.sh installs kvpress 0.5.5") \
            from None
    unpatch()
    return package


def unpatch() -> None:
    """Take kvpress' wrappers out of transformers' attention functions (kvpress wraps every one when it is imported,
    to fake keys for head-wise eviction; kvviz evicts with masks and its own attention)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    for name in [n for n, f in local.items() if getattr(f, "__module__", "") == "kvpress.attention_patch"]:
        del local[name]


def press_name(press: object) -> str:
    return type(press).__name__


def with_ratio(press: object, ratio: float) -> object:
    """A copy of ``press`` with kvpress' ``compression_ratio`` set (the press itself is left as it was)."""
    if not any("compression_ratio" in vars(c) or "compression_ratio" in getattr(c, "__annotations__", {})
               for c in type(press).__mro__):
        return press
    press = copy.deepcopy(press)  # a wrapper's ratio is its inner press's: the copy holds its own
    try:
        press.compression_ratio = ratio
    except AttributeError:  # an adaptive press (DMS' threshold, SimLayerKV's lazy layers) decides its own count
        pass
    return press


def acts_while_decoding(press: object) -> bool:
    """Whether ``press`` has a ``forward_hook`` of its own (kvpress' decoding presses, ComposedPress …): it keeps
    state between the model's passes and runs on a mirror of kvpress' cache (:mod:`~kvviz.policies.kvpress.mirror`)."""
    hook = getattr(type(press), "forward_hook", None)
    base = sys.modules.get("kvpress.presses.base_press")
    return hook is not None and (base is None or hook is not base.BasePress.forward_hook)


def adaptive(press: object) -> bool:
    """Whether ``press`` decides how many slots it keeps (its ``compression_ratio`` cannot be set)."""
    try:
        copy.deepcopy(press).compression_ratio = 0.5
    except AttributeError:
        return True
    return False


@dataclass(frozen=True)
class PressCode(Policy):
    """A kvpress press object run through its own ``compress``. Under a :class:`~kvviz.policies.base.Ratio` budget
    the run's ratio is the press's ``compression_ratio``; under a slot budget ``k`` of ``n`` it is
    ``1 − (k + ½)/n``, which kvpress rounds to ``k``."""

    name = "kvpress_code"
    reads_hidden = True

    instance: object = field(default=None, metadata={"hidden": True})  # the press object (no widget)
    eager: bool = False  # hand the press eager attention's weights, as kvpress does under attn_implementation="eager"
    seed: int | None = 0  # torch's generator seeded so before each decision (a press that draws: LeverageScore's sketch);
    # None: as the process has it

    def __post_init__(self) -> None:
        if not (callable(getattr(self.instance, "compress", None)) or callable(getattr(self.instance, "score", None))):
            raise KvvizError(f"{press_name(self.instance)} is not a kvpress press: it has no compress(module, "
                             "hidden_states, keys, values, attentions, kwargs) or score(...) method")
        refused = next((REFUSED[c.__name__] for c in type(self.instance).__mro__ if c.__name__ in REFUSED), None)
        if refused:
            raise KvvizError(f"kvviz does not run kvpress' {press_name(self.instance)}: {refused}")

    @functools.cached_property
    def decides_count(self) -> bool:  # once per policy: adaptive() copies the press, and runs ask before every step
        return adaptive(self.instance) or acts_while_decoding(self.instance)

    def settings(self) -> dict[str, object]:
        own = {name: getattr(self.instance, name, None) for name in arguments_of(type(self.instance))
               if name != "compression_ratio"}  # the ratio is the run's budget
        shown = {k: v if isinstance(v, (bool, int, float, str)) or v is None else press_name(v) for k, v in own.items()}
        return {"press": press_name(self.instance), **shown, **_own(self)}

    def score(self, candidates: Candidates) -> torch.Tensor:
        return self.decide(candidates).scores

    def decide(self, candidates: Candidates) -> Decision:
        lm, at = candidates.session.lm, candidates.at
        kept = torch.zeros(lm.layers, lm.kv_heads, at, dtype=torch.bool)
        scores = torch.zeros(lm.layers, lm.kv_heads, at)
        name, layer = press_name(self.instance), None
        try:
            with torch.random.fork_rng(devices=[]) if self.seed is not None else contextlib.nullcontext():
                if self.seed is not None:
                    torch.manual_seed(self.seed)
                if acts_while_decoding(self.instance):  # kvpress' cache mirrored step by step (mirror.py)
                    kept, scores = advance(mirror_of(candidates, self.instance), candidates, _hidden(candidates),
                                           lm.model.model.rotary_emb)
                else:
                    press = self._press_for(candidates)
                    hidden = _hidden(candidates)
                    positions = candidates.positions()
                    cos_sin = candidates.position_embeddings()
                    cache = DynamicCache()
                    for index in range(lm.layers):  # kvpress' hooks read the layer's keys and values from the cache,
                        cache.update(candidates.keys(index)[None], candidates.values(index)[None],  # by decoder layer
                                     candidates.module(index).layer_idx)
                    if callable(getattr(press, "post_init_from_model", None)):
                        press.post_init_from_model(lm.model)
                    for layer in range(lm.layers):
                        kept[layer], scores[layer] = self._layer(press, candidates, layer, hidden.layer(layer)[:at],
                                                                 positions, cos_sin, cache)
        except KvvizError:
            raise
        except USER_CODE_ERRORS as exc:
            where = "" if layer is None else f" in layer {layer}"
            raise KvvizError(f"kvpress' {name} failed{where}: {failure(exc)}") from exc
        alive = candidates.alive
        kept &= alive
        empty = (alive.any(-1) & ~kept.any(-1)).nonzero()
        if len(empty):
            layer, head = empty[0].tolist()
            raise KvvizError(f"kvpress' {name} kept no slot of {int(alive[layer, head].sum())} in layer {layer}, "
                             f"KV head {head} (and {len(empty) - 1} more heads): a head left empty has nothing to "
                             "attend to; give it a budget that keeps at least one slot (a lower compression ratio)")
        scores = torch.where(alive, scores, float("-inf"))
        budgets = kept.sum(-1).clamp(min=1)
        positions = torch.arange(at).expand_as(scores)
        order = torch.argsort(positions, dim=-1)  # kept first, then by score (higher first), then earlier first
        order = order.gather(-1, torch.argsort(scores.gather(-1, order), dim=-1, descending=True, stable=True))
        order = order.gather(-1, torch.argsort((~kept).gather(-1, order).byte(), dim=-1, stable=True))
        rank = torch.empty_like(order).scatter_(-1, order, positions.contiguous())
        return Decision(at, scores, budgets, alive, alive & ~kept, rank)

    def _press_for(self, candidates: Candidates) -> object:
        share = candidates.share
        if isinstance(share, Ratio):
            return with_ratio(self.instance, share.ratio)
        return with_ratio(self.instance, 1 - (candidates.keep + 0.5) / candidates.at)

    def _layer(self, press: object, candidates: Candidates, layer: int, hidden: torch.Tensor, positions: torch.Tensor,
               cos_sin: tuple[torch.Tensor, torch.Tensor], cache: DynamicCache) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept slots ``(KV, at)`` bool and the press's scores ``(KV, at)`` (kept 1, evicted 0 where it has no
        ``score`` of its own) in ``layer``."""
        lm, at = candidates.session.lm, candidates.at
        module = candidates.module(layer)
        keys, values = candidates.keys(layer)[None], candidates.values(layer)[None]
        attentions = _eager(candidates, layer) if self.eager else None
        kwargs = {"hidden_states": hidden[None], "position_embeddings": cos_sin, "attention_mask": None,
                  "past_key_values": cache,
                  "cache_position": torch.arange(at, device=keys.device), "position_ids": positions}
        seen: list[torch.Tensor] = []
        own_score = getattr(press, "score", None)
        if callable(own_score):  # the scores the outer press ranked by, kept for "why did this slot go?"
            def score(*args, **kw):
                result = own_score(*args, **kw)
                seen.append(result)
                return result
            object.__setattr__(press, "score", score)
        try:
            with hook_ready(module, lm.model.model.rotary_emb), torch.no_grad():
                if callable(getattr(press, "forward_hook", None)):  # kvpress' hook, as after a prompt's forward
                    press.forward_hook(module, [], kwargs, (None, attentions))
                    left = cache.layers[module.layer_idx]  # a hybrid's decoder layers number the cache
                    out_keys, out_values = left.keys, left.values
                elif callable(getattr(press, "compress", None)):
                    out_keys, out_values = press.compress(module, hidden[None], keys, values, attentions, kwargs)
                else:
                    out_keys, out_values = _scorer_compress(press, module, hidden[None], keys, values, attentions,
                                                            kwargs)
                masked = module.masked_key_indices
        finally:
            if callable(own_score):
                object.__delattr__(press, "score")
        kept = _found(press_name(press), keys[0], values[0], out_keys[0], out_values[0])
        if masked is not None:
            _, heads, slots = masked
            kept[heads.cpu(), slots.cpu()] = False
        score = seen[0][0].float().cpu() if seen and tuple(seen[0].shape) == (1, lm.kv_heads, at) else kept.float()
        return kept, score


NEEDS = {  # presses whose scores come from trained weights or statistics published per model, downloaded by name
    "QFilterPress": "query filters trained for the model (downloaded from the Hugging Face Hub)",
    "KVzapPress": "a scorer model trained for the model (downloaded from the Hugging Face Hub)",
    "FastKVzipPress": "gates trained for the model (downloaded from the Hugging Face Hub)",
    "RestoreKVPress": "restoration weights trained for the model (downloaded from the Hugging Face Hub)",
    "DuoAttentionPress": "per-head retrieval / streaming patterns learned for the model (downloaded from GitHub)",
    "ExpectedAttentionStatsPress": "query statistics gathered for the model (downloaded from the Hugging Face Hub)",
    "LUKVPress": "per-layer importance curves measured for the model (downloaded from GitHub)",
}
REFUSED = {  # presses whose work is not at kvpress' compress / forward_hook seam, and why
    "KVgradPress": "it replays the context through the model with backward passes inside its own __call__ (KVzip's "
                   "passes scored by gradients); the nearest: kv_zip (kvpress:KVzipPress)",
    "KVComposePress": "it patches the model's forward and replays the context inside its own __call__, fitting "
                      "aggregators on the attention of those passes; the nearest: kv_zip (kvpress:KVzipPress)",
    "FinchPress": "its window is the question, found by a delimiter token kvpress' pipeline adds to the tokenizer, "
                  "and it re-rotates the kept keys; the nearest: snapkv with the question's length as its window",
    "CAMPress": "it merges evicted values into kept ones while decoding; not run yet (kvviz's merging is an edit: "
                "whatif --merge)",
}
SIMPLE = (bool, int, float, str)


def own_presses() -> dict[str, type]:
    """kvpress' press classes by name (its ``__all__`` less the pipeline)."""
    package = kvpress()
    return {name: getattr(package, name) for name in package.__all__ if name.endswith("Press")}


def press_policy(name: str, arguments: dict[str, object]) -> PressCode:
    """kvpress' press ``name`` made with ``arguments`` (kvpress' names; text read as each field's type, a press-valued
    field from a press name, itself made with its defaults), as a policy running its own code."""
    classes = own_presses()
    if name not in classes:
        raise KvvizError(f"kvpress 0.5.5 has no press {name!r}")
    return policy_class(classes[name])(**_texts(classes[name], name, arguments))


def build(name: str, arguments: dict[str, object]) -> object:
    """kvpress' press ``name`` made with ``arguments`` (as :func:`press_policy` reads them)."""
    return press_policy(name, arguments).instance


def _texts(press_class: type, name: str, arguments: dict[str, object]) -> dict[str, object]:
    from kvviz.policies.by_name import _parsed

    known = {k: default for k, (default, _) in arguments_of(press_class).items()}
    known.update({f.name: f.default for f in dataclasses.fields(PressCode) if f.name != "instance"})  # eager, seed
    unknown = sorted(set(arguments) - set(known))
    if unknown:
        raise KvvizError(f"kvpress' {name} has no argument {unknown[0]!r}; its arguments: {', '.join(known) or 'none'}")
    return {k: _parsed(name, k, v, known[k]) if isinstance(v, str) else v for k, v in arguments.items()}


def arguments_of(press_class: type) -> dict[str, tuple[object, str]]:
    """The arguments ``press_class(...)`` takes: name → (default, annotation); None where there is no default (a
    dataclass field's factory is called)."""
    try:
        parameters = inspect.signature(press_class).parameters.values()
    except (TypeError, ValueError):
        return {}
    fields = {f.name: f for f in dataclasses.fields(press_class)} if dataclasses.is_dataclass(press_class) else {}
    found = {}
    for parameter in parameters:
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            continue
        default = None if parameter.default is parameter.empty else parameter.default
        spec = fields.get(parameter.name)
        if spec is not None and spec.default_factory is not dataclasses.MISSING:
            default = spec.default_factory()
        found[parameter.name] = (default, str(parameter.annotation))
    return found


def policy_class(press_class: type) -> type[PressCode]:
    """A kvviz policy class running ``press_class`` (a kvpress press, or a user's subclass) through its own code: its
    arguments with a plain default (numbers, text, switches; a wrapped press by its class name) are the policy's
    fields, by kvpress' names; ``compression_ratio`` is the run's budget. Its name is the press's class name."""
    fields, presses = [], {}
    for argument, (default, annotation) in arguments_of(press_class).items():
        if argument == "compression_ratio" or argument.startswith("_"):
            continue
        if callable(getattr(default, "compress", None)) or callable(getattr(default, "score", None)) \
                or (default is None and "Press" in annotation):  # a wrapped press, by its class name
            fields.append((argument, object, field(default=None if default is None else type(default).__name__)))
            presses[argument] = True
        elif isinstance(default, SIMPLE) or default is None:
            fields.append((argument, object, field(default=default)))

    def __post_init__(self) -> None:
        given = {f: getattr(self, f) for f, *_ in fields}
        for key in presses:  # a wrapped press named by its class: kvpress' own, made with its defaults
            if isinstance(given[key], str):
                given[key] = build(given[key], {})
        try:
            press = press_class(**given)
        except KvvizError:
            raise
        except USER_CODE_ERRORS as exc:
            raise KvvizError(f"cannot make kvpress' {press_class.__name__}: {failure(exc)}") from None
        object.__setattr__(self, "instance", press)
        PressCode.__post_init__(self)

    def settings(self) -> dict[str, object]:
        return {**{f: getattr(self, f) for f, *_ in fields}, **_own(self)}

    return dataclasses.make_dataclass(
        press_class.__name__, [(n, t, f) for n, t, f in fields], bases=(PressCode,), frozen=True,
        namespace={"name": press_class.__name__, "press_class": press_class, "__post_init__": __post_init__,
                   "settings": settings, "__module__": press_class.__module__})


def _own(policy: PressCode) -> dict[str, object]:
    """kvviz's own settings of a press run, where not their defaults."""
    return {**({"eager": True} if policy.eager else {}), **({} if policy.seed == 0 else {"seed": policy.seed})}


def _scorer_compress(press, module, hidden, keys, values, attentions, kwargs):
    """kvpress' ``ScorerPress.compress``: keep ``scores.topk(int(at·(1 − ratio)))`` per KV head."""
    ratio = getattr(press, "compression_ratio", 0.0)
    if ratio == 0:
        return keys, values
    scores = press.score(module, hidden, keys, values, attentions, kwargs)
    indices = scores.topk(int(keys.shape[2] * (1 - ratio)), dim=-1).indices
    indices = indices.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
    return keys.gather(2, indices), values.gather(2, indices)


def _found(name: str, keys: torch.Tensor, values: torch.Tensor, out_keys: torch.Tensor,
           out_values: torch.Tensor) -> torch.Tensor:
    """Which of the slots ``keys`` / ``values`` ``(KV, at, D)`` the press kept, from what it returned
    ``(KV, n, D)``: ``(KV, at)`` bool."""
    rows = matched(name, keys, values, out_keys, out_values)
    return torch.zeros(keys.shape[:2], dtype=torch.bool, device=rows.device).scatter_(-1, rows, True).cpu()


def _hidden(candidates: Candidates) -> HiddenLog:
    """The attention layers' inputs for the candidates: a policy run's record, or — for a one-shot decision on a
    session with no committed edit — one forward pass over the conversation's slots without a cache (what the
    cached passes computed, up to float32 rounding of another batch shape)."""
    if candidates.hidden is not None:
        return candidates.hidden
    session, at = candidates.session, candidates.at
    if len(session.commits.stack):
        raise KvvizError("a kvpress press reads the attention layers' inputs, which an edited cache changed: run it "
                         "as a policy run (prefill mode), or on the conversation with no committed edit")
    lm = session.lm
    log = HiddenLog(lm.layers)
    ids = torch.tensor([session.transcript.ids[:at]], device=lm.device)
    positions = torch.tensor([[s.position for s in session.transcript.slots[:at]]], device=lm.device)
    with torch.no_grad(), recording(lm, log):
        lm.model(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=1)
    return log


def _eager(candidates: Candidates, layer: int) -> torch.Tensor:
    """Eager attention's weights over the candidates, as each slot's query saw the slots before it:
    ``(1, H, at, at)`` float32 from the recorded queries and the cached keys."""
    lm, at = candidates.session.lm, candidates.at
    queries = candidates.queries(layer, slice(0, at)).float()  # (H, at, D)
    keys = candidates.keys(layer).float().repeat_interleave(lm.heads // lm.kv_heads, 0)  # (H, at, D)
    logits = queries @ keys.transpose(1, 2) * lm.scaling
    logits = logits.masked_fill(torch.ones(at, at, dtype=torch.bool, device=logits.device).triu(1), float("-inf"))
    return logits.softmax(-1)[None]
