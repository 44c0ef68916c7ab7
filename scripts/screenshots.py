"""Take the README's screenshots of the running dashboard (headless Debian chromium via Playwright).

Usage: .venv/bin/python scripts/screenshots.py   (writes assets/screenshot-*.png)
       .venv/bin/python scripts/screenshots.py --model PATH.gguf   (a sliding-window model: screenshot-window-*.png)
       .venv/bin/python scripts/screenshots.py --sweep DIR   (a sweep's folder: screenshot-sweeps.png)
       .venv/bin/python scripts/screenshots.py --schemes   (the quantizer settings and the schemes compared)
       .venv/bin/python scripts/screenshots.py --where   (an eviction and the step where it matters most)
       .venv/bin/python scripts/screenshots.py --rounded-blame   (an NVFP4 cache's run and the blame of its rounding)
       .venv/bin/python scripts/screenshots.py --notebook   (the widget in JupyterLab: screenshot-notebook.png)
       .venv/bin/python scripts/screenshots.py --marimo   (the marimo example, a chip clicked: screenshot-marimo.png)
       .venv/bin/python scripts/screenshots.py --latent   (a tiny DeepSeek-V3's latent cache: screenshot-latent.png)
       .venv/bin/python scripts/screenshots.py --hybrid   (a tiny Qwen3-Next's layers: screenshot-hybrid.png)
       .venv/bin/python scripts/screenshots.py --sparse   (a tiny DeepSeek-V3.2's read sets: screenshot-sparse.png)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.browser import (CHROMIUM, CHROMIUM_ARGS, browser_page, notebook_url, run_all,  # noqa: E402
                                running_app, running_lab, running_marimo)


VIEWS = "[data-testid=stTabs]:has-text('Cache growth')"  # the page's views (the what-if's chart tabs come first)


def wait_idle(page, seconds: float = 1.5) -> None:
    page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')", timeout=300_000)
    time.sleep(seconds)


def shoot(page, name: str, top: str, bottom: str | None, height: int = 1200) -> None:
    """Screenshot of the page from ``top``'s element down to ``bottom``'s (or ``height`` pixels)."""
    first = page.locator(top).first.bounding_box()
    last = page.locator(bottom).first.bounding_box()["y"] if bottom else first["y"] + height
    page.screenshot(path=str(ROOT / "assets" / f"screenshot-{name}.png"),
                    clip={"x": 0, "y": max(first["y"] - 20, 0), "width": 1440, "height": last - first["y"] + 20})


def main() -> None:
    with running_app() as url, browser_page(url, width=1440, height=4200) as page:
        # one tall viewport: Streamlit's main area scrolls internally, so element shots of a short one come out blank
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        page.get_by_role("button", name="Evict a fact").click()
        page.wait_for_selector(".kv-chip", timeout=300_000)
        page.mouse.move(1400, 20)  # no tooltip over the sidebar
        wait_idle(page, 3)
        metrics = "[data-testid=stMetric]"  # the what-if's numbers follow the strip (both in the editor)
        shoot(page, "strip", top="h1", bottom=metrics)
        shoot(page, "whatif", top=metrics, bottom=VIEWS)
        page.get_by_role("tab", name="Attention").click()
        wait_idle(page, 2)
        shoot(page, "attention", top=VIEWS, bottom=None, height=1500)
        page.get_by_role("button", name="Policy run: a name asked late").click()
        page.get_by_text("StreamingLLM keeps 4 sink slots").wait_for(timeout=300_000)  # the demo's notice: it ran
        wait_idle(page, 2)
        for _ in range(5):  # a rerun still under way can take the click: until the tab is really open
            page.get_by_role("tab", name="Policy run", exact=True).click()
            wait_idle(page, 1)
            if page.get_by_text("Restoring one evicted word").is_visible():
                break
        page.mouse.move(1400, 20)
        wait_idle(page, 3)
        shoot(page, "policy-run", top="text=streaming_llm, budget 24", bottom="[data-testid=stChatInput]")
    with running_app() as url, browser_page(url, width=1280, height=720) as page:  # what a laptop shows first
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        page.get_by_role("button", name="Evict a fact").click()
        page.wait_for_selector(".kv-chip", timeout=300_000)
        page.mouse.move(1270, 10)
        wait_idle(page, 3)
        page.get_by_text("Click a chip to evict it").scroll_into_view_if_needed()
        wait_idle(page, 1)
        page.screenshot(path=str(ROOT / "assets" / "screenshot-1280x720.png"))


def window_shots(model: str) -> None:
    """The strip and the attention view of a sliding-window model after a prompt longer than its window."""
    lines = [f"Note {i}: the review of project {chr(65 + i % 26)} moved to room {100 + i} on day {i % 7 + 1}."
             for i in range(48)]
    with running_app({"KVVIZ_MODEL": model}, startup_s=300) as url, browser_page(url, width=1440, height=4200) as page:
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=300_000)
        page.locator("[data-testid=stChatInputTextArea]").fill("\n".join(lines) + "\nWhere is the review of project B?")
        page.keyboard.press("Enter")
        page.wait_for_selector(".kv-outside", timeout=300_000)
        page.mouse.move(1400, 20)
        wait_idle(page, 3)
        page.locator(".kv-chip:not(.kv-outside)").first.evaluate(  # the window's edge in view (the strip scrolls)
            "(chip) => { const strip = chip.parentElement; strip.scrollTop += chip.getBoundingClientRect().top"
            " - strip.getBoundingClientRect().top - 120; }")
        shoot(page, "window-strip", top="text=Click a chip to evict", bottom="text=Quantizer settings")
        page.get_by_role("tab", name="Attention").click()
        wait_idle(page, 2)
        shoot(page, "window-attention", top=VIEWS, bottom=None, height=1500)


def family_shot(kind: str, name: str, chip: str = '.kv-chip[data-slot="3"]') -> None:
    """The strip of a tiny random model of ``kind`` with the token of the first ``chip`` evicted (DeepSeek-V3: the
    line on what a chip is; DeepSeek-V3.2: the slots the step read; Qwen3-Next: the line on its layers without KV) and
    the what-if's numbers, as ``screenshot-NAME.png``."""
    from transformers import AutoTokenizer

    from kvviz.model import resolve_checkpoint
    from kvviz.tiny_models import tiny

    with tempfile.TemporaryDirectory() as folder:
        tiny(kind).save_pretrained(folder)
        AutoTokenizer.from_pretrained(resolve_checkpoint(None)[0]).save_pretrained(folder)
        with running_app({"KVVIZ_MODEL": folder}) as url, browser_page(url, width=1440, height=4200) as page:
            page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
            page.locator("[data-testid=stChatInputTextArea]").fill("a = 3, b = 5. What is a + b?")
            page.keyboard.press("Enter")
            page.wait_for_selector(".kv-chip", timeout=300_000)
            wait_idle(page, 2)
            page.locator(chip).first.click()
            page.wait_for_selector(".kv-chip.kv-evicted", timeout=300_000)
            page.mouse.move(1400, 20)
            wait_idle(page, 3)
            shoot(page, name, top="text=Click a chip to evict", bottom=VIEWS)


