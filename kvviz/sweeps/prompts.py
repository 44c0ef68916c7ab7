"""Sweep prompts: the Prompt, kvviz's JSONL file (one case per line) and the first built-in sets, generated on the
fly (nothing downloaded); :mod:`kvviz.sweeps.sources` reads any source, kvpress' datasets and RULER-style sets too.

A line is a JSON object with ``prompt`` (one user turn) or ``turns`` (a list of them), and optionally ``id`` and
``expected`` (the answer the reply should contain). Blank lines are skipped; anything else is refused with its line
number. Built-in sets: ``builtin:needle``, ``builtin:kv``, ``builtin:vars`` and ``builtin:all`` (all three).
"""

from __future__ import annotations

import json
import sys
import random
from dataclasses import dataclass
from pathlib import Path

from kvviz.errors import KvvizError

MAX_PROMPT_CHARS = 200_000


@dataclass(frozen=True)
class Prompt:
    """One sweep prompt: its user turns, the answer its last reply should contain (or None) and its family; for a
    task scored as RULER scores it, the reference ``answers`` and the ``metric`` (:mod:`kvviz.sweeps.ruler`), and the
    reply length its data asks for."""

    id: str
    turns: tuple[str, ...]
    expected: str | None = None
    family: str = "file"
    answers: tuple[str, ...] = ()
    metric: str | None = None
    max_new_tokens: int | None = None


def read_jsonl(path: Path) -> list[Prompt]:
    if not path.is_file():
        raise KvvizError(f"prompt file {path} does not exist; pass a JSONL file or builtin:needle / kv / vars / all")
    return parse_jsonl(text_of(path.read_bytes(), str(path)), str(path))


