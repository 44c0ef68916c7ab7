"""A live notebook widget on a :class:`~kvviz.session.Session` (anywidget: JupyterLab, Notebook 7, VS Code, Colab, and
marimo through ``mo.ui.anywidget``). Its front end (the strip's own, kvviz/figures/strip.js and strip.css, then
``widget.js`` and ``widget.css``) ships in the package and loads nothing from the network.

The widget draws the strip at the step of slot ``at``; a click evicts a chip (everywhere, in the shown layer, or in
the shown layer's KV head, as ``scope`` says), a shift-click selects it for a bit-width. Each change re-runs
:func:`~kvviz.whatif.what_if` in the kernel and shows it in the same output; ``Commit`` and ``Undo`` change the
session as :meth:`Session.commit` / :meth:`Session.undo` do. What it holds is readable from Python: ``w.edit`` (the
:class:`~kvviz.edit.edit.Edit` being tried) and ``w.result`` (its :class:`~kvviz.whatif.WhatIf`). A refused change
leaves the draft and the session as they were and shows its one-line reason in the widget. The front end asks for a
change by setting the ``request`` trait (every front end applies trait changes alike; marimo then re-runs the cells
that read the widget).
"""

from __future__ import annotations

import copy
from pathlib import Path

import anywidget
import traitlets

from kvviz.edit.draft import EditDraft
from kvviz.edit.edit import Edit, Eviction
from kvviz.errors import KvvizError
from kvviz.numbers import number, reply_length
from kvviz.policies.base import Policy
from kvviz.figures.strip import front_end, strip_css
from kvviz.notebook.reprs import what_if_html
from kvviz.session import Session
from kvviz.view_data import sink_share, strip_chips
from kvviz.whatif import WhatIf, what_if

_HERE = Path(__file__).parent
SCOPES = ("everywhere", "layer", "kv head")


