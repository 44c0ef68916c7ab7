"""What a session file may hold, checked in full before anything is replayed or saved.

A JSON Schema (checked with ``jsonschema``) built for the loaded model: types, token ids within the vocabulary,
layers / KV heads / query heads that exist, slots and totals within the context window, finite numbers (merge
weights and static FP8 scales within ranges float32 holds), no unknown fields (the edits themselves are then parsed by
:meth:`Edit.from_dict`, still before anything is replayed). A refusal names the field (``$.turns[0].reply_ids[3]``)
and what is wrong with it.

Parsing refuses text over :data:`MAX_BYTES` and nesting Python's parser cannot follow before the schema runs. The
work is bounded too: before the schema, one walk over the containers refuses more than :data:`MAX_VALUES` values,
:data:`MAX_OBJECTS` objects, :data:`MAX_COMMITS` commits or :data:`MAX_MERGES` merges; and lists of numbers (slots,
token ids, merge rows) and bit tables are checked column by column with builtins (``kvvizFast``) — jsonschema itself
(~6 µs a number) looks only at one they do not accept, and says what it would have said anyway. A 14 MB file of
737,280 merges took 27 s of CPU in the schema before it was accepted; it is now refused by its count.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.validators import extend

from kvviz.errors import KvvizError
from kvviz.geometry import Geometry

FORMAT, VERSION = "kvviz-session", 1
MAX_BYTES = 16 * 2**20  # the app's upload limit (.streamlit/config.toml: server.maxUploadSize)
MAX_TEXT = 2**20  # characters of one user message
# What a file may hold in all, counted before the schema looks at it, and what each costs. A value is one list entry
# or object field (their checks and Edit.from_dict take ~0.1-0.3 µs each); jsonschema walks each object
# (~15 µs); Edit.from_dict builds a Merge per merge (~2 µs) and the replay checks each at every commit.
MAX_VALUES = 2**20  # 1,048,576: e.g. 64 commits each quantizing all 8,192 slots (16,384 entries each)
MAX_OBJECTS = 2**14  # 16,384 JSON objects: turns, commits, edits, their evictions and prunings
MAX_COMMITS = 256  # each a click on "Commit"; the replay checks and applies each (Edit.validate: 5-40 ms at 8k slots)
MAX_MERGES = 2**17  # 131,072 merges in all edits: "Merge the evicted slots" makes one per (layer, KV head) a slot is
#                     evicted in: 1,456 slots evicted everywhere in SmolLM2-135M (a sixth of its 8k context); a merge
#                     per (layer, KV head, slot) of the whole context would be 737,280
MAX_MERGE_WEIGHT = 1e6  # = kvviz.edit.parts.MAX_MERGE_WEIGHT (Merge's own bound; not imported: this module stays free
#                         of torch, so the command line refuses a file before torch's 2 s import; a test checks both)
STATIC_SCALES = (2.0**-126, 1e30)  # float32's smallest normal (the calibration's floor) to 1e30: scale × the FP8
#                                    format's largest value stays finite in float32
ROPE_MAX = 1e6  # RoPE frequencies are the model's own (≤ 1); a larger bound only keeps float32 angles finite


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
    return _fast({"type": "array", "maxItems": most, "items": items})


def _fast(schema: dict) -> dict:
    """``schema``, checked first by :func:`_all_valid`'s loops where its shape allows (lists of numbers, rows of them,
    bit tables); jsonschema looks at an instance only where they do not accept it, and says what it would have said."""
    return {"kvvizFast": schema} if _plain(schema) else schema


_NUMBER_KEYS = {"type", "minimum", "maximum", "exclusiveMinimum", "description"}


def _plain(schema: dict) -> bool:
    """Whether :func:`_all_valid` can check instances of ``schema``: numbers within bounds, arrays / objects of them."""
    kind, keys = schema.get("type"), set(schema)
    if kind in ("integer", "number"):
        return keys <= _NUMBER_KEYS
    if kind == "array":
        parts = [*schema.get("prefixItems", []), *([schema["items"]] if "items" in schema else [])]
        return keys <= {"type", "minItems", "maxItems", "prefixItems", "items"} and all(map(_plain, parts))
    if kind == "object":
        return keys == {"type", "maxProperties", "propertyNames", "additionalProperties"} \
            and set(schema["propertyNames"]) == {"pattern"} and _plain(schema["additionalProperties"])
    return False


def _all_valid(schema: dict, values: list) -> bool:
    """Whether every one of ``values`` is valid under ``schema`` (a :func:`_plain` one), column by column: one pass of
    builtins over a column of numbers rather than jsonschema's ~6 µs per number. The same rules as jsonschema's
    Draft 2020-12 (an integer may be a float with an integral value; bool is no number), so False means that
    jsonschema finds a problem."""
    kind = schema["type"]
    if kind in ("integer", "number"):
        types = set(map(type, values))
        if not types <= {int, float}:
            return False
        if float in types:
            floats = [v for v in values if type(v) is float]
            if any(map(math.isnan, floats)) or kind == "integer" and not all(map(float.is_integer, floats)):
                return False  # NaN: jsonschema lets it pass any bounds
        return not values or _within(schema, min(values)) and _within(schema, max(values))  # they decide
    if kind == "array":
        if not set(map(type, values)) <= {list}:
            return False
        lengths = set(map(len, values))
        if lengths and not schema.get("minItems", 0) <= min(lengths) <= max(lengths) <= schema.get("maxItems", 2**63):
            return False
        prefix = schema.get("prefixItems", [])
        for index, item in enumerate(prefix):
            column = list(map(itemgetter(index), values)) if min(lengths, default=0) > index else \
                [row[index] for row in values if len(row) > index]
            if not _all_valid(item, column):
                return False
        rest = [v for row in values for v in row[len(prefix):]] if prefix else [v for row in values for v in row]
        return "items" not in schema or _all_valid(schema["items"], rest)
    if not set(map(type, values)) <= {dict} or any(len(table) > schema["maxProperties"] for table in values):
        return False
    search = re.compile(schema["propertyNames"]["pattern"]).search  # what jsonschema's "pattern" does
    names = [name for table in values for name in table]
    return set(map(type, names)) <= {str} and all(map(search, names)) \
        and _all_valid(schema["additionalProperties"], [v for table in values for v in table.values()])


def _within(schema: dict, value: int | float) -> bool:
    return ("minimum" not in schema or value >= schema["minimum"]) \
        and ("maximum" not in schema or value <= schema["maximum"]) \
        and ("exclusiveMinimum" not in schema or value > schema["exclusiveMinimum"])


def _fast_keyword(validator, schema: dict, instance: Any, _parent: dict):
    """The ``kvvizFast`` keyword: ``schema`` for jsonschema, after :func:`_all_valid` did not accept ``instance``."""
    if not _all_valid(schema, [instance]):
        yield from validator.descend(instance, schema)


_Validator = extend(Draft202012Validator, {"kvvizFast": _fast_keyword})


def _object(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "additionalProperties": False, "required": list(required), "properties": properties}


def schema(lm: Geometry) -> dict:
    """The JSON Schema of a session document for a model of this shape."""
    window, vocab = lm.context_window, lm.vocab
    slot, token = _integer(0, window - 1), _integer(0, vocab - 1)
    number = {"type": "number"}
    scale = {"type": "number", "minimum": STATIC_SCALES[0], "maximum": STATIC_SCALES[1],
             "description": f"a static FP8 scale is in [2^-126, {STATIC_SCALES[1]:g}]: float32 must hold it and "
                            "its product with the format's largest value"}
    weight = {"type": "number", "minimum": 0, "maximum": MAX_MERGE_WEIGHT,
              "description": f"a merge weight is in [0, {MAX_MERGE_WEIGHT:g}]: the merged values must stay finite "
                             "in float32"}
    optional_ints = lambda high: {"anyOf": [{"type": "null"}, _list(_integer(0, high - 1), high)]}  # noqa: E731
    quantizer = _object({"axis": {"enum": ["channel", "token", "head", "tensor"]},
                         "format": {"enum": ["int", "e4m3", "e5m2", "nvfp4", "nvfp4-4over6", "mxfp4"]},
                         "fp32_scales": {"type": "boolean"},
                         "group_size": {"anyOf": [{"type": "null"}, _integer(1, lm.head_dim)]},
                         "symmetric": {"type": "boolean"}, "rotation": {"enum": ["none", "hadamard"]},
                         "outliers": _integer(0, lm.head_dim - 1),
                         "block": {"anyOf": [{"type": "null"}, _integer(1, 1 << 20)]},
                         "scales": {"anyOf": [{"type": "null"}, _list(_list(scale, lm.kv_heads), lm.layers)]},
                         "rope": {"anyOf": [{"type": "null"}, _list({"type": "number", "exclusiveMinimum": 0,
                                                                     "maximum": ROPE_MAX}, lm.head_dim // 2)]},
                         "no_rope": _list(_integer(0, lm.layers - 1), lm.layers)},
                        ("axis",))
    bits = _fast({"type": "object", "maxProperties": window, "propertyNames": {"pattern": "^(0|[1-9][0-9]{0,5})$"},
                  "additionalProperties": _integer(2, 16)})  # which widths exist: Edit.from_dict, before the replay
    edit = _object({
        "evict": _list(_object({"slots": _list(slot, window), "layers": optional_ints(lm.layers),
                                "heads": optional_ints(lm.kv_heads)}, ("slots",)), 4 * window),
        "key_bits": bits, "value_bits": bits, "keys": quantizer, "values": quantizer,
        "full_precision_window": _integer(0, window),
        "head_widths": {"anyOf": [{"type": "null"}, _list(_list(_integer(2, 16), lm.kv_heads), lm.layers)]},
        "exact_layers": _list(_integer(0, lm.layers - 1), lm.layers),
        "prune": _list(_object({"layer": _integer(0, lm.layers - 1), "head": _integer(0, lm.kv_heads - 1),
                                "channels": _list(_integer(0, lm.head_dim - 1), lm.head_dim), "slots": _list(slot, window)},
                               ("layer", "head", "channels", "slots")), lm.layers * lm.kv_heads * 4),
        "merge": _list({"type": "array", "prefixItems": [_integer(0, lm.layers - 1), _integer(0, lm.kv_heads - 1), slot, slot,
                                                          weight, _integer(0, window)],
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
    _check_counts(document)  # before the schema: what its walk (and the replay) would take is bounded first
    problem = next(_Validator(schema(lm)).iter_errors(document), None)
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


def _check_counts(document: dict) -> None:
    """Refuse a document holding more than :data:`MAX_VALUES` values, :data:`MAX_OBJECTS` objects, :data:`MAX_COMMITS`
    commits or :data:`MAX_MERGES` merges. One walk over its containers, each counted by its length before its entries
    are looked at: the walk stops within the limits, however the file is built (no schema has looked at it yet)."""
    commits = document.get("commits")
    if type(commits) is list and len(commits) > MAX_COMMITS:
        raise _refuse(f"it holds {len(commits):,} commits, more than the limit of {MAX_COMMITS:,}")
    values = objects = merges = 0
    too_many = _refuse(f"it holds more than {MAX_VALUES:,} values (list entries and object fields), the limit of a "
                       "session file")
    pending = [document]
    while pending:
        node = pending.pop()
        values += len(node)
        if values > MAX_VALUES:
            raise too_many
        if type(node) is dict:
            objects += 1
            if objects > MAX_OBJECTS:
                raise _refuse(f"it holds more than {MAX_OBJECTS:,} objects, the limit of a session file")
            rows = node.get("merge")
            merges += len(rows) if type(rows) is list else 0
            if merges > MAX_MERGES:
                raise _refuse(f"its edits hold more than {MAX_MERGES:,} merges, the limit of a session file")
            node = node.values()
        elif set(map(type, node)) == {list}:  # rows (merges): counted at once when they hold only numbers
            inner = sum(map(len, node))
            if values + inner > MAX_VALUES:
                raise too_many  # their entries are values wherever they are
            if not {list, dict} & set(map(type, chain.from_iterable(node))):
                values += inner
                continue
        if {list, dict} & set(map(type, node)):  # (a list of numbers, or a bit table, ends here)
            pending.extend(child for child in node if type(child) is list or type(child) is dict)


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
    message = error.message if len(error.message) <= 160 else f"{_short(error.instance)} is not allowed here"
    why = error.schema.get("description") if isinstance(error.schema, dict) else None
    return f"{message} ({why})" if why and error.validator in ("minimum", "maximum") else message


def token_count(document: dict) -> int:
    """Tokens a validated document's turns hold (its prefills and replies): what replaying it caches, at most."""
    return sum(len(turn["prefill_ids"]) + len(turn["reply_ids"]) for turn in document["turns"])


@dataclass(frozen=True)
class CheckedFile:
    """A session file's document, checked in full against a model's shape (:func:`check_file`): importing it on a
    model of that shape does not check it again."""

    document: dict
    geometry: Geometry

    @property
    def tokens(self) -> int:
        """The slots its replay caches (what a memory budget is asked for before it runs)."""
        return token_count(self.document)


def check_file(geometry: Geometry, text: str | bytes | Any) -> CheckedFile:
    """A session file's text (parsed with the size and nesting limits of :func:`parse`) or an
    already parsed document, checked in full against ``geometry``; refuses with :class:`KvvizError`, in one line."""
    document = parse(text) if isinstance(text, (str, bytes)) else text
    validate(geometry, document)
    return CheckedFile(document, geometry)