def text_of(data: bytes, name: str) -> str:
    """``data`` as UTF-8 text, or refused naming ``name`` and the line of the first byte that is not UTF-8 (a
    latin-1, UTF-16 or binary file)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise KvvizError(f"{name}:{line}: not UTF-8 text (byte {exc.start:,}); save the file as UTF-8 JSONL, one "
                         "object a line") from None


def json_line(line: str | bytes, where: str) -> object:
    """One line of JSON, or refused naming ``where``: not JSON, nested too deeply (Python's recursion limit) or an
    integer of more digits than Python reads (4,300)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise KvvizError(f"{where}: not JSON ({exc.msg}); each line is one object such as "
                         '{"prompt": "…", "expected": "…"}') from None
    except RecursionError:
        raise KvvizError(f"{where}: nested too deeply to be a prompt") from None
    except ValueError:  # int('9' * 5000): "Exceeds the limit (4300 digits) for integer string conversion"
        raise KvvizError(f"{where}: holds a number of more than {sys.get_int_max_str_digits():,} digits") from None


def prompt_id(value: object, where: str, default: str) -> str:
    """A prompt's id: a non-empty text or an integer (written as text); ``default`` when there is none. Anything else
    (``false``, a list, an empty text, a fraction) is refused: ids name the rows of the table."""
    if value is None or (isinstance(value, float) and value != value):  # NaN: a parquet row without one
        return default
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise KvvizError(f"{where}: id must be a non-empty text or an integer, got {value!r:.40}")
    return str(value)


def parse_jsonl(text: str, name: str) -> list[Prompt]:
    """The prompts of a JSONL ``text`` (a file's or an upload's, called ``name`` in messages); a bad line is refused
    with its number."""
    return [_parse(line, f"{name}:{number}", f"line{number}")
            for number, line in enumerate(text.split("\n"), start=1) if line.strip()]


def _parse(line: str, where: str, default_id: str) -> Prompt:
    item = json_line(line, where)
    if not isinstance(item, dict):
        raise KvvizError(f"{where}: a line must be a JSON object, not {type(item).__name__}")
    unknown = set(item) - {"id", "prompt", "turns", "expected"}
    if unknown:
        raise KvvizError(f"{where}: unknown field {sorted(unknown)[0]!r} (use id, prompt or turns, expected)")
    turns = [item["prompt"]] if "prompt" in item else item.get("turns")
    if ("prompt" in item) == ("turns" in item):
        raise KvvizError(f"{where}: give exactly one of prompt (a text) or turns (a list of texts)")
    if not isinstance(turns, list) or not turns or any(not isinstance(t, str) or not t.strip() for t in turns):
        raise KvvizError(f"{where}: the prompt or every turn must be a non-empty text")
    if sum(map(len, turns)) > MAX_PROMPT_CHARS:
        raise KvvizError(f"{where}: over {MAX_PROMPT_CHARS:,} characters")
    expected = item.get("expected")
    if expected is not None and (not isinstance(expected, str) or not expected.strip()):
        raise KvvizError(f"{where}: expected must be a non-empty text")
    return Prompt(prompt_id(item.get("id"), where, default_id), tuple(turns), expected)


# --- built-in sets ------------------------------------------------------------------------------------------------

_FILLER = ["The grass is green and the sky is blue.", "The river flows past the old mill toward the sea.",
           "Farmers bring their grain to the market each week.", "A light wind moves the leaves of the oak trees.",
           "The town library opens early on weekdays.", "Children play by the fountain in the square.",
           "The baker sells fresh bread before sunrise.", "Clouds gather over the hills in the afternoon."]


def filler(rng: random.Random, sentences: int) -> list[str]:
    """``sentences`` filler sentences drawn by ``rng`` (a haystack)."""
    return [rng.choice(_FILLER) for _ in range(sentences)]


def needle(lengths: tuple[int, ...] = (40, 120), depths: tuple[float, ...] = (0.1, 0.5, 0.9)) -> list[Prompt]:
    """Needle in a haystack: a secret number hidden at a relative ``depth`` of ``length`` filler sentences."""
    prompts = []
    for length in lengths:
        for depth in depths:
            rng = random.Random(f"needle-{length}-{depth}")
            code = str(rng.randint(1000, 9999))
            text = filler(rng, length)
            text.insert(round(depth * length), f"The secret code is {code}.")
            question = " ".join(text) + "\n\nWhat is the secret code? Answer with the number only."
            prompts.append(Prompt(f"needle-{length}-d{depth:g}", (question,), code, "needle"))
    return prompts


def key_value(pairs: tuple[int, ...] = (10, 30, 60)) -> list[Prompt]:
    """Key-value retrieval: ``pairs`` random keys with random values; the value of one of them is asked."""
    prompts = []
    for count in pairs:
        rng = random.Random(f"kv-{count}")
        keys = [f"{rng.choice('ABCDEFGH')}{rng.randint(100, 999)}" for _ in range(count)]
        keys = list(dict.fromkeys(keys))
        values = {key: str(rng.randint(10000, 99999)) for key in keys}
        asked = keys[rng.randrange(len(keys))]
        lines = "\n".join(f"{key}: {value}" for key, value in values.items())
        question = f"Here is a list of keys and values.\n{lines}\n\nWhat is the value of {asked}? Answer with the number only."
        prompts.append(Prompt(f"kv-{count}", (question,), values[asked], "kv"))
    return prompts


def variables(hops: tuple[int, ...] = (2, 4, 6)) -> list[Prompt]:
    """Multi-hop variable tracking (RULER-style): a value passed along a chain of ``hops`` assignments, among filler
    and a distracting chain; the last variable of the chain is asked."""
    prompts = []
    for count in hops:
        rng = random.Random(f"vars-{count}")
        value, other = str(rng.randint(10000, 99999)), str(rng.randint(10000, 99999))
        chain = [f"X{index}" for index in range(count + 1)]
        decoy = [f"Y{index}" for index in range(count + 1)]
        lines = [f"VAR {chain[0]} = {value}.", f"VAR {decoy[0]} = {other}."]
        for index in range(1, count + 1):
            lines += [f"VAR {chain[index]} = VAR {chain[index - 1]}.", rng.choice(_FILLER),
                      f"VAR {decoy[index]} = VAR {decoy[index - 1]}."]
        question = "\n".join(lines) + f"\n\nWhat is the value of VAR {chain[-1]}? Answer with the number only."
        prompts.append(Prompt(f"vars-{count}", (question,), value, "vars"))
    return prompts


SETS = {"needle": needle, "kv": key_value, "vars": variables}


def builtin(name: str) -> list[Prompt]:
    """A built-in set of these by name (``all``: the three)."""
    if name == "all":
        return [prompt for make in SETS.values() for prompt in make()]
    return SETS[name]()
