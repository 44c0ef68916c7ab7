"""Safe however the server is started: from another directory it still binds loopback only; with another address it
refuses every page; a page asked for under a foreign name (DNS rebinding) is refused."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from benchmarks.browser import browser_page, running_app
from tests.support.browser_page import needs_chromium

pytestmark = needs_chromium


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket listening on ``port`` (IPv4 and IPv6, from /proc/net)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_launched_from_another_directory_it_binds_loopback_only(tmp_path):
    with running_app(cwd=tmp_path) as url:
        port = urllib.parse.urlsplit(url).port
        assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, nothing else


def test_another_address_is_refused_with_the_fix(tmp_path):
    with running_app(cwd=tmp_path, args=("--server.address", "0.0.0.0")) as url, browser_page(url) as page:
        page.wait_for_selector("[data-testid=stAlert]", timeout=120_000)
        text = page.locator("[data-testid=stAlert]").inner_text()
        assert "listens on address 0.0.0.0" in text and "--server.address 127.0.0.1" in text
        assert page.locator("[data-testid=stChatInputTextArea]").count() == 0  # nothing of the app is drawn


def test_a_foreign_host_name_is_refused():
    with running_app() as url:
        port = urllib.parse.urlsplit(url).port
        rules = ("--host-resolver-rules=MAP rebind.example 127.0.0.1",)
        with browser_page(f"http://rebind.example:{port}", args=rules) as page:
            page.wait_for_selector("[data-testid=stAlert]", timeout=120_000)
            assert "not a name of this computer" in page.locator("[data-testid=stAlert]").inner_text()
            assert page.locator("[data-testid=stChatInputTextArea]").count() == 0


def test_a_kill_during_a_restore_keeps_the_autosave_and_it_restores(lm, tmp_path):
    """The server is killed (SIGKILL) while a page replays an autosave (a prompt and a 300-token reply, decoded step by
    step): the file is byte for byte as it was, and a new server restores it. (A release never writes the file: it
    frees tensors in memory.)"""
    import json

    from benchmarks.harness import token_ids
    from kvviz.edit.draft import EditDraft
    from kvviz.session import Session
    from kvviz.session_file import export_session
    from benchmarks.browser import app_process

    session = Session(lm)
    session.add_ids(token_ids(lm, 200))
    for index, token in enumerate(token_ids(lm, 300)):
        if index:
            session.step()
        session.force(token)
    sid = "ef" * 16
    path = tmp_path / f"{sid}.json"
    path.write_text('{"revision": 1, ' + json.dumps(export_session(session, EditDraft()))[1:])
    saved = path.read_bytes()
    env = {"KVVIZ_SESSIONS": str(tmp_path)}
    with app_process(env) as (url, server), browser_page(f"{url}/?s={sid}") as page:
        page.get_by_text("Restoring the autosaved session").wait_for(timeout=120_000)
        server.kill()
        server.wait(timeout=30)
    assert path.read_bytes() == saved
    with app_process(env) as (url, _), browser_page(f"{url}/?s={sid}") as page:
        page.locator(".kv-chip").nth(len(session) - 1).wait_for(state="attached", timeout=300_000)
        assert page.get_by_text(f"Cache: {len(session)} slots").count() == 1
    assert path.read_bytes() == saved  # restoring writes nothing: the file already holds the session
