"""Browser rows of the benchmark: the real app in headless Chromium (Playwright + Debian's chromium).

- ``browser click N``: a session of N cached slots is imported; a chip is clicked; the time from the click's
  ``pointerdown`` in the page until the what-if's KL value on the page has changed (the edit was applied, the step
  re-run and the numbers drawn; they are drawn together), on the page's own clock. Absolute seconds. The detail adds
  when Streamlit marked the run over and when the click's last long task (drawing the charts) ended, and the median
  seen from Playwright's side (the ~50 ms Playwright spends before it presses, scrolling and checking, is not the
  app's). The first clicks after loading a session warm up and are not counted. Each click is made on a settled
  page, as a person clicks after looking at the result: once the browser has run no long task for a while (the
  previous result's charts are drawn).
- ``browser settled N``: from the same ``pointerdown`` until the page is settled: Streamlit's run is over and the
  click's last long task (> 50 ms) has ended, with no other for 300 ms.
- ``overview draw``: the time from choosing the Attention tab until the layer × head overview is on screen.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Row, token_ids
from kvviz.edit.draft import EditDraft
from kvviz.session import Session
from kvviz.session_file import export_session
from benchmarks.browser import SESSION_UPLOAD, browser_page, running_app

RUN_OVER = "document.querySelector('[data-testid=stApp]').dataset.testScriptState !== 'running'"  # Streamlit's own
KL_CHANGED = """(before) => {  // the what-if's numbers are drawn together; KL stands for them
  const m = [...document.querySelectorAll('[data-testid=stMetric]')].find(e => e.textContent.includes('KL(full'));
  const done = m && m.querySelector('[data-testid=stMetricValue]').textContent !== before;
  return done && (performance.now() - window.kvvizPressed) / 1000;
}"""  # textContent, not innerText: polled every frame, it must not force a layout of the page being measured
RAN = f"() => {RUN_OVER} && (performance.now() - window.kvvizPressed) / 1000"  # polled once the new KL is shown
WARM_UP = 3  # clicks not counted: after loading a session the first ones were slower (437, 299, 355, then 174–286 ms)
QUIET_MS = 300  # settled: no long task (> 50 ms, the browser's own definition) for this long
SETTLED = f"""(quiet) => window.kvvizQuiet !== undefined && performance.now() - window.kvvizQuiet > quiet
  && {RUN_OVER} && window.kvvizQuiet"""
WATCH = """() => { if (!window.kvvizPressed) {  // once: note each pointerdown and the end of each long task
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
    page.evaluate(WATCH)
    return page.wait_for_function(SETTLED, arg=QUIET_MS, timeout=300_000).json_value()


def _clicks(page, count: int, repeats: int) -> dict[str, list[float]]:
    """Seconds from pressing a chip to the what-if's numbers redrawn (on the page's clock, and as seen from
    Playwright), to Streamlit marking the run over, and to the end of the click's last long task (charts drawn)."""
    times = {"numbers": [], "playwright": [], "run": [], "idle": []}
    for index in range(WARM_UP + repeats):
        chip = page.locator(".kv-chip").nth(count // 2 - 20 * index)
        chip.scroll_into_view_if_needed()
        before = _kl(page)
        _settled(page)
        start = time.perf_counter()
        chip.click()
        seconds = page.wait_for_function(KL_CHANGED, arg=before, timeout=120_000).json_value()
        elapsed = time.perf_counter() - start
        ran = page.wait_for_function(RAN, timeout=120_000, polling=20).json_value()
        pressed = page.evaluate("window.kvvizPressed")
        idle = (_settled(page) - pressed) / 1000
        if index >= WARM_UP:
            times["numbers"].append(seconds)
            times["playwright"].append(elapsed)
            times["run"].append(ran)
            times["idle"].append(idle)
    return times


def browser_rows(lm, counts: tuple[int, ...] = (2048, 8000), repeats: int = 5) -> list[Row]:
    folder = Path(tempfile.mkdtemp(prefix="kvviz-bench-"))
    files = {count: _session_file(lm, count, folder) for count in counts}
    rows = []
    with running_app({"KVVIZ_SESSIONS": str(folder)}) as url, browser_page(url) as page:
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=180_000)
        for count in counts:
            page.locator(SESSION_UPLOAD).set_input_files(str(files[count]))
            # the upload reruns the page: click "Load it" once the new file is listed and that run is over (the
            # button of the previous upload is still there until then)
            page.locator("[data-testid=stFileUploader]", has_text=files[count].name).wait_for(timeout=300_000)
            _settled(page)
            page.get_by_role("button", name="Load it").click()
            # the strip lives in a shadow root: Playwright's locators pierce it, document.querySelectorAll does not
            page.locator(".kv-chip").nth(count - 1).wait_for(state="attached", timeout=300_000)
            times = _clicks(page, count, 3 * repeats)  # short and noisy: more of them
            inside = times["numbers"]
            median = statistics.median(inside)
            rows.append(Row(f"browser click {count}", median, 0.3, False, median <= 0.3,
                            f"pointerdown → what-if numbers redrawn, median of {len(inside)} (range {min(inside):.2f}–"
                            f"{max(inside):.2f}), absolute seconds; from Playwright's side "
                            f"{statistics.median(times['playwright']):.2f} s; the page's run over (Streamlit's script "
                            f"state) after {statistics.median(times['run']):.2f} s"))
            settled = times["idle"]
            median = statistics.median(settled)
            rows.append(Row(f"browser settled {count}", median, 0.5, False, median <= 0.5,
                            f"pointerdown → the page settled (the run over and the click's last long task ended: "
                            f"strip, tables and charts drawn), median of {len(settled)} (range {min(settled):.2f}–"
                            f"{max(settled):.2f}), absolute seconds"))
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
