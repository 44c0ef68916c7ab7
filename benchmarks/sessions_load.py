"""``python -m benchmarks.sessions_load``: many browser sessions on one kvviz server, and the server's memory.

Opens N sessions in headless Chromium, one after another (each its own browser context, as N people): each imports a
conversation of ~T tokens, clicks a few chips and waits for the what-if. Then every browser is closed and the
server's RSS is followed while Streamlit drops the disconnected sessions (after ``--ttl`` seconds, Streamlit's
``server.disconnectedSessionTTL``; 120 by default, shortened here so the run is short) and kvviz's idle collector
runs (every ``--gc`` seconds, ``KVVIZ_GC_SECONDS``). Finally N new sessions are opened again, to see whether they
reuse the memory. Prints RSS over time (MB) and a summary. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.harness import token_ids
from kvviz.draft import EditDraft
from kvviz.model import load_model
from kvviz.session import Session
from kvviz.session_file import export_session
from tests.browser import CHROMIUM, CHROMIUM_ARGS, app_process


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def session_file(tokens: int, folder: Path) -> Path:
    session = Session(load_model())
    session.add_ids(token_ids(session.lm, tokens))
    path = folder / f"session-{tokens}.json"
    path.write_text(json.dumps(export_session(session, EditDraft())))
    return path


def open_session(browser, url: str, path: Path, clicks: int) -> object:
    """A new browser context on the app: import ``path``, click ``clicks`` chips, each until the what-if changed."""
    context = browser.new_context(viewport={"width": 1500, "height": 1200})
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("textarea", timeout=300_000)
    page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files(str(path))
    page.locator("[data-testid=stFileUploader]", has_text=path.name).wait_for(timeout=300_000)
    page.wait_for_timeout(500)
    page.get_by_role("button", name="Load it").click()
    chips = page.locator(".kv-chip")
    chips.nth(10).wait_for(timeout=600_000)
    page.wait_for_selector("[data-testid=stMetric]", timeout=300_000)
    for index in range(clicks):
        metric = page.locator("[data-testid=stMetric]", has_text="KL(full").locator("[data-testid=stMetricValue]")
        before = metric.text_content()
        chips.nth(20 + 7 * index).click()
        page.wait_for_function("""(before) => {
            const m = [...document.querySelectorAll('[data-testid=stMetric]')].find(e => e.textContent.includes('KL(full'));
            return m && m.querySelector('[data-testid=stMetricValue]').textContent !== before; }""",
                               arg=before, timeout=300_000)
    return context


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sessions_load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--clicks", type=int, default=3)
    parser.add_argument("--ttl", type=int, default=10, help="server.disconnectedSessionTTL in seconds")
    parser.add_argument("--gc", type=int, default=10, help="KVVIZ_GC_SECONDS")
    parser.add_argument("--wait", type=int, default=60, help="seconds to follow RSS after closing the browsers")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="kvviz-load-"))
    path = session_file(args.tokens, folder)
    env = {"KVVIZ_SESSIONS": str(folder / "sessions"), "KVVIZ_GC_SECONDS": str(args.gc)}
    samples: list[tuple[float, str, float]] = []
    with app_process(env, args=("--server.disconnectedSessionTTL", str(args.ttl))) as (url, server), \
            sync_playwright() as playwright:
        start = time.monotonic()

        def sample(what: str) -> float:
            value = rss_mb(server.pid)
            samples.append((time.monotonic() - start, what, value))
            print(f"{samples[-1][0]:7.1f} s  {value:8.1f} MB  {what}", flush=True)
            return value

        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        first = open_session(browser, url, path, 0)
        first.close()
        time.sleep(args.ttl + args.gc + 5)
        idle = sample("idle: model loaded, one session opened and dropped")
        contexts = []
        for index in range(args.sessions):
            contexts.append(open_session(browser, url, path, args.clicks))
            sample(f"{index + 1} session(s) open ({args.tokens} tokens, {args.clicks} clicks each)")
        peak = max(value for _, _, value in samples)
        for context in contexts:
            context.close()
        sample("all browsers closed")
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            time.sleep(5)
            after = sample("closed, waiting")
        contexts = [open_session(browser, url, path, args.clicks) for _ in range(args.sessions)]
        again = sample(f"{args.sessions} new sessions open")
        browser.close()
    print(f"\nidle {idle:.0f} MB · {args.sessions} sessions {peak:.0f} MB (+{(peak - idle) / args.sessions:.0f} MB each) "
          f"· {args.wait} s after closing {after:.0f} MB ({after - idle:+.0f} MB vs idle) · "
          f"{args.sessions} new sessions {again:.0f} MB ({again - peak:+.0f} MB vs the first {args.sessions})")


if __name__ == "__main__":
    main()
