"""kvpress presses by their own names: the kvviz policy and settings that reproduce each (NVIDIA's kvpress 0.5.5,
the library KV-compression research benchmarks with).

A press with a kvviz counterpart maps to one policy, its arguments to the policy's fields, plus the fields that make
kvviz follow kvpress' conventions (SnapKV's average pooling and whole window, TOVA's kept last token, RandomPress' draw
per KV head, PyramidKV's KVCache-Factory schedule); ``compression_ratio`` becomes a :class:`~kvviz.policies.base.Ratio`
budget, rounded as kvpress rounds. Wrappers: ``AdaKVPress(press=SnapKVPress)`` is ``ada_kv``; ``KeyRerotationPress``
re-rotates the kept keys; ``DecodingPress(base_press=…)`` runs the base press in mode ``after_steps``;
``ChunkKVPress(press=…)`` is ``chunk_kv`` and ``CriticalKVPress(press=…)`` ``critical_kv``. Every other press of
kvpress, a press object (:func:`from_press`) and a user's press class run their own code
(:mod:`kvviz.policies.kvpress.own_code`); presses that need downloaded weights or act outside kvpress' compress seam
are refused in one line saying why. Parity is prefill compression: kvpress compresses a prompt once after its forward pass, as kvviz's
``prefill`` mode does.
"""

from __future__ import annotations

import difflib

from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass, field

from kvviz.errors import KvvizError
from kvviz.numbers import press_budgets
from kvviz.policies.base import Policy, Ratio
from kvviz.policies.by_name import policy_named
from kvviz.policies.kvpress.own_code import NEEDS, PressCode, acts_while_decoding, own_presses, press_policy

SNAPKV = {"window": 64, "kernel": 5, "pooling": "avg", "window_kept": "all", "votes": "mean"}
SNAPKV_ARGUMENTS = {"window_size": "window", "kernel_size": "kernel"}


@dataclass(frozen=True)
class Press:
    """One press: the kvviz policy, kvpress argument → policy field, and the fields fixed by kvpress' conventions."""

    policy: str
    arguments: Mapping[str, str] = field(default_factory=dict)
    conventions: Mapping[str, object] = field(default_factory=dict)


PRESSES: dict[str, Press] = {
    "StreamingLLMPress": Press("streaming_llm", {"n_sink": "sinks"}),
    "KnormPress": Press("key_norm", conventions={"ties": "topk"}),
    "TOVAPress": Press("tova", conventions={"keep_last": True}),
    "SnapKVPress": Press("snapkv", SNAPKV_ARGUMENTS, SNAPKV),
    "PyramidKVPress": Press("pyramid_kv", {**SNAPKV_ARGUMENTS, "beta": "beta"},
                            {**SNAPKV, "beta": 20.0, "schedule": "kvpress"}),
    "ObservedAttentionPress": Press("observed_attention"),
    "RandomPress": Press("random", {"seed": "seed"}, {"per_head": True}),
    "KeyDiffPress": Press("key_diff", conventions={"ties": "topk"}),
    "ExpectedAttentionPress": Press("expected_attention", {"n_future_positions": "future", "n_sink": "sinks",
                                                           "use_covariance": "covariance", "use_vnorm": "vnorm",
                                                           "epsilon": "epsilon"}, {"ties": "topk"}),
    "LagKVPress": Press("lag_kv", {"n_sink": "sinks", "lag_size": "lag", "cross_scoring": "cross_scoring"},
                        {"ties": "topk"}),
    "CURPress": Press("cur", {"num_sinks": "sinks", "leverage_type": "leverage", "use_local_approximation": "local",
                              "local_window_size": "window"}, {"ties": "topk"}),
    "KVzipPress": Press("kv_zip", {"n_sink": "sinks", "chunk_size": "chunk", "layerwise": "layerwise",
                                   "kvzip_plus_normalization": "plus"}),
}
NEAREST = {  # presses kvviz does not run → the nearest kvviz policy, for the refusal
    "FastKVzipPress": "kv_zip",
    "ThinKPress": "the ThinK pruning edit (whatif --think R; kvviz.policies.reshaping.think): it prunes channels, "
                  "not slots",
    "MergingPress": "an eviction merged into the kept slots (whatif --policy … --merge; "
                    "kvviz.policies.reshaping.merge_evicted)", "QFilterPress": "key_norm", "DuoAttentionPress": "streaming_llm",
}
WRAPPERS = ("AdaKVPress", "ChunkKVPress", "CriticalKVPress", "DecodingPress", "KeyRerotationPress")
DECODING = {"compression_interval": 512, "target_size": 2048, "hidden_states_buffer_size": 256}  # kvpress' defaults
SCORE_ONLY = ("KnormPress", "KeyDiffPress")  # scores of keys alone: no protected window, no queries, any cache order
UNPROTECTED = (*SCORE_ONLY, "CURPress", "SnapKVPress")  # what kvviz's wrappers reproduce kvpress' wrappers over


