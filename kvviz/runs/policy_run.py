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
from dataclasses import asdict, dataclass, field

import torch

from kvviz.errors import KvvizError
from kvviz.model import LoadedModel
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.runs.progress import Progress
from kvviz.runs.timeline import NEVER
from kvviz.session import Session
from kvviz.whatif.metrics import kl_divergence


@dataclass(frozen=True)
class StepRecord:
    """Decode step ``step`` of the teacher-forced run: it processes ``slot`` and sees ``visible`` other slots (mean
    over layers and KV heads; ``by_segment`` splits them into history / query / generated)."""

    step: int
    slot: int
    visible: float
    by_segment: dict[str, float]
    kl: float
    top1_agree: bool
    full_top1: int
    policy_top1: int


@dataclass
class TurnRun:
    """One turn: the full reply, the policy's own (free) reply, and the teacher-forced comparison."""

    user: str
    prompt_ids: list[int]  # everything the full session cached before the turn's first decode step
    prompt_end: int  # slots the compressed session cached then: decode step s processes slot prompt_end + s
    full_ids: list[int]
    policy_ids: list[int]
    full_text: str
    policy_text: str
    divergence: int | None  # the step whose choice first differs (-1: the prefill's last row)
    records: list[StepRecord]  # step -1 (the prefill's last row, choosing the first token), then the decode steps
    forced: CompressedSession  # its slots hold the full reply: the steps' caches, for what-ifs and blame
    full_logits: torch.Tensor  # (len(full_ids), V) float32: the full run's logits before each of its tokens

    @property
    def steps(self) -> list[StepRecord]:
        """The decode steps 0, 1, …: :attr:`records` without the prefill's row."""
        return self.records[1:]

    def record(self, step: int) -> StepRecord:
        """Step ``step`` of :attr:`records` (-1: the prefill's last row)."""
        if not -1 <= step < len(self.steps):
            raise KvvizError(f"step {step} is not a step of this turn (-1 for the prefill's last row, "
                             f"0..{len(self.steps) - 1} for the decode steps)")
        return self.records[step + 1]

    @property
    def end(self) -> int:
        """One past the slot of the turn's last decode step: commits made at or after it belong to later turns."""
        return self.prompt_end + len(self.steps)

    @property
    def changed(self) -> bool:
        return self.full_ids != self.policy_ids


