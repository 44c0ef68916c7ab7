"""Policy runs: a policy compressing the cache as it runs, beside the full cache (docs/math.md §9)."""

from kvviz.runs.blame import Blame, blame, restore
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.runs.from_names import from_names
from kvviz.runs.policy_run import PolicyRun, TurnRun, run_policies, run_policy
from kvviz.schemes.kivi import Kivi

__all__ = ["Blame", "CompressedSession", "Kivi", "PolicyRun", "RunSettings", "TurnRun", "blame", "from_names",
           "restore", "run_policies", "run_policy"]
