"""Session files are bounded in work as in bytes (#46): counts that make an import expensive are refused before the
schema looks at the file, the schema's loops over lists of numbers say what jsonschema would say, and numbers used in
float32 (merge weights, static FP8 scales) must fit it — while a real session with merges and calibrated scales still
imports as it was."""

from __future__ import annotations

import copy
import json
import math

import pytest
from jsonschema import Draft202012Validator

from kvviz import session_schema
from kvviz.edit import parts as edit_parts
from kvviz.schemes.calibration import calibrate
from kvviz.cli import main
from kvviz.edit.draft import EditDraft
from kvviz.edit.parts import Merge
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.policies.reshaping import merge_evicted
from kvviz.session_file import export_session, import_session, read_session
from kvviz.session_schema import MAX_COMMITS, MAX_MERGES, MAX_OBJECTS, MAX_VALUES, schema, validate

PROMPT = "My cat is called Whiskers and my dog is called Rex. The cat sleeps on the red sofa. What is my cat called?"


def document(commits: list | None = None, draft: dict | None = None, turns: list | None = None) -> dict:
    """A session file of one short turn (ids need not be this model's: nothing here is replayed)."""
    result = {"format": "kvviz-session", "version": 1, "model": "x", "chat": False,
              "turns": turns or [{"user": "hi", "prefill_ids": list(range(1, 30)), "reply_ids": [5, 6], "shown": 2}],
              "commits": commits or []}
    return result | ({"draft": draft} if draft is not None else {})


def edit(**fields) -> dict:
    return {"evict": [], "key_bits": {}, "value_bits": {}, "keys": {"axis": "channel"}, "values": {"axis": "token"},
            "full_precision_window": 0} | fields


def one_line(refused: pytest.ExceptionInfo) -> str:
    message = str(refused.value)
    assert message.startswith("cannot import this session: ") and "\n" not in message and len(message) < 400, message
    return message


@pytest.fixture
def no_schema(monkeypatch):
    """The schema pass fails the test: a refusal must come before it."""
    monkeypatch.setattr(session_schema, "schema", lambda lm: pytest.fail("the schema pass ran"))


def test_the_reported_file_of_737280_merges_is_refused_by_its_count_before_the_schema(lm, no_schema):
    """The report's file: a merge per (layer, KV head, slot) of the context, 14 MB under the 16 MB limit, took 27 s of
    CPU in the schema (100 s as reported) before it was accepted. Now its count refuses it, before the schema."""
    g = lm.geometry
    rows = [[layer, head, slot, (slot + 1) % g.context_window, 0.5] for layer in range(g.layers)
            for head in range(g.kv_heads) for slot in range(g.context_window)]
    assert len(rows) == 737_280
    text = json.dumps(document([{"at": 10, "edit": edit(merge=rows)}]), separators=(",", ":"))
    assert len(text) < session_schema.MAX_BYTES
    with pytest.raises(KvvizError) as refused:
        read_session(lm, text)
    assert f"more than {MAX_MERGES:,} merges" in one_line(refused)


