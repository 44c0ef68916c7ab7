"""The app on tiny random models of other architectures (no download), under AppTest: a page runs tiny Qwen3, Gemma 2,
gpt-oss, DeepSeek-V3, DeepSeek-V3.2 and Qwen3-Next models with their heads named by KV group (gpt-oss's sink share
beside ρ; DeepSeek's latent said in a line; DeepSeek-V3.2's read set said in a line and drawn on the strip; Qwen3-Next's
layers without KV said in a line and in the layer picker), and switches between the server's models."""

from __future__ import annotations

import pytest

from app.views.whatif import CHARTS
from kvviz.tiny_models import tiny
from tests.support.app_test import open_view


@pytest.mark.parametrize("kind, labels", [
    ("qwen3", ["head 5 (KV 2)", "head 7 (KV 3)"]),  # 8 query heads over 4 KV heads
    ("gemma2", ["head 3 (KV 0)", "head 4 (KV 1)"]),  # over 2 KV heads; soft-capped, local / global layers
    ("gpt_oss", ["head 3 (KV 0)", "head 4 (KV 1)"]),  # learned sinks, sliding / full layers
    ("deepseek_v3", ["head 3 (KV 0)", "head 7 (KV 0)"]),  # latent attention: one latent read by all 8 heads
    ("deepseek_v32", ["head 3 (KV 0)", "head 7 (KV 0)"]),  # … each step reading the 12 slots its indexer picks
    ("qwen3_next", ["head 3 (KV 0)", "head 4 (KV 1)"]),  # hybrid: decoder layers 1 and 3 alone cache K/V
])
def test_the_app_runs_a_tiny_non_llama_model(tokenizer, tmp_path, monkeypatch, kind, labels):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    model = tiny(kind)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    monkeypatch.setenv("KVVIZ_MODEL", str(tmp_path))
    app = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app" / "main.py"), default_timeout=300).run()
    app.session_state["max_new_tokens"] = 4
    app.chat_input[0].set_value("a = 3, b = 5. What is a + b?").run()
    assert not app.exception and not [e.value for e in app.error]
    assert not [w.value for w in app.warning if "could not be drawn" in w.value]
    head = next(s for s in app.selectbox if s.key == "head")
    assert set(labels) <= set(head.options)  # as shown
    latent_kinds = ("deepseek_v3", "deepseek_v32")
    assert app.session_state["session"].lm.kv_heads == (1 if kind in latent_kinds else model.config.num_key_value_heads)
    latent = [c.value for c in app.caption if "caches one latent per token" in c.value]
    assert bool(latent) == (kind in latent_kinds)
    sparse = [c.value for c in app.caption if "reads a subset of its cache" in c.value]
    session = app.session_state["session"]
    assert sparse == ([f"This model reads a subset of its cache at each step (DeepSeek sparse attention): a lightning "
                       f"indexer scores every slot and each query reads the 12 of highest score. At slot "
                       f"{len(session) - 1}, layer 0 read 12 of the {len(session)} slots it saw; the others are "
                       "faded, with a dotted band. The cache keeps them all: evicting a slot that was read lets the "
                       "indexer pick the next one of its ranking (the what-if lists the slots it admitted)."]
                      if kind == "deepseek_v32" else [])
    assert len(app.get("plotly_chart")) >= 3  # the attention maps
    for label in CHARTS.values():  # the what-if's charts: one drawn at a time, the one whose tab is chosen
        app.session_state["whatif_chart"] = label
        app.run()
        assert len(app.get("vega_lite_chart")) == 1 and not app.exception
        assert not [w.value for w in app.warning if "could not be drawn" in w.value]
    hybrid = [c.value for c in app.caption if "This model is hybrid" in c.value]
    assert bool(hybrid) == (kind == "qwen3_next")
    rows = [c.value for c in app.caption if "Rows are the layers with a KV cache" in c.value]  # the Attention view
    assert rows == (["Rows are the layers with a KV cache (0 = decoder layer 1, 1 = decoder layer 3); decoder layers "
                     "0, 2 keep a recurrent state and have no attention weights to show."] if hybrid else [])
    layers = next(s for s in app.selectbox if s.key == "layer").options
    assert layers == (["0 (decoder layer 1)", "1 (decoder layer 3)"] if hybrid else [str(l) for l in range(3)])
    windows = [c.value for c in app.caption if "sliding window of" in c.value]
    assert bool(windows) == (kind in ("gemma2", "gpt_oss"))  # layer 0 is a local layer
    if kind == "deepseek_v3":  # the latent cache's own scheme is offered, and compared as the library compares it
        from kvviz.schemes.catalogue import schemes
        from kvviz.schemes.compare import compare_schemes

        chosen = app.multiselect(key="schemes_chosen")
        assert "fp8-ds-mla" in chosen.value
        chosen.set_value(["fp16", "fp8-ds-mla"])
        next(b for b in app.button if b.label == "Compare the schemes").click().run()
        assert not app.exception and not [e.value for e in app.error]
        version, at, rows = app.session_state["schemes"]
        assert rows == compare_schemes(app.session_state["session"], schemes(["fp16", "fp8-ds-mla"]), at)
        assert rows[1].kl > 0
    for label in ("Cache growth", "Channels", "Policies", "Policy run", "Sweeps"):  # only the open tab is drawn
        open_view(app, label)
        assert not app.exception and not [e.value for e in app.error], label
        assert not [w.value for w in app.warning if "could not be drawn" in w.value], label
    if kind == "deepseek_v32":  # a policy run's step: blame reads each unread slot alongside the indexer's picks
        open_view(app, "Policy run")
        next(n for n in app.number_input if n.label == "New tokens per turn").set_value(3)
        app.button[[b.label for b in app.button].index("Run the policy")].click().run()
        app.radio(key="run-blame-of").set_value("unread").run()
        app.button[[b.label for b in app.button].index("Blame this step")].click().run()
        assert not app.exception and not [e.value for e in app.error]
        ranked = app.session_state["policy_blame"]
        assert ranked.of == "unread" and ranked.rows
        assert any("Restoring one unread slot at a time read" in m.value for m in app.markdown)
    open_view(app, "Attention")
    sinks = [m for m in app.metric if m.label.startswith("Sink (layer 0")]
    assert len(sinks) == (kind == "gpt_oss")  # the sink's share beside ρ
    if sinks:
        assert 0 < float(sinks[0].value) < 1


def test_a_page_switches_between_the_servers_models(tokenizer, tmp_path, monkeypatch):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    tiny("phi3").save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    monkeypatch.setenv("KVVIZ_MODELS", f"{tmp_path},tiny:deepseek_v3")
    app = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app" / "main.py"), default_timeout=300).run()
    assert app.session_state["session"].lm.name.startswith("SmolLM2")
    model = next(s for s in app.selectbox if s.label == "Model")
    assert list(model.options) == ["(bundled)", str(tmp_path), "tiny:deepseek_v3"]
    model.select(str(tmp_path)).run()
    assert not app.exception
    assert app.session_state["session"].lm.name == tmp_path.name
    next(s for s in app.selectbox if s.label == "Model").select("tiny:deepseek_v3").run()  # a family, no download
    assert not app.exception and app.session_state["session"].lm.attention.latent is not None
    next(s for s in app.selectbox if s.label == "Model").select("(bundled)").run()
    assert app.session_state["session"].lm.name.startswith("SmolLM2")
