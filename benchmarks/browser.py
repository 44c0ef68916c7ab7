"""The running app in headless Chromium (Debian's chromium driven by Playwright), for the benchmark, the browser
tests and the README's screenshots. Only the loopback interface is used."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
SESSION_UPLOAD = "[data-testid=stSidebarUserContent] [data-testid=stFileUploaderDropzoneInput]"  # the sidebar's
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def app_process(env: dict[str, str] | None = None, startup_s: float = 120, cwd: Path = ROOT,
                args: tuple[str, ...] = ()) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start ``streamlit run app/main.py`` (from ``cwd``, with extra ``args``) on a free port; yields its loopback URL
    and the server process once it answers."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"), "--server.port", str(port),
         "--server.headless", "true", *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            try:
                urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the app did not start") from None
                time.sleep(0.5)
        yield url, process
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextmanager
def running_app(env: dict[str, str] | None = None, startup_s: float = 120, cwd: Path = ROOT,
                args: tuple[str, ...] = ()) -> Iterator[str]:
    """:func:`app_process`, yielding only the URL."""
    with app_process(env, startup_s, cwd, args) as (url, _):
        yield url


@contextmanager
def browser_page(url: str, width: int = 1500, height: int = 1400, args: tuple[str, ...] = ()) -> Iterator:
    """A Playwright page on ``url`` in headless Chromium (with extra command-line ``args``); ``page.dialogs`` collects
    (and dismisses) any dialog."""
    from playwright.sync_api import expect, sync_playwright

    # a loaded machine (CI beside other jobs) can take longer than expect's 5 s and an action's 30 s defaults for one
    # rerun (a click waits for its element to appear): these are bounds on a wait for the page's state, not timing
    # checks (none asserts how fast); one test run beside another took a click past 30 s
    expect.set_options(timeout=180_000)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *args])
        page = browser.new_page(viewport={"width": width, "height": height})
        page.set_default_timeout(180_000)
        page.dialogs = []
        page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(url)
        page.wait_for_selector("[data-testid=stApp]")
        try:
            yield page
        finally:
            browser.close()
