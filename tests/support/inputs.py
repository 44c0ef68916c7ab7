"""Inputs several tests share: a user policy's file, a follow-up conversation."""

from __future__ import annotations

USER_POLICY = '''
from dataclasses import dataclass
import torch
from kvviz.policies import Policy


@dataclass(frozen=True)
class Newest(Policy):
    name = "newest"
    bonus: float = 1.0

    def score(self, candidates):
        return torch.arange(candidates.at, dtype=torch.float32)[None, None] * self.bonus


@dataclass(frozen=True)
class WrongShape(Policy):
    name = "wrong_shape"

    def score(self, candidates):
        return torch.zeros(5)


@dataclass(frozen=True)
class Raises(Policy):
    name = "raises"

    def score(self, candidates):
        raise RuntimeError("boom")
'''


FOLLOW_UP = ["My dog is called Rex. Is the sky blue? Answer yes or no.", "What is my dog called?"]
