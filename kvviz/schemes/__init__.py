"""Named quantization schemes: the recipes above a session that say how a cache is stored — the scheme catalogue
(``int4-token``, ``fp8-e4m3-head``, ``nvfp4``, ``kivi-2``, ``quanto-4``, …), static FP8 calibration, KIVI's window,
caches a run writes slot by slot, transformers' QuantizedCache, and several schemes compared at one step. They build
on :mod:`kvviz.quant`'s tensor formats and on the session; each module is imported by its own name."""
