"""kvpress presses by their own names: the kvviz policy and settings that reproduce each (NVIDIA's kvpress 0.5.5,
the library KV-compression research benchmarks with).

A press with a kvviz counterpart maps to one policy, its arguments to the policy's fields, plus the fields that make
kvviz follow kvpress' conventions (SnapKV's average pooling and whole window, TOVA's kept last token, RandomPress' draw
per KV head, PyramidKV's KVCache-Factory schedule); ``compression_ratio`` becomes a :class:`~kvviz.policies.base.Ratio`
budget, rounded as kvpress rounds. Wrappers: ``AdaKVPress(press=SnapKVPress)`` is ``ada_kv``; ``KeyRerotationPress``
re-rotates the kept keys. Anything else is refused in one line naming the nearest kvviz policy. Parity is prefill
compression: kvpress compresses a prompt once after its forward pass, as kvviz's ``prefill`` mode does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvviz.errors import KvvizError
from kvviz.policies.base import Policy, Ratio

SNAPKV = {"window": 64, "kernel": 5, "pooling": "avg", "window_kept": "all"}
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
}
NEAREST = {  # presses kvviz does not reproduce yet → the nearest kvviz policy, for the refusal
    "AdaKVPress": "ada_kv (with press=SnapKVPress)", "CriticalKVPress": "snapkv", "CriticalAdaKVPress": "ada_kv",
    "ExpectedAttentionPress": "snapkv", "KeyDiffPress": "key_norm", "LagKVPress": "snapkv", "KVzipPress": "h2o",
    "ChunkKVPress": "snapkv", "ThinKPress": "key_norm", "QFilterPress": "key_norm", "DuoAttentionPress": "streaming_llm",
    "DecodingPress": "--mode decode --every N (kvviz compresses before a step, kvpress after)",
}


@dataclass(frozen=True)
class KvpressPolicy:
    """What a press becomes in kvviz: the policy, the budget its ``compression_ratio`` gives (None: none given), and
    the positions kept keys take (``rerotated`` under ``KeyRerotationPress``)."""

    policy: Policy
    ratio: Ratio | None
    positions: str = "original"


def from_kvpress(press: str | type, /, classes: Mapping[str, type[Policy]] | None = None,
                 **arguments: object) -> KvpressPolicy:
    """The kvviz policy that reproduces kvpress' ``press`` (its class or class name) with ``arguments`` (kvpress'
    names; text values are read as the field's type). ``classes``: the policies to build from (default: built-ins)."""
    from kvviz.policies import POLICIES
    from kvviz.runs.report import make_policy

    name = press if isinstance(press, str) else press.__name__
    arguments = dict(arguments)
    ratio = arguments.pop("compression_ratio", None)
    ratio = None if ratio is None else Ratio(float(ratio))
    if name == "KeyRerotationPress":
        inner = from_kvpress(_inner(name, arguments), classes, **arguments)
        return KvpressPolicy(inner.policy, inner.ratio if ratio is None else ratio, "rerotated")
    if name == "AdaKVPress":
        if _inner(name, arguments) != "SnapKVPress":
            raise KvvizError("kvviz reproduces AdaKVPress over SnapKVPress only (ada_kv); give press=SnapKVPress")
        mapping = Press("ada_kv", {**SNAPKV_ARGUMENTS, "alpha_safeguard": "floor"}, SNAPKV)
    elif name in PRESSES:
        mapping = PRESSES[name]
    else:
        nearest = NEAREST.get(name)
        raise KvvizError(f"kvpress' {name} has no exact kvviz counterpart"
                         + (f"; the nearest: {nearest}" if nearest else f"; presses kvviz reproduces: {', '.join(PRESSES)}"))
    unknown = sorted(set(arguments) - set(mapping.arguments))
    if unknown:
        raise KvvizError(f"kvpress' {name} argument {unknown[0]!r} has no kvviz counterpart; "
                         f"its arguments here: compression_ratio{''.join(', ' + a for a in mapping.arguments)}")
    params = {**mapping.conventions, **{mapping.arguments[key]: value for key, value in arguments.items()}}
    return KvpressPolicy(make_policy(classes or POLICIES, mapping.policy, params), ratio)


def _inner(wrapper: str, arguments: dict) -> str:
    """The wrapped press's name, taken out of ``arguments``."""
    inner = arguments.pop("press", None)
    if inner is None:
        raise KvvizError(f"kvpress' {wrapper} wraps a press: give press=NAME (e.g. press=SnapKVPress)")
    return inner if isinstance(inner, str) else type(inner).__name__


def table() -> str:
    """The mapping as a Markdown table (docs/kvpress.md holds it)."""
    rows = ["| kvpress press | arguments → kvviz fields | kvviz policy and conventions |", "|---|---|---|"]
    presses = {**PRESSES, "AdaKVPress": Press("ada_kv", {"press=SnapKVPress": "", **SNAPKV_ARGUMENTS,
                                                          "alpha_safeguard": "floor"}, SNAPKV)}
    for name, press in presses.items():
        arguments = ", ".join(["`compression_ratio` → ratio"]
                              + [f"`{a}`" + (f" → `{f}`" if f else "") for a, f in press.arguments.items()])
        conventions = ", ".join(f"`{k}={v!r}`" for k, v in press.conventions.items())
        rows.append(f"| `{name}` | {arguments} | `{press.policy}`"
                    + (f" with {conventions}" if conventions else "") + " |")
    rows.append("| `KeyRerotationPress` | `press=…` (any of the above) | the wrapped press, `--positions rerotated` |")
    return "\n".join(rows)
