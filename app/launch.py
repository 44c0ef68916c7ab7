"""Safe however the server was started: loopback only, and only pages asked for by a loopback name.

The shipped config (``app/.streamlit/config.toml``, read wherever ``streamlit run`` starts) binds 127.0.0.1. A server
started with another address (a flag, an environment variable, another config) is refused at every page, as is a
page requested under a name that is not a loopback name — the way DNS rebinding reaches a local server. Serving
others on purpose: ``KVVIZ_ALLOW_REMOTE=1``.
"""

from __future__ import annotations

import ipaddress

from kvviz import settings


def _loopback(name: str) -> bool:
    name = name.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """``127.0.0.1:8501`` → ``127.0.0.1``; ``[::1]:8501`` → ``::1``."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def refusal(address: str | None, host: str | None) -> str | None:
    """Why this page must not be served (one line, with the fix), or None. ``address``: the server's
    ``server.address`` (None or empty: every interface); ``host``: the request's Host header (None outside a real
    server, e.g. under AppTest, where nothing is listening)."""
    if host is None or settings.switched_on("KVVIZ_ALLOW_REMOTE"):
        return None
    if not address or not _loopback(address):
        listening = f"address {address}" if address else "every network interface"
        return (f"kvviz serves only this computer, but this server listens on {listening}. Restart it with "
                "`streamlit run app/main.py --server.address 127.0.0.1` (or set KVVIZ_ALLOW_REMOTE=1 to serve "
                "others on purpose).")
    if not _loopback(_host_name(host)):
        return (f"This page was requested as {host[:80]!r}, which is not a name of this computer. Open it as "
                "http://127.0.0.1 (with the same port) instead.")
    return None
