"""The notebook widget and reprs on the bundled model: requests sent as the widget's front end sends them give exactly
``what_if`` of the same edit (evictions in each scope, bits, an earlier step, a policy's decision); refused changes
leave the draft and the session as they were; the reprs are static HTML holding the objects' numbers."""

from __future__ import annotations

import re

import pandas as pd
import pytest
import traitlets

import kvviz
from kvviz import H2O, Edit, Kivi, RunSettings, blame, run_policy, what_if
from kvviz.notebook import html, widget
from kvviz.notebook import reprs
from kvviz.notebook import cache_widget as widget_module
from kvviz.policies.kvpress import own_code
from kvviz.policies.kvpress.presses import from_press

PROMPT = "My name is Ada and I live in Lisbon. Where do I live?"


@pytest.fixture
def session(make_chat):
    return make_chat(PROMPT, generate=8)


def click(w, kind: str, **content) -> None:
    """What the front end does: its ``request`` trait set and saved, which the kernel's comm (Jupyter) or marimo
    hands to ``set_state``; ``n`` counts the requests, as the front end does."""
    w.set_state({"request": {"kind": kind, **content, "n": w.request.get("n", 0) + 1}})


def test_a_clicked_chip_gives_the_what_if_of_its_eviction(session):
    w = widget(session)
    assert w.at == len(session) - 1 and len(w.chips) == len(session) and w.result is None and w.kl is None
    click(w, "evict", slot=12)
    click(w, "evict", slot=20)
    expected = what_if(session, Edit.evict([12, 20]))
    assert w.edit == Edit.evict([12, 20])
    # the same function on the same cache and the same inputs: the same bits
    assert w.kl == w.result.next_token.kl == expected.next_token.kl
    assert [c.id for c in w.result.next_token.edited] == [c.id for c in expected.next_token.edited]
    assert f"{expected.next_token.kl:.6g}" in w.result_html
    assert [c[5] for c in w.chips if c[0] in (12, 20)] == [1, 1]  # the strip rows' evicted column
    click(w, "evict", slot=12)  # a second click brings it back
    assert w.edit == Edit.evict([20]) and w.kl == what_if(session, Edit.evict([20])).next_token.kl


def test_scopes_bits_and_the_step_slider(session, lm):
    w = widget(session)
    w.layer, w.scope = 3, "layer"
    click(w, "evict", slot=9)
    assert w.edit == Edit.evict([9], layers=[3])
    assert w.kl == what_if(session, Edit.evict([9], layers=[3]), layer=3).next_token.kl
    w.scope, w.head = "kv head", 4
    click(w, "evict", slot=10)
    kv = 4 // (lm.heads // lm.kv_heads)
    assert (9,) in [e.slots for e in w.edit.evictions] and ((10,), (3,), (kv,)) in [
        (e.slots, e.layers, e.heads) for e in w.edit.evictions]
    click(w, "clear")
    assert w.edit.is_empty and w.result is None
    for slot in (5, 6):
        click(w, "select", slot=slot)
    assert [c[8] for c in w.chips if c[0] in (5, 6)] == [1, 1]  # selected
    click(w, "bits", bits=4)
    quantized = Edit.quantize([5, 6], 4)
    assert w.edit == quantized and w.kl == what_if(session, quantized, layer=3, head=4).next_token.kl
    w.at = 30  # time travel: the step of slot 30, with the slots before it
    assert len(w.chips) == 31 and w.kl == what_if(session, quantized, at=30, layer=3, head=4).next_token.kl


