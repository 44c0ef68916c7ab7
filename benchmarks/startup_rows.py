"""The app's cold start: ``streamlit run`` → the first interactive page (the model's files already on disk), against a
plain script that imports the same libraries and loads the same model with transformers. Both are fresh processes,
run alternately; the browser is started beforehand and not counted."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchmarks.harness import Row, row
from kvviz.model import resolve_checkpoint
from benchmarks.browser import CHROMIUM, CHROMIUM_ARGS, ROOT, free_port

PLAIN = """import streamlit, pandas, altair, torch, plotly.graph_objects  # plotly's own import loads nothing to draw with
from transformers import AutoModelForCausalLM, AutoTokenizer
AutoTokenizer.from_pretrained({folder!r})
AutoModelForCausalLM.from_pretrained({folder!r}, dtype=torch.float32, attn_implementation="sdpa").eval()
"""
INTERACTIVE = """() => !!document.querySelector('[data-testid=stChatInputTextArea]')
  && document.querySelector('[data-testid=stApp]').dataset.testScriptState !== 'running'"""


def _app_start(browser, env: dict[str, str]) -> float:
    """Seconds from spawning the server to a page whose chat box is there and whose first run is over."""
    port = free_port()
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"), "--server.port", str(port),
         "--server.headless", "true"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            try:
                urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
                break
            except OSError:
                if process.poll() is not None or time.perf_counter() - start > 300:
                    raise RuntimeError("the app did not start") from None
                time.sleep(0.05)
        page = browser.new_page()
        page.goto(url)
        page.wait_for_function(INTERACTIVE, timeout=300_000, polling=50)
        elapsed = time.perf_counter() - start
        page.close()
        return elapsed
    finally:
        process.terminate()
        process.wait(timeout=30)


def _plain_start(folder: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", PLAIN.format(folder=folder)], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def cold_start_row(bench, repeats: int = 3) -> Row:
    from playwright.sync_api import sync_playwright

    folder = str(resolve_checkpoint(None)[0])
    env = {**os.environ, "KVVIZ_SESSIONS": tempfile.mkdtemp(prefix="kvviz-bench-start-")}
    ours, plain = [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            _plain_start(folder)  # warm the page cache for both sides
            for _ in range(max(repeats, 3)):
                ours.append(_app_start(browser, env))
                plain.append(_plain_start(folder))
        finally:
            browser.close()
    return row("app cold start", ours, plain, 1.3)
