"""A policy run as one JSON-ready document (the ``policy-run --json`` fields other tools rely on)."""

from __future__ import annotations

from kvviz.runs.blame import Blame
from kvviz.runs.policy_run import PolicyRun, TurnRun
from kvviz.runs.timeline import NEVER


def _kept_after_prompt(run: TurnRun) -> list[list[list[int]]]:
    """Per layer and KV head, the slots the turn's first decode step sees: what its prompt's compression kept (to
    compare with another implementation's kept set slot by slot)."""
    seen = run.forced.visible_to(run.prompt_end)  # (L, KV, n)
    return [[heads.nonzero()[:, 0].tolist() for heads in layer] for layer in seen]


def _turn(run: TurnRun) -> dict:
    return {"user": run.user, "prompt_ids": run.prompt_ids, "kept_after_prompt": _kept_after_prompt(run),
            "full": {"ids": run.full_ids, "text": run.full_text},
            "policy_run": {"ids": run.policy_ids, "text": run.policy_text},
            "divergence": run.divergence, "changed": run.changed,
            "steps": [{"step": s.step, "slot": s.slot, "visible": round(s.visible), "kl": s.kl,
                       "top1_agree": s.top1_agree, "by_segment": s.by_segment} for s in run.records]}


def _quantized(result: PolicyRun) -> list[dict]:
    """The log of a window format (KIVI) for the last turn: ``{"first", "last", "step", "key_bits", "value_bits"}`` per
    run of slots quantized before the same step (-1: before the turn)."""
    cache_format = result.settings.cache_format
    if cache_format is None or cache_format.window_bits is None:
        return []
    key_bits, value_bits = cache_format.window_bits
    steps = result.quantized_steps().tolist()
    runs: list[dict] = []
    for slot, step in enumerate(steps):
        if step >= NEVER:
            continue
        if runs and runs[-1]["step"] == step and runs[-1]["last"] == slot - 1:
            runs[-1]["last"] = slot
        else:
            runs.append({"first": slot, "last": slot, "step": step, "key_bits": key_bits, "value_bits": value_bits})
    return runs


def _reshaped(result: PolicyRun) -> dict | None:
    """The run's prunings and merges: the settings, and per prompt (turn) the pruned channels per layer and KV head
    and the merges ``[layer, kv_head, source, target, weight]``."""
    reshape = result.settings.reshape
    if reshape is None or not (reshape.think or reshape.merge):
        return None
    parts = result.last.forced.session.commits.parts
    return {"think": reshape.think, "think_window": reshape.think_window, "merge": reshape.merge,
            "merge_rule": reshape.merge_rule, "merge_threshold": reshape.merge_threshold,
            "prompts": [{"pruned": [[list(p.channels) for p in part.prunings if p.layer == layer]
                                    for layer in range(result.last.forced.session.lm.layers)] if part.prunings else [],
                         "merges": [[m.layer, m.head, m.source, m.target, m.weight] for m in part.merges]}
                        for _, part in parts]}


def document(result: PolicyRun, blame: Blame | None = None) -> dict:
    """The run's document: the last turn's fields at the top level, every turn under ``turns``."""
    settings = result.settings
    policy = settings.policy
    last = _turn(result.last)
    return {
        "model": result.model,
        "policy": policy.name if policy is not None else None,
        "params": policy.settings() if policy is not None else {},
        "budget": settings.budget, "mode": settings.mode, "every": settings.every,
        **{kind: None for kind in ("kivi", "quanto", "written")},  # the cache format under its kind's key
        **({settings.cache_format.kind: settings.cache_format.settings()} if settings.cache_format else {}),
        "positions": settings.positions,
        "reader": None if settings.reader is None else {"name": settings.reader.name,
                                                         "params": settings.reader.settings(), "reads": settings.reads},
        "reshape": _reshaped(result),
        **{key: last[key] for key in ("prompt_ids", "kept_after_prompt", "full", "policy_run", "divergence", "steps")},
        "evictions": result.evictions(),
        "quantized": _quantized(result),
        "blame": [] if blame is None else [{"slots": r.slots, "kl_after_restore": r.kl_after_restore,
                                            "top1_restored": r.top1_restored, "mass": r.mass} for r in blame.rows],
        "blame_step": None if blame is None else blame.step,
        "blame_of": None if blame is None else blame.of,
        "blame_kl": None if blame is None else {"none_restored": blame.kl, "all_restored": blame.kl_all_restored},
        "turns": [_turn(run) | {"recency_only": list(result.recency_only(index))}
                  for index, run in enumerate(result.turns)],
    }
