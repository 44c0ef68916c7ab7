"""A tiny model of a family through kvviz, beside the same weights with transformers' eager attention, and a chat on
it: what the tests of other architectures compare (:mod:`kvviz.tiny_models` builds the models)."""

from __future__ import annotations

import torch

from kvviz.model import LoadedModel
from kvviz.session import Session
from kvviz.tiny_models import tiny


def tiny_pair(kind: str, tokenizer, turns: list[str], new_tokens: int = 6, **overrides):
    """A tiny model of ``kind`` (its config changed by ``overrides``) through kvviz (a :class:`LoadedModel`), the same
    weights with transformers' eager attention, and a session that answered ``turns`` with ``new_tokens`` each."""
    ours, eager = tiny(kind, **overrides), tiny(kind, attention="eager", **overrides)
    eager.load_state_dict(ours.state_dict())
    lm = LoadedModel(model=ours.requires_grad_(False), tokenizer=tokenizer, name=f"tiny {kind}",
                     device=torch.device("cpu"))
    session = Session(lm)
    for text in turns:
        session.add_user_turn(text)
        session.generate(new_tokens)
    return lm, eager.requires_grad_(False), session
