"""The Sweeps tab runs a sweep in a real headless Chromium, at the desk's size and a projector's: the form, the
progress, the table worst first, its download, and the worst case opened as a policy run — with a clean console."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.support.browser_page import choose, click_when_still, idle, in_view, still, watch_console


@pytest.mark.parametrize("width,height,upload", [(1500, 1000, False), (1280, 720, True)])
def test_the_sweeps_tab_runs_a_sweep_and_opens_its_worst_case(server, tmp_path, width, height, upload):
    """A built-in set at the desk's size; at the projector's, an uploaded JSONL file — first one with a bad line
    (refused with its line number, nothing run), then a good one."""
    from benchmarks.browser import browser_page

    with browser_page(server, width=width, height=height) as page:
        watch_console(page)
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        click_when_still(page, page.get_by_role("tab", name="Sweeps"))
        run = page.get_by_role("button", name="Run the sweep")
        run.wait_for(timeout=60_000)
        if upload:
            prompts = page.get_by_role("combobox", name="Prompts", exact=True)
            choose(page, prompts, "(upload a JSONL file)", reruns=False)  # inside the sweep's form
            expect(prompts).to_have_value("(upload a JSONL file)")
            bad = tmp_path / "bad.jsonl"
            bad.write_text('{"prompt": "The capital of France is Paris. What is it?", "expected": "Paris"}\n{oops\n')
            uploader = page.get_by_role("tabpanel", name="Sweeps").locator("[data-testid=stFileUploaderDropzoneInput]")
            uploader.set_input_files(str(bad))
            page.get_by_text("bad.jsonl", exact=True).wait_for(timeout=60_000)
            click_when_still(page, run)
            expect(page.locator("[data-testid=stAlert]", has_text="bad.jsonl:2: not JSON")).to_have_count(1)
            assert page.get_by_text("the worst first").count() == 0  # nothing ran
            good = tmp_path / "prompts.jsonl"
            good.write_text('{"id": "paris", "prompt": "The capital of France is Paris. What is it?", '
                            '"expected": "Paris"}\n')
            uploader.set_input_files(str(good))
            page.get_by_text("prompts.jsonl", exact=True).wait_for(timeout=60_000)
        page.get_by_label("First N prompts").fill("1")
        page.get_by_label("New tokens per reply").fill("4")
        click_when_still(page, run)
        caption = page.get_by_text("4 cases, the worst first")
        caption.wait_for(timeout=300_000)  # 1 prompt × h2o, snapkv × 0.25, 0.5
        expect(page.get_by_text("The sweep ran 4 cases")).to_have_count(1)
        expect(page.get_by_role("button", name="Download the table (CSV)")).to_have_count(1)
        expect(page.get_by_test_id("stVegaLiteChart")).to_have_count(1)
        if upload:
            expect(page.get_by_role("combobox", name="Case", exact=True)).to_have_value(re.compile(r"^paris · "))
        click_when_still(page, page.get_by_role("button", name="Open as a policy run"))
        page.get_by_text("it is in the Policy run tab").wait_for(timeout=300_000)
        idle(page)
        expect(page.get_by_role("tab", name="Policy run", exact=True)).to_have_attribute("aria-selected", "true")
        expect(page.get_by_text("Turn 1 · full cache")).to_have_count(1)
        still(page)
        assert in_view(page, page.get_by_text("Turn 1 · full cache"))  # the opened run comes into view
        assert page.console == []
