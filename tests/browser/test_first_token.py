"""A sweep's follow-up case whose reply differs from its first token on, in a real headless Chromium: the table says
what step −1 is, the case opens as a policy run at step −1 (the prompt's last token, whose prefill row chose the
first reply token), and blame explains it."""

from __future__ import annotations

import json

from kvviz.sweeps import SweepSpec, read_table, run_sweep
from tests.support.browser_page import choose, idle, settle, watch_console
from tests.support.inputs import FOLLOW_UP


def test_a_first_token_divergence_from_a_sweep_row_is_opened_and_blamed(lm, tmp_path):
    from benchmarks.browser import browser_page, running_app

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "dog", "turns": FOLLOW_UP}) + "\n")
    folder = tmp_path / "sweep"
    run_sweep(SweepSpec(str(prompts), ("h2o",), (0.3,), max_new_tokens=10), folder, progress=False)
    assert read_table(folder)["divergence"].tolist() == [-1]
    with running_app(env={"KVVIZ_SWEEPS": str(folder)}) as url, browser_page(url, height=2400) as page:
        watch_console(page)
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        settle(page, lambda: page.get_by_role("tab", name="Sweeps", exact=True).click())
        choose(page, page.locator("[data-testid=stSelectbox]").filter(has_text="Sweep on this server"), str(folder))
        page.get_by_text("1 case, the worst first").wait_for(timeout=120_000)
        page.get_by_role("button", name="Open as a policy run").click()
        page.get_by_text("Turn 2 · full cache").wait_for(timeout=300_000)
        page.get_by_text("differs from its first token on (step −1)").wait_for(timeout=60_000)
        # the step that chose the first token opens by default
        page.get_by_text("Step -1 (the prompt's last token: its prefill row chose the first reply token)").wait_for(
            timeout=120_000)
        idle(page)
        page.get_by_role("button", name="Blame this step").click()
        page.get_by_text("Restoring one evicted slot at a time").wait_for(timeout=120_000)
        page.get_by_role("button", name="Restore the top 3").click()
        page.get_by_text("restored together").wait_for(timeout=120_000)
        assert page.locator("[data-testid=stException]").count() == 0
        assert not page.console, page.console
