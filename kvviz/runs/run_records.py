"""What a policy run records, turn by turn and step by step (docs/math.md §9): the teacher-forced comparison's steps,
each turn's replies and caches, and the questions a run answers about them — when each slot left the cache, why, and
when KIVI quantized it. :mod:`kvviz.runs.policy_run` makes them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from kvviz.errors import KvvizError
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.runs.timeline import NEVER


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

    def __repr__(self) -> str:  # the plain-text output (a notebook shows HTML: kvviz.notebook.reprs)
        turns = "; ".join(
            f"turn {k}: " + ("same reply" if t.divergence is None else f"differs at step {t.divergence}")
            + f", KL max {max((r.kl for r in t.records), default=0):.4g}" for k, t in enumerate(self.turns))
        return f"PolicyRun({self.settings.label}, {self.model}: {turns})"

    @property
    def last(self) -> TurnRun:
        return self.turns[-1]

    @property
    def windowed(self) -> bool:
        """Whether its cache format rounds slots as they leave a full-precision window (KIVI): then the bit-width
        each slot is stored at changes over the steps (:meth:`quantized_steps`)."""
        return self.settings.cache_format is not None and self.settings.cache_format.window_bits is not None

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

    def recency_only(self, turn: int = -1) -> tuple[int, int]:
        """``(k, m)``: of the ``m`` decisions of ``turn`` that evicted slots, the ``k`` that kept only the policy's
        protected slots (recent or sink) in every layer and KV head — where its scores chose nothing."""
        run = self.turns[turn]
        reasons = run.forced.reasons
        evicting = reasons.evicting(run.prompt_end, run.end)
        return len(reasons.only_protected(evicting)), len(evicting)

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
        """The cache format's side of the timeline (KIVI's window): ``(n,)`` int, the turn's decode step from which
        each slot is stored at low bits (``-1``: before the turn; ``NEVER``: still at 16 bits at the end)."""
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
