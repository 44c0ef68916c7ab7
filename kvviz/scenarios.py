"""Ready demos (``assets/scenarios/*.json``): a conversation to run and an edit to start from, a policy run with the
blame of its divergence, or the toy numbers of docs/math.md §3."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvviz.attention_math import evicted_mass, renormalized
from kvviz.edit.draft import EditDraft
from kvviz.model import LoadedModel
from kvviz.session import Session

SCENARIOS = Path(__file__).resolve().parents[1] / "assets" / "scenarios"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    turns: list[str] = field(default_factory=list)
    max_new_tokens: int = 16
    evict_text: list[str] = field(default_factory=list)
    evict_slots: list[int] = field(default_factory=list)
    toy: dict | None = None
    policy_run: dict | None = None  # {"policy", "params", "budget", "mode", "blame_unit", "expect_blame"}
    continuation: int = 0  # greedy tokens the what-if continues with both caches when the demo opens
    claim: dict | None = None  # what the demo shows, checked by the tests (see :func:`check_claim`)


def load_scenarios(folder: Path = SCENARIOS) -> list[Scenario]:
    return [Scenario(**json.loads(path.read_text())) for path in sorted(folder.glob("*.json"))]


def find_slots(session: Session, text: str) -> list[int]:
    """Slots whose pieces cover the first occurrence of ``text`` in the cached text (empty when absent)."""
    spans = session.transcript.matches(text)
    return spans[0] if spans else []


def run_scenario(lm: LoadedModel, scenario: Scenario) -> tuple[Session, EditDraft, int]:
    """Run the scenario's turns (greedy) and prepare its edit as a draft. Also returns the step to look at: the last
    prefilled slot, whose step chose the first token of the answer."""
    session, draft = Session(lm), EditDraft()
    for text in scenario.turns:
        session.add_user_turn(text)
        session.generate(scenario.max_new_tokens)
    slots = set(scenario.evict_slots)
    for text in scenario.evict_text:
        slots.update(find_slots(session, text))
    answer_step = max(s.slot for s in session.transcript.slots if s.kind == "prefill")
    draft.evict_many(sorted(s for s in slots if s < answer_step))
    return session, draft, answer_step


def demo_view(session: Session, draft: EditDraft, at: int, scenario: Scenario) -> dict:
    """How the demo opens: the layer and query head whose attention the edit takes most of (largest ρ) and the
    continuation length."""
    from kvviz.whatif import what_if

    rho = what_if(session, draft.edit(at), at=at).heads["rho"]  # (L, H)
    layer, head = divmod(int(rho.argmax()), rho.shape[1])
    return {"layer": layer, "head": head, "continuation": scenario.continuation}


def check_claim(session: Session, draft: EditDraft, at: int, scenario: Scenario) -> list[str]:
    """What of the scenario's ``claim`` does not hold (empty: all of it). Keys: ``full_contains`` / ``full_lacks`` /
    ``edited_contains`` / ``edited_lacks`` (text in the greedy continuation with the full / edited cache),
    ``min_kl`` (next-token KL at the answer step), ``min_mean_rho`` (ρ averaged over layers and heads)."""
    from kvviz.whatif import what_if

    claim = scenario.claim or {}
    result = what_if(session, draft.edit(at), at=at, continuation=max(scenario.continuation, 1))
    texts = {"full": result.continuation.full, "edited": result.continuation.edited}
    failed = [f"{key}: {texts[key.split('_')[0]]!r}" for key in claim if key.endswith(("_contains", "_lacks"))
              and (claim[key] in texts[key.split("_")[0]]) != key.endswith("_contains")]
    if result.next_token.kl < claim.get("min_kl", 0):
        failed.append(f"min_kl: {result.next_token.kl:.3f}")
    if float(result.heads["rho"].mean()) < claim.get("min_mean_rho", 0):
        failed.append(f"min_mean_rho: {float(result.heads['rho'].mean()):.3f}")
    return failed


def toy_example(alpha: list[float], evict: list[int]) -> dict:
    """docs/math.md §3's toy numbers: ``ρ`` and ``α′ = α/(1−ρ)`` (None where evicted) for weights ``alpha`` with ``evict`` removed."""
    weights = torch.tensor(alpha, dtype=torch.float64)
    evicted = torch.zeros(len(alpha), dtype=torch.bool)
    evicted[evict] = True
    renorm = renormalized(weights, evicted)
    return {"rho": float(evicted_mass(weights, evicted)),
            "alpha_renorm": [None if gone else float(v) for v, gone in zip(renorm, evicted.tolist())]}


def run_policy_scenario(lm: LoadedModel, scenario: Scenario,
                        progress: Callable[[int, int], None] | None = None):
    """The scenario's policy run over its turns, and the blame of the first turn's divergence (None without one);
    ``progress(done, total)`` as :func:`~kvviz.runs.policy_run.run_policy` calls it."""
    from kvviz.policies.user import available
    from kvviz.runs.blame import blame
    from kvviz.runs.from_names import from_names
    from kvviz.runs.policy_run import run_policy

    spec = scenario.policy_run
    settings = from_names(spec["policy"], spec.get("params", {}), budget=spec["budget"],
                          mode=spec.get("mode", "decode"), classes=available())
    result = run_policy(lm, scenario.turns, settings, scenario.max_new_tokens, progress)
    first = next((index for index, run in enumerate(result.turns) if run.divergence is not None), None)
    ranked = None if first is None else blame(result, turn=first, unit=spec.get("blame_unit", "slot"))
    return result, ranked
