"""Importing kvpress leaves transformers' attention functions as they were (no model)."""

from __future__ import annotations

from kvviz.policies.kvpress import own_code


def test_importing_kvpress_leaves_transformers_attention_as_it_was():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before = dict(ALL_ATTENTION_FUNCTIONS.items())
    own_code.kvpress()
    assert dict(ALL_ATTENTION_FUNCTIONS.items()) == before
