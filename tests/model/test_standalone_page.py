"""The standalone page: its numbers are the library's, it fits the size budget, and ``chat --save`` then
``export-page`` writes it from a session file (``kvviz.cli.main`` in this process)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from kvviz.edit.edit import Edit
from kvviz.session import Session
from kvviz.figures.standalone_page import CONTINUATION, Prepared, page_data, standalone_html
from kvviz.whatif import what_if
from tests.support.cli import cli

HOSTILE = "Say </script><script>alert(1)</script> <img src=x onerror=alert(2)> **bold** ![x](http://example.com/x.png)"


@pytest.fixture(scope="module")
def session(make_chat, lm):
    session = make_chat(HOSTILE, generate=12)
    return session


def _weights(view: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(view["weights"]), dtype="<f4")


def test_the_page_holds_the_models_numbers(session):
    n, at = len(session), len(session) - 1
    prepared = [Prepared(at, Edit.evict([3, 4, 5])), Prepared(at - 2, Edit.quantize(range(1, 20), 2), "two bits")]
    data = page_data(session, prepared, [(2, None), (2, 4)], detail=(2, 4))
    mean, head = (_weights(v) for v in data["views"])
    rows = np.tril_indices(n)
    # float32 as computed; the mean of heads is summed head by head, so within float32 rounding of the batched mean
    assert np.abs(mean - session.weights(2).mean(0).numpy()[rows]).max() <= 1e-6
    assert np.array_equal(head, session.weights(2, head=4)[0].numpy()[rows])
    for kept, shown in zip(prepared, data["prepared"]):
        result = what_if(session, kept.edit, at=kept.at, layer=2, head=4)
        assert (shown["at"], shown["kl"], shown["tv"]) == (kept.at, result.next_token.kl, result.next_token.tv)
        assert shown["rho"] == float(result.heads["rho"][2, 4]) and shown["alpha"] == result.detail.alpha_full
        assert [row[1] for row in shown["edited"]] == [c.prob for c in result.next_token.edited]
        cont = what_if(session, kept.edit, at=kept.at, continuation=CONTINUATION).continuation  # the reply too
        assert shown["continuation"] == {"full": cont.full, "edited": cont.edited, "parting": cont.parting}
    assert data["prepared"][0]["evicted"] == [3, 4, 5] and data["prepared"][1]["label"] == "two bits"
    assert data["prepared"][1]["key_bits"] == {str(s): 2 for s in range(1, 20)}


def test_a_300_token_conversation_with_10_prepared_edits_fits_5_mb(lm):
    session = Session(lm)
    session.add_user_turn("Describe the key-value cache of a transformer in detail. " * 20)
    session.generate(40)
    at = len(session) - 1
    assert len(session) >= 300
    prepared = [Prepared(at - i, Edit.evict(range(10 * i, 10 * i + 8))) for i in range(10)]
    page = standalone_html(page_data(session, prepared, [(0, None), (15, None)]))
    assert len(page.encode()) <= 5 * 2**20


def test_the_draft_is_taken_at_the_step_the_file_shows_and_long_sessions_are_refused(session, lm):
    from kvviz.edit.draft import EditDraft
    from kvviz.errors import KvvizError
    from kvviz.figures.standalone_page import MAX_SLOTS, prepared_edits

    n, draft = len(session), EditDraft()
    draft.evict_many([3, n - 2])  # slot n - 2 is after the step shown: the edit at that step leaves it out
    kept = prepared_edits({"at": n - 4}, draft, n)
    assert kept == [Prepared(n - 4, draft.edit(n - 4))] and kept[0].edit.evictions[0].slots == (3,)
    assert page_data(session, kept, [(0, None)])["prepared"][0]["evicted"] == [3]
    assert prepared_edits({"prepared": [Prepared(5, Edit.evict([1])).to_dict()]}, draft, n) == \
        [Prepared(5, Edit.evict([1]))]  # kept edits come first
    assert prepared_edits({}, EditDraft(), n) == []
    long = Session(lm)
    long.add_ids([42] * (MAX_SLOTS + 1))
    with pytest.raises(KvvizError, match="at most 2,048"):
        page_data(long, [], [(0, None)])


def test_hostile_text_cannot_close_the_data_script(session):
    page = standalone_html(page_data(session, [], [(0, None)]))
    start = page.index('<script type="application/json" id="kvviz-data">')
    end = page.index("</script>", start)
    data = json.loads(page[start:end].split(">", 1)[1])  # the first </script> after it is its own end
    assert data["turns"][0]["user"] == HOSTILE
    assert "<img" not in page[start:end] and "default-src 'none'" in page


def test_export_page_from_a_chat_save(tmp_path, monkeypatch):
    saved, out = tmp_path / "session.json", tmp_path / "page.html"
    monkeypatch.chdir(tmp_path)
    chat = cli("chat", "--turn", "Name one planet.", "--max-new-tokens", "8", "--save", str(saved))
    assert chat.returncode == 0, chat.stderr
    document = json.loads(saved.read_text())
    n = sum(len(t["prefill_ids"]) + len(t["reply_ids"]) for t in document["turns"]) - 1
    document["view"] = {"layer": 1, "prepared": [{"at": n - 1, "edit": {"evict": [{"slots": [2, 3]}]}}]}
    saved.write_text(json.dumps(document))
    page = cli("export-page", str(saved), "--out", str(out), "--head", "mean", "--head", "3")
    assert page.returncode == 0, page.stderr
    assert "2 attention views, 1 prepared edits" in page.stdout and out.stat().st_size > 0
    bad = cli("export-page", str(saved), "--out", str(out), "--layer", "99")
    assert bad.returncode == 2 and bad.stderr.startswith("error: layer 99") and "Traceback" not in bad.stderr
