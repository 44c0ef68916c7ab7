"""What a policy run's first compression will keep, known before the run: whether the budget holds only the slots the
policy keeps whatever their scores (its recent window, sinks: :meth:`~kvviz.policies.base.Policy.protected`), so that
its scores choose nothing and the run keeps recency alone (kvpress' SnapKVPress, window 64, on a short prompt at
ratio 0.5). After a run, :meth:`~kvviz.runs.run_records.PolicyRun.recency_only` says the same from what happened."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvviz.chat_template import render
from kvviz.model import LoadedModel
from kvviz.policies.base import Policy, slots_kept
from kvviz.runs.compressed import RunSettings


@dataclass(frozen=True)
class Forecast:
    """The first compression of a run: ``at`` candidate slots of which ``keep`` stay in every layer and KV head, and
    ``protected`` of them the policy keeps whatever their scores."""

    policy: str
    at: int
    keep: int
    protected: int

    @property
    def recency_only(self) -> bool:
        return self.protected >= self.keep

    def __str__(self) -> str:
        than = "more than" if self.protected > self.keep else "as many as"
        return (f"{self.policy}'s first compression keeps {self.keep} of {self.at} slots in every layer and KV head, "
                f"and {self.policy} protects {self.protected} of them whatever their scores (its recent window or "
                f"sinks), {than} it keeps: its scores will choose nothing (the newest protected slots stay).")

    def advice(self, by_ratio: bool, budget: str = "the budget", ratio: str = "the ratio",
               window: tuple[str, object] | None = None) -> str:
        """What lets the policy choose, naming the controls the caller shows: the ``budget`` (slots) raised to
        ``protected + 1``, or with ``by_ratio`` kvpress' ``ratio`` lowered until ``int(n·(1 − ratio))`` keeps that
        many of the ``at`` slots; and the policy's own ``window`` parameter (name, value), where it has one, set
        below the slots kept."""
        need = self.protected + 1
        if by_ratio:
            highest = int((1 - need / self.at) * 100) / 100  # two decimals, rounded down: int(n·(1 − r)) ≥ need
            ways = [f"lower {ratio} to {highest:.2f} or less (it then keeps at least {need} of {self.at} slots)"
                    if highest > 0 else f"no {ratio} can ({self.policy} protects all {self.at} slots)"]
        else:
            ways = [f"raise {budget} to {need} or more"]
        if window is not None:
            ways.append(f"set {window[0]} (now {window[1]}) below {self.keep}")
        return "To let it choose: " + ", or ".join(ways) + "."


def first_compression(lm: LoadedModel, turns: Sequence[str], settings: RunSettings) -> Forecast | None:
    """The first compression of a run of ``turns`` under ``settings`` (counted on the first turn's prompt as the chat
    template renders it), or None: no policy, one that shares the budget unevenly between layers or heads or decides
    its own count (their protected share is not one number), or a first turn that fits the budget in prefill mode."""
    policy, budget = settings.policy, settings.budget
    if policy is None or budget is None or not turns or policy.decides_count \
            or type(policy).budgets is not Policy.budgets:
        return None
    prompt = len(render(lm.tokenizer, [{"role": "user", "content": turns[0]}])[0])
    keep = budget if isinstance(budget, int) else slots_kept(budget, prompt)
    if prompt <= keep and settings.mode == "prefill":
        return None
    at = prompt if prompt > keep else keep + 1  # decoding: the first step over the budget
    return Forecast(policy.name, at, keep, policy.protected(at, keep))
