"""The caches of other model families in a real headless Chromium at 1500×1000, each served from a tiny random model
saved to a folder (no download): the strip shows what is particular to the cache, a click evicts, the numbers appear
and the console stays clean. Learned sinks (gpt-oss): a sink chip before slot 0 with the sink's share of the step's
attention, which grows when slots are evicted (α_sink / (1 − ρ)), as the what-if's sink number says. Latent attention
(DeepSeek-V3's MLA): the strip says a chip is a token's latent shared by every head, and a click evicts it. Hybrid layers
(Qwen3-Next): the strip says which decoder layers cache K/V and which keep a recurrent state, the layer picker names
the attention layers by their decoder layer, and a click evicts. Sparse selection (DeepSeek-V3.2's DSA): the strip says
how many slots the step read and fades the others, each chip's tooltip gives its indexer score and rank; a click on a
slot it read evicts it, and the what-if counts the
slots the indexer picked instead."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.support.browser_page import send, settle, shows_evicted, watch_console


def _served(kind: str, tokenizer, tmp_path_factory):
    """The app serving a tiny random model of ``kind`` saved to a folder (loaded as a checkpoint is): its URL."""
    from benchmarks.browser import running_app
    from kvviz.tiny_models import tiny

    folder = tmp_path_factory.mktemp(f"tiny-{kind}")
    tiny(kind).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with running_app({"KVVIZ_MODEL": str(folder)}) as url:
        yield url


@pytest.fixture(scope="module")
def gpt_oss_server(tokenizer, tmp_path_factory):
    yield from _served("gpt_oss", tokenizer, tmp_path_factory)


@pytest.fixture(scope="module")
def deepseek_server(tokenizer, tmp_path_factory):
    yield from _served("deepseek_v3", tokenizer, tmp_path_factory)


@pytest.fixture(scope="module")
def sparse_server(tokenizer, tmp_path_factory):
    yield from _served("deepseek_v32", tokenizer, tmp_path_factory)


@pytest.fixture(scope="module")
def hybrid_server(tokenizer, tmp_path_factory):
    yield from _served("qwen3_next", tokenizer, tmp_path_factory)


def _share(page) -> float:
    return float(page.locator(".kv-sink").get_attribute("data-share"))


def test_the_sink_has_a_chip_of_its_own_and_eviction_grows_its_share(gpt_oss_server):
    from benchmarks.browser import browser_page

    with browser_page(gpt_oss_server, width=1500, height=1000) as page:
        watch_console(page)
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        send(page, "a = 3, b = 5. What is a + b?")
        sink = page.locator(".kv-sink")
        expect(sink).to_have_count(1)
        expect(sink).to_have_text(re.compile(r"^sink 0\.\d{3}$"))
        assert page.locator(".kv-strip > *").first.get_attribute("class") == "kv-sink"  # before slot 0
        before = _share(page)
        metric = page.locator("[data-testid=stMetric]", has_text="Sink (layer 0")
        expect(metric).to_have_count(1)
        chip = page.locator('.kv-chip[data-slot="3"]')
        settle(page, lambda: chip.click())
        shows_evicted(chip, 3)
        expect(metric).to_contain_text("vs")  # the what-if's sink share, edited vs full
        expect(page.locator(".kv-chip.kv-evicted")).to_have_count(1)  # the sink is no slot: not a .kv-chip
        assert _share(page) == pytest.approx(before)  # the strip shows the step as cached; the what-if the edit
        assert page.console == []


def test_the_offline_page_of_a_sink_model_draws_the_sinks_chip(tokenizer, tmp_path):
    """The offline page computes each step's sink share from the rows it carries (1 − Σ α): the chip equals the
    library's, to the float32 rounding of the rows (each weight within 2^-24 relative, summed over the slots)."""
    from playwright.sync_api import sync_playwright

    from benchmarks.browser import CHROMIUM, CHROMIUM_ARGS
    from kvviz.edit.edit import Edit
    from kvviz.figures.standalone_page import Prepared, page_data, standalone_html
    from kvviz.tiny_sessions import tiny_pair
    from kvviz.view_data import sink_share

    _, _, session = tiny_pair("gpt_oss", tokenizer, ["a = 3, b = 5. What is a + b?"])
    at = len(session) - 1
    path = tmp_path / "page.html"
    path.write_text(standalone_html(page_data(session, [Prepared(at, Edit.evict([3]))], [(1, 4)])))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(offline=True, viewport={"width": 1500, "height": 1000}).new_page()
        watch_console(page)
        page.goto(path.as_uri())
        expect(page.locator(".kv-sink")).to_have_count(1)
        expected = sink_share(session, at, 1, 4)["share"]
        assert _share(page) == pytest.approx(expected, abs=(at + 1) * 2**-23)
        assert page.console == []
        browser.close()


