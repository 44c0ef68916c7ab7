"""Cache formats: how cached keys and values are stored in fewer bits (quantizers, outlier handling, widths per slot
and per (layer, KV head), KIVI, QuantizedCache, static FP8 scales) and the scheme catalogue that names them.
Each module is imported by its own name; this package imports nothing, so ``kvviz.quant.names`` stays torch-free."""