@dataclass
class PolicyRun:
    settings: RunSettings
    model: str
    turns: list[TurnRun] = field(default_factory=list)

    @property
    def last(self) -> TurnRun:
        return self.turns[-1]

    def evictions(self, turn: int = -1) -> list[dict]:
        """When each slot left the cache during ``turn``: ``{"slot", "step", "layer", "kv_head"}`` with ``step`` the
        first decode step of the turn that no longer sees it (0 for a compression right after the prompt) and
        ``layer`` / ``kv_head`` None where it left every layer / KV head at once."""
        run = self.turns[turn]
        timeline = run.forced.timeline
        start, stop = run.prompt_end, run.end  # later turns may go on in the same session
        records = []
        for k, at in enumerate(timeline.at):
            if not start <= at < stop:
                continue
            hit = timeline.evicted_at == k  # (L, KV, n)
            for slot in hit.any(0).any(0).nonzero()[:, 0].tolist():
                where = hit[:, :, slot]
                if bool(where.all()):
                    records.append({"slot": slot, "step": at - start, "layer": None, "kv_head": None})
                    continue
                for layer in where.any(1).nonzero()[:, 0].tolist():
                    heads = where[layer]
                    if bool(heads.all()):
                        records.append({"slot": slot, "step": at - start, "layer": layer, "kv_head": None})
                    else:
                        records.extend({"slot": slot, "step": at - start, "layer": layer, "kv_head": h}
                                       for h in heads.nonzero()[:, 0].tolist())
        return records

    def why(self, slot: int, turn: int = -1) -> list[dict]:
        """Why ``slot`` left the cache during ``turn``: one row per (layer, KV head) it left, layer by layer —
        ``step`` as in :meth:`evictions`, the policy's ``score`` of it then, the ``threshold`` (the lowest score kept
        in that layer and KV head), ``margin`` = score − threshold, its ``rank`` in the order of keeping (from 1)
        among ``candidates``, the ``budget``, the ``outcome`` and the ``reason`` in words."""
        run = self.turns[turn]
        return [{"step": at - run.prompt_end, **asdict(row), "margin": row.margin}
                for at, row in run.forced.reasons.why(slot, run.prompt_end, run.end)]

    def eviction_steps(self, turn: int = -1) -> torch.Tensor:
        """The timeline picture of ``turn``: ``(L, KV, n)`` int, the turn's decode step from which each slot is
        hidden (``-1``: before the turn; ``NEVER``: still cached at the end)."""
        run = self.turns[turn]
        timeline = run.forced.timeline
        at = torch.tensor(timeline.at + [NEVER], dtype=torch.long)
        n = run.prompt_end + len(run.steps)
        commits = timeline.evicted_at[:, :, :n].long()
        commits = torch.nn.functional.pad(commits, (0, n - commits.shape[-1]), value=NEVER)
        slots = at[commits.clamp(max=len(timeline.at))]
        later = (commits >= NEVER) | (slots >= run.end)  # still cached when the turn ended
        return torch.where(later, NEVER, torch.where(slots < run.prompt_end, -1, slots - run.prompt_end))

    def quantized_steps(self, turn: int = -1) -> torch.Tensor:
        """KIVI's side of the timeline: ``(n,)`` int, the turn's decode step from which each slot is stored at low
        bits (``-1``: before the turn; ``NEVER``: still at 16 bits at the end)."""
        run = self.turns[turn]
        timeline = run.forced.timeline
        n = run.prompt_end + len(run.steps)
        steps = torch.full((n,), NEVER, dtype=torch.long)
        done = 0
        for at, quantized in zip(timeline.at, timeline.quantized):
            if at >= run.end:  # a later turn's
                break
            if quantized > done:
                steps[done:min(quantized, n)] = max(-1, at - run.prompt_end) if at >= run.prompt_end else -1
                done = quantized
        return steps


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
    end-of-turn included) and the logits ``(V,)`` before each of its tokens."""

    prompt_ids: list[int]
    ids: list[int]
    logits: list[torch.Tensor]


def full_replies(lm: LoadedModel, turns: Sequence[str], max_new_tokens: int,
                 progress: Progress | None = None) -> list[FullTurn]:
    """The full-cache side of a run of ``turns``: it depends on no policy, so runs of several policies on the same
    turns (a sweep) can share it."""
    _check(turns, max_new_tokens)
    full, replies = Session(lm), []
    progress = progress or Progress(None, 0)
    for text in turns:
        full.add_user_turn(text)
        progress.tick()
        prompt_ids = list(full.transcript.ids)
        replies.append(FullTurn(prompt_ids, *_full_reply(full, max_new_tokens, progress.tick)))
        progress.total -= 2 * (max_new_tokens - len(replies[-1].ids))  # the reply's length is known, on both sides
    return replies


def _check(turns: Sequence[str], max_new_tokens: int) -> None:
    if not turns:
        raise KvvizError("a policy run needs at least one turn")
    if max_new_tokens < 1:
        raise KvvizError("max_new_tokens must be at least 1")


def run_policy(lm: LoadedModel, turns: Sequence[str], settings: RunSettings, max_new_tokens: int = 64,
               progress: Callable[[int, int], None] | None = None, full: list[FullTurn] | None = None) -> PolicyRun:
    """Answer ``turns`` with the full cache and with ``settings``' compression, side by side (module doc).
    ``progress(done, total)`` is called after each forward pass (``total``: an upper bound, exact once every reply is
    known; an exception it raises abandons the run); ``full`` is the full side when already computed
    (:func:`full_replies` of the same turns and ``max_new_tokens``)."""
    _check(turns, max_new_tokens)
    # passes: each turn's prompt and reply steps (as many as its tokens) on the full side, then on the policy's (a free
    # reply past a divergence is counted when it happens)
    counter = Progress(progress, 2 * len(turns) * max_new_tokens if full is None else sum(len(t.ids) for t in full))
    full = full if full is not None else full_replies(lm, turns, max_new_tokens, counter)
    if len(full) != len(turns):
        raise KvvizError(f"the full run has {len(full)} turns for {len(turns)} turns")
    policy = CompressedSession(lm, settings)
    result = PolicyRun(settings, lm.name)
    for text, reference in zip(turns, full):
        policy.add_turn(text)
        counter.tick()  # the prompt's pass
        forced, free, turn = _compare(policy, reference.ids, reference.logits, max_new_tokens, counter)
        result.turns.append(TurnRun(text, reference.prompt_ids, forced.prompt_end[-1], reference.ids,
                                    turn["policy_ids"], _text(lm, reference.ids), _text(lm, turn["policy_ids"]),
                                    turn["divergence"], turn["steps"], forced, torch.stack(reference.logits).cpu()))
        policy = free
    return result


def _text(lm: LoadedModel, ids: list[int]) -> str:
    """A reply's text: end-of-turn and other special tokens left out."""
    return lm.tokenizer.decode([i for i in ids if i not in lm.stop_ids], skip_special_tokens=True)


