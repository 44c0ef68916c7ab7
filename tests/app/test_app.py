"""The Streamlit app through AppTest: the full flow, every view on an empty and on a long conversation, demos."""

from __future__ import annotations

import re

from app.views.whatif import CHARTS
from kvviz.numbers import ordinal
from kvviz.policies import H2O, KVZip
from kvviz.view_data import reply_as_cached
from tests.support.app_test import assert_clean, metric, open_view, start, strip_data


def test_rho_is_of_the_head_the_picker_names():
    """The what-if's ρ follows the Head picker: with the mean of heads, the mean over the layer's query heads of each
    one's evicted share (not head 0's); with a head, that head's — each equal to a what-if run here."""
    from kvviz.whatif import what_if

    app = start()
    app.chat_input[0].set_value("a = 3, b = 5. What is a + b?").run()
    draft = app.session_state["draft"]
    for slot in (30, 31, 32):
        draft.toggle_evicted(slot)
    app.run()
    assert_clean(app)
    session, at = app.session_state["session"], len(app.session_state["session"]) - 1
    rho = what_if(session, draft.edit(at), at=at).heads["rho"][0]  # (H,), layer 0
    assert metric(app, "ρ (layer 0, mean of heads)") == f"{float(rho.mean()):.4f}" != f"{float(rho[0]):.4f}"
    app.session_state["whatif_chart"] = CHARTS["alpha"]
    app.run()
    assert any("with the mean of heads chosen above, head 0's" in c.value for c in app.caption)
    app.selectbox(key="head").set_value(2).run()
    assert_clean(app)
    assert metric(app, "ρ (layer 0, head 2)") == f"{float(rho[2]):.4f}"
    assert not any("with the mean of heads chosen above" in c.value for c in app.caption)


def test_full_flow_send_select_compare_commit_undo():
    app = start()
    app.chat_input[0].set_value("a = 3, b = 5. What is a + b?").run()
    assert_clean(app)
    session = app.session_state["session"]
    assert len(session) > 0 and session.turns[0]["user"] == "a = 3, b = 5. What is a + b?"
    assert reply_as_cached(session)[0] in [t.value for t in app.text]  # the reply as cached; the pending token apart
    assert metric(app, "KL") == "0"  # nothing edited yet
    draft = app.session_state["draft"]  # a selection as the strip would make it
    for slot in (30, 31, 32):
        draft.toggle_evicted(slot)
    draft.set_bits(range(5, 20), 4, 2)
    app.run()
    assert_clean(app)
    assert float(metric(app, "KL")) > 0
    open_view(app, "Cache growth")
    assert_clean(app)
    assert metric(app, "Cache bytes") != metric(app, "Cache after")
    next(b for b in app.button if b.label.startswith("Commit edit")).click().run()
    assert_clean(app)
    assert len(app.session_state["session"].commits.stack) == 1
    assert metric(app, "KL") == "0"  # the draft was cleared: the committed cache is now the full one
    next(b for b in app.button if b.label.startswith("Undo")).click().run()
    assert_clean(app)
    assert not app.session_state["session"].commits.stack


def test_every_view_renders_on_an_empty_conversation():
    app = start()
    assert_clean(app)
    assert any("Send a message" in i.value for i in app.info)


