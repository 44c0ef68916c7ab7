"""The command line's help names every built-in policy (no model loaded)."""

from __future__ import annotations


def test_whatif_help_names_every_built_in_policy():
    from kvviz.cli import build_parser
    from kvviz.policies import POLICIES

    whatif = build_parser()._subparsers._group_actions[0].choices["whatif"]
    help_text = next(a.help for a in whatif._actions if "--policy" in a.option_strings)
    assert [name for name in POLICIES if name not in help_text] == []
