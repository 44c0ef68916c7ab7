"""One sweep case: a prompt answered with the full cache and with one policy at one budget (a policy run), summarised
as one table row."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product

from kvviz.errors import KvvizError
from kvviz.model import LoadedModel
from kvviz.policies.base import Ratio
from kvviz.sweeps.prompts import Prompt
from kvviz.sweeps.ruler import string_match

Row = dict[str, object]


@dataclass(frozen=True)
class Case:
    """A prompt × policy × budget (× cache scheme: ``kivi-N`` / ``quanto-N``, None for the model's own cache), with
    the run's mode and reply length."""

    prompt: Prompt
    policy: str
    budget: int | float
    mode: str = "decode"
    every: int = 1
    max_new_tokens: int = 32
    scheme: str | None = None

    @property
    def key(self) -> str:
        """Names the case's row (a resumed sweep skips the keys it has)."""
        return f"{self.prompt.id}|{self.policy}|{self.budget!r}|{self.mode}|{self.every}|{self.max_new_tokens}" + (
            f"|{self.scheme}" if self.scheme else "")


def cases_for(prompts: list[Prompt], policies: list[str], budgets: list[int | float], mode: str = "decode",
              every: int = 1, max_new_tokens: int = 32, schemes: list[str | None] | None = None) -> list[Case]:
    """Every prompt × policy × budget × scheme (default: the model's own cache only), prompt by prompt."""
    return [Case(prompt, policy, budget, mode, every, prompt.max_new_tokens or max_new_tokens, scheme)
            for prompt, policy, budget, scheme in product(prompts, policies, budgets, schemes or [None])]


def refuse_too_long(lm: LoadedModel, prompts: list[Prompt], max_new_tokens: int) -> None:
    """Refuse, naming the first, a prompt whose turns' tokens and replies (``max_new_tokens`` each, or its own) cannot
    fit the model's context window — counted without the chat template's few tokens per turn, so a prompt refused
    here could never run."""
    texts = [turn for prompt in prompts for turn in prompt.turns]
    counts = iter(len(ids) for ids in lm.tokenizer(texts, add_special_tokens=False)["input_ids"]) if texts else iter(())
    for prompt in prompts:
        need = sum(next(counts) for _ in prompt.turns) + len(prompt.turns) * (prompt.max_new_tokens or max_new_tokens)
        if need > lm.context_window:
            raise KvvizError(f"prompt {prompt.id!r:.60} is longer than the model's context: its turns and replies "
                             f"need at least {need:,} tokens of {lm.context_window:,}; shorten it or leave it out")


def by_prompt(cases: list[Case]) -> list[list[Case]]:
    """Consecutive cases of one prompt, grouped: a worker runs a group in order and computes its full side once."""
    groups: list[list[Case]] = []
    for case in cases:
        if groups and groups[-1][0].prompt == case.prompt and groups[-1][0].max_new_tokens == case.max_new_tokens:
            groups[-1].append(case)
        else:
            groups.append([case])
    return groups


def matches(reply: str, expected: str | None) -> bool | None:
    """Whether ``reply`` contains the expected answer (case and surrounding space ignored); None without one."""
    return None if expected is None else expected.strip().lower() in reply.lower()


def run_cases(lm: LoadedModel, cases: list[Case], batch: int = 4,
              progress: Callable[[int, int], None] | None = None) -> list[Row]:
    """The rows of ``cases`` (:func:`run_case`). Consecutive cases of one prompt run together, up to ``batch`` at a
    time: one full-cache run beside them and their decode steps batched (:func:`~kvviz.runs.policy_run.run_policies`);
    ``batch`` 0: each case alone, one step at a time. ``progress(done, total)`` hears of the forward passes of all
    the cases (as :func:`~kvviz.runs.policy_run.run_policies` counts them)."""
    from kvviz.policies.user import available
    from kvviz.runs.policy_run import run_policies

    classes, rows = available(), []
    groups = parts(cases, batch)
    sizes = [(1 + len(part)) * len(part[0].prompt.turns) * part[0].max_new_tokens for part in groups]
    total, before = sum(sizes), 0  # passes in all, and before this part
    for part, size in zip(groups, sizes):
        report = None if progress is None else (
            lambda done, _, before=before, size=size: progress(before + min(done, size), total))
        before += size
        runs = run_policies(lm, part[0].prompt.turns, [run_settings(case, classes) for case in part],
                            part[0].max_new_tokens, report, batch=batch > 0)
        rows += [_row(case, run.last) for case, run in zip(part, runs)]
    return rows


def parts(cases: list[Case], batch: int) -> list[list[Case]]:
    """The cases as :func:`run_cases` runs them together: consecutive ones of one prompt, up to ``batch`` (≥ 1)."""
    size = max(batch, 1)
    return [group[start:start + size] for group in by_prompt(cases) for start in range(0, len(group), size)]


def run_case(lm: LoadedModel, case: Case) -> Row:
    """The case's policy run, summarised over its last turn: mean / max KL(full ‖ policy) teacher-forced on the full
    reply over its steps -1, 0, … (one per reply token), top-1 agreement, the divergence step (-1: the first token;
    None: none), whether the answer changed, and whether each reply contains the expected answer; the prompt's turns
    ride along (JSON), so a row can be opened again."""
    return run_cases(lm, [case])[0]


def _row(case: Case, last) -> Row:
    kls = [step.kl for step in last.records]  # one per reply token: the prefill's last row (step -1) first
    return {
        "key": case.key, "prompt_id": case.prompt.id, "family": case.prompt.family, "policy": case.policy,
        "budget": case.budget, "fraction": isinstance(case.budget, float),
        "ratio": case.budget.ratio if isinstance(case.budget, Ratio) else None, "mode": case.mode, "every": case.every, "max_new_tokens": case.max_new_tokens,
        "scheme": case.scheme or "fp16", "prompt_slots": len(last.prompt_ids), "steps": len(kls),
        "kl_mean": sum(kls) / len(kls), "kl_max": max(kls),
        "top1_agreement": sum(s.top1_agree for s in last.records) / len(kls),
        "divergence": last.divergence, "answer_changed": last.changed,
        "expected": case.prompt.expected, "full_match": matches(last.full_text, case.prompt.expected),
        "policy_match": matches(last.policy_text, case.prompt.expected),
        "full_text": last.full_text, "policy_text": last.policy_text, "turns": json.dumps(list(case.prompt.turns)),
        **_scores(case.prompt, last.full_text, last.policy_text),
    }


def _scores(prompt: Prompt, full: str, policy: str) -> Row:
    """A task's RULER metric for both replies (:mod:`kvviz.sweeps.ruler`), with its answers; nothing without them."""
    if not prompt.answers:
        return {}
    return {"metric": prompt.metric, "answers": json.dumps(list(prompt.answers)),
            "full_score": string_match(full, prompt.answers, prompt.metric),
            "policy_score": string_match(policy, prompt.answers, prompt.metric)}


def run_settings(case: Case, classes: dict):
    """The :class:`~kvviz.runs.compressed.RunSettings` of ``case``: its policy (from ``classes``), budget, mode and
    cache scheme — the same for a sweep's run and for the case opened again."""
    from kvviz.runs.from_names import from_names

    return from_names(case.policy, budget=case.budget, mode=case.mode, every=case.every,
                      schemes=[case.scheme] if case.scheme else [], classes=classes)


def case_of(row: Row) -> Case:
    """The case a table row came from (its prompt's turns are in the row), e.g. to open it as a policy run."""
    ratio = row.get("ratio")
    if isinstance(ratio, (int, float)) and ratio == ratio:  # kvpress' ratio (NaN or None: not one)
        budget = Ratio(float(ratio))
    else:
        budget = float(row["budget"]) if row["fraction"] else int(row["budget"])
    answers, metric = row.get("answers"), row.get("metric")
    prompt = Prompt(str(row["prompt_id"]), tuple(json.loads(row["turns"])), row.get("expected"), str(row["family"]),
                    tuple(json.loads(answers)) if isinstance(answers, str) else (),
                    metric if isinstance(metric, str) else None)
    scheme = row.get("scheme")
    return Case(prompt, str(row["policy"]), budget, str(row["mode"]), int(row["every"]), int(row["max_new_tokens"]),
                scheme if isinstance(scheme, str) and scheme != "fp16" else None)