def test_every_view_renders_on_a_long_conversation():
    app = start()
    session = app.session_state["session"]
    session.add_ids([(i * 37) % 40000 + 100 for i in range(1100)])
    session.step()
    app.session_state["draft"].toggle_evicted(3)
    app.run()
    assert_clean(app)
    assert len(app.session_state["session"]) == 1101
    assert float(metric(app, "KL")) >= 0
    assert len(app.get("plotly_chart")) == 3  # the Attention tab, open by default: overview, head map, row
    open_view(app, "Cache growth")
    assert_clean(app)
    assert len(app.get("plotly_chart")) == 1  # only the open tab is drawn
    for label in ("Policies", "Policy run", "Sweeps"):
        open_view(app, label)
        assert_clean(app)
        assert not app.get("plotly_chart") and float(metric(app, "KL")) >= 0  # the editor stays
    import pyarrow as pa

    assert len(app.get("vega_lite_chart")) == 1  # the what-if's charts: the one whose tab is chosen (ρ and ‖Δo‖)
    app.session_state["whatif_chart"] = CHARTS["alpha"]
    app.run()
    charts = app.get("vega_lite_chart")  # α's one table holds 3 series of 1,101 slots in 2-slot blocks
    rows = pa.ipc.open_stream(charts[0].proto.data.data).read_all().num_rows
    assert len(charts) == 1 and rows == 3 * 551


def test_policy_seeds_the_strip_and_comparison_runs():
    app = start()
    app.chat_input[0].set_value("Tell me about attention sinks in one sentence.").run()
    open_view(app, "Policies")
    app.number_input(key="policy-0-h2o-recent_fraction").set_value(0.25).run()  # a policy's parameter is a widget
    next(b for b in app.button if b.label.startswith("Put h2o")).click().run()
    assert_clean(app)
    session, draft = app.session_state["session"], app.session_state["draft"]
    assert draft.policy_name == "h2o" and draft.policy_settings == {"recent_fraction": 0.25}
    assert draft.policy == H2O(recent_fraction=0.25).edit(session, 0.5, len(session) - 1)
    next(b for b in app.button if b.label == "Compare the two").click().run()
    assert_clean(app)
    report = app.session_state["comparison"]
    assert [r.policy for r in report.rows] == ["h2o", "streaming_llm"] and 0 <= report.overlap <= 1
    app.number_input(key="policy-1-streaming_llm-sinks").set_value(-1).run()  # refused with one line
    assert_clean(app)
    assert any("sinks must be a non-negative integer" in re.sub(r"\\(.)", r"\1", w.value) for w in app.warning)
    next(s for s in app.selectbox if s.label == "Compare with").select("kv_zip").run()  # a policy with passes of its own says what they cost
    assert_clean(app)
    extra = KVZip().extra_tokens(session, len(session) - 1)
    assert extra > 0 and any(f"kv_zip runs {extra} more tokens through the model" in c.value for c in app.caption)


def test_demo_scenarios_load_with_their_edits():
    app = start()
    next(b for b in app.button if b.label == "Evict a fact").click().run()
    assert_clean(app)
    session, draft = app.session_state["session"], app.session_state["draft"]
    evicted = sorted(draft.evicted)
    assert evicted and "".join(session.transcript.slots[s].text for s in evicted).strip() == "Whiskers"
    assert app.session_state["continuation"] == 12  # the demo opens with both continuations
    heading = next(m.value for m in app.markdown if m.value.startswith("**Greedy continuations**"))
    parted = re.fullmatch(r"\*\*Greedy continuations\*\* \(the same first (\d+) tokens?, different from the "
                          r"(\d+\w\w) on\)", heading)  # the demo's continuations part after a few tokens
    assert parted and ordinal(int(parted[1]) + 1) == parted[2], heading  # counted from the 1st, not from 0
    assert any("Whiskers" in i.value for i in app.info)  # its story, as a note
    assert isinstance(app.session_state["head"], int)  # one head (the edit's largest ρ), not the mean
    next(b for b in app.button if b.label == "Toy numbers: ρ and α′").click().run()
    assert_clean(app)
    table = app.dataframe[0].value.to_dict("records")
    assert any(row["#2"] == "0.105" and row["#3"] == "0.632" for row in table)


def test_empty_message_is_refused_inline():
    app = start()
    app.chat_input[0].set_value("   ").run()
    assert_clean(app)
    assert any("empty" in w.value for w in app.warning)
    assert len(app.session_state["session"]) == 0