ADAKV = Press("ada_kv", {**SNAPKV_ARGUMENTS, "alpha_safeguard": "floor"}, SNAPKV)
WRAPPED = {  # wrappers over an unprotected press: (kvviz policy, kvpress argument → field)
    "ChunkKVPress": ("chunk_kv", {"chunk_length": "chunk"}),
    "CriticalKVPress": ("critical_kv", {"epsilon": "epsilon", "first_stage_ratio": "first_stage"}),
}


@dataclass(frozen=True)
class KvpressPolicy:
    """What a press becomes in kvviz: the policy, the budget its ``compression_ratio`` gives (None: none given), and
    the positions kept keys take (``rerotated`` under ``KeyRerotationPress``)."""

    policy: Policy
    ratio: Ratio | int | None  # the budget: a ratio, or DecodingPress' target_size in slots
    positions: str = "original"
    mode: str = "prefill"  # kvpress compresses a prompt once; DecodingPress after every N decode steps
    every: int = 1


def from_kvpress(press: str | type, /, classes: Mapping[str, type[Policy]] | None = None,
                 **arguments: object) -> KvpressPolicy:
    """The kvviz policy that reproduces kvpress' ``press`` (its class or class name) with ``arguments`` (kvpress'
    names; text values are read as the field's type). ``classes``: the policies to build from (default: built-ins)."""
    from kvviz.policies import POLICIES

    name = press if isinstance(press, str) else getattr(press, "__name__", type(press).__name__)
    arguments = dict(arguments)
    budgets = press_budgets(arguments, name)  # compression_ratio, compression_interval, target_size: numbers
    arguments.update(budgets)
    ratio = arguments.pop("compression_ratio", None)
    ratio = None if ratio is None else Ratio(ratio)
    if not isinstance(press, str) and name not in (*PRESSES, *WRAPPERS):  # a press object or class: its own code
        instance = press(**arguments) if isinstance(press, type) else press
        return from_press(instance, ratio)
    if name not in (*PRESSES, *WRAPPERS, *NEAREST, *NEEDS) and name in own_presses():
        return _own(press_policy(name, arguments), ratio)
    if name in NEEDS:
        raise KvvizError(f"kvpress' {name} needs {NEEDS[name]}, which kvviz cannot download; the nearest: "
                         f"{NEAREST.get(name, 'its own kvviz counterpart')}")
    if name == "DecodingPress":
        return _decoding(classes, ratio, arguments)
    if name in WRAPPED:
        policy, own = WRAPPED[name]
        inner = _inner(name, arguments)
        if inner not in UNPROTECTED:  # kvpress pads a protected window in the inner press's own score scale
            return _own(press_policy(name, {**arguments, "press": inner}), ratio)
        unknown = sorted(set(arguments) - set(own))
        if unknown:
            raise KvvizError(f"kvpress' {name} argument {unknown[0]!r} has no kvviz counterpart; its arguments here: "
                             f"compression_ratio, press{''.join(', ' + a for a in own)}")
        params = {"inner": f"kvpress:{inner}", **{own[k]: v for k, v in arguments.items()}}
        return KvpressPolicy(policy_named(classes or POLICIES, policy, params), ratio)
    if name == "KeyRerotationPress":
        inner = from_kvpress(_inner(name, arguments), classes, **arguments)
        return KvpressPolicy(inner.policy, inner.ratio if ratio is None else ratio, "rerotated")
    if name == "AdaKVPress":
        inner = _inner(name, arguments)
        if inner != "SnapKVPress":  # kvpress' own code over any other scorer
            return _own(press_policy(name, {**arguments, "press": inner}), ratio)
    mapping = _mapping(name)
    unknown = sorted(set(arguments) - set(mapping.arguments))
    if unknown:
        raise KvvizError(f"kvpress' {name} argument {unknown[0]!r} has no kvviz counterpart; "
                         f"its arguments here: compression_ratio{''.join(', ' + a for a in mapping.arguments)}")
    params = {**mapping.conventions, **{mapping.arguments[key]: value for key, value in arguments.items()}}
    return KvpressPolicy(policy_named(classes or POLICIES, mapping.policy, params), ratio)


def from_press(press: object, ratio: Ratio | None = None) -> KvpressPolicy:
    """A kvpress press object — kvpress' own or a user's ``BasePress`` / ``ScorerPress`` subclass — as a kvviz
    policy running its own code (:mod:`~kvviz.policies.kvpress.own_code`); the budget is ``ratio``, else the press's
    ``compression_ratio``."""
    try:
        own = getattr(press, "compression_ratio", None)
    except Exception:  # an adaptive press's ratio exists after a forward pass only (DMS, SimLayerKV)
        own = None
    if ratio is None and isinstance(own, (int, float)) and not isinstance(own, bool):
        ratio = Ratio(press_budgets({"compression_ratio": own}, type(press).__name__)["compression_ratio"])
    return _own(PressCode(instance=press), ratio)


def _own(policy: PressCode, ratio: Ratio | None) -> KvpressPolicy:
    """A press running its own code: an adaptive or decoding press decides its own count (the budget holds all);
    a press that acts while decoding runs in mode decode, asked before every step as kvpress' hook is after it."""
    if ratio is None and policy.decides_count:
        ratio = Ratio(0.0)
    return KvpressPolicy(policy, ratio, mode="decode" if acts_while_decoding(policy.instance) else "prefill")


