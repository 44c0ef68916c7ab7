"""Browser rows of the benchmark: the real app in headless Chromium (Playwright + Debian's chromium).

- ``browser click N``: a session of N cached slots is imported; a chip is clicked; the time from the click's
  ``pointerdown`` in the page until the what-if's KL value on the page has changed and the run has finished (the edit
  was applied, the step re-run and the page redrawn), on the page's own clock. Absolute seconds. The time Playwright
  itself takes before it presses (scrolling, actionability checks: ~50 ms on 2 cores) is not the app's and is left
  out; the row's detail also gives the median seen from Playwright's side.
  Each click is made on a settled page, as a person clicks after looking at the result: once the browser has run no
  long task for a while (the previous result's charts are drawn); the detail also reports when the last long task
  of a click ended.
- ``overview draw``: the time from choosing the Attention tab until the layer × head overview is on screen.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from kvviz.bench import Row, token_ids
from kvviz.browser import browser_page, running_app
from kvviz.draft import EditDraft
from kvviz.export import export_session
from kvviz.session import Session

KL_CHANGED = """(before) => {
  const m = [...document.querySelectorAll('[data-testid=stMetric]')].find(e => e.textContent.includes('KL(full'));
  const done = m && m.querySelector('[data-testid=stMetricValue]').textContent !== before
    && !document.querySelector('[data-testid=stStatusWidget]');
  return done && (performance.now() - window.kvvizPressed) / 1000;
}"""  # textContent, not innerText: polled every frame, it must not force a layout of the page being measured
QUIET_MS = 300  # settled: no long task (> 50 ms, the browser's own definition) for this long
SETTLED = """(quiet) => window.kvvizQuiet !== undefined && performance.now() - window.kvvizQuiet > quiet
  && !document.querySelector('[data-testid=stStatusWidget]') && window.kvvizQuiet"""
PRESSES = """() => { if (!window.kvvizPressed) {
  document.addEventListener('pointerdown', () => { window.kvvizPressed = performance.now(); }, true);
  window.kvvizQuiet = performance.now();  // when the last long task ended
  new PerformanceObserver(list => list.getEntries().forEach(task => {
    window.kvvizQuiet = Math.max(window.kvvizQuiet, task.startTime + task.duration); }))
    .observe({type: 'longtask'}); }
  window.kvvizPressed = -1; }"""  # strip chips: composed events


def _session_file(lm, count: int, folder: Path) -> Path:
    session = Session(lm)
    session.add_ids(token_ids(lm, count))
    path = folder / f"session-{count}.json"
    path.write_text(json.dumps(export_session(session, EditDraft())))
    return path


def _kl(page) -> str:
    return page.locator("[data-testid=stMetric]", has_text="KL(full").locator("[data-testid=stMetricValue]").text_content()


def _settled(page) -> float:
    """Wait until the page is settled (see :data:`SETTLED`); returns ``performance.now()`` (ms) of the end of its
    last long task."""
    page.evaluate(PRESSES)
    return page.wait_for_function(SETTLED, arg=QUIET_MS, timeout=300_000).json_value()


def _clicks(page, count: int, repeats: int) -> dict[str, list[float]]:
    """Seconds from pressing a chip to the what-if's numbers redrawn (on the page's clock, and as seen from
    Playwright) and to the page idle again (its charts drawn)."""
    times = {"numbers": [], "playwright": [], "idle": []}
    for index in range(repeats + 1):
        chip = page.locator(".kv-chip").nth(count // 2 - 20 * index)
        chip.scroll_into_view_if_needed()
        before = _kl(page)
        _settled(page)
        start = time.perf_counter()
        chip.click()
        seconds = page.wait_for_function(KL_CHANGED, arg=before, timeout=120_000).json_value()
        elapsed = time.perf_counter() - start
        pressed = page.evaluate("window.kvvizPressed")
        idle = (_settled(page) - pressed) / 1000
        if index:
            times["numbers"].append(seconds)
            times["playwright"].append(elapsed)
            times["idle"].append(idle)
    return times


def browser_rows(lm, counts: tuple[int, ...] = (1024, 2048), repeats: int = 5) -> list[Row]:
    folder = Path(tempfile.mkdtemp(prefix="kvviz-bench-"))
    files = {count: _session_file(lm, count, folder) for count in counts}
    rows = []
    with running_app({"KVVIZ_SESSIONS": str(folder)}) as url, browser_page(url) as page:
        page.wait_for_selector("textarea", timeout=180_000)
        for count in counts:
            page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files(str(files[count]))
            # the upload reruns the page: click "Load it" once the new file is listed and that run is over (the
            # button of the previous upload is still there until then)
            page.locator("[data-testid=stFileUploader]", has_text=files[count].name).wait_for(timeout=300_000)
            _settled(page)
            page.get_by_role("button", name="Load it").click()
            # the strip lives in a shadow root: Playwright's locators pierce it, document.querySelectorAll does not
            page.locator(".kv-chip").nth(count - 1).wait_for(state="attached", timeout=300_000)
            times = _clicks(page, count, 2 * repeats - 1)  # short and noisy: more of them
            inside = times["numbers"]
            median = statistics.median(inside)
            rows.append(Row(f"browser click {count}", median, 0.3, False, median <= 0.3,
                            f"pointerdown → what-if numbers redrawn, median of {len(inside)} (range {min(inside):.2f}–"
                            f"{max(inside):.2f}), absolute seconds; from Playwright's side "
                            f"{statistics.median(times['playwright']):.2f} s; last long task (charts drawn) ends after "
                            f"{statistics.median(times['idle']):.2f} s"))
        draws = []
        for _ in range(repeats):
            page.get_by_role("tab", name="Cache growth").click()
            page.wait_for_timeout(300)
            start = time.perf_counter()
            page.get_by_role("tab", name="Attention").click()
            page.wait_for_function("""() => [...document.querySelectorAll('[data-testid=stPlotlyChart]')]
                .some(c => c.innerText.includes('every layer') && c.offsetParent !== null
                      && c.querySelector('.heatmaplayer, image, canvas'))""", timeout=60_000)
            draws.append(time.perf_counter() - start)
        median = statistics.median(draws)
        rows.append(Row("overview draw", median, 1.5, False, median <= 1.5,
                        f"tab chosen → overview on screen ({max(counts)} slots), absolute seconds"))
    return rows
