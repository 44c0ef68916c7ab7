"""Browser rows of the benchmark: the real app in headless Chromium (Playwright + Debian's chromium).

- ``browser click N``: a session of N cached slots is imported; a chip is clicked; the time until the what-if's KL
  value on the page has changed (the edit was applied, the step re-run and the page redrawn). Absolute seconds.
- ``overview draw``: the time from choosing the Attention tab until the layer × head overview is on screen.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from kvviz.bench import Row, token_ids
from kvviz.draft import EditDraft
from kvviz.export import export_session
from kvviz.session import Session

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
KL_CHANGED = """(before) => {
  const m = [...document.querySelectorAll('[data-testid=stMetric]')].find(e => e.innerText.includes('KL(full'));
  return m && m.querySelector('[data-testid=stMetricValue]').innerText !== before
    && !document.querySelector('[data-testid=stStatusWidget]');
}"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _session_file(lm, count: int, folder: Path) -> Path:
    session = Session(lm)
    session.add_ids(token_ids(lm, count))
    path = folder / f"session-{count}.json"
    path.write_text(json.dumps(export_session(session, EditDraft())))
    return path


def _kl(page) -> str:
    return page.locator("[data-testid=stMetric]", has_text="KL(full").locator("[data-testid=stMetricValue]").inner_text()


def _clicks(page, count: int, repeats: int) -> list[float]:
    times = []
    for index in range(repeats + 1):
        chip = page.locator(".kv-chip").nth(count // 2 - 20 * index)
        chip.scroll_into_view_if_needed()
        before = _kl(page)
        start = time.perf_counter()
        chip.click()
        page.wait_for_function(KL_CHANGED, arg=before, timeout=120_000)
        if index:
            times.append(time.perf_counter() - start)
    return times


def browser_rows(lm, counts: tuple[int, ...] = (1024, 2048), repeats: int = 5) -> list[Row]:
    from playwright.sync_api import sync_playwright

    port, folder = _free_port(), Path(tempfile.mkdtemp(prefix="kvviz-bench-"))
    files = {count: _session_file(lm, count, folder) for count in counts}
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"),
                               "--server.port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**__import__("os").environ, "KVVIZ_SESSIONS": str(folder)})
    rows = []
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"])
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("textarea", timeout=180_000)
            for count in counts:
                page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files(str(files[count]))
                page.get_by_role("button", name="Load it").click()
                page.wait_for_function(f"document.querySelectorAll('.kv-chip').length == {count}", timeout=300_000)
                page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')", timeout=300_000)
                median = statistics.median(_clicks(page, count, repeats))
                rows.append(Row(f"browser click {count}", median, 0.3, False, median <= 0.3,
                                f"click → what-if redrawn, median of {repeats}, absolute seconds"))
            draws = []
            for _ in range(repeats):
                page.get_by_role("tab", name="What-if (full | edited)").click()
                page.wait_for_timeout(300)
                start = time.perf_counter()
                page.get_by_role("tab", name="Attention").click()
                page.locator("[data-testid=stPlotlyChart]").filter(has_text="every layer").first.wait_for(state="visible")
                page.wait_for_function("""() => [...document.querySelectorAll('[data-testid=stPlotlyChart]')]
                    .some(c => c.innerText.includes('every layer') && c.querySelector('.heatmaplayer, image, canvas'))""")
                draws.append(time.perf_counter() - start)
            median = statistics.median(draws)
            rows.append(Row("overview draw", median, 1.5, False, median <= 1.5,
                            f"tab chosen → overview on screen ({max(counts)} slots), absolute seconds"))
            browser.close()
    finally:
        server.terminate()
    return rows