def test_a_latent_cache_says_what_a_chip_is_and_a_click_evicts_the_token(deepseek_server):
    from benchmarks.browser import browser_page

    with browser_page(deepseek_server, width=1500, height=1000) as page:
        _chat_and_note(page, "This model caches one latent per token", "256 latent and 8 RoPE channels per layer")
        _a_click_evicts(page)  # the token's latent mattered to the next token


def test_a_hybrid_model_says_which_layers_cache_and_a_click_evicts(hybrid_server):
    from benchmarks.browser import browser_page

    with browser_page(hybrid_server, width=1500, height=1000) as page:
        _chat_and_note(page, "This model is hybrid", "only 2 cache keys and values (decoder layers 1, 3")
        picker = page.locator("[data-testid=stSelectbox]").filter(has=page.get_by_role("combobox", name="Layer"))
        expect(picker).to_match_aria_snapshot('- combobox "Layer": 0 (decoder layer 1)')  # the picker's shown value
        _a_click_evicts(page)


def test_a_sparse_model_fades_what_the_step_did_not_read_and_a_click_brings_the_next_pick_in(sparse_server):
    from benchmarks.browser import browser_page

    with browser_page(sparse_server, width=1500, height=1000) as page:
        _chat_and_note(page, "This model reads a subset of its cache", "each query reads the 12 of highest score")
        note = page.get_by_text("This model reads a subset of its cache").inner_text()
        seen = int(re.search(r"layer 0 read 12 of the (\d+) slots it saw", note).group(1))  # the page's own count
        expect(page.locator(".kv-chip")).to_have_count(seen)  # the strip drawn (it may follow the line)
        unread = page.locator(".kv-chip.kv-unread")
        expect(unread).to_have_count(seen - 12)  # the step read 12 of the slots it saw, its own among them
        expect(unread.first).to_have_attribute("title", re.compile(r"\nindexer score \S+, rank \d+ of \d+: not read"))
        read = page.locator(".kv-chip:not(.kv-unread):not(.kv-current)").first
        _a_click_evicts(page, int(read.get_attribute("data-slot")))
        anew = page.locator("[data-testid=stMetric]", has_text="Read anew (layer 0)")
        expect(anew.locator("[data-testid=stMetricValue]")).to_have_text("1")  # the indexer's next pick


def _chat_and_note(page, starts: str, says: str) -> None:
    """Send a turn on a clean console and wait for the one line above the strip that starts with ``starts``."""
    watch_console(page)
    page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
    send(page, "a = 3, b = 5. What is a + b?")
    note = page.get_by_text(starts)
    expect(note).to_have_count(1)
    expect(note).to_contain_text(says)
    expect(note).to_be_visible()


def _a_click_evicts(page, slot: int = 3) -> None:
    """A click on ``slot``'s chip evicts it, the next token's KL appears and is positive, the console stays clean."""
    chip = page.locator(f'.kv-chip[data-slot="{slot}"]')
    settle(page, lambda: chip.click())
    shows_evicted(chip, slot)
    kl = page.locator("[data-testid=stMetric]", has_text="KL(full").locator("[data-testid=stMetricValue]")
    expect(kl).to_have_text(re.compile(r"\d"))
    assert float(kl.inner_text().split()[0]) > 0
    assert page.console == []