def test_picker_buttons_edit_before_the_what_if_runs(monkeypatch):
    """The editor computes the what-if before drawing (one burst for the browser): the picker's buttons are callbacks,
    so their edit is in that computation — one what-if per click, showing the edit — and in the strip of that run."""
    import app.views.whatif as view
    from kvviz.whatif.memory import step_memory

    calls = []
    original = view.what_if
    monkeypatch.setattr(view, "what_if", lambda *a, **k: calls.append(a[1]) or original(*a, **k))
    app = start()
    app.session_state["max_new_tokens"] = 4
    for message in ("Name three colours.", "And two more?"):
        app.chat_input[0].set_value(message).run()
    assert_clean(app)
    app.selectbox(key="pick_k").set_value(2).run()
    session, draft = app.session_state["session"], app.session_state["draft"]
    at = len(session) - 1
    for label, check in (("Evict this turn", lambda edit: edit.evictions and not edit.key_bits),
                         ("History → these bits", lambda edit: set(edit.key_bits.values()) == {2}),
                         ("Clear edit", lambda edit: edit.is_empty)):
        calls.clear()
        next(b for b in app.button if b.label == label).click().run()
        assert_clean(app)
        edit = draft.edit(at)
        assert len(calls) == 1 and calls[0] == edit and check(edit), label  # one run, with this click's edit
        assert metric(app, "Cache bytes") == f"{step_memory(session, edit, at).edited_bytes:,}"
        chips = strip_data(app)["chips"]  # the strip drawn in the same run
        assert {c[0] for c in chips if c[5]} == {s for e in edit.evictions for s in e.slots}, label
        assert {c[0]: c[6] for c in chips if c[6] < 16} == dict(edit.key_bits), label
    assert metric(app, "KL") == "0"


def test_a_bad_user_policy_module_is_one_line_and_the_built_ins_still_run(monkeypatch):
    monkeypatch.setenv("KVVIZ_POLICIES", "no_such_module_here:Thing")
    app = start()
    app.chat_input[0].set_value("My name is Ada. What is my name?").run()
    assert_clean(app)
    for label in ("Policies", "Policy run"):  # each tab that lists the policies says it
        open_view(app, label)
        refusals = [w.value for w in app.warning if "KVVIZ_POLICIES" in w.value.replace("\\", "")]  # escaped Markdown
        assert refusals and all("\n" not in r for r in refusals)
    app.number_input(key="run-h2o-recent_fraction").set_value(0.5)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    result = app.session_state["policy_run"]
    assert result.settings.policy.name == "h2o" and result.last.full_ids


def test_committed_edits_stay_on_the_strip_and_the_commit_list_undoes_them():
    from kvviz.edit.draft import EditDraft
    from kvviz.view_data import strip_chips

    app = start()
    app.chat_input[0].set_value("a = 3, b = 5. What is a + b?").run()
    draft = app.session_state["draft"]
    for slot in (30, 31):
        draft.toggle_evicted(slot)
    app.run()
    next(b for b in app.button if b.label.startswith("Commit edit")).click().run()
    draft = app.session_state["draft"]
    draft.set_bits(range(5, 8), 4, 2)
    app.run()
    next(b for b in app.button if b.label.startswith("Commit edit")).click().run()
    assert_clean(app)
    session = app.session_state["session"]
    at = len(session) - 1
    chips = strip_chips(session, EditDraft(), at, 0, None)  # nothing being tried: only what is committed
    assert [c[11] for c in chips[28:33]] == [0, 0, 1, 1, 0] and all(c[5] == 0 for c in chips)
    assert [(c[12], c[13]) for c in chips[4:9]] == [(16, 16), (4, 2), (4, 2), (4, 2), (16, 16)]
    listed = [t.value for t in app.text if t.value.startswith("#")]
    assert listed[0].startswith("#2 ") and "quantized 3 keys to int4 per channel and 3 values to int2 per token" in listed[0]
    assert listed[1].startswith("#1 ") and "evicted 2 slots" in listed[1]
    app.button(key="undo-0").click().run()  # the first commit, and the one made on top of it
    assert_clean(app)
    assert not app.session_state["session"].commits.stack
    assert not [t.value for t in app.text if t.value.startswith("#1 ")]


