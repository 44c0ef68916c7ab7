"""The dashboard in a real headless Chromium (Playwright + Debian's chromium): send a message, click a chip, see the
side-by-side numbers change; hostile text shows literally and runs nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import expect

from benchmarks.browser import SESSION_UPLOAD
from tests.support.browser_page import idle, settle, shows_evicted

ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = "Repeat this: <img src=x onerror=alert(1)> <script>alert(2)</script> **bold** $x$"


@pytest.fixture(scope="module")
def page(server):
    from benchmarks.browser import browser_page

    with browser_page(server) as page:
        yield page


def upload(page, path: Path) -> None:
    """Put ``path`` in the sidebar's session uploader once the page shows one (during a rerun the old and the new
    sidebar can both be on the page)."""
    expect(page.locator(SESSION_UPLOAD)).to_have_count(1)
    page.locator(SESSION_UPLOAD).set_input_files(str(path))


def load_it(page) -> None:
    """Press *Load it* once the upload's rerun is over (a click during it can be lost on a busy machine); returns
    once the load's run is over."""
    page.get_by_role("button", name="Load it").wait_for(timeout=60_000)
    idle(page)
    settle(page, lambda: page.get_by_role("button", name="Load it").click())


def kl_text(page) -> str:
    return page.locator("[data-testid=stMetric]", has_text="KL(full").locator("[data-testid=stMetricValue]").inner_text()


def test_send_click_chip_and_numbers_change(page):
    page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
    page.fill("[data-testid=stChatInputTextArea]", PAYLOAD)
    page.keyboard.press("Enter")
    page.wait_for_selector(".kv-chip", timeout=180_000)
    page.wait_for_function("document.querySelectorAll('[data-testid=stMetric]').length >= 5", timeout=180_000)
    expect(page.locator("[data-testid=stMetric]", has_text="KL(full")
           .locator("[data-testid=stMetricValue]")).to_have_text("0")  # nothing edited yet: the page's state
    before = kl_text(page)
    chips = page.locator(".kv-chip")
    target = chips.nth(chips.count() // 2)
    target.scroll_into_view_if_needed()
    settle(page, target.click)  # the editor's autosave and export record are written at the end of its run
    page.wait_for_function("""() => {
        const m = [...document.querySelectorAll('[data-testid=stMetric]')].find(e => e.innerText.includes('KL(full'));
        return m && m.querySelector('[data-testid=stMetricValue]').innerText !== '0';
    }""", timeout=120_000)
    assert kl_text(page) != before
    expect(page.locator(".kv-chip.kv-evicted")).to_have_count(1)  # the numbers are sent first, the strip right after
    page.screenshot(path=str(ROOT / "assets" / "browser-test.png"), full_page=False)
    slot = int(target.get_attribute("data-slot"))
    shows_evicted(target, slot)  # as the widget and the offline page show it (tests/browser/test_notebook.py, …)
    with page.expect_download() as download:  # the export is built when clicked: it holds the click made in the editor
        page.get_by_role("button", name="Export session (JSON)").click()
    evicted = json.loads(Path(download.value.path()).read_text())["draft"]["edit"]["evict"]
    assert [e["slots"] for e in evicted] == [[slot]]
    total = chips.count()
    settle(page, target.click)  # clicking again restores the slot: the chip is updated in place, the numbers back to 0
    page.wait_for_function("""() => {
        const m = [...document.querySelectorAll('[data-testid=stMetric]')].find(e => e.innerText.includes('KL(full'));
        return m && m.querySelector('[data-testid=stMetricValue]').innerText === '0';
    }""", timeout=120_000)
    expect(page.locator(".kv-chip.kv-evicted")).to_have_count(0)
    assert page.locator(".kv-chip").count() == total and int(target.get_attribute("data-slot")) == slot


def test_hostile_text_is_shown_literally_and_runs_nothing(page):
    chat = page.locator("[data-testid=stChatMessage]").first
    assert PAYLOAD in chat.inner_text()
    strip_text = page.locator(".kv-strip").inner_text().replace("\n", "")
    assert "<img" in strip_text and "<script>" in strip_text and "**" in strip_text and "$x$" in strip_text.replace(" ", "")
    assert page.locator("img[src=x]").count() == 0
    assert page.locator(".kv-strip script, [data-testid=stChatMessage] script").count() == 0
    assert page.locator("[data-testid=stChatMessage] strong, [data-testid=stChatMessage] .katex").count() == 0
    assert page.dialogs == []


def test_hostile_model_output_is_shown_literally(page, lm, tmp_path):
    """A session whose *generated* text is the payload, imported through the sidebar."""
    from kvviz.edit.draft import EditDraft
    from kvviz.session_file import export_session
    from kvviz.session import Session

    session = Session(lm)
    session.add_user_turn("Show me some markup.")
    for index, token in enumerate(lm.tokenizer.encode(PAYLOAD, add_special_tokens=False) + [2]):
        if index:
            session.step()
        session.force(token)
    session.set_announced(len(session.produced) - 1)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(export_session(session, EditDraft())))
    upload(page, path)
    load_it(page)
    page.wait_for_function(
        "[...document.querySelectorAll('[data-testid=stChatMessage]')].some(m => m.innerText.includes('Show me some'))",
        timeout=180_000)
    page.wait_for_function("text => [...document.querySelectorAll('[data-testid=stChatMessage]')]"
                           ".some(m => m.innerText.includes(text))", arg=PAYLOAD)  # the reply, as text
    assert page.locator("img[src=x]").count() == 0
    assert page.locator("[data-testid=stChatMessage] strong, [data-testid=stChatMessage] .katex").count() == 0
    assert page.dialogs == []