def sweep_shot(folder: str) -> None:
    """The Sweeps tab on a sweep's folder, and the case opened as a policy run."""
    with running_app({"KVVIZ_SWEEPS": folder}) as url, browser_page(url, width=1440, height=3000) as page:
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        page.get_by_role("tab", name="Sweeps").click()
        page.get_by_text("Sweep on this server").wait_for(timeout=60_000)
        page.locator("[data-testid=stSelectbox]").filter(has_text="Sweep on this server").click()
        page.get_by_role("option", name=folder).click()
        page.get_by_text("cases, the worst first").wait_for(timeout=60_000)
        page.mouse.move(1400, 20)
        wait_idle(page, 3)
        shoot(page, "sweeps", top="text=Sweep on this server", bottom="text=Open as a policy run", height=0)


def where_shot() -> None:
    """The dog's name evicted at the newest step: the what-if's numbers and, below them, the step it matters at."""
    with running_app() as url, browser_page(url, width=1440, height=2400) as page:
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        page.fill("[data-testid=stChatInputTextArea]",
                  "My cat is called Whiskers and my dog is called Rex. What is my dog called?")
        page.keyboard.press("Enter")
        page.wait_for_selector(".kv-chip", timeout=300_000)
        wait_idle(page, 3)
        page.locator(".kv-chip.kv-query", has_text="Rex").first.click()
        wait_idle(page, 2)
        page.get_by_role("button", name="Where does this edit matter most?").click()
        page.get_by_text("Matters most at step").wait_for(timeout=300_000)
        page.mouse.move(1400, 20)
        wait_idle(page, 3)  # the answer scrolled itself to the top: the numbers above it back into the picture
        page.mouse.move(800, 600)
        page.mouse.wheel(0, -350)  # as a person scrolls: the scroll mark lets go
        wait_idle(page, 1)
        shoot(page, "where", top="[data-testid=stMetric]", bottom=None, height=250)


