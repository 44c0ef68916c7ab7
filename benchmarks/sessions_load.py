"""``python -m benchmarks.sessions_load``: many browser sessions on one kvviz server, and the server's memory.

Opens N sessions in headless Chromium, one after another (each its own browser context, as N people): each imports a
conversation of ~T tokens, clicks a few chips and waits for the what-if. Then every browser is closed and the
server's RSS is followed while Streamlit drops the disconnected sessions (after ``--ttl`` seconds, Streamlit's
``server.disconnectedSessionTTL``; 120 by default, shortened here so the run is short) and kvviz's idle collector
runs (every ``--gc`` seconds, ``KVVIZ_GC_SECONDS``). Finally N new sessions are opened again, to see whether they
reuse the memory. Prints RSS over time (MB) and a summary. Loopback only.

With a budget (``--budget-mb`` or ``--budget-sessions``) each page also sends a message and is visited again, and the
run reports the figures of docs/serving.md: RSS above idle at its peak and ``--wait`` s after every page closed (also
as anonymous memory, leaving out the model's mapped weights), and the health endpoint's latency. The server runs with
``MALLOC_ARENA_MAX`` as ``scripts/app.sh`` sets it (``--arena-max``). ``--limit`` stops a run that hangs.
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import time
from pathlib import Path

from benchmarks.browser_rows import RUN_OVER
from benchmarks.harness import token_ids
from kvviz.edit.draft import EditDraft
from kvviz.model import load_model
from kvviz.session import Session
from kvviz.session_file import export_session
from benchmarks.browser import CHROMIUM, CHROMIUM_ARGS, SESSION_UPLOAD, app_process


def rss_mb(pid: int, kind: str = "VmRSS") -> float:
    """Resident memory of process ``pid`` in MB (from /proc): all of it, or ``kind`` ``RssAnon`` (the heap: what
    sessions hold) or ``RssFile`` (mapped files: the model's safetensors, paged in by its first forward pass)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{kind}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {kind} for process {pid}")


def session_file(tokens: int, folder: Path, chat: bool = False) -> Path:
    """A session of ``tokens`` ordinary tokens: raw ids, or (``chat``) a chat turn of that text and a short reply."""
    session = Session(load_model())
    ids = token_ids(session.lm, tokens)
    if chat:
        session.add_user_turn(session.lm.tokenizer.decode(ids))
        session.generate(8)
    else:
        session.add_ids(ids)
    path = folder / f"session-{tokens}.json"
    path.write_text(json.dumps(export_session(session, EditDraft())))
    return path


def open_session(browser, url: str, path: Path, clicks: int, message: str | None = None) -> object:
    """A new browser context on the app: import ``path``, click ``clicks`` chips, each until the what-if changed, and
    send ``message`` (if given) until its reply is written."""
    context = browser.new_context(viewport={"width": 1500, "height": 1200})
    page = context.new_page()
    context.kvviz_page = page
    page.goto(url)
    page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=300_000)
    page.locator(SESSION_UPLOAD).set_input_files(str(path))
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
    if message is not None:
        messages = page.locator("[data-testid=stChatMessage]").count()
        page.fill("[data-testid=stChatInputTextArea]", message)
        page.keyboard.press("Enter")
        page.wait_for_function(f"document.querySelectorAll('[data-testid=stChatMessage]').length >= {messages + 2}",
                               timeout=300_000)
        settled(page)
    return context


def settled(page) -> None:
    """Until Streamlit's runs are over and stay over for a second (the reply's rerun follows its stream)."""
    for _ in range(2):
        page.wait_for_function(RUN_OVER, timeout=300_000)
        page.wait_for_timeout(1000)
    page.wait_for_function(RUN_OVER, timeout=300_000)


def reply_shown(page) -> str:
    """The text of the last assistant message on the page."""
    return page.locator("[data-testid=stChatMessage]").last.locator("[data-testid=stText]").inner_text().strip()


def expected_reply(path: Path, message: str) -> str:
    """The greedy reply the library gives to ``message`` on the session in ``path`` (the CLI's code path)."""
    from kvviz.session_file import read_session

    session, _, _ = read_session(load_model(), path.read_bytes())
    session.add_user_turn(message)
    return session.generate(48).strip()


