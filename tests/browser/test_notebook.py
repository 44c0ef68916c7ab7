"""The widget as a person uses it: JupyterLab (started here on 127.0.0.1 with a token) opens the explore notebook in
headless Chromium, runs every cell, a click on a chip shows the KL, and a cell run afterwards finds the widget's edit
and its KL equal to ``what_if`` for the same slot. Nothing leaves 127.0.0.1 and the console shows no error. A saved
notebook's HTML outputs (the reprs) show the strip with no kernel and no network. marimo's app view runs the marimo
example: a click re-runs the cell that reads the widget."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient
from playwright.sync_api import sync_playwright

from benchmarks.browser import CHROMIUM, CHROMIUM_ARGS, notebook_url, run_all, running_lab, running_marimo
from tests.support.browser_page import shows_evicted

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SLOT = 14
CHECK = f"""from kvviz import Edit, what_if
r = w.result
print("check", r is not None and w.edit == Edit.evict([{SLOT}]), repr(r and r.next_token.kl),
      repr(what_if(session, Edit.evict([{SLOT}])).next_token.kl))"""


def _browser_page(p, outside: list[str], errors: list[str]):
    browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})

    def route(request_route):
        if request_route.request.url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:", "file://")):
            request_route.continue_()
        else:
            outside.append(request_route.request.url)
            request_route.abort()

    page.route("**/*", route)
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    return browser, page


def test_jupyterlab_runs_the_explore_notebook_and_a_click_shows_the_kl(tmp_path):
    book = nbformat.read(EXAMPLES / "explore.ipynb", as_version=4)
    book.cells.append(nbformat.v4.new_code_cell(CHECK, id="check"))
    nbformat.write(book, tmp_path / "explore.ipynb")
    outside, errors = [], []
    with running_lab(tmp_path) as (url, token):
        with sync_playwright() as p:
            browser, page = _browser_page(p, outside, errors)
            try:
                page.goto(notebook_url(url, token, "explore.ipynb"))
                page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
                run_all(page, tmp_path / "explore.ipynb")
                last = page.locator(".jp-Notebook .jp-CodeCell").filter(has_text='print("check"')
                last.locator(".jp-OutputArea-output", has_text="check False").wait_for(timeout=240_000)  # none tried
                chip = page.locator(f".kvviz-widget .kv-chip[data-slot='{SLOT}']").first
                chip.click()
                status = page.locator(".kvviz-widget .kvviz-status").first
                page.wait_for_function("s => s.dataset.kl !== ''", arg=status.element_handle(), timeout=120_000)
                shown_kl = float(status.get_attribute("data-kl"))
                assert "KL(full ‖ edited)" in status.inner_text()
                assert "line-through" in chip.evaluate("c => getComputedStyle(c).textDecorationLine")
                shows_evicted(chip, SLOT)  # as the app and the offline page show it
                last.locator(".jp-InputArea-editor").click()
                page.keyboard.press("Control+Enter")  # run it again, in place
                output = last.locator(".jp-OutputArea-output", has_text="check True")
                output.wait_for(timeout=120_000)
                _, same_edit, widget_kl, reference_kl = output.inner_text().split()
                assert same_edit == "True" and float(widget_kl) == float(reference_kl) == shown_kl
            except Exception:
                page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)  # kept with pytest's tmp files
                print(page.locator(".jp-Notebook").inner_text()[-4000:])
                raise
            browser.close()
    assert not outside, outside
    assert not errors, errors


def test_a_saved_notebook_shows_its_outputs_with_no_kernel_and_no_network(tmp_path):
    book = nbformat.read(EXAMPLES / "debug_policy.ipynb", as_version=4)
    NotebookClient(book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    parts = [out["data"]["text/html"] for cell in book.cells if cell.cell_type == "code" for out in cell.outputs
             if "text/html" in out.get("data", {})]
    page_file = tmp_path / "saved.html"
    page_file.write_text("<!doctype html><meta charset=utf-8><body>" + "<hr>".join(parts) + "</body>")
    outside, errors = [], []
    with sync_playwright() as p:
        browser, page = _browser_page(p, outside, errors)
        page.goto(page_file.as_uri())
        assert page.locator(".kvviz-run").count() == 1 and page.locator(".kvviz-blame").count() == 1
        assert page.locator(".kvviz-run svg").count() == 3 and "KL per step" in page.inner_text(".kvviz-run")
        assert page.locator(".kvviz-run").bounding_box()["height"] > 50
        assert page.locator(".kvviz-blame tbody tr").count() >= 1
        browser.close()
    assert not outside and not errors, (outside, errors)


def test_marimo_runs_the_widget_and_a_click_reruns_the_cell_that_reads_it(tmp_path):
    """``mo.ui.anywidget(kvviz.widget(session))`` in marimo's app view: a click on a chip evicts it, the widget shows
    the KL, and marimo runs the example's next cell again (it reads the widget), which shows the widget's KL beside
    ``what_if`` of the same edit: equal, and equal to what the widget shows."""
    notebook = tmp_path / "explore_marimo.py"
    notebook.write_text((EXAMPLES / "explore_marimo.py").read_text())
    outside, errors = [], []
    with running_marimo(notebook) as url, sync_playwright() as p:
        browser, page = _browser_page(p, outside, errors)
        try:
            page.goto(url)
            page.get_by_text("Click a chip above to evict it.").wait_for(timeout=240_000)
            page.locator(f".kvviz-widget .kv-chip[data-slot='{SLOT}']").first.click()
            line = page.get_by_text(f"evicted [{SLOT}] · KL in the widget")
            line.wait_for(timeout=120_000)
            words = line.inner_text().split()
            widget_kl, reference_kl = float(words[words.index("widget") + 1]), float(words[-1])
            shown_kl = float(page.locator(".kvviz-widget .kvviz-status").first.get_attribute("data-kl"))
            assert widget_kl == reference_kl == shown_kl > 0
            shows_evicted(page.locator(f".kvviz-widget .kv-chip[data-slot='{SLOT}']").first, SLOT)
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        browser.close()
    assert not outside, outside
    assert not errors, errors
