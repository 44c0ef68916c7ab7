"""Numbers given at the edge — command-line flags, policy and press parameters, the app's fields — checked once, the
same way everywhere: a real number (not a bool, not text that only looks like one), not NaN, finite as the float32
it becomes where it is used (|x| ≤ 3.4e38: 1e39 is finite in Python and infinite in a float32 tensor), an integer
where one is meant (within int32), and inside its field's range. Each refusal is one line naming the field. Imports
nothing heavy, so the command line refuses a bad flag without loading torch. (And :func:`ordinal`, a count said as a
place: 1st, 2nd, 11th.)"""

from __future__ import annotations

import math

from kvviz.errors import KvvizError

FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32
INT32_MAX = 2**31 - 1


def number(value: object, what: str, low: float | None = None, high: float | None = None, *,
           above: bool = False, below: bool = False, integer: bool = False) -> int | float:
    """``value`` (a number, or text to read as one) checked: finite in float32 (an integer: within int32), and in
    ``[low, high]`` (``above`` / ``below``: the bound itself excluded). Returns it as ``int`` or ``float``."""
    if isinstance(value, str):
        value = _read(value, what, integer)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KvvizError(f"{what} must be {'an integer' if integer else 'a number'}, got {_shown(value)}")
    if integer and (isinstance(value, float) and not value.is_integer()):
        raise KvvizError(f"{what} must be an integer, got {_shown(value)}")
    if isinstance(value, float) and math.isnan(value):
        raise KvvizError(f"{what} must be a number, got NaN")
    limit = INT32_MAX if integer else FLOAT32_MAX
    if not -limit <= value <= limit:
        raise KvvizError(f"{what} must be finite and at most {limit:.4g} in size, got {_shown(value)}")
    if (low is not None and (value <= low if above else value < low)) or \
            (high is not None and (value >= high if below else value > high)):
        raise KvvizError(f"{what} must be {_range(low, high, above, below)}, got {_shown(value)}")
    return int(value) if integer else float(value)


def ordinal(n: int) -> str:
    """``n`` as an English ordinal: 1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, 102nd."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def reply_length(value: object) -> int:
    """``max_new_tokens`` — the command line's ``--max-new-tokens``, :meth:`kvviz.session.Session.stream`'s and the
    notebook widget's argument — checked one way: a whole number from 1 to int32's largest."""
    return int(number(value, "max_new_tokens", 1, integer=True))


def _range(low: float | None, high: float | None, above: bool, below: bool) -> str:
    """``[0, 1)``, ``at least 1``, ``above 0``, ``at most 8``: a field's range in words."""
    if low is not None and high is not None:
        return f"in {'(' if above else '['}{low:g}, {high:g}{')' if below else ']'}"
    if low is not None:
        return f"{'above' if above else 'at least'} {low:g}"
    return f"{'below' if below else 'at most'} {high:g}"


MAX_TOPK = 1024  # rows of a next-token table: each rank is counted against the tokens above it, (k × candidates)


def top_k(value: object, vocab: int | None = None) -> int:
    """A next-token table's length — ``whatif --topk`` and :func:`kvviz.whatif.what_if`'s ``topk`` — checked one way:
    a whole number from 1 to :data:`MAX_TOPK` (and the vocabulary's size, when known)."""
    return int(number(value, "top-k", 1, min(MAX_TOPK, vocab or MAX_TOPK), integer=True))


def _shown(value: object) -> str:
    """``value`` as a refusal quotes it: its repr, cut at 60 characters (an integer of 5,000 digits has no repr)."""
    try:
        text = repr(value)
    except ValueError:  # int.__repr__ past sys.get_int_max_str_digits()
        return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
    return text if len(text) <= 60 else f"{text[:57]}…"


def _read(text: str, what: str, integer: bool) -> int | float:
    try:
        return int(text.strip()) if integer else float(text.strip())
    except ValueError:
        raise KvvizError(f"{what} must be {'an integer' if integer else 'a number'}, got {_shown(text)}") from None


PRESS_BUDGETS = {  # kvpress' arguments that set a press's budget: (low, high, above, below, integer)
    "compression_ratio": (0.0, 1.0, False, True, False),
    "compression_interval": (1, None, False, False, True),
    "target_size": (1, None, False, False, True),
}


def press_budgets(arguments: dict[str, object], press: str = "the press") -> dict[str, int | float]:
    """kvpress' budget arguments among ``arguments`` (text or numbers), each checked (:data:`PRESS_BUDGETS`): the
    command line checks them before anything loads, :func:`kvviz.policies.kvpress.presses.from_kvpress` when it builds."""
    checked = {}
    for name, (low, high, above, below, integer) in PRESS_BUDGETS.items():
        if name in arguments:
            checked[name] = number(arguments[name], f"{press}'s {name}", low, high, above=above, below=below,
                                   integer=integer)
    return checked