def per_session_bytes(path: Path, clicks: int) -> int:
    """What one page's session holds after the import and ``clicks`` what-ifs (as the registry accounts it)."""
    from kvviz.edit.edit import Edit
    from kvviz.session_file import read_session
    from kvviz.whatif import what_if

    session, _, _ = read_session(load_model(), path.read_bytes())
    for index in range(clicks):
        what_if(session, Edit.evict([20 + 7 * index]))
    return session.nbytes()


def over_limit(signum, frame) -> None:
    raise TimeoutError("the load run took longer than --limit")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sessions_load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--clicks", type=int, default=3)
    parser.add_argument("--ttl", type=int, default=10, help="server.disconnectedSessionTTL in seconds")
    parser.add_argument("--gc", type=int, default=10, help="KVVIZ_GC_SECONDS")
    parser.add_argument("--wait", type=int, default=60, help="seconds to follow RSS after closing the browsers")
    parser.add_argument("--budget-sessions", type=float, default=0, metavar="K",
                        help="set KVVIZ_SERVER_MEMORY_MB to K sessions' worth; each page also sends a message, whose "
                             "reply must equal the library's, and every page is visited again at the end")
    parser.add_argument("--budget-mb", type=float, default=0, metavar="MB",
                        help="as --budget-sessions, with KVVIZ_SERVER_MEMORY_MB=MB")
    parser.add_argument("--arena-max", type=int, default=2,
                        help="the server's MALLOC_ARENA_MAX, as scripts/app.sh sets it (0: glibc's default)")
    parser.add_argument("--limit", type=int, default=3600, help="stop the whole run after this many seconds")
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, over_limit)
    signal.alarm(args.limit)  # the run stops by itself: the exception closes the browsers and stops the server
    if args.budget_sessions or args.budget_mb:
        return budgeted(args)
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="kvviz-load-"))
    path = session_file(args.tokens, folder)
    env = {"KVVIZ_SESSIONS": str(folder / "sessions"), "KVVIZ_GC_SECONDS": str(args.gc)}
    if args.arena_max:
        env["MALLOC_ARENA_MAX"] = str(args.arena_max)
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


