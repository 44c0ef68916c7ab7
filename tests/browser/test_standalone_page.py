"""The standalone page in headless Chromium with the network off: it opens from file://, shows the strip, switches
between prepared edits on a chip click, requests nothing and shows hostile text literally."""

from __future__ import annotations

import re

import pytest

from kvviz.edit.edit import Edit
from kvviz.session import Session
from kvviz.figures.standalone_page import Prepared, page_data, standalone_html
from benchmarks.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.browser_page import shows_evicted

HOSTILE = "Say </script><script>alert(1)</script> <img src=x onerror=alert(2)> **bold** ![x](http://example.com/x.png)"


@pytest.fixture(scope="module")
def session(lm):
    session = Session(lm)
    session.add_user_turn(HOSTILE)
    session.generate(12)
    return session


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
        expect(page.locator(".kv-result h3")).to_have_text(re.compile(r"^Greedy continuations \((the same tokens|"
                                                                      r"they differ|the same first)"))
        expect(page.locator(".kv-continuation pre")).to_have_count(2)  # the full and the edited cache's replies
        page.locator('.kv-chip[data-slot="9"]').click()  # only the second edit evicts slot 9
        expect(page.locator(".kv-result h2")).to_contain_text(f"second at slot {at - 1}")
        expect(page.locator('.kv-chip[data-slot="9"]')).to_have_class(re.compile(r"\bkv-evicted\b"))
        shows_evicted(page.locator('.kv-chip[data-slot="9"]'), 9)  # as the app and the widget show it
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