class CacheWidget(anywidget.AnyWidget):
    """The strip, the step slider, the scope and bit-width controls and the what-if of the edit being tried."""

    _esm = front_end(_HERE / "widget.js")  # the strip's one front end, then the widget's own lines
    _css = strip_css() + (_HERE / "widget.css").read_text(encoding="utf-8")

    # drawn by the front end
    chips = traitlets.List().tag(sync=True)  # per slot up to `at`: its kvviz.view_data.strip_chips row, as the
    # dashboard's strip draws it — [slot, text, segment, turn, attention, evicted (0 no / 1 everywhere / 2 some layers
    # or KV heads), key bits, value bits, selected, …, committed eviction (11), committed key bits (12), …]
    sink = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)  # a learned sink's share (gpt-oss):
    # kvviz.view_data.sink_share, drawn as a chip before slot 0; None without sinks
    slots = traitlets.Int(0).tag(sync=True)
    layers = traitlets.Int(1).tag(sync=True)
    heads = traitlets.Int(1).tag(sync=True)
    commits = traitlets.Int(0).tag(sync=True)
    result_html = traitlets.Unicode("").tag(sync=True)
    kl = traitlets.Float(None, allow_none=True).tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    busy = traitlets.Bool(False).tag(sync=True)  # a what-if is running in the kernel
    progress = traitlets.Unicode("").tag(sync=True)  # a turn in progress: what it is doing ("" when none)
    # set by the front end (or from Python)
    at = traitlets.Int(0).tag(sync=True)
    layer = traitlets.Int(0).tag(sync=True)
    head = traitlets.Int(-1).tag(sync=True)  # -1: the mean of the query heads
    scope = traitlets.Unicode("everywhere").tag(sync=True)
    # a click or a button: {"kind": "evict" | "select" | "bits" | "clear" | "commit" | "undo", "slot" | "bits": …,
    # "n": the front end's count, so a second click on the same chip is a change too}. A trait, not a custom
    # message: marimo re-runs the cells that read the widget when the front end changes a trait (after the change
    # is applied here), as Jupyter's front ends apply it
    request = traitlets.Dict().tag(sync=True)

    def __init__(self, session: Session, topk: int = 10, **settings):
        self.session, self.topk = session, topk  # before the traits: their validation reads the session
        super().__init__(**settings)
        self.draft = EditDraft()
        self._result: WhatIf | None = None
        self.observe(self._on_request, names=["request"])
        self.observe(self._on_view, names=["at", "layer", "head"])
        self.refresh()

    @traitlets.validate("at", "layer", "head", "scope")
    def _valid(self, proposal: dict) -> object:
        name, value, lm = proposal["trait"].name, proposal["value"], self.session.lm
        allowed = {"at": range(max(len(self.session), 1)), "layer": range(lm.layers), "head": range(-1, lm.heads),
                   "scope": SCOPES}[name]
        if value not in allowed:
            raise traitlets.TraitError(f"{name} {value!r} is not one of this session's: {_span(allowed)}")
        return value

    # --- what Python reads ---------------------------------------------------------------------------------------

    @property
    def edit(self) -> Edit:
        """The edit being tried at the step of slot :attr:`at` (slots from ``at`` on left out)."""
        return self.draft.edit(self.at)

    @property
    def result(self) -> WhatIf | None:
        """The what-if of :attr:`edit` (None while it edits nothing)."""
        return self._result

    # --- actions (the front end's requests call these; a notebook cell may too) ----------------------------------

    def evict(self, slot: int) -> None:
        """Evict ``slot`` in the widget's scope, or bring it back if the draft evicts it anywhere."""
        self._change(lambda: self._toggle(slot))

    def select(self, slot: int) -> None:
        """Add ``slot`` to the selection a bit-width applies to, or take it out."""
        self._change(lambda: self.draft.toggle_selected(self._cached(slot)), run=False)

    def set_bits(self, bits: int) -> None:
        """Store the selected slots' keys and values at ``bits`` (16: the model's precision); clears the selection."""
        def apply() -> None:
            if not self.draft.selected:
                raise KvvizError("shift-click chips to select them first, then pick a bit-width")
            self.draft.set_bits(self.draft.selected, bits, bits)
            self.draft.selected = set()
        self._change(apply)

    def policy(self, policy: Policy, budget: int | float) -> None:
        """Start from ``policy``'s decision at the shown step (kvviz's, a kvpress press's — ``from_press(press)``'s
        ``.policy`` — or your own class): its evictions, per layer and KV head, become the edit being tried (hand
        evictions cleared, bit-widths kept), as the dashboard's Policies tab seeds the strip; clicks then change it."""
        self._change(lambda: self.draft.seed(policy.edit(self.session, budget, self.at), policy.name,
                                             decided_by=(policy, budget, self.at)))

    def clear(self) -> None:
        """Drop the edit being tried."""
        self._change(self.draft.clear)

    def commit(self) -> None:
        """Make the edit part of the conversation (:meth:`Session.commit`): later steps run on the edited cache."""
        def apply() -> None:
            if self.at != len(self.session) - 1:
                raise KvvizError("commits apply to the newest step: move the step slider to the end first")
            self.session.commit(self.draft.edit())
            self.draft.clear()
        self._change(apply)

    def undo(self) -> None:
        """Take the newest committed edit back (:meth:`Session.undo`)."""
        self._change(self.session.undo)

    def turn(self, text: str, max_new_tokens: int = 32) -> str:
        """Add a user turn and generate its reply, showing the prefill's layers and the decode steps as they run
        (:meth:`Session.add_user_turn`, :meth:`Session.stream`); returns the reply. A refused turn changes nothing."""
        session, before = self.session, self.session.on_layer
        session.on_layer = lambda done, total: setattr(self, "progress", f"prefill: layer {done + 1} of {total}")
        try:
            max_new_tokens = reply_length(max_new_tokens)  # refused before the turn is prefilled
            session.add_user_turn(text)
            for k, _token in enumerate(session.stream(max_new_tokens)):
                self.progress = f"decode step {k + 1} of at most {max_new_tokens}"
        except Exception as error:  # noqa: BLE001 — shown in the widget (and raised in the cell)
            self.error = _one_line(error)
            raise
        finally:
            session.on_layer, self.progress = before, ""
        self.draft.clear()
        self.refresh()
        return session.reply

    def refresh(self) -> None:
        """Redraw after the session changed outside the widget (a new turn, a decode step): the step moves to the
        newest slot."""
        n, lm, at = len(self.session), self.session.lm, self.at
        with self.hold_trait_notifications():
            self.slots, self.layers, self.heads = n, lm.layers, lm.heads
            self.commits = len(self.session.commits.stack)
            self.at = max(n - 1, 0)
        if self.at == at:  # else the step's observer has redrawn it
            self._update(run=True)

    # --- inside ------------------------------------------------------------------------------------------------

    def _on_request(self, change: dict) -> None:
        """A request from the page (or any code that sets :attr:`request`): one that is malformed — no or a bad
        ``slot`` / ``bits`` — is shown in :attr:`error`, never raised out of the observer."""
        content = change["new"]
        actions = {"evict": lambda: self.evict(_whole(content, "slot")),
                   "select": lambda: self.select(_whole(content, "slot")),
                   "bits": lambda: self.set_bits(_whole(content, "bits")),
                   "clear": self.clear, "commit": self.commit, "undo": self.undo, "refresh": self.refresh}
        kind = content.get("kind") if isinstance(content, dict) else None
        if kind in actions:
            try:
                actions[kind]()
            except KvvizError as error:
                self.error = _one_line(error)

    def _on_view(self, _change) -> None:
        self._update(run=True)

    def _cached(self, slot: int) -> int:
        if not 0 <= slot < self.at:
            raise KvvizError(f"slot {slot} is not cached before the step of slot {self.at}: the step's own slot and "
                             f"later ones cannot be edited there")
        return slot

    def _toggle(self, slot: int) -> None:
        slot = self._cached(slot)
        if slot in self.draft.evicted_somewhere() or self.scope == "everywhere":
            self.draft.toggle_evicted(slot)
            return
        if self.scope == "kv head" and self.head < 0:
            raise KvvizError("evicting in one KV head needs a head: pick a query head (not the mean of heads)")
        lm = self.session.lm
        heads = None if self.scope == "layer" else (self.head // (lm.heads // lm.kv_heads),)
        self.draft.policy = Edit(evictions=self.draft.policy.evictions + (Eviction((slot,), (self.layer,), heads),))

    def _change(self, apply, run: bool = True) -> None:
        """Apply a change to the draft or the session; a refused one restores the draft (the session refuses
        before it changes) and shows why."""
        before = copy.deepcopy(self.draft)
        try:
            apply()
        except Exception as error:  # noqa: BLE001 — shown in the widget, never a dead output
            self.draft = before
            self.error = _one_line(error)
            return
        if self.commits != len(self.session.commits.stack):  # a commit or an undo: the step goes to the newest
            self.refresh()
        else:
            self._update(run)

    def _update(self, run: bool) -> None:
        session, error = self.session, ""
        try:
            self.chips = self._chips()
            head = None if self.head < 0 else self.head
            self.sink = sink_share(session, self.at, self.layer, head) if len(session) else None
            if run:
                self._result = None
                self.result_html, self.kl = "", None
                edit = self.edit
                if not edit.is_empty and len(session):
                    self._result = self._what_if(edit)
                    self.result_html, self.kl = what_if_html(self._result), self._result.next_token.kl
        except Exception as failure:  # noqa: BLE001 — shown in the widget, never a dead output
            error = _one_line(failure)
        self.error = error

    def _chips(self) -> list[list]:
        if not len(self.session):
            return []
        head = None if self.head < 0 else self.head
        return strip_chips(self.session, self.draft, self.at, self.layer, head)

    def _what_if(self, edit: Edit) -> WhatIf:
        self.busy = True
        try:
            return what_if(self.session, edit, self.at, self.layer, max(self.head, 0), self.topk)
        finally:
            self.busy = False


def _span(allowed) -> str:
    return f"{allowed.start}..{allowed.stop - 1}" if isinstance(allowed, range) else ", ".join(allowed)


def _whole(content: dict, name: str) -> int:
    """The request's ``name`` field as a whole number, or refused naming it."""
    return int(number(content.get(name), f"the request's {name}", integer=True))


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    message = text[0] if text else ""
    return message if isinstance(error, KvvizError) else f"{type(error).__name__}: {message}"


def widget(session: Session, topk: int = 10) -> CacheWidget:
    """A live widget on ``session`` (display it as a cell's last expression; in marimo: ``mo.ui.anywidget(w)``)."""
    return CacheWidget(session, topk)