def schemes_shot() -> None:
    """The quantizer settings (FP8 scales, keys before RoPE) and the quantization schemes compared at the step."""
    with running_app() as url, browser_page(url, width=1440, height=4200) as page:
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        page.get_by_role("button", name="Evict a fact").click()
        page.wait_for_selector(".kv-chip", timeout=300_000)
        wait_idle(page, 2)
        page.get_by_text("Quantizer settings").click()
        page.get_by_text("Compare quantization schemes at this step").click()
        wait_idle(page, 1)
        page.get_by_role("button", name="Compare the schemes").click()
        page.get_by_text("Cache bytes as computed").wait_for(state="attached", timeout=300_000)
        wait_idle(page, 1)
        for title in ("Quantizer settings", "Compare quantization schemes at this step"):  # a rerun may fold them
            if not page.locator("details", has_text=title).first.evaluate("d => d.open"):
                page.get_by_text(title).click()
        page.get_by_text("Cache bytes as computed").wait_for(timeout=60_000)
        page.mouse.move(1400, 20)
        wait_idle(page, 3)
        shoot(page, "schemes", top="text=Quantizer settings", bottom="text=Cache bytes as computed", height=0)


def rounded_blame_shot() -> None:
    """A run whose cache is NVFP4 (no policy), its divergence step opened and blamed: which slots' rounding did it."""
    import re

    with running_app() as url, browser_page(url, width=1440, height=3600) as page:
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        page.fill("[data-testid=stChatInputTextArea]", "My cat is called Whiskers. What is my cat called?")
        page.keyboard.press("Enter")
        page.wait_for_selector(".kv-chip", timeout=300_000)
        wait_idle(page, 2)
        page.get_by_role("tab", name="Policy run", exact=True).click()
        form = page.get_by_role("tabpanel", name="Policy run").locator("[data-testid=stForm]")
        form.wait_for(timeout=60_000)
        for label, option in (("Policy", "(none: a quantized cache only)"), ("Cache format", "nvfp4")):
            box = page.locator("[data-testid=stSelectbox]").filter(
                has=page.locator("label", has_text=re.compile(f"^{re.escape(label)}$"))).first
            box.click()
            page.keyboard.type(option)
            page.get_by_role("option", name=option, exact=True).click()  # Enter can pick a stale highlight
            wait_idle(page, 1)
        form.get_by_label("New tokens per turn").fill("6")
        form.get_by_role("button", name="Run the policy").click()
        page.get_by_text("Turn 1 · full cache").wait_for(timeout=300_000)
        wait_idle(page, 2)
        page.get_by_role("spinbutton", name="Open step").fill("2")
        page.get_by_role("spinbutton", name="Open step").press("Enter")
        page.get_by_text("Step 2 processes slot").wait_for(timeout=60_000)
        wait_idle(page, 1)
        page.get_by_role("button", name="Blame this step").click()
        page.get_by_text("Restoring one rounded slot").wait_for(timeout=300_000)
        page.mouse.move(1400, 20)
        wait_idle(page, 3)
        shoot(page, "rounded-blame", top="text=Step 2 processes slot", bottom=None, height=760)


