"""Guided tours (``assets/tours/*.json``): a conversation and a list of steps, each a caption and the state to show —
which step of the cache, which slots evicted or quantized, which layer and head. The captions' numbers are the live
model's: ``{kl}``, ``{rho}``… are filled from a what-if of the step's edit, and each step's ``expect`` is checked by
the tests against them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kvviz.edit.draft import EditDraft
from kvviz.errors import KvvizError
from kvviz.model import LoadedModel
from kvviz.quant.quantizer import Quantizer
from kvviz.scenarios import find_slots, toy_example
from kvviz.session import Session

TOURS = Path(__file__).resolve().parents[1] / "assets" / "tours"
# the model's own text (anything): formatted by the caller
TEXT_FIELDS = ("token", "full_top", "edited_top", "full_reply", "edited_reply", "policy_reply", "blame_top")


@dataclass(frozen=True)
class TourStep:
    caption: str  # Markdown with ``{name}`` fields from :func:`stage`'s numbers
    at: str | int = "answer"  # "answer" (the step that chose the reply's first token), "end", "prefill_end" or a slot
    evict_text: list[str] = field(default_factory=list)  # slots covering these texts, before the step, evicted
    quantize: dict | None = None  # {"slots": "history" | [..], "key_bits", "value_bits", "keys": "channel" | "token"}
    head: str | list[int] = "max_rho"  # the layer and head shown: the largest ρ of the edit, or [layer, head]
    toy: dict | None = None  # {"alpha": [...], "evict": [[...], ...]} as a toy demo: §3's numbers, the first eviction's
    # as {toy_rho} and {toy_renorm}
    look: str = ""  # where to look on the page (shown under the caption)
    view: str = ""  # a view tab the step opens (e.g. "Channels")
    scroll: str = ""  # where the page scrolls (the app's places: top, strip, charts, views, run, blame); default: the
    # step's subject (the toy numbers, the view, else the strip)
    channels: list[int] | None = None  # [layer, kv_head] of the Channels view: {outliers}, {outlier_layers}, …
    continuation: int = 0  # greedy tokens both caches continue with: {full_reply}, {edited_reply}; the what-if shows them
    policy_run: str = ""  # a policy-run demo (assets/scenarios) on the tour's turns, opened with its blame: the turn
    # that goes wrong first, {divergence}, {full_reply} / {policy_reply}, {policy_kl}, and blame's best row: {blame_top},
    # {blame_kl}, {top1_restored}, {blame_left_turn} (the turn, from 0, during which its slots were first evicted);
    # {first_reply_same}: whether the first turn's replies are the same
    expect: dict = field(default_factory=dict)  # {"min_kl", "max_kl", "min_rho", "top1_changed", ...,
    # "edited_reply_lacks": text, "full_reply_contains": text}: checked


@dataclass(frozen=True)
class Tour:
    name: str
    description: str
    turns: list[str]
    steps: list[TourStep]
    max_new_tokens: int = 16


@dataclass
class Stage:
    """One step, ready to show: the slot whose step is shown, the draft edit, the layer and head, the numbers."""

    at: int
    draft: EditDraft
    layer: int
    head: int
    numbers: dict
    policy_run: tuple | None = None  # (PolicyRun, Blame) of the step's policy-run demo

    def caption(self, step: TourStep, text=lambda value: value) -> str:
        """The step's caption with the numbers; ``text`` formats the model's text fields (:data:`TEXT_FIELDS`) for
        where the caption is shown (e.g. as Markdown code spans)."""
        return step.caption.format(**{k: text(v) if k in TEXT_FIELDS else v for k, v in self.numbers.items()})


def load_tours(folder: Path = TOURS) -> list[Tour]:
    tours = []
    for path in sorted(folder.glob("*.json")):
        document = json.loads(path.read_text())
        tours.append(Tour(**{**document, "steps": [TourStep(**step) for step in document["steps"]]}))
    return tours


def play(lm: LoadedModel, tour: Tour) -> Session:
    """The tour's conversation, greedy."""
    session = Session(lm)
    for text in tour.turns:
        session.add_user_turn(text)
        session.generate(tour.max_new_tokens)
    return session


def _at(session: Session, at: str | int) -> int:
    slots = session.transcript.slots
    prefill_end = max(s.slot for s in slots if s.kind == "prefill")
    where = {"answer": prefill_end, "prefill_end": prefill_end, "end": len(session) - 1}
    if isinstance(at, int) and 0 <= at < len(session):
        return at
    if at not in where:
        raise KvvizError(f"a tour step's 'at' must be answer, end, prefill_end or a cached slot, not {at!r}")
    return where[at]


def _draft(session: Session, step: TourStep, at: int) -> EditDraft:
    draft = EditDraft()
    draft.evict_many(sorted({s for text in step.evict_text for s in find_slots(session, text) if s < at}))
    if step.quantize:
        spec = step.quantize
        slots = range(at) if spec["slots"] == "history" else [s for s in spec["slots"] if s < at]
        draft.set_bits(list(slots), spec["key_bits"], spec.get("value_bits", spec["key_bits"]))
        draft.keys = Quantizer(axis=spec.get("keys", "channel"), outliers=spec.get("outliers", 0),
                               rotation=spec.get("rotation", "none"))
    return draft


