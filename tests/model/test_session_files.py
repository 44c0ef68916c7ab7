"""Crafted session files: every one is refused with one line naming what is wrong — before anything is replayed,
leaving the session that was there unchanged — and ``replay`` prints a good file's transcript."""

from __future__ import annotations

import json

import pytest

from kvviz.cli import main
from kvviz.edit.draft import EditDraft
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.session import Session
from kvviz.session_file import export_session, read_session
from tests.support.session_files import MARKUP, changed

REFUSED = {  # path, value, what the message must name
    "wrong format": ("format", "other", "not a kvviz session file"),
    "markdown version": ("version", MARKUP, "format version"),
    "version as text": ("version", "1", "format version"),
    "turns not a list": ("turns", {"a": 1}, "$.turns"),
    "user not text": ("turns.0.user", 42, "$.turns[0].user"),
    "negative reply id": ("turns.0.reply_ids.0", -1, "$.turns[0].reply_ids[0]"),
    "reply id past vocab": ("turns.1.reply_ids.3", 49152, "$.turns[1].reply_ids[3]"),
    "pending past vocab": ("turns.1.reply_ids.3", 10**12, "$.turns[1].reply_ids[3]"),
    "id as float": ("turns.0.prefill_ids.0", 1.5, "$.turns[0].prefill_ids[0]"),
    "id as text": ("turns.0.prefill_ids.0", "1", "$.turns[0].prefill_ids[0]"),
    "huge number": ("turns.0.prefill_ids.0", 10**300, "$.turns[0].prefill_ids[0]"),
    "100k reply tokens": ("turns.0.reply_ids", [5] * 100_000, "$.turns[0].reply_ids"),
    "shown past reply": ("turns.0.shown", 99, "$.turns[0].shown"),
    "view.at text": ("view.at", "zzz", "$.view.at"),
    "view layer": ("view.layer", 30, "$.view.layer"),
    "view head": ("view.head", 9, "$.view.head"),
    "eviction layer 1e6": ("commits.0.edit.evict.0.layers", [1_000_000], "$.commits[0].edit.evict[0].layers[0]"),
    "eviction KV head": ("commits.0.edit.evict.0.heads", [3], "$.commits[0].edit.evict[0].heads[0]"),
    "unknown bits": ("draft.edit.key_bits", {"5": 5}, "bit-width must be one of"),
    "bits key not a slot": ("draft.edit.key_bits", {"x": 4}, "$.draft.edit.key_bits"),
    "draft slot past the end": ("draft.edit.key_bits", {"900": 4}, "slots beyond the transcript"),
    "unknown field": ("view.extra", MARKUP, "a field kvviz does not know"),
    "group size": ("draft.edit.keys.group_size", 65, "$.draft.edit.keys.group_size"),
    "temperature out of range": ("sampling.temperature", 99.0, "temperature must be between 0 and 10"),
    "commit past the end": ("commits.0.at", 5000, "a committed edit lies beyond the conversation"),
    "nested deep": ("view", "DEEP", "nested too deeply"),
    "policy name markup too long": ("draft.policy_name", MARKUP * 3, "$.draft.policy_name"),
}


def text_of(document: dict, name: str) -> str:
    text = json.dumps(document)
    if name == "nested deep":
        text = text.replace('"DEEP"', "[" * 100_000 + "]" * 100_000)
    return text


@pytest.mark.parametrize("name", REFUSED)
def test_crafted_files_are_refused_naming_the_field_and_change_nothing(lm, valid_session_file, name):
    path, value, expected = REFUSED[name]
    keeper = Session(lm)
    keeper.add_user_turn("This session is open while the file is imported.")
    before = json.dumps(export_session(keeper, EditDraft()))
    with pytest.raises(KvvizError) as refused:
        read_session(lm, text_of(changed(valid_session_file, path, value), name))
    message = str(refused.value)
    assert expected in message and "\n" not in message and len(message) < 400, message
    assert json.dumps(export_session(keeper, EditDraft())) == before