def notebook_shot() -> None:
    """The explore notebook run in JupyterLab, the name in the first turn evicted (the second asks for it) and the
    city quantized to 2 bits: the widget's strip and what-if."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "notebooks"
        folder.mkdir()
        shutil.copy(ROOT / "examples" / "explore.ipynb", folder)
        with running_lab(folder) as (url, token), sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.goto(notebook_url(url, token, "explore.ipynb"))
            run_all(page, folder / "explore.ipynb")
            page.locator(".jp-CodeCell").last.locator(".jp-OutputArea-output").last.wait_for(timeout=300_000)
            widget = page.locator(".kvviz-widget").first
            widget.locator(".kv-chip", has_text="\u2423Ada").first.click()
            page.wait_for_function("s => s.dataset.kl !== ''", arg=widget.locator(".kvviz-status").element_handle(),
                                   timeout=120_000)
            widget.locator(".kv-chip", has_text="\u2423Lisbon").first.click(modifiers=["Shift"])
            widget.get_by_text("2 bits", exact=True).click()
            page.wait_for_function("() => document.querySelector('.kvviz-widget .kv-bits')", timeout=120_000)
            time.sleep(2)
            widget.scroll_into_view_if_needed()
            box = widget.bounding_box()
            page.set_viewport_size({"width": 1440, "height": int(box["height"]) + 200})
            widget.screenshot(path=str(ROOT / "assets" / "screenshot-notebook.png"))
            browser.close()


def marimo_shot() -> None:
    """The marimo example in marimo's app view, the name evicted by a click: the widget, its what-if, and the cell
    that reads the widget, run again by marimo with the widget's KL beside what_if's."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as scratch:
        notebook = Path(scratch) / "explore_marimo.py"
        shutil.copy(ROOT / "examples" / "explore_marimo.py", notebook)
        with running_marimo(notebook) as url, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1300})  # marimo scrolls inside its page
            page.goto(url)
            page.get_by_text("Click a chip above to evict it.").wait_for(timeout=300_000)
            page.locator(".kvviz-widget .kv-chip", has_text="\u2423Ada").first.click()
            page.get_by_text("KL in the widget").wait_for(timeout=120_000)
            time.sleep(2)
            page.screenshot(path=str(ROOT / "assets" / "screenshot-marimo.png"))
            browser.close()

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a sliding-window model (e.g. the Gemma 3 270M GGUF): its window shots")
    parser.add_argument("--sweep", help="a sweep's folder: the Sweeps tab")
    parser.add_argument("--schemes", action="store_true", help="the quantizer settings and the schemes compared")
    parser.add_argument("--where", action="store_true", help="an eviction and the step where it matters most")
    parser.add_argument("--rounded-blame", action="store_true", help="an NVFP4 run's step blamed on its rounding")
    parser.add_argument("--notebook", action="store_true", help="the notebook widget in JupyterLab")
    parser.add_argument("--marimo", action="store_true", help="the marimo example in marimo's app view")
    parser.add_argument("--latent", action="store_true", help="a tiny DeepSeek-V3's latent cache, a token evicted")
    parser.add_argument("--hybrid", action="store_true", help="a tiny Qwen3-Next's layers, a token evicted")
    parser.add_argument("--sparse", action="store_true", help="a tiny DeepSeek-V3.2's read sets, a read token evicted")
    arguments = parser.parse_args()
    if arguments.latent:
        family_shot("deepseek_v3", "latent")
    elif arguments.hybrid:
        family_shot("qwen3_next", "hybrid")
    elif arguments.sparse:
        family_shot("deepseek_v32", "sparse", ".kv-chip:not(.kv-unread):not(.kv-current)")
    elif arguments.notebook:
        notebook_shot()
    elif arguments.marimo:
        marimo_shot()
    elif arguments.rounded_blame:
        rounded_blame_shot()
    elif arguments.where:
        where_shot()
    elif arguments.schemes:
        schemes_shot()
    elif arguments.sweep:
        sweep_shot(arguments.sweep)
    elif arguments.model:
        window_shots(arguments.model)
    else:
        main()
