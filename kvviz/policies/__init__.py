"""Eviction policies, one file each; :data:`POLICIES` maps a name to its class."""

from kvviz.policies.base import Policy, slots_kept
from kvviz.policies.h2o import H2O
from kvviz.policies.key_norm import KeyNorm
from kvviz.policies.random import RandomPolicy
from kvviz.policies.snapkv import SnapKV
from kvviz.policies.streaming_llm import StreamingLLM
from kvviz.policies.tova import TOVA

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (StreamingLLM, H2O, SnapKV, TOVA, KeyNorm, RandomPolicy)}

__all__ = ["H2O", "POLICIES", "TOVA", "KeyNorm", "Policy", "RandomPolicy", "SnapKV", "StreamingLLM", "slots_kept"]