def test_looking_back_forks_the_conversation_and_keeps_the_branch_it_left():
    """Time travel to the step that chose the answer, evict the dog's name, fork: a new branch re-runs the conversation
    from that step (kvviz.fork: tests/model/test_fork.py checks its numbers), the commit list says what ran on the
    edit, the branch left is kept — its replies side by side with the fork's — and switching back replays it as it
    was."""
    app = start()
    app.chat_input[0].set_value("My dog is called Rex. What is my dog called?").run()
    session = app.session_state["session"]
    ids, reply = list(session.transcript.ids), session.reply
    back = next(s.slot for s in session.transcript.slots if s.kind == "decode") - 1
    rex = [s.slot for s in session.transcript.slots if s.text == " Rex"][0]
    app.session_state["at"] = back
    app.session_state["draft"].toggle_evicted(rex)
    app.run()
    assert_clean(app)
    assert not [b for b in app.button if b.key == "commit-edit"]  # a commit edits what is to come: here it forks
    assert app.button(key="fork").label == f"Fork from step {back}"
    assert any(f"looking back at step {back}" in i.value for i in app.info)
    app.button(key="fork").click().run()
    assert_clean(app)
    fork = app.session_state["session"]
    assert fork is not session and fork.transcript.ids[: back + 1] == ids[: back + 1]
    assert [c.at for c in fork.commits.stack] == [back] and fork.reply != reply
    assert session.transcript.ids == ids and session.reply == reply  # the branch left is untouched
    assert app.session_state["branch"] == f"fork at step {back}" and app.session_state["at"] is None
    assert any(f"You are on the branch fork at step {back}" in i.value for i in app.info)
    listed = [t.value for t in app.text if t.value.startswith("#1 ")]
    assert listed[0].startswith(f"#1 · from slot {back} ") and f"{len(fork) - back} steps ran on it" in listed[0]
    assert [t.value for t in app.text if t.value.startswith("main · ")] == ["main · 1 turn"]
    side = next(d.value for d in app.dataframe if "main" in d.value.columns)
    assert list(side["main"]) == [reply] and list(side[f"fork at step {back}"]) == [fork.reply]
    app.button(key="branch-0").click().run()  # back to the branch left: replayed, the fork kept in its place
    assert_clean(app)
    again = app.session_state["session"]
    assert again.transcript.ids == ids and again.reply == reply and not again.commits.stack
    assert app.session_state["branch"] == "main"
    assert [b["name"] for b in app.session_state["branches"]] == [f"fork at step {back}"]


def test_step_one_token_advances_the_reply_as_the_strip_holds_it():
    app = start()
    app.session_state["max_new_tokens"] = 3  # stops before the end of the turn
    app.chat_input[0].set_value("Tell me a short story about a cat.").run()
    session = app.session_state["session"]
    for _ in range(2):
        next(b for b in app.button if b.label == "Step one token").click().run()
        assert_clean(app)
        turn = session.transcript.turn
        generated = [s.id for s in session.transcript.slots if s.turn == turn and s.kind == "decode"]
        expected = session.lm.tokenizer.decode(generated, skip_special_tokens=True)
        assert expected and app.chat_message[-1].children[0].value == expected  # the reply's text element
        assert any("not cached yet" in c.value and c.value.endswith(f"id {session.pending}") for c in app.caption)
    assert len(generated) == 4


