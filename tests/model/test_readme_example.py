"""The README's Python example runs as printed, on the bundled model."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_python_example_runs(lm, monkeypatch, capsys):
    """The README's notebook-style example uses only the public API and runs as written (its model load returns the
    session's already loaded model)."""
    import kvviz

    text = (ROOT / "README.md").read_text()
    start = text.index("```python") + len("```python")
    code = text[start: text.index("```", start)]
    monkeypatch.setattr(kvviz, "load_model", lambda *args, **kwargs: lm, raising=False)
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2] == "torch.Size([30, 9])" and printed[-1].endswith("bytes")
