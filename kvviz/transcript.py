"""The token-level record of a conversation: one entry per cached slot, plus the cache-growth log.

A *slot* is the index of a token in processing order. Its *position* is the absolute position RoPE saw; positions are
never renumbered, even after eviction. The *segment* of a slot is relative to the newest turn: earlier turns are
``history``; the newest turn's prefilled tokens are ``query`` and its decoded tokens ``generated`` (docs/math.md §1).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Literal

from tokenizers import decoders
from transformers import PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import bytes_to_unicode

Segment = Literal["history", "query", "generated"]
SEGMENTS: tuple[Segment, ...] = ("history", "query", "generated")


@dataclass(frozen=True)
class Slot:
    """One cached token. ``kind`` is how it entered the cache: ``prefill`` or ``decode``."""

    slot: int
    id: int
    text: str
    position: int
    turn: int
    kind: Literal["prefill", "decode"]


@dataclass(frozen=True)
class GrowthEvent:
    """Cache length after one forward pass (a prefill or a decode step), split by segment as of that moment."""

    step: int
    kind: Literal["prefill", "decode"]
    turn: int
    added: int
    length: int
    history: int
    query: int
    generated: int


@dataclass
class Transcript:
    """Slots in processing order and the growth log. Pure bookkeeping: no tensors."""

    slots: list[Slot] = field(default_factory=list)
    growth: list[GrowthEvent] = field(default_factory=list)
    turn: int = -1
    typed_control: set[int] = field(default_factory=set)  # slots of control tokens the user typed (raw mode)
    renumbered: int | None = None  # the next token's position when a policy run re-rotated the cache

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def ids(self) -> list[int]:
        return [s.id for s in self.slots]

    @property
    def next_position(self) -> int:
        """Position of the next token: one past the last slot's, never the (possibly compacted) length — unless a
        policy run re-rotated the kept keys to the positions of their order (``renumbered``)."""
        if self.renumbered is not None:
            return self.renumbered
        return self.slots[-1].position + 1 if self.slots else 0

    def segment(self, slot: Slot) -> Segment:
        if slot.turn < self.turn:
            return "history"
        return "query" if slot.kind == "prefill" else "generated"

    def segments(self) -> list[Segment]:
        return [self.segment(s) for s in self.slots]

    def counts(self) -> dict[Segment, int]:
        counts = dict.fromkeys(SEGMENTS, 0)
        for segment in self.segments():
            counts[segment] += 1
        return counts

    def matches(self, text: str, stop: int | None = None, ignore_case: bool = False) -> list[list[int]]:
        """Per occurrence of ``text`` in the joined text of the slots before ``stop``, the slots whose pieces cover
        it (so a word split over several tokens is found)."""
        slots = self.slots[:stop]
        starts, offset = [], 0
        for slot in slots:
            starts.append(offset)
            offset += len(slot.text)
        joined = "".join(s.text for s in slots)
        if ignore_case:
            joined, text = joined.lower(), text.lower()
        found, begin = [], joined.find(text) if text else -1
        while begin >= 0:
            end = begin + len(text)
            found.append([s.slot for s, start in zip(slots, starts) if start < end and start + len(s.text) > begin])
            begin = joined.find(text, begin + 1)
        return found

    def text_of(self, slots: Iterable[int]) -> str:
        """The pieces of ``slots`` joined, in the order given (e.g. the word a blame row restores)."""
        return "".join(self.slots[s].text for s in slots)

    def history_slots(self, before: int) -> list[int]:
        """Slots below ``before`` that belong to earlier turns."""
        return [s.slot for s in self.slots[:before] if s.turn < self.turn]

    def turn_slots(self, before: int) -> list[int]:
        """Slots below ``before`` of the newest turn (its query and what was generated)."""
        return [s.slot for s in self.slots[:before] if s.turn == self.turn]

    def boundaries(self) -> list[tuple[int, str]]:
        """Where a segment or a turn starts, after the first slot: ``(slot, "segment tN")``."""
        marks, previous = [], None
        for slot in self.slots:
            label = f"{self.segment(slot)} t{slot.turn}"
            if label != previous:
                marks.append((slot.slot, label))
                previous = label
        return marks[1:]

    def append(self, ids: list[int], pieces: list[str], kind: Literal["prefill", "decode"]) -> None:
        """Record ``ids`` as cached (after a successful forward) and log the growth."""
        start = len(self.slots)
        position = self.next_position
        self.slots.extend(
            Slot(start + i, tok, piece, position + i, self.turn, kind) for i, (tok, piece) in enumerate(zip(ids, pieces))
        )
        self.renumbered = None
        self.growth.append(GrowthEvent(len(self.growth), kind, self.turn, len(ids), len(self.slots), **self.counts()))

    def rows(self) -> list[dict]:
        """JSON-ready rows: slot, id, text, position, segment, turn."""
        return [
            {k: v for k, v in asdict(s).items() if k != "kind"} | {"segment": self.segment(s)} for s in self.slots
        ]


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    return {char: byte for byte, char in bytes_to_unicode().items()}


def token_pieces(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[str]:
    """The text of each token on its own.

    For byte-level BPE a character may span tokens (an emoji is often 2–4 tokens); bytes that are not a whole UTF-8
    character on their own are shown as ``\\xNN`` escapes, so every slot keeps a visible, faithful piece.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(getattr(backend, "decoder", None), decoders.ByteLevel):
        return [tokenizer.decode([i]) for i in ids]
    table = _byte_decoder()
    pieces = []
    for token in tokenizer.convert_ids_to_tokens(ids):
        if all(char in table for char in token):
            pieces.append(bytes(table[char] for char in token).decode("utf-8", "backslashreplace"))
        else:  # added tokens are stored verbatim
            pieces.append(token)
    return pieces