def stage(session: Session, step: TourStep) -> Stage:
    """The state of ``step`` on the tour's ``session`` and the numbers its caption and checks use."""
    from kvviz.whatif import what_if

    at = _at(session, step.at)
    draft = _draft(session, step, at)
    transcript = session.transcript
    kinds = [s.kind for s in transcript.slots[: at + 1]]
    segments = transcript.segments()[: at + 1]
    numbers = {"at": at, "n": at + 1, "token": transcript.slots[at].text,
               "history": segments.count("history"), "query": segments.count("query"),
               "generated": segments.count("generated"), "prefilled": kinds.count("prefill"),
               "per_slot": session.lm.bytes_per_slot, "evicted": len(draft.evicted)}
    layer, head = (step.head if isinstance(step.head, list) else (0, 0))
    edit = draft.edit(at)
    if at > 0:
        more = {"continuation": step.continuation}
        result = what_if(session, edit, at=at, layer=layer, head=head, **more)
        if step.head == "max_rho" and not edit.is_empty:
            rho = result.heads["rho" if edit.evictions else "delta_isolated"]
            layer, head = divmod(int(rho.argmax()), rho.shape[1])
            result = what_if(session, edit, at=at, layer=layer, head=head, **more)
        if step.continuation:
            words = [session.lm.tokenizer.decode(ids, skip_special_tokens=True).strip()  # no end-of-turn marker
                     for ids in (result.continuation.full_ids, result.continuation.edited_ids)]
            numbers |= {"full_reply": words[0], "edited_reply": words[1]}
        nt, memory, heads = result.next_token, result.memory, result.heads
        numbers |= {"kl": nt.kl, "tv": nt.tv, "top1": "flips" if nt.top1_changed else "stays",
                    "top1_changed": nt.top1_changed, "rho": float(heads["rho"][layer, head]),
                    "rho_mean": float(heads["rho"].mean()), "kv_bytes": memory.full_bytes,
                    "edited_bytes": memory.edited_bytes, "saved": 1 - memory.edited_bytes / max(memory.full_bytes, 1),
                    "weight_term": float(heads["weight_term"][layer, head]),
                    "content_term": float(heads["content_term"][layer, head]),
                    "full_top": nt.full[0].text, "edited_top": nt.edited[0].text}
    if step.channels:
        from kvviz.channels import channels, outliers_by_layer

        channel_layer, kv_head = step.channels
        found = outliers_by_layer(session, at)
        numbers |= {"channel_layer": channel_layer, "kv_head": kv_head, "layers": len(found),
                    "outliers": ", ".join(map(str, channels(session, channel_layer, kv_head, at).outliers)) or "none",
                    "outlier_layers": sum(any(row) for row in found)}
    ran = _policy_run(session, step.policy_run) if step.policy_run else None
    if ran is not None:
        result, ranked = ran
        turn, best = result.turns[ranked.turn], ranked.rows[0]
        numbers |= {"divergence": ranked.step, "policy_kl": ranked.kl, "full_reply": turn.full_text.strip(),
                    "policy_reply": turn.policy_text.strip(), "blame_top": turn.forced.session.transcript.text_of(best.slots),
                    "blame_kl": best.kl_after_restore, "top1_restored": best.top1_restored,
                    "first_reply_same": result.turns[0].full_ids == result.turns[0].policy_ids,
                    "blame_left_turn": next((index for index in range(len(result.turns)) if any(  # when it left
                        e["slot"] in best.slots for e in result.evictions(index))), None)}
    if step.toy:
        toy = toy_example(step.toy["alpha"], step.toy["evict"][0])
        numbers |= {"toy_rho": toy["rho"],
                    "toy_renorm": ", ".join("gone" if v is None else f"{v:.3f}" for v in toy["alpha_renorm"])}
    return Stage(at, draft, layer, head, numbers | {"layer": layer, "head": head}, ran)


def _policy_run(session: Session, name: str) -> tuple:
    """The policy-run demo ``name`` and the blame of its first divergence; its turns must be the tour's."""
    from kvviz.scenarios import load_scenarios, run_policy_scenario

    scenario = next((s for s in load_scenarios() if s.name == name and s.policy_run), None)
    if scenario is None:
        raise KvvizError(f"a tour step names the policy-run demo {name!r}, which assets/scenarios does not hold")
    if scenario.turns != [turn["user"] for turn in session.conversation()]:
        raise KvvizError(f"the demo {name!r} runs other turns than its tour")
    # consecutive steps on the same demo (its run, then its blame) share one run, kept with the tour's conversation
    result, ranked = session.memoized("tour_policy_run", name, lambda: run_policy_scenario(session.lm, scenario), keep=1)
    if ranked is None:
        raise KvvizError(f"the demo {name!r} never diverges: it has nothing to blame")
    return result, ranked


def check(stage: Stage, step: TourStep) -> list[str]:
    """What of ``step.expect`` the live numbers do not meet (empty: all of it)."""
    failed, numbers = [], stage.numbers
    for key, wanted in step.expect.items():
        if key.endswith(("_contains", "_lacks")):  # text of the model's: whether it holds ``wanted``
            text = str(numbers.get(key.rsplit("_", 1)[0], ""))
            if (wanted in text) != key.endswith("_contains"):
                failed.append(f"{key}: {wanted!r} in {text!r}")
            continue
        name, bound = (key[4:], "min") if key.startswith("min_") else (key[4:], "max") if key.startswith("max_") \
            else (key, "equal")
        value = numbers.get(name)
        ok = value is not None and (value >= wanted if bound == "min" else value <= wanted if bound == "max"
                                    else value == wanted)
        if not ok:
            failed.append(f"{key}: expected {wanted!r}, the model gives {value!r}")
    return failed