def test_kept_edits_are_saved_with_the_session_and_make_the_standalone_page():
    from kvviz.figures.standalone_page import Prepared, page_data, standalone_html

    app = start()
    app.chat_input[0].set_value("Name two colours.").run()
    app.session_state["draft"].toggle_evicted(5)
    app.run()
    keep = next(b for b in app.button if b.label == "Keep this edit for the page")
    keep.click().run()
    assert_clean(app)
    session, kept = app.session_state["session"], app.session_state["prepared"]
    assert [Prepared.from_dict(k) for k in kept] == [Prepared(len(session) - 1, app.session_state["draft"].edit(len(session)))]
    saved = app.session_state["export"]["doc"]
    assert saved["view"]["prepared"] == kept  # in the autosave and the export
    assert any("standalone page (1 kept edits" in b.label for b in app.get("download_button"))
    # a slide (tests/model/test_slides.py)
    assert any(b.label == "Download the figure" for b in app.get("download_button"))
    page = standalone_html(page_data(session, [Prepared.from_dict(k) for k in kept], [(0, None)]))
    assert '"evicted":[5]' in page
    next(b for b in app.button if b.label == "Forget the kept edits").click().run()
    assert_clean(app)
    assert not app.session_state["prepared"]


def test_long_work_that_fails_is_one_line_and_keeps_the_page():
    """Work handed to the page's run (a policy run, a sweep case) that raises shows one line, not a traceback, and
    keeps nothing."""
    from app.long_work import Work

    def broken(progress):
        progress(1, 4)
        raise RuntimeError("out of luck")

    app = start()
    app.session_state["long_work"] = Work("Running the full cache and the policy side by side", broken,
                                          lambda result: app.session_state.__setitem__("kept", result))
    app.run()
    assert_clean(app)
    assert any("could not finish" in w.value and "out of luck" in w.value for w in app.warning)  # (Markdown-escaped)
    assert "kept" not in app.session_state and "long_work" not in app.session_state


def test_a_kvpress_press_file_runs_in_the_policy_run_tab(monkeypatch, tmp_path):
    """A press written against kvpress (a ScorerPress subclass) named in KVVIZ_POLICIES: listed by its class name,
    its argument a widget, run with kvpress' own code in prefill mode at kvpress' ratio."""
    path = tmp_path / "far_keys.py"
    path.write_text("from dataclasses import dataclass\n\nfrom kvpress import ScorerPress\n\n\n@dataclass\n"
                    "class FarKeysPress(ScorerPress):\n    compression_ratio: float = 0.0\n    power: float = 1.0\n\n"
                    "    def score(self, module, hidden_states, keys, values, attentions, kwargs):\n"
                    "        norms = keys.norm(dim=-1)\n"
                    "        return (norms - norms.mean(-1, keepdim=True)).abs() ** self.power\n")
    monkeypatch.setenv("KVVIZ_POLICIES", str(path))
    app = start()
    app.chat_input[0].set_value("My name is Ada and I keep bees. What is my name?").run()
    open_view(app, "Policy run")
    app.selectbox[[s.label for s in app.selectbox].index("Policy")].set_value("FarKeysPress")
    app.selectbox[[s.label for s in app.selectbox].index("Compress")].set_value("prefill")
    app.number_input[[n.label for n in app.number_input].index("or kvpress ratio")].set_value(0.5)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()  # the form: its defaults
    assert_clean(app)
    assert app.session_state["policy_run"].settings.policy.settings() == {"power": 1.0}
    app.number_input(key="run-FarKeysPress-power").set_value(2.0)  # now shown under the press's own name
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    result = app.session_state["policy_run"]
    policy = result.settings.policy
    assert type(policy).__name__ == "FarKeysPress" and policy.settings() == {"power": 2.0}
    assert type(policy.instance).__name__ == "FarKeysPress" and policy.instance.power == 2.0
    kept = result.last.forced.visible_to(result.last.prompt_end)  # (L, KV, n): what the first decode step saw
    n = kept.shape[-1]
    assert bool((kept.sum(-1) == int(n * 0.5)).all())
