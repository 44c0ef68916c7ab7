"""kvviz: see and edit the KV cache of a real language model.

The library never imports streamlit; ``app/`` lays out what it computes.
"""
