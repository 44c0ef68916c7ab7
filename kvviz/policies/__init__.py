"""Eviction policies, one file each; :data:`POLICIES` maps a name to its class."""

from kvviz.policies.ada_kv import AdaKV
from kvviz.policies.base import Candidates, Policy, slots_kept
from kvviz.policies.chunk_kv import ChunkKV
from kvviz.policies.critical_kv import CriticalKV
from kvviz.policies.cur import CUR
from kvviz.policies.expected_attention import ExpectedAttention
from kvviz.policies.h2o import H2O
from kvviz.policies.key_diff import KeyDiff
from kvviz.policies.key_norm import KeyNorm
from kvviz.policies.kv_zip import KVZip
from kvviz.policies.lag_kv import LagKV
from kvviz.policies.observed_attention import ObservedAttention
from kvviz.policies.pyramid_kv import PyramidKV
from kvviz.policies.r_kv import RKV
from kvviz.policies.random import RandomPolicy
from kvviz.policies.rocket_kv import RocketKV
from kvviz.policies.snapkv import SnapKV
from kvviz.policies.streaming_llm import StreamingLLM
from kvviz.policies.tova import TOVA

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (StreamingLLM, H2O, SnapKV, TOVA, PyramidKV, AdaKV, KeyNorm,
                                                         RandomPolicy, ObservedAttention, KeyDiff, LagKV, ChunkKV,
                                                         ExpectedAttention, CUR, CriticalKV, KVZip, RKV, RocketKV)}

__all__ = ["CUR", "H2O", "AdaKV", "Candidates", "ChunkKV", "CriticalKV", "ExpectedAttention", "KVZip", "KeyDiff", "KeyNorm", "LagKV",
           "ObservedAttention", "POLICIES", "Policy", "PyramidKV", "RKV", "RandomPolicy", "RocketKV", "SnapKV", "StreamingLLM", "TOVA",
           "slots_kept"]
