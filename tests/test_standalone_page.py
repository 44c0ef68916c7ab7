"""The standalone page: its numbers are the library's, it fits the size budget, the command line writes it from a
session file, and in headless Chromium with the network off it opens from file://, shows the strip, switches between
prepared edits on a chip click, requests nothing and shows hostile text literally."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvviz.edit.edit import Edit
from kvviz.session import Session
from kvviz.session_file import export_session
from kvviz.figures.standalone_page import Prepared, page_data, standalone_html
from kvviz.whatif import what_if
from benchmarks.browser import CHROMIUM, CHROMIUM_ARGS, ROOT

HOSTILE = "Say </script><script>alert(1)</script> <img src=x onerror=alert(2)> **bold** ![x](http://example.com/x.png)"


@pytest.fixture(scope="module")
def session(lm):
    session = Session(lm)
    session.add_user_turn(HOSTILE)
    session.generate(12)
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


def test_export_page_from_a_chat_save(tmp_path):
    saved, out = tmp_path / "session.json", tmp_path / "page.html"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = lambda *args: subprocess.run([sys.executable, "-m", "kvviz", *args], capture_output=True, text=True,  # noqa: E731
                                       cwd=tmp_path, env=env, timeout=600)
    chat = run("chat", "--turn", "Name one planet.", "--max-new-tokens", "8", "--save", str(saved))
    assert chat.returncode == 0, chat.stderr
    document = json.loads(saved.read_text())
    n = sum(len(t["prefill_ids"]) + len(t["reply_ids"]) for t in document["turns"]) - 1
    document["view"] = {"layer": 1, "prepared": [{"at": n - 1, "edit": {"evict": [{"slots": [2, 3]}]}}]}
    saved.write_text(json.dumps(document))
    page = run("export-page", str(saved), "--out", str(out), "--head", "mean", "--head", "3")
    assert page.returncode == 0, page.stderr
    assert "2 attention views, 1 prepared edits" in page.stdout and out.stat().st_size > 0
    bad = run("export-page", str(saved), "--out", str(out), "--layer", "99")
    assert bad.returncode == 2 and bad.stderr.startswith("error: layer 99") and "Traceback" not in bad.stderr


@pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                    reason="Debian's chromium is not installed (scripts/test.sh installs it)")
def test_the_page_works_offline_from_disk(session, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    at = len(session) - 1
    prepared = [Prepared(at, Edit.evict([3, 4])), Prepared(at - 1, Edit.evict([4, 9]), "second")]
    path = tmp_path / "page.html"
    path.write_text(standalone_html(page_data(session, prepared, [(0, None)])))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(offline=True)
        page = context.new_page()
        requests, problems, dialogs = [], [], []
        page.on("request", lambda request: requests.append(request.url))
        page.on("console", lambda message: problems.append(message.text))
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(path.as_uri())
        expect(page.locator(".kv-chip")).to_have_count(len(session))
        expect(page.locator(".kv-result h2")).to_contain_text("evict 2 slots (3, 4)")
        page.locator('.kv-chip[data-slot="9"]').click()  # only the second edit evicts slot 9
        expect(page.locator(".kv-result h2")).to_contain_text(f"second at slot {at - 1}")
        expect(page.locator('.kv-chip[data-slot="9"]')).to_have_class(re.compile(r"\bkv-evicted\b"))
        page.locator('.kv-chip[data-slot="4"]').click()  # both: clicking cycles to the next after the shown one
        expect(page.locator(".kv-result h2")).to_contain_text("evict 2 slots (3, 4)")
        page.locator('.kv-chip[data-slot="20"]').click()
        expect(page.locator(".kv-notice")).to_have_text("No prepared edit touches slot 20.")
        page.get_by_role("button", name="▶ Play the growth").click()  # the cache grows, slot by slot
        page.wait_for_function("(last) => +document.querySelector('input[type=range]').value < last", arg=len(session) - 10)
        growing = page.evaluate("[...document.querySelectorAll('.kv-chip')].filter(c => c.offsetParent).length")
        expect(page.get_by_role("button", name="▶ Play the growth")).to_be_visible(timeout=30_000)  # it ended
        assert 0 < growing < len(session) and page.locator("input[type=range]").input_value() == str(len(session) - 1)
        assert page.evaluate("[...document.querySelectorAll('.kv-chip')].filter(c => c.offsetParent).length") == \
            len(session)  # at the end every slot is there
        assert HOSTILE in page.locator(".kv-user").inner_text()
        assert page.locator("img, a").count() == 0 and not dialogs and not problems
        assert requests == [path.as_uri()]
        browser.close()
