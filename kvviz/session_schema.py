"""What a session file may hold, checked in full before anything is replayed or saved.

A JSON Schema (checked with ``jsonschema``) built for the loaded model: types, token ids within the vocabulary,
layers / KV heads / query heads that exist, slots and totals within the context window, finite numbers, no unknown
fields (the edits themselves are then parsed by :meth:`Edit.from_dict`, still before anything is replayed). A refusal names the field (``$.turns[0].reply_ids[3]``) and what is wrong with it.
Parsing refuses text over :data:`MAX_BYTES` and nesting Python's parser cannot follow before the schema runs.
"""

from __future__ import annotations

import json
import math
from typing import Any

from jsonschema import Draft202012Validator

from kvviz.errors import KvvizError
from kvviz.geometry import Geometry

FORMAT, VERSION = "kvviz-session", 1
MAX_BYTES = 16 * 2**20  # the app's upload limit (.streamlit/config.toml: server.maxUploadSize)
MAX_TEXT = 2**20  # characters of one user message


def _refuse(message: str) -> KvvizError:
    return KvvizError(f"cannot import this session: {message}")


def parse(text: str | bytes) -> Any:
    """The JSON document in ``text``; refuses oversized text, bad UTF-8, bad JSON, non-finite numbers and deep
    nesting with one line each."""
    if len(text) > MAX_BYTES:
        raise _refuse(f"the file has {len(text):,} bytes, over the limit of {MAX_BYTES:,}")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise _refuse("it is nested too deeply to be a kvviz session") from None
    except UnicodeDecodeError as exc:
        raise _refuse(f"it is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise _refuse(f"it is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:  # NaN / Infinity, or an integer too long to convert
        raise _refuse(f"it is not valid JSON ({_short(str(exc))})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _integer(low: int, high: int) -> dict:
    return {"type": "integer", "minimum": low, "maximum": high}


def _list(items: dict, most: int) -> dict:
    # maxItems before items: a huge list is refused before its items are looked at
    return {"type": "array", "maxItems": most, "items": items}


def _object(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "additionalProperties": False, "required": list(required), "properties": properties}


def schema(lm: Geometry) -> dict:
    """The JSON Schema of a session document for a model of this shape."""
    window, vocab = lm.context_window, lm.vocab
    slot, token = _integer(0, window - 1), _integer(0, vocab - 1)
    number = {"type": "number"}
    optional_ints = lambda high: {"anyOf": [{"type": "null"}, _list(_integer(0, high - 1), high)]}  # noqa: E731
    quantizer = _object({"axis": {"enum": ["channel", "token", "head", "tensor"]}, "format": {"enum": ["int", "e4m3", "e5m2"]},
                         "group_size": {"anyOf": [{"type": "null"}, _integer(1, lm.head_dim)]},
                         "symmetric": {"type": "boolean"}, "rotation": {"enum": ["none", "hadamard"]},
                         "outliers": _integer(0, lm.head_dim - 1),
                         "block": {"anyOf": [{"type": "null"}, _integer(1, 1 << 20)]},
                         "scales": {"anyOf": [{"type": "null"}, _list(_list({"type": "number", "exclusiveMinimum": 0},
                                                                             lm.kv_heads), lm.layers)]},
                         "rope": {"anyOf": [{"type": "null"}, _list({"type": "number"}, lm.head_dim // 2)]}}, ("axis",))
    bits = {"type": "object", "maxProperties": window, "propertyNames": {"pattern": "^(0|[1-9][0-9]{0,5})$"},
            "additionalProperties": _integer(2, 16)}  # which widths exist: Edit.from_dict, before the replay
    edit = _object({
        "evict": _list(_object({"slots": _list(slot, window), "layers": optional_ints(lm.layers),
                                "heads": optional_ints(lm.kv_heads)}, ("slots",)), 4 * window),
        "key_bits": bits, "value_bits": bits, "keys": quantizer, "values": quantizer,
        "full_precision_window": _integer(0, window),
        "head_widths": {"anyOf": [{"type": "null"}, _list(_list(_integer(2, 16), lm.kv_heads), lm.layers)]},
        "prune": _list(_object({"layer": _integer(0, lm.layers - 1), "head": _integer(0, lm.kv_heads - 1),
                                "channels": _list(_integer(0, lm.head_dim - 1), lm.head_dim), "slots": _list(slot, window)},
                               ("layer", "head", "channels", "slots")), lm.layers * lm.kv_heads * 4),
        "merge": _list({"type": "array", "prefixItems": [_integer(0, lm.layers - 1), _integer(0, lm.kv_heads - 1), slot, slot,
                                                          {"type": "number", "minimum": 0}, _integer(0, window)],
                        "minItems": 5, "maxItems": 6}, lm.layers * lm.kv_heads * window),
        "merge_rule": {"enum": ["average", "add"]}})
    turn = _object({"user": {"type": "string", "maxLength": MAX_TEXT}, "prefill_ids": _list(token, window),
                    "reply_ids": _list(token, window), "shown": _integer(0, window), "raw": {"type": "boolean"}},
                   ("user", "prefill_ids", "reply_ids", "shown"))
    setting = {"anyOf": [number, {"type": "boolean"}, {"type": "string", "maxLength": 64}]}  # a policy's fields
    settings = {"type": "object", "maxProperties": 16, "additionalProperties": setting}
    return _object({
        "revision": _integer(0, 2**53), "format": {"const": FORMAT}, "version": {"const": VERSION},
        "model": {"type": "string", "maxLength": 4096}, "chat": {"type": "boolean"},
        "sampling": _object({"temperature": number, "top_p": number, "seed": _integer(0, 2**63 - 1)}),
        "turns": _list(turn, window),
        "commits": _list(_object({"at": _integer(0, window), "edit": edit}, ("at", "edit")), window),
        "view": _object({"layer": _integer(0, lm.layers - 1), "head": _integer(-1, lm.heads - 1),
                         "at": {"anyOf": [{"type": "null"}, slot]},
                         "prepared": _list(_object({"at": slot, "edit": edit,  # kept for the standalone page
                                                    "label": {"type": "string", "maxLength": 200}}, ("at", "edit")),
                                           32)}),
        "draft": _object({"edit": edit, "policy_name": {"type": "string", "maxLength": 64},
                          "policy_settings": settings}, ("edit",)),
    }, ("format", "version", "turns"))


def validate(lm: Geometry, document: Any) -> None:
    """Refuse ``document`` unless it is a session a model of this shape can replay: the schema first (the first problem found,
    by its path), then the totals — tokens within the context window, commits and the draft within the
    conversation, shown counts within each reply."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise _refuse("it is not a kvviz session file")
    if document.get("version") != VERSION or isinstance(document.get("version"), bool):
        raise _refuse(f"format version {_short(document.get('version'))} is not {VERSION}")
    problem = next(Draft202012Validator(schema(lm)).iter_errors(document), None)
    if problem is not None:
        while problem.context:  # "not valid under any of the given schemas": say what the closest one wanted
            problem = _closest(problem.context)
        raise _refuse(f"{problem.json_path}: {_reason(problem)}")
    turns = document["turns"]
    total = sum(len(t["prefill_ids"]) + len(t["reply_ids"]) for t in turns)
    if total > lm.context_window + len(turns):  # a turn's last reply token is chosen but not cached
        raise _refuse(f"its turns hold {total:,} tokens, more than the context window of {lm.context_window:,}")
    for index, turn in enumerate(turns):
        if turn["shown"] > len(turn["reply_ids"]):
            raise _refuse(f"$.turns[{index}].shown: {turn['shown']} is more than its {len(turn['reply_ids'])} reply "
                          "tokens")
        if not turn["prefill_ids"]:
            raise _refuse(f"$.turns[{index}].prefill_ids: a turn needs at least one token")
    commits = document.get("commits", [])
    if any(a["at"] > b["at"] for a, b in zip(commits, commits[1:])):
        raise _refuse("$.commits: commits must be in the order they were made")
    for name, value in document.get("sampling", {}).items():
        if not math.isfinite(value):
            raise _refuse(f"$.sampling.{name}: {value} is not a finite number")


def _closest(errors: list) -> Any:
    """Of the errors of an ``anyOf``'s branches, the one that says most: past a type check, deepest, last."""
    past_type = [e for e in errors if e.validator != "type"] or list(errors)
    return max(reversed(past_type), key=lambda e: len(e.absolute_path))


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _reason(error) -> str:
    """``jsonschema``'s message, with the offending value shortened (a huge list must not fill the page)."""
    if error.validator in ("maxItems", "maxProperties", "maxLength"):
        return f"longer than the limit of {error.validator_value:,}"
    if error.validator == "additionalProperties":
        return _short("has a field kvviz does not know (" + error.message.split("(")[-1])
    return error.message if len(error.message) <= 160 else f"{_short(error.instance)} is not allowed here"


def token_count(document: dict) -> int:
    """Tokens a validated document's turns hold (its prefills and replies): what replaying it caches, at most."""
    return sum(len(turn["prefill_ids"]) + len(turn["reply_ids"]) for turn in document["turns"])
