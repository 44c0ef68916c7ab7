"""The bundled model loads with its shape, on the device asked for."""

from __future__ import annotations

from kvviz.model import bundled_gguf, converted_dir


def test_bundled_model_shape_and_device(lm):
    assert (lm.layers, lm.heads, lm.kv_heads, lm.head_dim) == (30, 9, 3, 64)
    assert lm.context_window == 8192 and lm.model.config.vocab_size == 49152
    assert lm.device_label == "cpu · float32"
    assert 2 in lm.stop_ids  # <|im_end|>
    assert (converted_dir(bundled_gguf()) / "model.safetensors").is_file()