def test_refused_changes_leave_everything_as_it_was(session, lm, monkeypatch):
    w = widget(session)
    click(w, "evict", slot=12)
    edit, version, kl = w.edit, session.version, w.kl
    refusals = [({"kind": "evict", "slot": len(session) - 1}, "not cached before the step"),
                ({"kind": "evict", "slot": -3}, "not cached before the step"),
                ({"kind": "bits", "bits": 4}, "select them first"),
                ({"kind": "undo"}, "cannot undo 1")]
    for message, reason in refusals:
        click(w, **message)
        assert reason in w.error and w.edit == edit and session.version == version and w.kl == kl
    for name, value in (("at", len(session)), ("layer", lm.layers), ("head", lm.heads), ("scope", "nowhere")):
        with pytest.raises(traitlets.TraitError, match=f"{name} .* is not one of this session's"):
            setattr(w, name, value)
    assert w.edit == edit and w.kl == kl
    w.scope = "kv head"  # the mean of heads names no KV head
    click(w, "evict", slot=14)
    assert "needs a head" in w.error and w.edit == edit
    w.scope, w.at = "everywhere", 40
    click(w, "commit")
    assert "newest step" in w.error and session.version == version and not session.commits.stack

    def broken(*_args, **_kwargs):
        raise RuntimeError("boom in the kernel\nsecond line")

    monkeypatch.setattr(widget_module, "what_if", broken)
    click(w, "evict", slot=13)  # the draft changed, the what-if failed: one line in the widget, no dead output
    assert w.error == "RuntimeError: boom in the kernel" and w.result is None
    monkeypatch.undo()
    click(w, "evict", slot=13)
    assert w.error == "" and w.kl == what_if(session, Edit.evict([12]), at=40).next_token.kl


def test_a_new_step_reruns_the_what_if_once(session, monkeypatch):
    w = widget(session)
    click(w, "evict", slot=12)
    runs = []
    monkeypatch.setattr(widget_module, "what_if", lambda *args, **kw: runs.append(args) or what_if(*args, **kw))
    session.step()
    w.refresh()  # the step moves to the new slot: one what-if there
    assert len(runs) == 1 and runs[0][2] == w.at == len(session) - 1
    w.refresh()  # nothing moved: the what-if of the same step again, once
    assert len(runs) == 2


def test_commit_undo_and_a_turn_from_the_widget(session):
    w = widget(session)
    click(w, "evict", slot=12)
    click(w, "commit")
    assert w.error == "" and w.commits == 1 and session.commits.stack and w.edit.is_empty
    assert [c[11] for c in w.chips if c[0] == 12] == [1]  # struck through as committed
    click(w, "undo")
    assert w.commits == 0 and not session.commits.stack
    click(w, "select", slot=5)
    click(w, "bits", bits=2)
    click(w, "commit")  # committed bits stay marked on the chip (the draft is empty again)
    assert w.edit.is_empty and [(c[6], c[12]) for c in w.chips if c[0] == 5] == [(16, 2)]  # committed bits
    click(w, "undo")
    assert [(c[6], c[12]) for c in w.chips if c[0] == 5] == [(16, 16)]
    said = []
    w.observe(lambda change: said.append(change["new"]), names="progress")
    n = len(session)
    reply = w.turn("And what is my name?", max_new_tokens=4)
    assert reply == session.reply and w.slots == len(session) > n and w.at == len(session) - 1
    assert any(s.startswith("prefill: layer") for s in said) and any(s.startswith("decode step") for s in said)
    assert said[-1] == "" and w.progress == ""


def static(text: str) -> None:
    """Static HTML: no script, no URL, no event handler attribute."""
    assert "<script" not in text and not re.search(r"https?://|//cdn", text) and not re.search(r"\son\w+=", text)


def test_reprs_are_static_html_with_the_objects_numbers(session, lm):
    session.commit(Edit.evict([12]))
    text = reprs.session_html(session)
    static(text)
    assert text.count("<span title=") == len(session) and "1 committed edit(s)" in text
    chip = re.findall(r'<span title="slot 12 [^>]*>', text)[0]
    assert "line-through" in chip and "evicted" in chip
    result = what_if(session, Edit.evict(range(9, 15)))
    shown = html(result)._repr_html_()
    static(shown)
    assert f"{result.next_token.kl:.6g}" in shown and f"{result.memory.edited_bytes:,}" in shown
    with pytest.raises(TypeError, match="no notebook view"):
        html(3)