@pytest.mark.parametrize("text", ["", "{", "NaN", '{"format": "kvviz-session", "version": 1, "turns": [], "x": NaN}',
                                  b"\xff\xfe", "[" * 100_000])
def test_text_that_is_not_a_session_is_refused_in_one_line(lm, text):
    with pytest.raises(KvvizError, match="cannot import this session"):
        read_session(lm, text)


def test_oversized_text_is_refused_before_parsing(lm):
    with pytest.raises(KvvizError, match="over the limit"):
        read_session(lm, " " * (16 * 2**20 + 1))


def test_replay_prints_the_transcript_and_refuses_before_loading_the_model(valid_session_file, tmp_path, capsys,
                                                                           monkeypatch):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(valid_session_file))
    assert main(["replay", str(good), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [t["user"] for t in document["turns"]] == ["My name is Ada.", "What is my name?"]
    assert document["cache_length"] == len(document["tokens"])
    import kvviz.model

    monkeypatch.setattr(kvviz.model, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(changed(valid_session_file, "turns.0.reply_ids.0", -1)))
    assert main(["replay", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot import this session: $.turns[0].reply_ids[0]") and "\n" not in err
    assert main(["replay", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_a_replay_reports_progress_and_stops_when_asked(lm, valid_session_file):
    """``progress(done, total)`` after each forward pass, rising to the total; an exception from it (the page's
    Stop) abandons the replay, and nothing but the abandoned session was touched."""
    seen = []
    session, _, _ = read_session(lm, json.dumps(valid_session_file), lambda done, total: seen.append((done, total)))
    assert seen == sorted(seen) and seen[-1] == (len(session), len(session)) and len(seen) > 3

    class Stopped(Exception):
        pass

    def stop(done: int, total: int) -> None:
        if done > 20:
            raise Stopped

    with pytest.raises(Stopped):
        read_session(lm, json.dumps(valid_session_file), stop)


def test_a_draft_from_a_policy_with_text_and_flag_settings_saves_and_loads(lm):
    """SnapKV's pooling / window_kept (text) and TOVA's keep_last (a flag) travel in the draft's policy settings."""
    from kvviz.policies import SnapKV, TOVA

    session = Session(lm)
    session.add_user_turn("The harbour log: the Aurora at dawn, the Bellwether at noon. Which ship came at noon?")
    for policy in (SnapKV(window=8, pooling="avg", window_kept="all"), TOVA(keep_last=True)):
        draft = EditDraft.from_edit(policy.edit(session, 0.5), policy.name, policy.settings())
        _, restored, _ = read_session(lm, json.dumps(export_session(session, draft)))
        assert restored.policy_name == policy.name and restored.policy_settings == policy.settings()
        assert restored.edit().to_dict() == draft.edit().to_dict()


def test_a_merge_commit_under_a_later_commit_survives_export_and_import_once(lm):
    """Commits are stored cumulative; the import commits what each one adds. Committing the recorded edit whole put
    the first commit's merges in a second time (values folded twice: logits off by ~2e-4) and grew the file at every
    save and load. Export → import → export must give the same commits and the same logits, bit for bit."""
    from kvviz.policies.reshaping import merge_evicted

    session = Session(lm)
    session.add_user_turn("My dog is called Rex and my cat is called Tom. What is my dog called?")
    at = len(session) - 1
    session.commit(merge_evicted(session, Edit.evict(range(10, 16), layers=range(0, 30, 5)), at))
    session.generate(2)
    session.commit(Edit.evict([20, 21]))
    session.generate(2)
    text = json.dumps(export_session(session))
    restored, _, _ = read_session(lm, text)
    assert restored.commits.stack == session.commits.stack  # the same cumulative edits, merges once
    assert bool((restored.logits == session.logits).all())
    assert json.dumps(export_session(restored)) == text  # a second save and load changes nothing
    document = json.loads(text)
    document["commits"][1]["edit"]["merge"] = document["commits"][1]["edit"]["merge"][1:]  # not the one before + more
    with pytest.raises(KvvizError, match="does not extend the one before it"):
        read_session(lm, json.dumps(document))
