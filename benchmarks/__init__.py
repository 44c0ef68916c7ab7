"""kvviz's benchmark: ratios against plain transformers, measured in one run (``python -m benchmarks``)."""