def test_a_refused_import_with_markdown_fetches_nothing(page, tmp_path):
    """A session file whose field holds a Markdown image: refused with one line, shown literally, no request made."""
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    path = tmp_path / "markdown.json"
    path.write_text(json.dumps({"format": "kvviz-session", "version": 1, "turns": [
        {"user": "hi", "prefill_ids": [1], "reply_ids": ["![x](http://example.com/x.png)"], "shown": 0}]}))
    upload(page, path)
    load_it(page)
    warning = page.locator("[data-testid=stAlert]", has_text="cannot import this session")
    expect(warning).to_have_count(1, timeout=60_000)
    assert "![x](http://example.com/x.png)" in warning.inner_text()
    idle(page)  # the run that drew the warning is over: an image in it would have been asked for
    assert not [url for url in requests if "example.com" in url]
    assert page.locator("[data-testid=stAlert] img, [data-testid=stAlert] a").count() == 0  # no image, no link


@pytest.mark.parametrize("slot", ["-1", "abc", "99999"])
def test_a_tampered_strip_event_shows_one_line_and_no_traceback(page, slot):
    chip = page.locator(".kv-chip").nth(3)
    chip.evaluate("(chip, slot) => { chip.dataset.slot = slot; }", slot)
    settle(page, chip.click)
    notice = page.locator("[data-testid=stAlert]", has_text="ignored a click on the strip")
    expect(notice).to_have_count(1, timeout=60_000)
    assert page.locator("[data-testid=stException]").count() == 0
    assert "Traceback" not in page.locator("[data-testid=stApp]").inner_text()
    assert page.locator(".kv-chip.kv-evicted").count() == 0
    chip.evaluate("(chip) => { chip.dataset.slot = '3'; }")


def _page_state(page) -> tuple[str, int, int]:
    """What an upload must not change: the cache heading, the chat's messages and the strip's chips."""
    heading = page.locator("h3", has_text="Cache:").first.inner_text()
    return heading, page.locator("[data-testid=stChatMessage]").count(), page.locator(".kv-chip").count()


@pytest.mark.parametrize("kind", ["50 MB", "nested", "100k ids"])
def test_an_oversized_or_hostile_upload_is_refused_in_one_line_and_changes_nothing(page, tmp_path, kind):
    idle(page)
    before = _page_state(page)
    path = tmp_path / "upload.json"
    if kind == "50 MB":  # over the server's maxUploadSize: the uploader refuses it before anything is sent
        path.write_text('{"format": "kvviz-session", "pad": "' + "x" * (50 * 2**20) + '"}')
    elif kind == "nested":
        path.write_text('{"format": "kvviz-session", "version": 1, "view": ' + "[" * 100_000 + "]" * 100_000 + "}")
    else:
        path.write_text(json.dumps({"format": "kvviz-session", "version": 1, "turns": [
            {"user": "hi", "prefill_ids": [1, 2, 3], "reply_ids": [5] * 100_000, "shown": 0}]}))
    upload(page, path)
    if kind == "50 MB":
        uploader = page.locator("[data-testid=stSidebarUserContent] [data-testid=stFileUploader]")
        expect(uploader).to_contain_text("File must be 16.0MB or smaller", timeout=30_000)
        expect(page.get_by_role("button", name="Load it")).to_have_count(0)  # nothing to load: it never came
    else:
        load_it(page)
        warning = page.locator("[data-testid=stAlert]", has_text="cannot import this session")
        expect(warning).to_have_count(1, timeout=60_000)
        assert len(warning.inner_text().strip().splitlines()) == 1
    idle(page)
    assert "Traceback" not in page.locator("[data-testid=stApp]").inner_text()
    assert _page_state(page) == before


def _open_reshape(page) -> None:
    if not page.get_by_role("button", name="Prune with ThinK").is_visible():
        page.get_by_text("Prune key channels (ThinK) or merge evicted values").click()
        expect(page.get_by_role("button", name="Prune with ThinK")).to_be_visible()


def test_prune_and_merge_from_the_strip_and_a_policy_says_why_on_its_chips(page):
    idle(page)
    chips = page.locator(".kv-chip")
    target = chips.nth(chips.count() // 3)
    target.scroll_into_view_if_needed()
    settle(page, target.click)
    expect(page.locator(".kv-chip.kv-evicted")).to_have_count(1, timeout=120_000)
    _open_reshape(page)
    settle(page, lambda: page.get_by_role("button", name="Merge the evicted slots").click())
    _open_reshape(page)
    page.get_by_role("button", name="Prune with ThinK").click()
    summary = page.get_by_text("key channels pruned in 90 (layer, KV head) pairs")
    expect(summary).to_be_visible(timeout=120_000)
    assert "merges (average)" in summary.inner_text()
    assert page.locator("[data-testid=stException]").count() == 0
    settle(page, lambda: page.get_by_role("button", name="Clear edit").click())
    settle(page, lambda: page.get_by_role("tab", name="Policies").click())
    page.get_by_role("button", name="Put h2o's mask on the strip").click()
    partial = page.locator(".kv-chip.kv-partial")
    expect(partial.first).to_be_visible(timeout=120_000)
    idle(page)
    title = partial.first.get_attribute("title")
    assert "h2o at slot" in title and "lowest kept" in title, title
