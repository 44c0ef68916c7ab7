"""A policy run beside the full-cache run, turn by turn (docs/math.md §9).

For every turn: the full session answers greedily; the compressed session is teacher-forced on that reply, so every
decode step ``s`` (it processes the reply's token ``s`` and predicts token ``s + 1``) compares the two next-token
distributions on the same prefix — KL(full ‖ policy) and top-1 agreement stay comparable after the answers part.
The prefill's last row, which chooses the reply's first token, is step ``-1``: a step like the others in the records
(in a follow-up turn it reads the history as the policy left it, and is where a compressed follow-up most often fails).
Where the policy's own choice first differs (the divergence) the run forks: the free run continues on its own
tokens, and it is the free run that carries the conversation into the next turn, as a real deployment would.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvviz import kv_cache
from kvviz.errors import KvvizError
from kvviz.model import LoadedModel
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.runs.lockstep import Steps, drive
from kvviz.runs.run_records import PolicyRun, StepRecord, TurnRun
from kvviz.runs.timeline import NEVER
from kvviz.session import Session
from kvviz.whatif.metrics import kl_divergence

__all__ = ["NEVER", "FullTurn", "PolicyRun", "StepRecord", "TurnRun", "held_slots", "run_policies", "run_policy"]


class Progress:
    """Counts a run's forward passes for ``report(done, total)``; ``total`` is an upper bound that tightens as the run
    learns how long its replies are (an exception ``report`` raises abandons the run)."""

    def __init__(self, report: Callable[[int, int], None] | None, total: int):
        self.report, self.done, self.total = report, 0, total

    def tick(self) -> None:
        self.done += 1
        if self.report is not None:
            self.report(self.done, max(self.total, self.done))


def held_slots(lm: LoadedModel, turns: Sequence[str], max_new_tokens: int) -> int:
    """What a run of ``turns`` may hold, in cached slots' worth of memory (:attr:`LoadedModel.bytes_per_slot`): the
    full session, the compressed one and one fork per turn (every turn may diverge), each as long as the whole
    conversation (prompts counted at ~3 characters a token), plus the full run's logits of every step."""
    slots = sum(len(text) // 3 + 32 for text in turns) + max_new_tokens * len(turns)
    logits = len(turns) * max_new_tokens * lm.config.vocab_size * 4
    return (len(turns) + 2) * slots + -(-logits // lm.bytes_per_slot)


@dataclass(frozen=True)
class FullTurn:
    """One turn of the full-cache run: everything cached before its first decode step, the greedy reply (ids,
    end-of-turn included) and the logits ``(V,)`` before each of its tokens (both growing while the turn runs)."""

    prompt_ids: list[int]
    ids: list[int]
    logits: list[torch.Tensor]


def _check(turns: Sequence[str], max_new_tokens: int) -> None:
    if not turns:
        raise KvvizError("a policy run needs at least one turn")
    if max_new_tokens < 1:
        raise KvvizError("max_new_tokens must be at least 1")


def run_policy(lm: LoadedModel, turns: Sequence[str], settings: RunSettings, max_new_tokens: int = 64,
               progress: Callable[[int, int], None] | None = None, batch: bool = True) -> PolicyRun:
    """Answer ``turns`` with the full cache and with ``settings``' compression, side by side (module doc).
    ``progress(done, total)`` is called after each forward pass (``total``: an upper bound, exact once every reply is
    known; an exception it raises abandons the run); ``batch`` as in :func:`run_policies`."""
    return run_policies(lm, turns, [settings], max_new_tokens, progress, batch)[0]


def run_policies(lm: LoadedModel, turns: Sequence[str], settings: Sequence[RunSettings], max_new_tokens: int = 64,
                 progress: Callable[[int, int], None] | None = None, batch: bool = True) -> list[PolicyRun]:
    """:func:`run_policy` of each of ``settings`` on the same ``turns``, beside one full-cache run. ``batch``: the
    decode steps of the full run, the forced runs and the free runs that hold as many slots run as one batched
    forward pass (:mod:`kvviz.runs.lockstep`; the same numbers as one by one, up to the rounding of another batch
    shape), and policies that read no hidden states take a copy of the full run's first prompt instead of
    prefilling it again."""
    _check(turns, max_new_tokens)
    sides = 1 + len(settings)
    # passes, per side: each turn's prompt and reply steps, as many as its tokens (a free reply past a divergence is
    # counted when it happens, a reply that ends early when it does)
    counter = Progress(progress, sides * len(turns) * max_new_tokens)
    full, policies = Session(lm), [CompressedSession(lm, each) for each in settings]
    runs = [PolicyRun(each, lm.name) for each in settings]
    for number, text in enumerate(turns, start=1):
        full.add_user_turn(text)
        counter.tick()
        for policy in policies:
            if batch and not len(policy) and policy.hidden is None:
                full.memo.clear()  # derived data is not copied
                policy.take_prompt(_copy(full, full.cache))
            else:
                policy.add_turn(text)
            counter.tick()
        reference = FullTurn(list(full.transcript.ids), [full.pending], [full.logits])
        more = lambda: _goes_on(full, reference.ids, max_new_tokens)  # noqa: E731 - read while the full run steps
        outcomes = drive(lm, [_full_reply(full, reference, max_new_tokens, counter, sides)]
                         + [_compare(policy, reference, more, max_new_tokens, counter) for policy in policies], batch)
        for index, (forced, free, turn) in enumerate(outcomes[1:]):
            runs[index].turns.append(TurnRun(
                text, reference.prompt_ids, forced.prompt_end[-1], reference.ids, turn["policy_ids"],
                _text(lm, reference.ids), _text(lm, turn["policy_ids"]), turn["divergence"], turn["steps"], forced,
                torch.stack(reference.logits).cpu()))
            policies[index] = free
            for kept in {id(forced): forced, id(free): free}.values():  # not rows of the turn's batch buffers any more
                kv_cache.own(kept.session.cache)
        if number < len(turns):
            kv_cache.own(full.cache)
    return runs


def _text(lm: LoadedModel, ids: list[int]) -> str:
    """A reply's text: end-of-turn and other special tokens left out."""
    return lm.tokenizer.decode([i for i in ids if i not in lm.stop_ids], skip_special_tokens=True)


def _goes_on(session: Session, ids: list[int], max_new_tokens: int) -> bool:
    """Whether a greedy reply ``ids`` (its last token pending in ``session``) takes another decode step."""
    return len(ids) < max_new_tokens and ids[-1] not in session.lm.stop_ids and session.has_room(1)


def _full_reply(full: Session, reply: FullTurn, max_new_tokens: int, progress: Progress, sides: int) -> Steps:
    """The full session's greedy reply, step by step into ``reply`` (ids, end-of-turn included, and the logits before
    each of its tokens)."""
    while _goes_on(full, reply.ids, max_new_tokens):
        yield [(full, None)]
        progress.tick()
        reply.ids.append(full.pending)
        reply.logits.append(full.logits)
    full.set_announced(len(reply.ids))
    progress.total -= sides * (max_new_tokens - len(reply.ids))  # the reply's length is known, on every side


def _compare(policy: CompressedSession, full: FullTurn, more: Callable[[], bool], max_new_tokens: int,
             progress: Progress) -> Steps:
    """Teacher-force ``policy`` on the full reply (known up to its last token; ``more()``: whether the full run
    takes another step now); fork the free run where its choice first differs, and step it beside the forced run
    (both hold as many slots) to the end of its own greedy reply. Returns the forced side, the free side (the same
    object when they never part) and the turn's records."""
    session = policy.session
    free: CompressedSession | None = None
    divergence, own = None, []  # own: the free run's reply so far
    row = policy.prompt_end[-1] - 1  # the prefill's last row saw the history as it stood before this prompt
    steps = [_record(-1, row, policy.visible_to(row), session.transcript.segments(), session.logits, full.logits[0],
                     full.ids[0])]
    if not steps[0].top1_agree:  # the prefill already chose otherwise (a follow-up turn on a compressed history)
        divergence, free, own = -1, _fork(policy), _forked(policy, max_new_tokens, progress)
    step = 0
    while True:
        forced = step + 1 < len(full.ids) or more()
        freely = free is not None and _goes_on(free.session, own, max_new_tokens)
        if not (forced or freely):
            break
        segments = session.transcript.segments() if forced else None
        logits = yield [(policy, full.ids[step])] * forced + [(free, None)] * freely
        if freely:
            progress.tick()
            own.append(free.session.pending)
        if forced:  # the full run's step of the same token gave full.ids[step + 1]
            steps.append(_record(step, len(session) - 1, policy.seen, segments, logits[0], full.logits[step + 1],
                                 full.ids[step + 1]))
            if free is None and not steps[-1].top1_agree:
                divergence, free, own = step, _fork(policy), _forked(policy, max_new_tokens, progress)
            progress.tick()
            step += 1
    if free is None:
        session.set_announced(len(full.ids))
        return policy, policy, {"policy_ids": list(full.ids), "divergence": None, "steps": steps}
    progress.total -= max_new_tokens - len(own)  # the free reply ended early
    free.session.set_announced(len(own))
    return policy, free, {"policy_ids": own, "divergence": divergence, "steps": steps}


def _forked(policy: CompressedSession, max_new_tokens: int, progress: Progress) -> list[int]:
    """The free reply so far, right after the fork (its last token its own choice), its passes counted."""
    progress.total += max_new_tokens - len(policy.session.produced)  # the free reply's passes, at most
    return list(policy.session.produced)


def _record(step: int, slot: int, seen: torch.Tensor, segments: list[str], logits: torch.Tensor,
            full_logits: torch.Tensor, full_choice: int) -> StepRecord:
    """The record of the step that processed ``slot`` seeing ``seen`` (bool ``(L, KV, slot)``) of the slots before it
    (``segments`` theirs), with next-token ``logits`` ``(V,)`` against the full run's."""
    visible = seen.float().mean((0, 1))  # (slot,) share of layers and KV heads that see each slot
    by_segment = {name: float(sum(v for v, s in zip(visible.tolist(), segments) if s == name))
                  for name in ("history", "query", "generated")}
    choice = int(logits.argmax())
    return StepRecord(step, slot, float(visible.sum()), by_segment, float(kl_divergence(full_logits, logits)),
                      choice == full_choice, full_choice, choice)


def _fork(policy: CompressedSession) -> CompressedSession:
    """An independent copy of ``policy``."""
    policy.session.memo.clear()  # derived data is not copied
    return _copy(policy, policy.session.cache)


def _copy(value, cache) -> object:
    """An independent copy of ``value`` (a session, or a run holding one) whose cache is ``cache``: the model is
    shared, not copied, and the cache's slots are copied without its spare room or a batch's other rows."""
    lm = value.lm
    return copy.deepcopy(value, memo={id(lm): lm} | kv_cache.compact_memo(cache))
