"""One conversation with the model: history → query prefill → decode appends, on one KV cache (docs/math.md §1).

The session owns its cache, transcript and recorded queries; the model is shared and stays stateless. Every forward
pass is atomic: if it fails, the cache, the recorded queries and the transcript are left as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import torch
from transformers import Cache

from kvviz import kv_cache, prefill, recurrent, settings
from kvviz.chat_template import chat_delta, check_unicode
from kvviz.edit.commits import CommitLog, Commits
from kvviz.edit.check import check_edit
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.memo import Memo, held_bytes
from kvviz.model import LoadedModel
from kvviz.numbers import reply_length
from kvviz.recorded_weights import recorded_weights
from kvviz.recorder import QueryLog, read_mask
from kvviz.sampling import Sampling, Token
from kvviz.transcript import Transcript, token_pieces

T = TypeVar("T")


@dataclass(frozen=True)
class SessionBytes:
    """What a session holds: its KV cache (cached slots) and its recorded queries (with spare capacity)."""

    kv_bytes: int
    recorded_bytes: int


def new_query_log(lm: LoadedModel) -> QueryLog:
    """An empty log of ``lm``'s queries per slot, and of its recurrent layers' inputs and its read sets (sparse
    selection) when it has them."""
    linear = len(recurrent.linear_layers(lm.config))
    return QueryLog(lm.layers, lm.heads, lm.head_dim, lm.dtype, lm.device, (linear, lm.config.hidden_size),
                    lm.attention.reads)


class Session:
    """A turn-by-turn conversation on a shared :class:`LoadedModel`."""

    def __init__(self, lm: LoadedModel, sampling: Sampling | None = None, memory_budget: int | None = None,
                 commits: Callable[[Cache], Commits] | None = None):
        """``memory_budget``: bytes of cache + recorded queries this session may hold (default: the
        ``KVVIZ_MEMORY_BUDGET_MB`` environment variable, else 4096 MiB); a turn or step beyond it is refused.
        ``commits``: the commit log built on the session's cache (a policy run's timeline, kvviz.runs.timeline);
        by default the user's own :class:`~kvviz.edit.commits.CommitLog`."""
        self.lm = lm
        default = int(settings.number("KVVIZ_MEMORY_BUDGET_MB", 4096) * 2**20)
        self.memory_budget = memory_budget if memory_budget is not None else default
        self.sampling = sampling or Sampling()
        self.transcript = Transcript()
        self.cache = kv_cache.roomy(lm.model.config)  # decode steps write into spare room, no copy of the cache
        self.queries = new_query_log(lm)
        self.messages: list[dict[str, str]] = []
        self.turns: list[dict[str, str]] = []
        self.produced: list[int] = []  # tokens chosen in the current turn; the last one is pending
        self.past_replies: list[tuple[list[int], int]] = []  # earlier turns' (chosen tokens, how many were shown)
        self.pending: int | None = None
        self.logits: torch.Tensor | None = None  # (V,) float32 next-token logits that chose ``pending``
        self._announced = 0
        self._generator = self.sampling.generator()
        self.commits: Commits = (commits or partial(CommitLog, layers=lm.layers, kv_heads=lm.kv_heads))(self.cache)
        self.version = 0  # bumped by every change of the cache (views key their caches on it)
        self.memo = Memo()  # derived data (views, the what-if's full runs), dropped when ``version`` moves
        self.released: str | None = None  # why :meth:`release` freed this session's tensors, once it has
        self.on_layer: Callable[[int, int], None] | None = None  # told (layers done, layers) as a forward pass runs
        self.prefill_chunk = prefill.CHUNK  # a longer prefill runs as passes of this many tokens (same numbers)
        self.selector: Callable | None = None  # picks what a decode step reads (a run's query-aware reader)

    def __repr__(self) -> str:  # the plain-text output (a notebook shows the strip: kvviz.notebook.reprs)
        return f"Session({self.lm.name}, {len(self)} slots, {len(self.commits.stack)} committed edits)"

    # --- turns -----------------------------------------------------------------------------------------------

    def add_user_turn(self, text: str, raw_special_tokens: bool = False,
                      commit_after: tuple[int, Edit] | None = None) -> list[int]:
        """Render the conversation with the chat template and prefill only the tokens not yet cached.

        The text is tokenized as text: control strings typed in it (``<|im_end|>``) become ordinary tokens, so a
        message cannot open a turn of another role. ``raw_special_tokens`` reads them as the real control tokens
        (for studying them); the transcript notes which slots those are. Returns the prefilled ids. Refuses empty
        text and text that does not fit the context window.

        ``commit_after=(k, edit)`` commits ``edit`` once the first ``k`` prefilled tokens are cached (``0 < k <``
        their count), so the rest of the prompt runs as a second pass on the edited cache: a fork from a step inside
        a prompt (:mod:`kvviz.fork`). That turn is not atomic: a failure in the second pass leaves it half done.
        """
        if not isinstance(text, str) or not text.strip():
            raise KvvizError("the message is empty; type some text")
        check_unicode(text)
        message = {"role": "user", "content": text} | ({"raw": True} if raw_special_tokens else {})
        messages = self.messages + self._reply_message() + [message]
        delta, typed = chat_delta(self.lm.tokenizer, messages, self.transcript.ids)
        self.check_room(len(delta))
        if commit_after is None:
            self._prefill(delta, text)
        else:
            self._prefill_around(delta, text, *commit_after)
        self.transcript.typed_control |= {len(self) - len(delta) + index for index in typed}
        self.messages = messages
        return delta

    def add_ids(self, ids: Sequence[int]) -> None:
        """Start a turn from raw token ids (no chat template): they are prefilled on top of the cache."""
        ids = [int(i) for i in ids]
        if not ids:
            raise KvvizError("a turn needs at least one token")
        vocab = self.lm.model.config.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise KvvizError(f"token ids must be in [0, {vocab})")
        self.check_room(len(ids))
        self._prefill(ids, self.lm.tokenizer.decode(ids))

    def _reply_message(self) -> list[dict[str, str]]:
        return [{"role": "assistant", "content": self.reply}] if self.messages else []

    def check_room(self, count: int) -> None:
        """Refuse ``count`` more tokens beyond the context window or this session's memory budget."""
        left = self.lm.context_window - self.transcript.next_position
        if count > left:
            raise KvvizError(f"the message needs {count} tokens but only {left} are left in the context window")
        needed = (len(self) + count) * self.lm.bytes_per_slot
        if needed > self.memory_budget:
            raise KvvizError(f"this would hold {needed / 2**20:.0f} MiB of cache and recorded queries, over this "
                             f"session's budget of {self.memory_budget / 2**20:.0f} MiB (KVVIZ_MEMORY_BUDGET_MB)")

    def has_room(self, count: int) -> bool:
        """Whether ``count`` more tokens fit the context window and the memory budget."""
        try:
            return self.check_room(count) is None
        except KvvizError:
            return False

    def _begin_turn(self, user: str) -> None:
        if self.turns:
            self.turns[-1]["assistant"] = self.reply
            self.past_replies.append((list(self.produced), self._announced))
        self.turns.append({"user": user, "assistant": ""})
        self.transcript.turn += 1
        self.produced, self.pending, self._announced = [], None, 0

    # --- forward passes --------------------------------------------------------------------------------------

    def _prefill(self, ids: list[int], user: str) -> None:
        """A new turn: the pass first (it may fail or be stopped, changing nothing), then the turn's bookkeeping."""
        logits = self._forward(ids)
        self._begin_turn(user)
        self._accept(ids, logits, "prefill")

    def _prefill_around(self, ids: list[int], user: str, split: int, edit: Edit) -> None:
        """A new turn prefilled in two passes, ``edit`` committed between them (see :meth:`add_user_turn`)."""
        if not 0 < split < len(ids):
            raise KvvizError(f"an edit committed inside a prompt of {len(ids)} tokens goes after 1 to "
                             f"{len(ids) - 1} of them, not {split}")
        self._prefill(ids[:split], user)
        self.commit(edit)
        self._accept(ids[split:], self._forward(ids[split:]), "prefill")
        self.produced = [self.pending]  # the first pass's choice was never a reply token

    def step(self) -> Token:
        """Decode one step: the pending token's K/V is appended to the cache and the next token is chosen."""
        self.check_step()
        self.end_step(self._forward([self.pending]))
        return self._token(self.pending)

    def check_step(self) -> None:
        """Refuse a decode step that cannot run (a released session, no turn yet, no room)."""
        self._check_held()
        if self.pending is None:
            raise KvvizError("nothing to decode yet: add a turn first")
        if self.transcript.next_position >= self.lm.context_window:
            raise KvvizError("the context window is full")
        self.check_room(1)

    def end_step(self, logits: torch.Tensor) -> None:
        """Accept a step whose pass (here, or batched: kvviz.runs.lockstep) cached the pending token; logits (V,)."""
        self._accept([self.pending], logits, "decode")
        self._announced = max(self._announced, len(self.produced) - 1)  # a cached token is part of the reply

    def _forward(self, ids: list[int]) -> torch.Tensor:
        """Append the K/V and queries of ``ids`` (atomic, see :mod:`kvviz.prefill`); the last one's ``(V,)`` logits."""
        self._check_held()
        return prefill.forward(self.lm, self.cache, self.queries, self.commits.evicted, ids,
                               self.transcript.next_position, self.on_layer, self.prefill_chunk, self.selector)

    def _accept(self, ids: list[int], logits: torch.Tensor, kind: str) -> None:
        self.version += 1
        self.transcript.append(ids, token_pieces(self.lm.tokenizer, ids), kind)  # type: ignore[arg-type]
        self.logits = logits
        self.pending = self.sampling.choose(self.logits, self._generator)
        self.produced.append(self.pending)

    # --- generation ------------------------------------------------------------------------------------------

    @property
    def turn_ended(self) -> bool:
        return self.pending is None or self.pending in self.lm.stop_ids

    def stream(self, max_new_tokens: int) -> Iterator[Token]:
        """Yield up to ``max_new_tokens`` new tokens of the reply (at least 1: :func:`kvviz.numbers.reply_length`,
        checked when called), decoding one step each; stops at end-of-turn.

        Stopping the iteration early is safe: each step is complete before its token is yielded.
        """
        return self._stream(reply_length(max_new_tokens))

    def _stream(self, max_new_tokens: int) -> Iterator[Token]:
        for _ in range(max_new_tokens):
            if self._announced == len(self.produced):  # the pending token was shown already: decode it
                if self.turn_ended or not self.has_room(1):
                    return
                self.step()
            if self.turn_ended:
                return
            self._announced += 1
            yield self._token(self.pending)

    def generate(self, max_new_tokens: int, on_token: Callable[[Token], None] | None = None) -> str:
        """Generate until end-of-turn or ``max_new_tokens``; returns the reply so far."""
        for token in self.stream(max_new_tokens):
            if on_token is not None:
                on_token(token)
        return self.reply

    def force(self, token: int) -> None:
        """Replace the pending token by ``token`` (replaying a recorded reply); the next step decodes it."""
        if self.pending is None:
            raise KvvizError("nothing to reply to: add a turn first")
        self.pending = self.produced[-1] = int(token)

    def replies(self) -> list[tuple[list[int], int]]:
        """Every turn's chosen tokens (the newest turn's last one is pending) and how many of them were shown."""
        return self.past_replies + ([(list(self.produced), self._announced)] if self.turns else [])

    def set_announced(self, count: int) -> None:
        """How many chosen tokens of this turn count as shown (replay), never fewer than are cached (:attr:`reply`)."""
        self._announced = max(0, len(self.produced) - 1, min(int(count), len(self.produced)))

    @property
    def reply(self) -> str:
        """The current turn's reply, by one rule: its generated slots as the cache holds them (every token :meth:`step`
        cached), then the pending token once :meth:`stream` has yielded it; end-of-turn excluded."""
        ids = [i for i in self.produced[: self._announced] if i not in self.lm.stop_ids]
        return self.lm.tokenizer.decode(ids, skip_special_tokens=True)

    def conversation(self) -> list[dict[str, str]]:
        """Turns so far as ``{"user", "assistant"}``; the newest assistant text is the reply so far."""
        return [dict(turn) for turn in self.turns[:-1]] + [dict(turn, assistant=self.reply) for turn in self.turns[-1:]]

    def piece(self, token_id: int) -> str:
        """The text of one token (see :func:`token_pieces`)."""
        return token_pieces(self.lm.tokenizer, [token_id])[0]

    def _token(self, token_id: int) -> Token:
        return Token(token_id, self.piece(token_id))

    # --- reading ---------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.transcript)

    def pending_token(self) -> Token | None:
        """The chosen token whose K/V is not yet cached (``None`` before the first turn)."""
        return None if self.pending is None else self._token(self.pending)

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached keys (post-RoPE) and values of ``layer``: two ``(KV, n, D)`` tensors."""
        keys, values = kv_cache.layer_kv(self.cache, layer)
        return keys[0], values[0]

    def weights(self, layer: int, start: int = 0, stop: int | None = None, head: int | None = None) -> torch.Tensor:
        """Attention weights of the slots ``start..stop-1`` as queries: ``(H, stop - start, stop)`` float32, or
        ``(1, stop - start, stop)`` for one query ``head`` (see :func:`~kvviz.recorded_weights.recorded_weights`)."""
        lm = self.lm
        return recorded_weights(self.commits, self.queries, lm.geometry, lm.attention, layer, start, stop, head)

    def read_set(self, layer: int, at: int) -> torch.Tensor | None:
        """With sparse selection (DSA, :mod:`kvviz.sparse`): bool ``(at + 1,)``, the slots the step of slot ``at``
        read in ``layer`` (its indexer's top-k among the slots it saw); None for a model whose steps read every slot
        they see."""
        if self.queries.reads is None:
            return None
        if not 0 <= at < len(self):
            raise KvvizError(f"slot {at} is not cached (the cache holds {len(self)})")
        return read_mask(self.queries.reads.layer(layer)[0, at], at + 1)

    # --- committed edits -------------------------------------------------------------------------------------

    def commit(self, edit: Edit) -> None:
        """Apply ``edit`` to the session's cache: every later step runs on the edited cache (positions unchanged)."""
        self._check_held()
        check_edit(self.lm, self.transcript, edit, len(self))
        self.commits.push(edit, len(self))
        self.version += 1

    def undo(self, count: int = 1) -> None:
        """Take the newest ``count`` committed edits back (evicted slots reappear, quantized ones get their original
        K/V); refuses more than there are, changing nothing."""
        if not 1 <= count <= len(self.commits.stack):
            raise KvvizError(f"there are {len(self.commits.stack)} committed edits; cannot undo {count}")
        for _ in range(count):
            self.commits.pop()
        self.version += 1

    def attention_row(self, layer: int, head: int, slot: int) -> torch.Tensor:
        """What slot ``slot`` attended to in ``layer``/``head``: ``(slot + 1,)`` weights over slots ``0..slot``."""
        if not 0 <= head < self.lm.heads:
            raise KvvizError(f"head {head} does not exist (the model has {self.lm.heads} query heads)")
        return self.weights(layer, slot, slot + 1)[head, 0]

    def memoized(self, kind: str, key: Hashable, compute: Callable[[], T], keep: int | None = None) -> T:
        """Derived data of this cache version, computed once (see :class:`~kvviz.memo.Memo`)."""
        return self.memo.get(self.version, kind, key, compute, keep)

    def memory(self) -> SessionBytes:
        """Bytes of the KV cache (with a hybrid model's recurrent states) and of the recorded queries (with its
        recurrent layers' recorded inputs)."""
        return SessionBytes(kv_cache.nbytes(self.cache) + recurrent.nbytes(self.cache), self.queries.nbytes)

    def nbytes(self) -> int:
        """Bytes of every tensor held: cache (with room), recorded queries, quantization originals, derived data."""
        return held_bytes((self.cache.layers, self.queries, self.commits, self.memo, self.logits))

    def _check_held(self) -> None:
        if self.released:
            raise KvvizError(f"this session was released ({self.released}); rebuild it from its session file")

    def release(self, why: str) -> int:
        """Free every tensor (see :meth:`nbytes`, returned) while nothing uses the session, e.g. to make room for
        others; afterwards it only says ``why`` (``released``): rebuild it from its session file."""
        held = self.nbytes()
        self.memo.clear()
        self.cache = kv_cache.roomy(self.lm.model.config)
        self.queries = new_query_log(self.lm)
        self.commits = CommitLog(self.cache, self.lm.layers, self.lm.kv_heads)
        self.logits, self.released = None, why
        return held
