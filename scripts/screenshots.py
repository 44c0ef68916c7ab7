"""Take the README's screenshots of the running dashboard (headless Debian chromium via Playwright).

Usage: .venv/bin/python scripts/screenshots.py   (writes assets/screenshot-*.png)
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
PORT = 8597


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
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.port", str(PORT)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/_stcore/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=[
                "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"])
            # one tall viewport: Streamlit's main area scrolls internally, so element shots of a short one come out blank
            page = browser.new_page(viewport={"width": 1440, "height": 4200})
            page.goto(f"http://127.0.0.1:{PORT}/")
            page.wait_for_selector("textarea", timeout=120_000)
            page.get_by_role("button", name="Evict the definitions").click()
            page.wait_for_selector(".kv-chip", timeout=300_000)
            wait_idle(page, 3)
            shoot(page, "strip", top="h1", bottom="[data-testid=stTabs]")
            shoot(page, "whatif", top="[data-testid=stTabs]", bottom=None, height=1900)
            for name, file in (("Attention", "attention"), ("Cache growth", "growth"), ("Policies", "policies")):
                page.get_by_role("tab", name=name).click()
                if name == "Policies":
                    page.get_by_role("button", name="Compare the two").click()
                wait_idle(page, 2)
                shoot(page, file, top="[data-testid=stTabs]", bottom=None, height=1500)
            browser.close()
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