def test_ipython_shows_the_objects_as_html(session):
    from IPython.core.interactiveshell import InteractiveShell

    named = {(kind.__module__, kind.__name__) for kind in reprs.RENDERERS if kind is not pd.DataFrame}
    assert set(kvviz._VIEWS) == named  # the formatter knows every object html() shows (but pandas' own tables)
    shell = InteractiveShell.instance()
    try:
        kvviz._register_views()
        data, _ = shell.display_formatter.format(session)
        assert "kvviz session" in data["text/html"] and "text/plain" in data
    finally:
        InteractiveShell.clear_instance()


def test_policy_run_blame_and_sweep_reprs(lm):
    run = run_policy(lm, [PROMPT], RunSettings(H2O(), budget=16), max_new_tokens=4)
    shown = reprs.policy_run_html(run)
    static(shown)
    turn = run.turns[0]
    assert f"{max(r.kl for r in turn.records):.4g}" in shown and turn.policy_text.split()[0] in shown
    assert shown.count("<svg") == 3  # the KL per step, the slots each step sees, the eviction timeline
    quantized = run_policy(lm, [PROMPT], RunSettings(cache_format=Kivi(group=8, residual=4)), max_new_tokens=3)
    kivi = reprs.policy_run_html(quantized)
    assert kivi.count("<svg") == 3 and "key bits" in kivi  # no timeline (nothing evicted); the bit-widths instead
    found = blame(run)
    text = reprs.blame_html(found)
    static(text)
    assert f"{found.kl:.4g}" in text and text.count("<tr>") == min(len(found.rows), reprs.BLAME_ROWS) + 1
    table = pd.DataFrame({"policy": ["h2o", "h2o", "tova", "tova"], "budget": [8, 16, 8, 16],
                          "kl_mean": [0.5, 0.2, 0.4, 0.1]})
    chart = reprs.sweep_html(table)
    static(chart)
    assert "<svg" in chart and "4 cases · 2 policies" in chart


def test_a_policy_seeds_the_widget_as_it_seeds_the_strip(session):
    w = widget(session)
    policy = H2O()
    w.policy(policy, 16)
    edit = policy.edit(session, 16, w.at)
    assert w.edit == edit and w.kl == what_if(session, edit).next_token.kl
    evicted = {c[0] for c in w.chips if c[5]}
    assert evicted == edit.evicted_slots() and evicted
    gone = min(evicted)
    click(w, "evict", slot=gone)  # a click on one of its slots brings it back everywhere
    assert w.edit.evicted_slots() == evicted - {gone}
    before, kl = w.edit, w.kl
    w.policy(policy, -5)  # refused: the draft as it was, the reason in the widget
    assert "budget" in w.error and w.edit == before and w.kl == kl


def test_a_kvpress_press_object_seeds_the_widget(session):
    """A press as its users build it, running its own code (``from_press``), seeds the widget as kvviz's policies
    do; a press that cannot run on this cache (SnapKVPress' 64-token window over a shorter conversation) is
    refused in one line and leaves the draft as it was."""
    kvpress = own_code.kvpress()  # imported as kvviz imports it: transformers' attention registry left alone
    own = from_press(kvpress.SnapKVPress(compression_ratio=0.5, window_size=8))
    w = widget(session)
    w.policy(own.policy, own.ratio)
    edit = own.policy.edit(session, own.ratio, w.at)
    assert w.error == "" and w.edit == edit and edit.evicted_slots()
    assert w.kl == what_if(session, edit).next_token.kl
    before, kl = w.edit, w.kl
    too_wide = from_press(kvpress.SnapKVPress(compression_ratio=0.5))
    w.policy(too_wide.policy, too_wide.ratio)
    assert w.error and "\n" not in w.error and w.edit == before and w.kl == kl


def test_plain_text_for_terminals(session, lm):
    assert repr(session) == f"Session({lm.name}, {len(session)} slots, 0 committed edits)"
    result = what_if(session, Edit.evict([12]))
    assert repr(result).startswith(f"WhatIf(at={len(session) - 1}, kl={result.next_token.kl:.6g}, ")
    run = run_policy(lm, [PROMPT], RunSettings(H2O(), budget=16), max_new_tokens=2)
    assert repr(run).startswith(f"PolicyRun({run.settings.label}, {lm.name}: turn 0: ")
