"""A run's settings from names, as a person gives them: the one builder the command line (``policy-run``), the app's
Policy run tab, sweeps, scenarios and the notebook call, so that the same words make the same run everywhere.

A policy by name comes from the one table of :mod:`kvviz.policies.registry` (kvviz's, the user's, ``kvpress:NAME``,
a press file); a kvpress press brings how kvpress runs it — its ratio, mode, positions and interval — which the
settings given here override only where they are given (and refuse where they would contradict it). A cache format
comes from scheme names (:func:`kvviz.schemes.written.run_cache`) or a :class:`~kvviz.schemes.kivi.Kivi`; a run holds
one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvviz.edit.reshape import Reshape
from kvviz.errors import KvvizError
from kvviz.policies.base import Policy, Ratio
from kvviz.policies.registry import Chosen, chosen, from_file
from kvviz.runs.compressed import RunSettings
from kvviz.schemes.cache_format import CacheFormat, one_format
from kvviz.schemes.kivi import Kivi
from kvviz.schemes.written import run_cache


def from_names(policy: str | None = None, params: Mapping[str, object] | None = None, *,
               budget: int | float | None = None, ratio: float | None = None, mode: str | None = None,
               every: int | None = None, positions: str | None = None, schemes: Sequence[str] = (),
               kivi: Kivi | None = None, reshape: Reshape | None = None, press_file: str | None = None,
               classes: Mapping[str, type[Policy]] | None = None, q_group_size: int = 64, residual: int = 128,
               axis: int = 0, round_own: bool = False, reader: str | None = None, reads: int | None = None
               ) -> RunSettings:
    """The :class:`~kvviz.runs.compressed.RunSettings` of policy ``policy`` (a name of ``classes``, default
    :func:`~kvviz.policies.user.available`; ``kvpress:NAME``; or ``press_file`` = ``FILE.py:CLASS``) with
    ``params`` (text values read as the field's type; a press's in kvpress' names), its ``budget`` in slots or as a
    fraction, or kvpress' ``ratio`` (the fraction removed), and its cache format: ``kivi`` and / or ``schemes``
    (``kivi-2``, ``quanto-4``, ``nvfp4``, … — one in all; ``fp16`` is the model's own cache; ``q_group_size``,
    ``residual``, ``axis``: QuantizedCache's; ``round_own``: a written scheme rounds the step's own K/V too).
    ``mode``, ``every`` and ``positions`` default to a press's (else decode, 1, original). ``reader``: a policy by
    name (its defaults) whose scores choose the ``reads`` slots each decode step reads, the cache kept. Every refusal
    is one line."""
    if ratio is not None and budget is not None:
        raise KvvizError("give --budget or --ratio, not both")
    budget = Ratio(ratio) if ratio is not None else budget
    pick = _pick(policy, params, press_file, classes)
    if pick is not None:  # what the press says about the run, where the caller left it open
        press = press_file is not None or (policy or "").startswith("kvpress:")
        if press and budget is not None and set(params or {}) & {"compression_ratio", "target_size"}:
            raise KvvizError("give the budget once: the press's compression_ratio (or target_size), or --ratio / "
                             "--budget")
        if budget is None:  # a press's own: its compression_ratio, DecodingPress' target_size, all for an adaptive one
            budget = pick.budget
        if press_file is not None and budget is None:
            if not pick.policy.decides_count:
                raise KvvizError("give --ratio R: the press's compression_ratio, the fraction it removes")
            budget = Ratio(0.0)
        mode = mode or pick.mode
        if pick.mode == "after_steps" and mode == "after_steps":  # DecodingPress' compression_interval
            if every not in (None, 1, pick.every):
                raise KvvizError("DecodingPress sets the interval: --param compression_interval=N, not --every")
            every = pick.every
        if positions in (None, "original"):
            positions = pick.positions
    reading = None if reader is None else _pick(reader, None, None, classes)
    if reading is not None and reading.budget is not None:
        raise KvvizError(f"{reader} is a kvpress press that sets its own budget; a reader takes kvviz's policies")
    chosen_reader = None if reading is None else reading.policy
    if pick is not None and pick.reader is not None:  # a two-stage policy (rocket_kv): its own per-step reader
        if reading is not None:
            raise KvvizError(f"{pick.policy.name} reads with its own second stage; give no --read-with")
        if mode not in (None, pick.mode):
            raise KvvizError(f"{pick.policy.name} compresses the prompt once ({pick.mode}), then picks what each step "
                             f"reads; give mode {pick.mode}, not {mode}")
        chosen_reader, reads = pick.reader, pick.reads if reads is None else reads
        mode = pick.mode
    return RunSettings(None if pick is None else pick.policy, budget, mode or "decode", 1 if every is None else every,
                       _format(schemes, kivi, q_group_size, residual, axis, round_own), positions or "original",
                       reshape, chosen_reader, reads)


def _format(schemes: Sequence[str], kivi: Kivi | None, q_group_size: int, residual: int, axis: int,
            round_own: bool) -> CacheFormat | None:
    """The run's one cache format of ``kivi`` and the ``schemes`` named."""
    return one_format(kivi, *(run_cache(name, q_group_size, residual, axis, round_own) for name in schemes))


def _pick(policy: str | None, params: Mapping[str, object] | None, press_file: str | None,
          classes: Mapping[str, type[Policy]] | None) -> Chosen | None:
    """The policy named, with what its source says about the run; None for a run of its cache format alone."""
    if press_file is not None:
        if policy is not None:
            raise KvvizError("give --policy or --press-file, not both")
        return from_file(press_file, params)
    if policy is None:
        if params:
            raise KvvizError(f"parameters {', '.join(params)} need a policy to take them")
        return None
    if classes is None:
        from kvviz.policies.user import available

        classes = available()
    return chosen(classes, policy, params)