def _decoding(classes: Mapping[str, type[Policy]] | None, ratio: Ratio | None, arguments: dict) -> KvpressPolicy:
    """``DecodingPress(base_press, compression_interval, target_size)``: the base press's policy compressing after
    every ``compression_interval``-th decode step down to ``target_size`` slots (mode ``after_steps``)."""
    inner = arguments.pop("base_press", None)
    if inner is None:
        raise KvvizError("kvpress' DecodingPress wraps a press: give base_press=NAME (e.g. base_press=KnormPress)")
    settings = {**DECODING, **{k: arguments.pop(k) for k in list(arguments) if k in DECODING}}
    if ratio is not None:
        raise KvvizError("kvpress' DecodingPress compresses to target_size, not by a compression ratio")
    every, target = (settings[k] for k in ("compression_interval", "target_size"))  # checked by press_budgets
    inner = inner if isinstance(inner, str) else type(inner).__name__
    if inner not in SCORE_ONLY:  # kvpress' own DecodingPress over a mirror of its cache (kvviz.policies.kvpress.mirror)
        return _own(press_policy("DecodingPress", {**arguments, **settings, "base_press": inner}), ratio)
    base = from_kvpress(inner, classes, **arguments)
    if base.positions != "original":
        raise KvvizError("kvviz's DecodingPress runs keep the original positions; leave KeyRerotationPress out")
    return KvpressPolicy(base.policy, target, "original", "after_steps", every)


def _mapping(name: str) -> Press:
    """The mapping of press ``name`` (``AdaKVPress`` over SnapKV); one line naming the nearest policy otherwise."""
    if name == "AdaKVPress":
        return ADAKV
    if name in PRESSES:
        return PRESSES[name]
    nearest = NEAREST.get(name)
    if nearest is None and name not in (*WRAPPERS, *NEEDS):
        known = sorted({*PRESSES, *WRAPPERS, *NEAREST, *own_presses()})
        close = difflib.get_close_matches(name, known, 3, cutoff=0.8)
        raise KvvizError(f"kvpress has no press called {name!r}" + (f"; did you mean {', '.join(close)}?" if close
                         else f"; its presses: {', '.join(known)}"))
    raise KvvizError(f"kvpress' {name} has no exact kvviz counterpart"
                     + (f"; the nearest: {nearest}" if nearest else f"; presses kvviz reproduces: {', '.join(PRESSES)}"))


def names() -> list[str]:
    """The presses a picker offers by name (``AdaKVPress`` over SnapKV; the ``KeyRerotationPress`` wrapper is the
    run's positions setting)."""
    return [*PRESSES, "AdaKVPress"]


def defaults(name: str) -> dict[str, object]:
    """Press ``name``'s arguments (kvpress' names, ``compression_ratio`` apart) and the values kvviz reproduces it
    with when they are not given: its policy's fields under kvpress' conventions."""
    from kvviz.policies import POLICIES

    mapping = _mapping(name)
    fields = {f.name: f.default for f in dataclasses.fields(POLICIES[mapping.policy])}
    return {argument: mapping.conventions.get(field, fields[field]) for argument, field in mapping.arguments.items()}


def _inner(wrapper: str, arguments: dict) -> str:
    """The wrapped press's name, taken out of ``arguments``."""
    inner = arguments.pop("press", None)
    if inner is None:
        raise KvvizError(f"kvpress' {wrapper} wraps a press: give press=NAME (e.g. press=SnapKVPress)")
    return inner if isinstance(inner, str) else type(inner).__name__


def table() -> str:
    """The mapping as a Markdown table (docs/kvpress.md holds it)."""
    rows = ["| kvpress press | arguments → kvviz fields | kvviz policy and conventions |", "|---|---|---|"]
    presses = {**PRESSES, "AdaKVPress": Press("ada_kv", {"press=SnapKVPress": "", **ADAKV.arguments}, SNAPKV)}
    for name, press in presses.items():
        arguments = ", ".join(["`compression_ratio` → ratio"]
                              + [f"`{a}`" + (f" → `{f}`" if f else "") for a, f in press.arguments.items()])
        conventions = ", ".join(f"`{k}={v!r}`" for k, v in press.conventions.items())
        rows.append(f"| `{name}` | {arguments} | `{press.policy}`"
                    + (f" with {conventions}" if conventions else "") + " |")
    rows.append("| `KeyRerotationPress` | `press=…` (any of the above) | the wrapped press, `--positions rerotated` |")
    for name, (policy, own) in WRAPPED.items():
        rows.append(f"| `{name}` | `compression_ratio` → ratio, `press=` {', '.join(f'`{p}`' for p in UNPROTECTED)} → "
                    f"`inner`{''.join(f', `{a}` → `{f}`' for a, f in own.items())} | `{policy}` |")
    rows.append("| `DecodingPress` | `base_press=KnormPress` or `KeyDiffPress`, `compression_interval` → `--every`, "
                "`target_size` → `--budget` | the base press, `--mode after_steps` |")
    return "\n".join(rows)