class Monitor:
    """A thread sampling the server's RSS and the latency of its health endpoint (``/_stcore/health``, answered by
    the server's event loop: it waits while a page's run holds the loop) every ``period`` s."""

    def __init__(self, url: str, pid: int, period: float = 0.5):
        import threading

        self.url, self.pid, self.period = url, pid, period
        self.rss: list[tuple[float, float, float]] = []  # (time, MB, of which anonymous MB)
        self.health: list[float] = []  # seconds, one per request (a request that failed counts its timeout)
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import urllib.request

        while not self._stop.is_set():
            self.rss.append((time.monotonic(), rss_mb(self.pid), rss_mb(self.pid, "RssAnon")))
            start = time.monotonic()
            try:
                urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=30).read()
            except OSError:
                self.failed += 1
            self.health.append(time.monotonic() - start)
            self._stop.wait(self.period)

    def peak(self, since: float = 0.0) -> tuple[float, float]:
        """The highest RSS sampled since ``since`` and the highest anonymous RSS (MB)."""
        samples = [sample for sample in self.rss if sample[0] >= since]
        return max(mb for _, mb, _ in samples), max(anon for _, _, anon in samples)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def budgeted(args: argparse.Namespace) -> None:
    """N pages under a budget (``--budget-mb``, or K sessions' worth): replies equal the library's, released pages
    restore when visited again (same reply, same cache length), and the server's RSS: idle (the model loaded, read
    by one page's first reply — its weights are a mapped file, resident from the first forward pass on — and that
    page closed), its peak above idle, and ``--wait`` s after every browser closed (the shipped config: Streamlit
    keeps a closed page's state ``server.disconnectedSessionTTL``, 120 s), each also as anonymous memory (the heap),
    with the health endpoint's latency throughout."""
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="kvviz-load-"))
    path, message = session_file(args.tokens, folder, chat=True), "Say one more sentence about this."
    expected = expected_reply(path, message)
    if args.budget_mb:
        budget_mb = args.budget_mb
        print(f"budget {budget_mb:.0f} MB ({budget_mb * 2**20 / per_session_bytes(path, args.clicks):.1f} sessions' "
              f"worth as Session.nbytes counts them); expected reply {expected[:60]!r}")
    else:
        budget_mb = args.budget_sessions * per_session_bytes(path, args.clicks) / 2**20
        print(f"budget {budget_mb:.0f} MB ({args.budget_sessions:g} sessions' worth); expected reply {expected[:60]!r}")
    env = {"KVVIZ_SESSIONS": str(folder / "sessions"), "KVVIZ_SERVER_MEMORY_MB": f"{budget_mb:.0f}"}
    if args.arena_max:
        env["MALLOC_ARENA_MAX"] = str(args.arena_max)
    print(f"MALLOC_ARENA_MAX {args.arena_max or 'unset'}", flush=True)
    with app_process(env) as (url, server), sync_playwright() as playwright:
        monitor = Monitor(url, server.pid)
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        first = browser.new_context()
        page = first.new_page()
        page.goto(url)
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=300_000)
        cold = rss_mb(server.pid)
        page.fill("[data-testid=stChatInputTextArea]", "Hi")  # a first reply reads every weight of the model
        page.keyboard.press("Enter")
        page.wait_for_function("document.querySelectorAll('[data-testid=stChatMessage]').length >= 2",
                               timeout=300_000)
        settled(page)
        first.close()
        time.sleep(20)  # a sweep (5 s) sees it gone, the collector waits 3 s without runs
        idle, idle_anon = rss_mb(server.pid), rss_mb(server.pid, "RssAnon")
        start = time.monotonic()
        print(f"idle: {idle:.0f} MB, {idle_anon:.0f} MB of it anonymous (the model loaded and read by a first "
              f"reply, its page closed; {cold:.0f} MB before that reply)", flush=True)
        contexts, equal, refused = [], 0, 0
        for index in range(args.sessions):
            began = time.monotonic()
            contexts.append(open_session(browser, url, path, args.clicks, message))
            shown = reply_shown(contexts[-1].kvviz_page)
            equal += shown == expected
            refused += contexts[-1].kvviz_page.get_by_text("memory budget").count() > 0
            print(f"page {index + 1}: {time.monotonic() - began:.0f} s, RSS {rss_mb(server.pid) - idle:+.0f} MB above "
                  f"idle (peak during its runs {monitor.peak(began)[0] - idle:+.0f}), reply equal: {shown == expected}"
                  + ("" if shown == expected else f" (shown {shown[:80]!r})"), flush=True)
        restored_count = 0
        for index, context in enumerate(contexts):
            began, page = time.monotonic(), context.kvviz_page
            page.locator(".kv-chip").nth(30).click()  # a run: a released page restores itself first
            settled(page)
            restored = page.get_by_text("set aside to free the server").count() > 0
            restored_count += restored
            header = page.get_by_text("Cache:").first.inner_text()
            print(f"page {index + 1} again: {time.monotonic() - began:.0f} s, restored {restored}, {header}, "
                  f"reply equal: {reply_shown(page) == expected}, RSS {rss_mb(server.pid) - idle:+.0f} MB above idle",
                  flush=True)
        peak, peak_anon = monitor.peak(start)
        under_load = list(monitor.health)
        for context in contexts:
            context.close()
        closed = time.monotonic()
        while time.monotonic() - closed < args.wait:
            time.sleep(min(5, args.wait - (time.monotonic() - closed)))
            print(f"{time.monotonic() - closed:5.1f} s after closing: RSS {rss_mb(server.pid) - idle:+.0f} MB above "
                  "idle", flush=True)
        after, after_anon = rss_mb(server.pid), rss_mb(server.pid, "RssAnon")
        monitor.stop()
        browser.close()
    health = monitor.health
    print(f"\n{args.sessions} sessions ({args.tokens} tokens, {args.clicks} clicks and a message each), budget "
          f"{budget_mb:.0f} MB: {equal} replies equal the library's, {refused} page(s) showed a budget refusal, "
          f"{restored_count} restored when visited again\n"
          f"RSS idle {idle:.0f} MB · peak {peak:.0f} MB ({peak - idle:+.0f} MB above idle; anonymous "
          f"{peak_anon - idle_anon:+.0f}) · {args.wait} s after every page closed {after:.0f} MB "
          f"({after - idle:+.0f} MB above idle; anonymous {after_anon - idle_anon:+.0f})\n"
          f"health endpoint: {len(health)} requests, p50 {percentile(health, 0.5) * 1000:.0f} ms, "
          f"p99 {percentile(health, 0.99) * 1000:.0f} ms, max {max(health) * 1000:.0f} ms "
          f"(under load: max {max(under_load) * 1000:.0f} ms), {monitor.failed} failed")


if __name__ == "__main__":
    main()
