"""A session as one offline HTML page: the conversation, the strip, the attention of every step for the layers and
heads chosen at export, and the what-if results of the edits a speaker prepared. It opens from disk with no server
and loads nothing (a Content-Security-Policy forbids any request); all text is set as text, never as markup.

The numbers are the library's own: the attention rows are :meth:`Session.weights` (float32 as computed; a mean of
heads is summed head by head) and each prepared
edit is a :func:`~kvviz.whatif.what_if` whose results are stored as computed.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvviz.edit.draft import EditDraft
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.figures.slides import describe
from kvviz.figures.strip import front_end, strip_css
from kvviz.session import Session
from kvviz.spelling import spell
from kvviz.transcript import SEGMENTS
from kvviz.whatif import what_if

_HERE = Path(__file__).parent
MAX_VIEWS = 8  # (layer, head) views of the attention in one page
MAX_PREPARED = 32
MAX_SLOTS = 2048  # every step's row of a view is n(n+1)/2 floats: ~11 MB of page per view at 2,048 slots


@dataclass(frozen=True)
class Prepared:
    """An edit kept for the page: ``edit`` tried at the step of slot ``at``, shown with ``label``."""

    at: int
    edit: Edit
    label: str = ""

    def to_dict(self) -> dict:
        return {"at": self.at, "edit": self.edit.to_dict(), "label": self.label}

    @staticmethod
    def from_dict(value: dict) -> Prepared:
        return Prepared(int(value["at"]), Edit.from_dict(value["edit"]), str(value.get("label", "")))


def prepared_edits(view: dict, draft: EditDraft, n: int) -> list[Prepared]:
    """The edits a session file's ``view`` keeps for the page; without any, its draft's edit for the step the view
    shows (the newest by default), if it edits anything."""
    kept = [Prepared.from_dict(value) for value in view.get("prepared", [])]
    at = n - 1 if view.get("at") is None else int(view["at"])
    edit = draft.edit(at)
    return kept if kept or edit.is_empty else [Prepared(at, edit)]


def _floats(values: np.ndarray) -> str:
    """float32 values as base64 (little-endian): exact and ~4/3 bytes per value."""
    return base64.b64encode(np.ascontiguousarray(values, dtype="<f4").tobytes()).decode()


def _triangle(session: Session, layer: int, head: int | None) -> np.ndarray:
    """Every step's attention row over slots ``0..at``, concatenated (step ``at`` starts at ``at (at + 1) / 2``); the
    mean of heads is summed one head at a time (never all ``(H, n, n)`` at once)."""
    heads = [head] if head is not None else range(session.lm.heads)
    rows = sum(session.weights(layer, head=h)[0] for h in heads) / len(heads)  # (n, n), causal rows
    return rows.cpu().numpy()[np.tril_indices(rows.shape[0])]


CONTINUATION = 12  # greedy tokens after each prepared edit, with the full and the edited cache


def _result(session: Session, prepared: Prepared, layer: int, head: int) -> dict:
    room = session.lm.context_window - 1 - session.transcript.slots[prepared.at].position
    result = what_if(session, prepared.edit, at=prepared.at, layer=layer, head=head,
                     continuation=max(0, min(CONTINUATION, room)))
    cont = result.continuation
    detail, nt = result.detail, result.next_token
    table = lambda rows: [[spell(c.text), c.prob, c.rank + 1, c.rank_other + 1, c.logit_delta] for c in rows]  # noqa: E731
    edit = prepared.edit.resolved(prepared.at)
    return {
        "at": result.at, "label": prepared.label or describe(edit), "evicted": sorted(edit.evicted_slots()),
        "key_bits": {str(s): b for s, b in edit.key_bits.items()},
        "value_bits": {str(s): b for s, b in edit.value_bits.items()},
        "kl": nt.kl, "tv": nt.tv, "top1_changed": nt.top1_changed,
        "rho": float(result.heads["rho"][detail.layer, detail.head]), "layer": detail.layer, "head": detail.head,
        "bytes": [result.memory.edited_bytes, result.memory.full_bytes],
        "full": table(nt.full), "edited": table(nt.edited),
        "alpha": detail.alpha_full, "renorm": [0.0 if v is None else v for v in detail.alpha_renorm],
        "used": [0.0 if v is None else v for v in detail.alpha_edited],
        "continuation": None if cont is None else {"full": cont.full, "edited": cont.edited, "parting": cont.parting},
    }


def page_data(session: Session, prepared: list[Prepared], views: list[tuple[int, int | None]],
              detail: tuple[int, int] = (0, 0), title: str = "") -> dict:
    """What the page shows, JSON-ready. ``views``: (layer, head or None for the mean of heads) whose attention of
    every step is stored; ``detail``: the layer and head of each prepared result's α chart and ρ."""
    lm, n = session.lm, len(session)
    if n == 0:
        raise KvvizError("the conversation is empty: there is nothing to put on a page")
    if n > MAX_SLOTS:
        raise KvvizError(f"the conversation has {n:,} slots; a standalone page holds at most {MAX_SLOTS:,} (the "
                         "attention of every step grows with the square of the length)")
    if not 1 <= len(views) <= MAX_VIEWS:
        raise KvvizError(f"choose between 1 and {MAX_VIEWS} layer/head views of the attention, not {len(views)}")
    if len(prepared) > MAX_PREPARED:
        raise KvvizError(f"at most {MAX_PREPARED} prepared edits fit one page, not {len(prepared)}")
    for layer, head in [*views, detail]:
        if not 0 <= layer < lm.layers or not (head is None or 0 <= head < lm.heads):
            raise KvvizError(f"layer {layer} / head {head} do not exist ({lm.layers} layers, {lm.heads} query heads)")
    segments = session.transcript.segments()
    slots = [[spell(s.text), SEGMENTS.index(segments[s.slot]), s.turn] for s in session.transcript.slots]
    return {
        "title": title or f"kvviz — {lm.name}", "model": lm.name, "slots": slots,
        "sinks": bool(lm.attention.sinks),  # learned sinks: each row's share 1 − Σ α is drawn as a chip of its own
        "turns": session.conversation(),
        "views": [{"layer": layer, "head": head, "weights": _floats(_triangle(session, layer, head))}
                  for layer, head in views],
        "prepared": [_result(session, p, *detail) for p in prepared],
    }


def standalone_html(data: dict) -> str:
    """The page: the data as JSON inside the HTML (``<`` escaped, so no text can close its script element), with the
    page's own CSS and JavaScript inlined."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    css = strip_css() + (_HERE / "standalone_page.css").read_text(encoding="utf-8")
    js = front_end(_HERE / "standalone_page.js")  # the strip's one front end, then the page's own script
    policy = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(data['title'])}</title>\n<style>{css}</style></head>\n"
            f'<body><div id="app"></div>\n<script type="application/json" id="kvviz-data">{payload}</script>\n'
            f"<script>{js}</script></body></html>\n")
