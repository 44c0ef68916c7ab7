"""The server's configuration is safe by default (loopback address, upload limits, no telemetry)."""

from __future__ import annotations

from pathlib import Path


APP = str(Path(__file__).resolve().parents[2] / "app" / "main.py")


def test_server_is_safe_by_default():
    import tomllib

    config = tomllib.loads((Path(APP).parent / ".streamlit" / "config.toml").read_text())  # read wherever run from
    assert config["server"]["address"] == "127.0.0.1"
    assert config["server"]["enableXsrfProtection"] is True
    assert config["browser"]["gatherUsageStats"] is False
    assert config["client"]["showErrorDetails"] == "none" and config["client"]["toolbarMode"] == "viewer"