def _full_reply(full: Session, max_new_tokens: int, tick: Callable[[], None]) -> tuple[list[int], list[torch.Tensor]]:
    """The full session's greedy reply (ids, end-of-turn included) and the logits before each of its tokens."""
    ids, logits = [full.pending], [full.logits]
    while len(ids) < max_new_tokens and ids[-1] not in full.lm.stop_ids and full.has_room(1):
        full.step()
        tick()
        ids.append(full.pending)
        logits.append(full.logits)
    full.set_announced(len(ids))
    return ids, logits


def _compare(policy: CompressedSession, full_ids: list[int], full_logits: list[torch.Tensor], max_new_tokens: int,
             progress: Progress) -> tuple[CompressedSession, CompressedSession, dict]:
    """Teacher-force ``policy`` on the full reply; fork the free run where its choice first differs. Returns the
    forced side, the free side (the same object when they never part) and the turn's records."""
    session = policy.session
    free: CompressedSession | None = None
    divergence = None
    row = policy.prompt_end[-1] - 1  # the prefill's last row saw the history as it stood before this prompt
    steps = [_record(-1, row, policy.visible_to(row), session.transcript.segments(), session.logits, full_logits[0],
                     full_ids[0])]
    if not steps[0].top1_agree:  # the prefill already chose otherwise (a follow-up turn on a compressed history)
        divergence, free = -1, _fork(policy)
    for step in range(len(full_ids) - 1):
        segments = session.transcript.segments()
        logits = policy.step(full_ids[step])
        steps.append(_record(step, len(session) - 1, policy.seen, segments, logits, full_logits[step + 1],
                             full_ids[step + 1]))
        if free is None and not steps[-1].top1_agree:
            divergence, free = step, _fork(policy)
        progress.tick()
    if free is None:
        session.set_announced(len(full_ids))
        return policy, policy, {"policy_ids": list(full_ids), "divergence": None, "steps": steps}
    progress.total += max_new_tokens - len(free.session.produced)  # the free reply's passes, at most
    own = _free_reply(free, max_new_tokens, progress)
    return policy, free, {"policy_ids": own, "divergence": divergence, "steps": steps}


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
    """An independent copy of ``policy`` (the model is shared, not copied)."""
    lm = policy.lm
    policy.session.memo.clear()  # derived data is not copied
    return copy.deepcopy(policy, memo={id(lm): lm})


def _free_reply(free: CompressedSession, max_new_tokens: int, progress: Progress) -> list[int]:
    """The forked run's own greedy reply: it forked right after choosing a token of its own."""
    session = free.session
    ids = list(session.produced)
    while len(ids) < max_new_tokens and ids[-1] not in free.lm.stop_ids and session.has_room(1):
        free.step()
        progress.tick()
        ids.append(session.pending)
    progress.total -= max_new_tokens - len(ids)  # it ended early
    session.set_announced(len(ids))
    return ids
