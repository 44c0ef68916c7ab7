"""The running app in headless Chromium (Debian's chromium driven by Playwright), for the benchmark, the browser
tests and the README's screenshots. Only the loopback interface is used."""

from __future__ import annotations

import json
import os
import secrets
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


def _answers(url: str, process: subprocess.Popen, name: str, timeout_s: float = 120) -> None:
    """Until ``url`` answers (``name``'s server, ``process``, started)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"{name} did not start") from None
            time.sleep(0.5)


@contextmanager
def app_process(env: dict[str, str] | None = None, startup_s: float = 120, cwd: Path = ROOT,
                args: tuple[str, ...] = (), log: Path | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start ``streamlit run app/main.py`` (from ``cwd``, with extra ``args``) on a free port; yields its loopback URL
    and the server process once it answers. ``log``: a file for the server's output (else it is dropped)."""
    port = free_port()
    out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 — closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"), "--server.port", str(port),
         "--server.headless", "true", *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        _answers(f"{url}/_stcore/health", process, "the app", startup_s)
        yield url, process
    finally:
        process.terminate()
        process.wait(timeout=30)
        if log is not None:
            out.close()


@contextmanager
def running_app(env: dict[str, str] | None = None, startup_s: float = 120, cwd: Path = ROOT,
                args: tuple[str, ...] = (), log: Path | None = None) -> Iterator[str]:
    """:func:`app_process`, yielding only the URL."""
    with app_process(env, startup_s, cwd, args, log) as (url, _):
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


# --- JupyterLab, for the notebook widget's browser test and screenshot -------------------------------------------

SETTINGS = {  # every cell in the page (Lab draws only the visible ones by default), no news prompt
    "notebook-extension/tracker": {"windowingMode": "none"},
    "apputils-extension/notification": {"fetchNews": "false"},
}


@contextmanager
def running_lab(folder: Path) -> Iterator[tuple[str, str]]:
    """JupyterLab on ``folder``, on 127.0.0.1 with a token and settings of its own (beside ``folder``), once it
    answers: yields its URL and token, and stops it after."""
    port, token = free_port(), secrets.token_hex(16)
    lab = folder.parent / f"{folder.name}-lab"
    for name, values in SETTINGS.items():
        where = lab / "settings" / "@jupyterlab" / f"{name}.jupyterlab-settings"
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(json.dumps(values))
    # JupyterLab's debugger asks a new kernel for its state and logs a console error when the kernel's answer is cut
    # short ("Could not restore the debugger state: Canceled future for debug_request message"), as it is under
    # load: no kvviz flow uses the debugger, and the browser tests forbid console errors
    page_config = lab / "config" / "labconfig" / "page_config.json"
    page_config.parent.mkdir(parents=True, exist_ok=True)
    page_config.write_text(json.dumps({"disabledExtensions": {"@jupyterlab/debugger-extension": True}}))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(lab / "config"), "JUPYTER_RUNTIME_DIR": str(lab / "run"),
           "JUPYTERLAB_WORKSPACES_DIR": str(lab / "workspaces"), "JUPYTERLAB_SETTINGS_DIR": str(lab / "settings"),
           "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={folder}", "--LabApp.news_url=",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _answers(f"{url}/api/status?token={token}", process, "JupyterLab")
        yield url, token
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextmanager
def running_marimo(notebook: Path) -> Iterator[str]:
    """``marimo run notebook`` (the app view: every cell run, the code hidden) on 127.0.0.1 with no token, once it
    answers: yields its URL, and stops it after."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "marimo", "run", str(notebook), "--headless", "--no-token", "--host", "127.0.0.1",
         "--port", str(port)], cwd=notebook.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1", "MARIMO_SKIP_UPDATE_CHECK": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        _answers(url + "/health", process, "marimo")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def notebook_url(url: str, token: str, path: str) -> str:
    """The Lab URL of notebook ``path`` with its kernel already started through the server's REST API (Lab then
    joins that session instead of asking which kernel to start)."""
    request = urllib.request.Request(
        f"{url}/api/sessions", method="POST", headers={"Authorization": f"token {token}",
                                                       "Content-Type": "application/json"},
        data=json.dumps({"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}}).encode())
    urllib.request.urlopen(request, timeout=60).read()
    return f"{url}/lab/tree/{path}?token={token}"


def run_all(page, notebook: Path, timeout_s: float = 300) -> None:
    """Run the code cells of ``notebook`` (the file the page shows) in order as a person would: select one,
    Ctrl+Enter, wait for its number (Lab draws a notebook's cells a few at a time: the count is the file's). A run
    asked before
    Lab has joined the kernel is dropped (the prompt stays ``[ ]``), so it is asked again until the cell starts (a
    started cell shows ``[*]`` at once: no cell runs twice)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    cells = sum(cell["cell_type"] == "code" for cell in json.loads(notebook.read_text())["cells"])
    prompts = page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt")
    page.wait_for_function(f"() => document.querySelectorAll('.jp-Notebook .jp-CodeCell').length >= {cells}",
                           timeout=90_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
    for index in range(cells):
        prompt = prompts.nth(index)
        for _ in range(24):
            dialog = page.locator(".jp-Dialog")
            if dialog.count():  # Lab had not joined the kernel yet and asks which to start: its default, python3
                dialog.locator(".jp-mod-accept").first.click()
                dialog.first.wait_for(state="detached", timeout=30_000)
                page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
            prompt.click()
            page.keyboard.press("Control+Enter")
            try:
                page.wait_for_function("p => /\\[(\\*|\\d+)\\]/.test(p.textContent)", arg=prompt.element_handle(),
                                       timeout=5_000)
                break
            except PlaywrightTimeout:
                continue  # asked again (after the kernel chooser, if Lab opened it)
        else:
            raise AssertionError(f"code cell {index} never started")
        page.wait_for_function("p => /\\[\\d+\\]/.test(p.textContent)", arg=prompt.element_handle(),
                               timeout=timeout_s * 1000)