@pytest.mark.parametrize("name", ["values", "objects", "commits", "merges in all"])
def test_each_count_limit_refuses_before_the_schema_naming_the_limit(lm, no_schema, name):
    small = edit(evict=[{"slots": [3]}])
    documents = {  # each just over one limit, and within the others
        "values": (document(turns=[{"user": "hi", "prefill_ids": [1] * MAX_VALUES, "reply_ids": [], "shown": 0}]),
                   f"more than {MAX_VALUES:,} values"),
        "objects": (document(draft={"edit": edit(evict=[{"slots": [3]}] * MAX_OBJECTS)}),
                    f"more than {MAX_OBJECTS:,} objects"),
        "commits": (document([{"at": 5, "edit": small}] * (MAX_COMMITS + 1)), f"limit of {MAX_COMMITS:,}"),
        # merges spread over several edits: the limit is on all of them together
        "merges in all": (document([{"at": 20, "edit": edit(merge=[[0, 0, 1, 2, 0.5]] * (MAX_MERGES // 4 + 1))}] * 4),
                          f"more than {MAX_MERGES:,} merges"),
    }
    bad, words = documents[name]
    with pytest.raises(KvvizError) as refused:
        validate(lm.geometry, bad)
    assert words in one_line(refused)


def unwrapped(node):
    """The schema as jsonschema alone would check it (each ``kvvizFast`` wrapper replaced by what it wraps)."""
    if isinstance(node, dict):
        if set(node) == {"kvvizFast"}:
            return unwrapped(node["kvvizFast"])
        return {key: unwrapped(value) for key, value in node.items()}
    return [unwrapped(value) for value in node] if isinstance(node, list) else node


BROKEN = {  # a path in a document with one commit (merges, evictions, bits) and a draft with static scales; a value
    "slot past the window": ("commits.0.edit.evict.1.slots.2", 8192),
    "slot as float": ("commits.0.edit.evict.1.slots.0", 2.5),
    "integral float slot": ("commits.0.edit.evict.1.slots.0", 2.0),  # an integer to jsonschema: accepted by both
    "slot as bool": ("commits.0.edit.evict.1.slots.0", True),
    "scope layer": ("commits.0.edit.evict.0.layers.0", 30),
    "token past the vocabulary": ("turns.0.prefill_ids.7", 49152),
    "merge layer": ("commits.0.edit.merge.3.0", 30),
    "merge row too short": ("commits.0.edit.merge.2", [0, 0, 1]),
    "merge row too long": ("commits.0.edit.merge.2", [0, 0, 1, 2, 0.5, 0, 9]),
    "merge weight as text": ("commits.0.edit.merge.1.4", "0.5"),
    "merge weight NaN": ("commits.0.edit.merge.1.4", float("nan")),  # jsonschema's bounds let NaN pass; Merge not
    "merge weight 1e39": ("commits.0.edit.merge.1.4", 1e39),
    "merge weight negative": ("commits.0.edit.merge.1.4", -0.5),
    "merge round": ("commits.0.edit.merge.0", [0, 0, 1, 2, 0.5, 8193]),
    "bits key": ("commits.0.edit.key_bits", {"4": 4, "x": 4}),
    "bits key with a newline": ("commits.0.edit.key_bits", {"4\n": 4}),  # Python's "$" matches before it: accepted
    "bits width": ("commits.0.edit.value_bits", {"4": 17}),
    "static scale 1e308": ("draft.edit.keys.scales.2.1", 1e308),
    "static scale 0": ("draft.edit.keys.scales.0.0", 0.0),
    "channel": ("commits.0.edit.prune.0.channels.1", 64),
}


@pytest.mark.parametrize("name", BROKEN)
def test_the_schemas_loops_say_what_jsonschema_says(lm, name):
    """The first problem (its path and message) found with the loops over lists of numbers is jsonschema's own."""
    scales = [[0.01 * (1 + head)] * lm.kv_heads for head in range(lm.layers)]
    good = document([{"at": 20, "edit": edit(
        evict=[{"slots": [3], "layers": [2], "heads": [1]}, {"slots": [4, 5, 6]}], key_bits={"7": 4},
        value_bits={"7": 2}, prune=[{"layer": 0, "head": 1, "channels": [3, 4], "slots": [1, 2]}],
        merge=[[0, 0, 8, 9, 0.5], [1, 2, 10, 11, 0.25], [2, 1, 12, 13, 1.0], [29, 2, 14, 15, 0.0, 1]])}],
        draft={"edit": edit(keys={"axis": "head", "format": "e4m3", "scales": scales})})
    assert next(session_schema._Validator(schema(lm.geometry)).iter_errors(good), None) is None
    path, value = BROKEN[name]
    bad = copy.deepcopy(good)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    target = bad
    for part in parents:
        target = target[part]
    target[last] = value
    fast = next(session_schema._Validator(schema(lm.geometry)).iter_errors(bad), None)
    plain = next(Draft202012Validator(unwrapped(schema(lm.geometry))).iter_errors(bad), None)
    assert (fast is None) == (plain is None)
    if plain is not None:
        assert (fast.json_path, fast.message) == (plain.json_path, plain.message)


@pytest.mark.parametrize("weight", [1e39, 1e308, math.nextafter(1e6, math.inf)])
def test_merge_weights_beyond_float32s_use_are_refused_in_one_line(lm, weight):
    """1e39 and 1e308 are finite doubles but no float32: they passed as "finite", and export-page wrote a page whose
    data was not JSON. Refused by the schema, naming the field and the range."""
    bad = document([{"at": 20, "edit": edit(merge=[[0, 0, 8, 9, 0.5], [3, 1, 10, 11, weight]])}])
    with pytest.raises(KvvizError) as refused:
        read_session(lm, json.dumps(bad))
    message = one_line(refused)
    assert "$.commits[0].edit.merge[1][4]" in message and "a merge weight is in [0, 1e+06]" in message


def test_a_nan_merge_weight_is_refused_naming_the_range(lm):
    """JSON cannot carry NaN (parse refuses it); a document built in Python can, and jsonschema's bounds let it pass:
    the Merge refuses it, saying which numbers it takes."""
    with pytest.raises(KvvizError, match="cannot import this session: it is not valid JSON"):
        read_session(lm, json.dumps(document([{"at": 20, "edit": edit(merge=[[0, 0, 8, 9, float("nan")]])}])))
    with pytest.raises(KvvizError) as refused:
        import_session(lm, document([{"at": 20, "edit": edit(merge=[[0, 0, 8, 9, float("nan")]])}]))
    message = str(refused.value)
    assert "weight must be a finite non-negative number of at most 1e+06" in message and "nan" in message
    assert "\n" not in message


def test_a_static_fp8_scale_of_1e308_is_refused_in_one_line(lm):
    scales = [[1.0] * lm.kv_heads for _ in range(lm.layers)]
    scales[4][2] = 1e308  # float32 holds no such number: its scale × max(e4m3) was inf, the quantized keys NaN
    bad = document(draft={"edit": edit(key_bits={"3": 8}, keys={"axis": "head", "format": "e4m3", "scales": scales})})
    with pytest.raises(KvvizError) as refused:
        read_session(lm, json.dumps(bad))
    message = one_line(refused)
    assert "$.draft.edit.keys.scales[4][2]" in message and "a static FP8 scale is in [2^-126, 1e+30]" in message


def test_export_page_refuses_a_float32_overflow_before_loading_the_model(lm, tmp_path, capsys, monkeypatch):
    """The report: ``export-page`` of a file with a merge weight of 1e39 exited 0 and wrote a page that did not open."""
    import kvviz.model

    monkeypatch.setattr(kvviz.model, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    source, page = tmp_path / "weights.json", tmp_path / "page.html"
    source.write_text(json.dumps(document([{"at": 20, "edit": edit(merge=[[0, 0, 8, 9, 1e39]])}])))
    assert main(["export-page", str(source), "--out", str(page)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot import this session: $.commits[0].edit.merge[0][4]") and "\n" not in err
    assert not page.exists()


def test_a_real_session_with_merges_and_calibrated_scales_still_imports(make_chat, lm):
    """A policy's merges committed (MergingPress' weights, within [0, 1]) and a draft quantized to FP8 with calibrated
    static scales: the file passes the new limits and imports to the same session. The schema and Merge take the
    same weights: the largest one, and not the next double."""
    assert session_schema.MAX_MERGE_WEIGHT == edit_parts.MAX_MERGE_WEIGHT
    session = make_chat(PROMPT)
    at = len(session) - 1
    merged = merge_evicted(session, Edit.evict(range(10, 20), layers=range(0, 30, 3)), at)
    assert len(merged.merges) > 50 and all(0 < m.weight <= 1 for m in merged.merges)
    session.commit(merged)
    session.generate(2)
    keys, values = calibrate(lm).quantizers("e4m3", "head")
    largest = Merge(2, 1, 5, 6, edit_parts.MAX_MERGE_WEIGHT)
    draft = EditDraft.from_edit(Edit(key_bits={4: 8, 5: 8}, value_bits={4: 8}, keys=keys, values=values,
                                     merges=(largest,)))
    text = json.dumps(export_session(session, draft))
    restored, restored_draft, _ = read_session(lm, text)
    assert restored.commits.stack == session.commits.stack
    assert restored_draft.edit() == draft.edit()
    assert restored.transcript.ids == session.transcript.ids and bool((restored.logits == session.logits).all())
    beyond = math.nextafter(edit_parts.MAX_MERGE_WEIGHT, math.inf)
    with pytest.raises(KvvizError, match="at most 1e\\+06"):
        Merge(2, 1, 5, 6, beyond)
    with pytest.raises(KvvizError, match="a merge weight is in"):
        read_session(lm, text.replace(f"{edit_parts.MAX_MERGE_WEIGHT!r}]", f"{beyond!r}]"))
