"""A hub id loads from a local Hugging Face cache with the hub offline (``python -m kvviz`` in a process of its own,
since the hub's settings are read at import), and a missing one is refused in one line."""

from __future__ import annotations

from kvviz.tiny_models import tiny


def _cli(env: dict, *args: str):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "kvviz", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_a_hub_id_loads_from_the_local_cache_offline_and_a_missing_one_is_one_line(tokenizer, tmp_path):
    snapshot = tmp_path / "hub" / "models--kvviz-test--tiny-qwen3" / "snapshots" / ("0" * 40)
    tiny("qwen3").save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    out = _cli(env, "chat", "--model", "kvviz-test/tiny-qwen3", "--turn", "Hi", "--max-new-tokens", "2", "--json")
    assert out.returncode == 0, out.stderr
    assert '"model": "kvviz-test/tiny-qwen3"' in out.stdout
    out = _cli(env, "chat", "--model", "kvviz-test/not-cached", "--turn", "Hi")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "not in the local Hugging Face cache" in out.stderr and "offline" in out.stderr
