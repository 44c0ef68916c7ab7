"""Hostile files and values, third round (issue #61), on the bundled model: a press file that calls ``sys.exit`` or
keeps nothing is refused in one line (exit 2), never a silent success; the library refuses what the command line
refuses (a negative reply length, a top-k past the vocabulary) and changes nothing; the notebook widget shows a
malformed request in ``w.error``; prompts longer than the context are named as such. The crafted press files are in
``tests/model/hostile/``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvviz import Edit, what_if
from kvviz.errors import KvvizError
from kvviz.notebook import widget
from kvviz.sweeps.cases import refuse_too_long
from kvviz.sweeps.prompts import Prompt
from tests.support.cli import cli

HOSTILE = Path(__file__).parent / "hostile"
PROMPT = "My name is Ada and I live in Lisbon. Where do I live?"


@pytest.mark.parametrize("press, words", [
    ("exits_on_import.py:QuietPress", r"--press-file: cannot import .*exits_on_import.py \(it called sys.exit\(0\)\)"),
    ("exits_in_score.py:ExitingPress", r"kvpress' ExitingPress failed in layer 0: it called sys.exit\(0\)"),
    ("keeps_nothing.py:EmptyingPress", r"kvpress' EmptyingPress kept no slot of \d+ in layer 0, KV head 0"),
])
def test_a_press_that_exits_or_keeps_nothing_is_refused(press, words):
    """``SystemExit`` is not an ``Exception``: ``sys.exit(0)`` in a press file ended policy-run with exit 0 and no
    output; a press that kept nothing ran on with each head's top slot."""
    done = cli("policy-run", "--turn", PROMPT, "--max-new-tokens", "2", "--press-file", str(HOSTILE / press),
               "--ratio", "0.5")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == "" and done.stderr.count("\n") == 1 and re.search(words, done.stderr), done.stderr


def test_a_negative_reply_length_is_refused_before_the_turn(make_chat):
    session = make_chat(PROMPT, generate=4)
    before = (len(session), list(session.transcript.ids), session.reply)
    with pytest.raises(KvvizError, match="max_new_tokens must be at least 1, got -1"):
        session.stream(-1)
    w = widget(session)
    with pytest.raises(KvvizError, match="max_new_tokens must be at least 1, got -1"):
        w.turn("And where does Ada work?", max_new_tokens=-1)
    assert "max_new_tokens must be at least 1" in w.error
    assert (len(session), list(session.transcript.ids), session.reply) == before  # the turn was not prefilled


def test_a_top_k_past_the_table_is_refused(make_chat, lm):
    session = make_chat(PROMPT, generate=4)
    """``topk=10**9`` crashed in torch ("selected index k out of range"); the whole vocabulary (49,152) asked for
    38 GB of pairwise rank comparisons."""
    for topk, words in ((10**9, r"in \[1, 1024\]"), (lm.config.vocab_size, r"in \[1, 1024\]"),
                        (0, r"in \[1, 1024\]"), (True, "an integer, got True"), (2.5, "an integer, got 2.5")):
        with pytest.raises(KvvizError, match=f"top-k must be {words}"):
            what_if(session, Edit.evict([3]), topk=topk)
    assert len(what_if(session, Edit.evict([3]), topk=1024).next_token.full) == 1024


@pytest.mark.parametrize("request_", [{"kind": "evict"}, {"kind": "evict", "slot": "abc"},
                                      {"kind": "select", "slot": [1]}, {"kind": "bits", "bits": None},
                                      {"kind": "evict", "slot": 10**30}, {"kind": "evict", "slot": 2.5}])
def test_a_malformed_widget_request_is_shown_not_raised(make_chat, request_):
    session = make_chat(PROMPT, generate=4)
    w = widget(session)
    w.set_state({"request": {**request_, "n": 1}})  # what the front end (or any code) sends
    assert w.error.startswith("the request's ") and w.edit == Edit()


def test_prompts_longer_than_the_context_are_named_as_such(lm):
    """A 15 MB upload was refused as "the server's memory budget … needs 214,350 MiB more"."""
    long = Prompt("long-one", ("hello " * (lm.context_window + 10),))
    with pytest.raises(KvvizError, match=r"prompt 'long-one' is longer than the model's context: its turns and "
                                         rf"replies need at least [\d,]+ tokens of {lm.context_window:,}"):
        refuse_too_long(lm, [Prompt("short", ("hi",)), long], 32)
    refuse_too_long(lm, [Prompt("short", ("hi",))], 32)
