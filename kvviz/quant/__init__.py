"""Tensor formats: how cached keys and values are stored in fewer bits — quantizers (integer, FP8, NVFP4 / MXFP4),
outlier handling, widths per slot and per (layer, KV head), bit allocation — and the grammar of scheme names. The
named recipes built from them live in :mod:`kvviz.schemes`, above the session. Each module is imported by its own
name; this package imports nothing, so ``kvviz.quant.names`` stays torch-free."""
