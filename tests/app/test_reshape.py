"""The app's pruning and merging controls through AppTest: ThinK's prunings and merges of the evicted slots land in
the draft, the what-if shows them, a commit keeps them and undo takes them back."""

from __future__ import annotations

from kvviz.policies.reshaping import think
from tests.support.app_test import assert_clean, metric, start


def button(app, label: str):
    return next(b for b in app.button if b.label.startswith(label))


def test_prune_merge_commit_and_undo_from_the_page():
    app = start()
    app.chat_input[0].set_value("My cat is called Whiskers and my dog is called Rex. What is my cat called?").run()
    assert_clean(app)
    session, at = app.session_state["session"], len(app.session_state["session"]) - 1
    app.slider(key="think_ratio").set_value(0.5).run()
    button(app, "Prune with ThinK").click().run()
    assert_clean(app)
    draft = app.session_state["draft"]
    assert draft.prunings == think(session, 0.5, 32, at)
    assert float(metric(app, "KL")) > 0
    assert any("32 key channels" in c.value or "key channels pruned" in c.value for c in app.caption)
    draft.evict_many([20, 21, 22])
    app.run()
    button(app, "Merge the evicted slots").click().run()
    assert_clean(app)
    merges = app.session_state["draft"].merges
    assert merges and {m.source for m in merges} == {20, 21, 22}
    button(app, "Commit edit to the conversation").click().run()
    assert_clean(app)
    committed = session.commits.current
    assert committed.prunings and committed.merges == merges and not app.session_state["draft"].merges
    button(app, "Undo commit").click().run()
    assert_clean(app)
    assert not session.commits.stack


def test_a_policy_run_from_the_page_prunes_and_merges_at_the_prompt():
    from tests.support.app_test import open_view

    app = start()
    app.chat_input[0].set_value("My cat is called Whiskers and my dog is called Rex. What is my cat called?").run()
    open_view(app, "Policy run")
    next(s for s in app.selectbox if s.label == "Compress").select("prefill")
    next(n for n in app.number_input if n.label.startswith("ThinK")).set_value(0.25)
    next(c for c in app.checkbox if c.label == "Merge the evicted").check()
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    result = app.session_state["policy_run"]
    reshape = result.settings.reshape
    assert reshape.think == 0.25 and reshape.merge and result.settings.mode == "prefill"
    parts = result.last.forced.session.commits.parts
    assert parts and parts[0][1].merges and parts[0][1].prunings
    assert any("ThinK prunes 25" in c.value for c in app.caption), [c.value for c in app.caption][:8]


def test_schemes_compared_from_the_page_are_the_librarys_rows():
    from kvviz.schemes.catalogue import schemes
    from kvviz.schemes.compare import compare_schemes

    app = start()
    app.chat_input[0].set_value("My cat is called Whiskers and my dog is called Rex. What is my cat called?").run()
    app.multiselect(key="schemes_chosen").set_value(["fp16", "fp8-e4m3-head", "quanto-2"])  # a form: sent with it
    button(app, "Compare the schemes").click().run()
    assert_clean(app)
    session = app.session_state["session"]
    version, at, rows = app.session_state["schemes"]
    assert rows == compare_schemes(session, schemes(["fp16", "fp8-e4m3-head", "quanto-2"]), at)
    table = next(d for d in app.dataframe if "KL (nats)" in d.value.columns).value
    assert list(table["Scheme"]) == ["fp16", "fp8-e4m3-head", "quanto-2"] and table["KL (nats)"][0] == 0
    assert not session.commits.stack and version == session.version  # comparing changes nothing
