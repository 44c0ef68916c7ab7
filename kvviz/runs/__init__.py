"""Policy runs: a policy compressing the cache as it runs, beside the full cache (docs/math.md §9)."""

from kvviz.runs.blame import Blame, blame, restore
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.schemes.kivi import Kivi
from kvviz.runs.policy_run import PolicyRun, TurnRun, run_policies, run_policy

__all__ = ["Blame", "CompressedSession", "Kivi", "PolicyRun", "RunSettings", "TurnRun", "blame", "restore",
           "run_policies", "run_policy"]
