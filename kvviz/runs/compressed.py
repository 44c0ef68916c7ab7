"""One side of a policy run: a :class:`~kvviz.session.Session` whose cache a policy compresses as a real
implementation would, turn by turn and step by step (docs/math.md §9).

- The prompt of a turn is prefilled with full attention on whatever the cache still holds.
- ``prefill`` mode compresses once right after it; ``decode`` mode before every ``every``-th decode step while the
  cache is over the budget; ``both`` does both; ``after_steps`` after every ``every``-th decode step, as kvpress'
  ``DecodingPress`` (``compression_interval`` = every, ``target_size`` = budget) — the same as ``decode`` except
  that the prompt is never compressed before the first step. The budget bounds the slots a step sees besides its
  own (in ``after_steps``, up to ``every − 1`` more between compressions).
- The policy decides on the compressed cache: scores come from attention as the steps computed it, evicted slots
  never come back and accumulate nothing, nothing after the step is seen.
- A cache format (kvviz.schemes.cache_format) stores what is kept as a real implementation does: KIVI quantizes
  whole groups as they leave the full-precision window, before the step that first sees them so; a written format
  rounds each slot once, when written; QuantizedCache flushes its residual into the rounded part.
- Positions stay the original absolute ones, or (``positions="rerotated"``, for policies that keep the same slots
  everywhere) the kept keys are re-rotated to the positions of their order and the next token follows them.
- A ``reader`` keeps the cache and chooses, before each decode step, the ``reads`` slots (per layer and KV head) that
  step reads — any policy's scores, as sparse attention in an engine (Quest, RocketKV's second stage) selects per
  step; a policy may evict as well (RocketKV's first stage). The other slots are hidden from that step alone.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Literal

import torch

from kvviz import kv_cache
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.hidden_log import HiddenLog, recording
from kvviz.model import LoadedModel
from kvviz.policies.base import Candidates, Policy, kept_share, received_attention, slots_kept
from kvviz.policies.reshaping import merging, think
from kvviz.policies.rocket_kv import HybridSparse
from kvviz.runs.reasons import Reasons
from kvviz.schemes.cache_format import CacheFormat
from kvviz.edit.reshape import Reshape
from kvviz.rope import Rotary
from kvviz.runs.timeline import Timeline
from kvviz.sampling import Sampling
from kvviz.session import Session

Mode = Literal["prefill", "decode", "both", "after_steps"]
MODES = ("prefill", "decode", "both", "after_steps")
POSITIONS = ("original", "rerotated")


@dataclass(frozen=True)
class RunSettings:
    """How a policy run compresses. ``policy`` None runs the cache format alone; ``budget`` is a slot count or a
    fraction of the slots cached after each turn's prompt; ``cache_format`` how the kept K/V are stored (KIVI, a
    written scheme, QuantizedCache: kvviz.schemes.cache_format), None for the model's own cache."""

    policy: Policy | None = None
    budget: int | float | None = None
    mode: Mode = "decode"
    every: int = 1
    cache_format: CacheFormat | None = None
    positions: Literal["original", "rerotated"] = "original"
    reshape: Reshape | None = None  # ThinK's prunings, merges of the evicted, at each prompt
    reader: Policy | HybridSparse | None = None  # keeps the cache; picks the slots each decode step reads: a policy
    # before the step, or a query-aware reader inside its pass with its query (RocketKV's hybrid sparse attention)
    reads: int | None = None  # … how many per layer and KV head

    def __post_init__(self) -> None:
        rewrites = self.reshape is not None and (self.reshape.think or self.reshape.merge)  # prunes or merges
        if self.cache_format is not None and not isinstance(self.cache_format, CacheFormat):
            raise KvvizError(f"a run's cache format is KIVI, a written scheme or QuantizedCache "
                             f"(kvviz.schemes.cache_format), got {type(self.cache_format).__name__}")
        if self.positions not in POSITIONS:
            raise KvvizError(f"positions must be 'original' or 'rerotated', got {self.positions!r}")
        if self.positions == "rerotated" and (self.policy is None or not self.policy.uniform or self.cache_format):
            raise KvvizError("re-rotated positions need a policy that keeps the same slots in every layer and KV head "
                             "(streaming_llm, random) and the model's own cache (no KIVI, QuantizedCache or written "
                             "scheme)")
        if rewrites:
            if self.cache_format is not None or self.positions == "rerotated":
                alone = self.cache_format.name if self.cache_format else "a quantized cache"
                raise KvvizError(f"pruning or merging runs without {alone} and with original positions (both rewrite "
                                 "the cache kvviz keeps for them)")
            if self.reshape.merge and (self.policy is None or self.mode not in ("prefill", "both")):
                raise KvvizError("merging folds what a prompt's compression evicts: it needs a policy and mode prefill "
                                 "or both (kvpress' MergingPress compresses the prompt)")
        if self.mode not in MODES:
            raise KvvizError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise KvvizError(f"every must be a positive integer, got {self.every!r}")
        if (self.reader is None) != (self.reads is None):
            raise KvvizError("a reader needs a count of slots to read per step (reads), and reads need a reader")
        if self.reads is not None and (isinstance(self.reads, bool) or not isinstance(self.reads, int)
                                       or self.reads < 1):
            raise KvvizError(f"reads must be a positive whole number of slots, got {self.reads!r}")
        if self.reader is not None and not isinstance(self.reader, (Policy, HybridSparse)):
            raise KvvizError(f"a reader is a policy or hybrid sparse attention, got {type(self.reader).__name__}")
        if self.reader is not None and self.positions == "rerotated":
            raise KvvizError("a reader hides slots from one step only; re-rotated positions move them for good")
        if self.policy is None and self.cache_format is None and self.reader is None:
            raise KvvizError("a run needs a policy, a reader, a quantized cache (KIVI, QuantizedCache, a scheme), or "
                             "several")
        if self.policy is not None:
            if self.budget is None:
                raise KvvizError("a policy run needs a budget (a slot count or a fraction)")
            slots_kept(self.budget, 1)  # refuses a malformed budget now, not in the middle of a run
            if isinstance(self.budget, int) and self.budget < 1:
                raise KvvizError(f"the budget keeps no slot ({self.budget}); keep at least one")
        elif self.budget is not None:
            raise KvvizError("a budget needs a policy to enforce it; choose one, or leave the budget out")
        if self.mode == "prefill" and self.every != 1:
            raise KvvizError("every N steps applies to compression before decode steps; use mode decode or both")

    @property
    def label(self) -> str:
        parts = []
        if self.policy is not None:
            every = f" every {self.every} steps" if self.every > 1 else ""
            parts.append(f"{self.policy.name}, budget {self.budget}, {self.mode}{every}")
        if self.reader is not None:
            parts.append(f"each step reads {self.reads} by {self.reader.name}"
                         + (f" (ρ {self.reader.compression_ratio:g})" if isinstance(self.reader, HybridSparse) else ""))
        if self.cache_format is not None:
            parts.append(self.cache_format.label)
        if self.reshape is not None and self.reshape.label:
            parts.append(self.reshape.label)
        where = " · original positions" if self.positions == "original" else \
            " · re-rotated positions (kept keys at the positions of their order in the cache)"
        return "; ".join(parts) + where


class CompressedSession:
    """A greedy session compressed by ``settings`` (see the module doc)."""

    def __init__(self, lm: LoadedModel, settings: RunSettings):
        self.lm, self.settings = lm, settings
        if settings.positions == "rerotated" and lm.attention.reads:
            raise KvvizError(f"{lm.name} picks the slots each step reads with an indexer whose keys carry their "
                             "positions too (sparse attention); re-rotating them is not built yet: use original "
                             "positions")
        rotary = Rotary(lm) if settings.positions == "rerotated" else None
        if settings.cache_format is not None and settings.cache_format.kind != "written" and lm.attention.latent \
                is not None:
            raise KvvizError(f"{lm.name} caches a latent per token (MLA); KIVI's window and transformers' "
                             "QuantizedCache are not built on it yet: take a cache written slot by slot (fp8-ds-mla, "
                             "int*-token, fp8-*, …)")
        cache_format = settings.cache_format.for_model(lm) if settings.cache_format is not None else None
        self.session = Session(lm, Sampling(), commits=lambda cache: Timeline(cache, lm.layers, lm.kv_heads,
                                                                               cache_format, rotary))
        self.timeline: Timeline = self.session.commits
        # attention each slot received so far, kept up to date only for policies that read it (H2O)
        self.running = torch.zeros(lm.layers, lm.kv_heads, 0, dtype=torch.float64)
        before = (settings.policy, settings.reader if isinstance(settings.reader, Policy) else None)
        self.accumulates = any(p is not None and p.accumulates for p in before)
        self.keep = 0  # this turn's budget in slots
        self.steps = 0  # decode steps of this turn so far
        self.prompt_end: list[int] = []  # per turn: slots cached after its prompt
        self.seen: torch.Tensor | None = None  # (L, KV, n): what the last step saw besides its own slot
        self.reasons = Reasons(lm.layers, lm.kv_heads)  # why each evicted slot went
        reads = any(p is not None and p.reads_hidden for p in before)
        self.hidden = HiddenLog(lm.layers) if reads else None  # the attention inputs, for policies that read them
        self.picks: dict = {}  # what the reader keeps between its choices (Candidates.scratch)
        self.chosen: dict[int, torch.Tensor] = {}  # a query-aware reader's picks in the pass under way, per layer
        if isinstance(settings.reader, HybridSparse):
            if lm.attention.latent is not None or lm.attention.reads:
                raise KvvizError(f"{lm.name} caches a latent per token; hybrid sparse attention is for models whose "
                                 "KV heads cache keys")
            self.session.selector = self._select
        self.scratch: dict = {}  # what the policy keeps between this run's decisions (Candidates.scratch)
        self.residual: int | None = None  # formats that flush: slots in their full-precision residual (None: none yet)

    def __len__(self) -> int:
        return len(self.session)

    def add_turn(self, text: str) -> None:
        """Prefill a user turn (full attention on the cache as it stands), then compress as the mode says."""
        start = len(self.session)
        with self._recording():
            self.session.add_user_turn(text)
        self._prompted(start)

    def take_prompt(self, session: Session) -> None:
        """:meth:`add_turn` of a first turn whose prompt ``session`` already holds (a fresh copy of a session with
        just that prompt prefilled: the same pass, not run again); this run takes the session over."""
        if len(self.session) or self.hidden is not None or session.commits.boundaries():
            raise KvvizError("only a fresh run of a policy that reads no hidden states takes over a prefilled prompt")
        self.session, self.timeline.cache, session.commits = session, session.cache, self.timeline
        session.selector = self._select if isinstance(self.settings.reader, HybridSparse) else None
        self._prompted(0)

    def add_ids(self, ids: list[int]) -> None:
        """:meth:`add_turn` for raw token ids (no chat template)."""
        start = len(self.session)
        with self._recording():
            self.session.add_ids(ids)
        self._prompted(start)

    def _recording(self):
        """The forward passes' attention inputs into :attr:`hidden` (when the policy reads them)."""
        return recording(self.lm, self.hidden) if self.hidden is not None else contextlib.nullcontext()

    def _prompted(self, start: int) -> None:
        self._computed(start)
        self._received(slice(start, len(self.session)))
        self.prompt_end.append(len(self.session))
        budget = self.settings.budget
        if self.settings.policy is not None:  # a count stands as it is; a fraction is of this prompt's slots
            self.keep = budget if isinstance(budget, int) else slots_kept(budget, len(self.session))
            if self.keep < 1:
                raise KvvizError(f"a budget of {budget} keeps no slot of this {len(self.session)}-slot prompt")
        self.steps = 0
        evicted = self._compress(self.settings.mode in ("prefill", "both"))
        self._flush(len(self.session) - start)
        reshape = self.settings.reshape
        if reshape is not None and (reshape.think or reshape.merge):
            self._reshape(reshape, evicted)

    def _reshape(self, reshape: Reshape, evicted: torch.Tensor | None) -> None:
        """ThinK's prunings and the merges of what the prompt's compression ``evicted`` (bool ``(L, KV, at)``), written
        into the cache and kept by the timeline (kvviz.edit.reshape)."""
        at = len(self.session)
        prunings = think(self.session, reshape.think, reshape.think_window, at) if reshape.think else ()
        merges = ()
        if reshape.merge and evicted is not None:
            kept = self.alive()
            merges = tuple(replace(m, round=len(self.prompt_end) - 1) for m in merging(
                self.session, evicted, at, reshape.merge_threshold, kept=kept))
        if self.timeline.reshape(at, Edit(prunings=prunings, merges=merges, merge_rule=reshape.merge_rule)):
            self.session.version += 1
            self.session.memo.clear()

    def step(self, token: int | None = None) -> torch.Tensor:
        """Decode one step — of ``token`` instead of the chosen one when given (teacher forcing) — after the
        compression due before it. Returns the step's next-token logits ``(V,)`` float32."""
        self.begin_step(token)
        with self._recording():
            self.session.step()
        return self.end_step()

    @property
    def batchable(self) -> bool:
        """Whether its decode steps can run in a batch of sessions (:mod:`kvviz.runs.lockstep`): evictions only hide
        slots (no cache format, pruning, merging or re-rotation rewrites the cache) and the policy reads no hidden
        states."""
        reshape = self.settings.reshape
        return (self.hidden is None and self.timeline.format is None and self.timeline.rotary is None
                and not (reshape is not None and (reshape.think or reshape.merge))
                and not isinstance(self.settings.reader, HybridSparse))  # it picks inside the session's own pass

    def begin_step(self, token: int | None = None) -> Session:
        """The part of :meth:`step` before its pass: the compression due, then ``token`` forced. Returns the session
        whose pending token the pass processes."""
        mode, every = self.settings.mode, self.settings.every
        due = mode in ("decode", "both") and self.steps % every == 0 or (
            mode == "after_steps" and self.steps and self.steps % every == 0)  # after step every − 1, 2·every − 1 …
        self._compress(due)
        self._read()
        self.seen = self.alive()
        if token is not None:
            self.session.force(token)
        return self.session

    def end_step(self) -> torch.Tensor:
        """The part of :meth:`step` after its pass (the session accepted it): what a query-aware reader picked, the
        attention the slots received, the quantization due. Returns the step's next-token logits ``(V,)`` float32."""
        if self.chosen:  # the slots the step saw but its reader did not pick: hidden from that step, as it ran
            at = len(self.session) - 1
            picked = torch.stack([self.chosen[layer][:, :at] for layer in range(self.lm.layers)])
            self.timeline.read(at, self.seen & ~picked)
            self.seen = self.seen & picked
            self.chosen = {}
            self.session.version += 1
            self.session.memo.clear()
        self._computed(len(self.session) - 1)
        self._received(slice(len(self.session) - 1, len(self.session)))
        self.steps += 1
        self._flush(1)
        return self.session.logits

    def _flush(self, added: int) -> None:
        """After a pass that added ``added`` slots (they attended unquantized), a flush when the cache format says
        one is due (QuantizedCache: kvviz.schemes.quanto); otherwise they join its residual."""
        cache_format = self.timeline.format
        if cache_format is None or not cache_format.flush_due(self.residual, added):
            if self.residual is not None:
                self.residual += added
            return
        self.timeline.flush(len(self.session), len(self.session))
        self.residual = 0
        self.session.version += 1
        self.session.memo.clear()

    # --- compression -----------------------------------------------------------------------------------------

    def alive(self) -> torch.Tensor:
        """Bool ``(L, KV, n)``: the cached slots the next step sees (not evicted, within each layer's window)."""
        return self.visible_to(len(self.session))

    def visible_to(self, slot: int) -> torch.Tensor:
        """Bool ``(L, KV, slot)``: the slots before ``slot`` that the step of ``slot`` saw (or will see)."""
        return ~self.timeline.hidden(slot, slot) & ~self.lm.attention.outside(slot, slot)[:, None]

    def _compress(self, evict: bool) -> torch.Tensor | None:
        """Compress before the slot about to be processed, as the mode says; the slots it evicted now (bool
        ``(L, KV, at)``), or None."""
        at = len(self.session)
        evicted = None
        if evict and self.settings.policy is not None:
            alive = self.alive()
            if int(alive.sum(-1).max()) > self.keep or self.settings.policy.decides_count:
                running = self.running.float() if self.accumulates else None
                candidates = Candidates(self.session, at, self.keep, alive, running, kept_share(self.settings.budget),
                                        self.hidden, self.scratch)
                decision = self.settings.policy.decide(candidates)
                self.reasons.record(decision)
                evicted = decision.evicted
        cache_format = self.timeline.format
        if self.timeline.record(at, evicted, cache_format.quantized_prefix(at) if cache_format else 0):
            self.session.version += 1
            self.session.memo.clear()
            if self.timeline.rotary is not None:  # the next token follows the kept ones
                self.session.transcript.renumbered = self.timeline.kept_count(at)
        return evicted

    def _select(self, layer: int, query: torch.Tensor, key: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """The session's decode steps: the slots the query-aware reader picks in ``layer`` (see
        :meth:`kvviz.recorder.Probe.select`), kept for :meth:`end_step`."""
        lm = self.lm
        group = lm.heads // lm.kv_heads
        seen = allowed[0, :: group if allowed.shape[1] > 1 else 1, 0]  # (KV, n): per KV head
        seen = seen.expand(lm.kv_heads, -1)
        chosen = self.settings.reader.pick(query[0, :, 0].view(lm.kv_heads, group, -1), key[0], seen,
                                           self.settings.reads)
        self.chosen[layer] = chosen.cpu()
        return chosen[None, :, None]

    def _read(self) -> None:
        """The reader's choice of the slots the step about to run reads (the others hidden from it alone)."""
        reader, at = self.settings.reader, len(self.session)
        self.chosen = {}
        if reader is None or isinstance(reader, HybridSparse):
            return
        alive = self.alive()
        if int(alive.sum(-1).max()) <= self.settings.reads and not reader.decides_count:
            return
        running = self.running.float() if self.accumulates else None
        decision = reader.decide(Candidates(self.session, at, self.settings.reads, alive, running, None, self.hidden,
                                            self.picks))
        self.timeline.read(at, decision.evicted)
        self.session.version += 1
        self.session.memo.clear()

    def _computed(self, start: int) -> None:
        """Re-rotated runs: note the keys of the slots from ``start`` as computed."""
        if self.timeline.rotary is not None:
            self.timeline.note_computed([slot.position for slot in self.session.transcript.slots[start:]])

    def _received(self, rows: slice) -> None:
        """Add the attention the slots got from the query slots ``rows`` (just processed) to :attr:`running`."""
        if not self.accumulates:
            return
        lm, n = self.lm, rows.stop
        self.running = torch.nn.functional.pad(self.running, (0, n - self.running.shape[-1]))
        if rows.stop - rows.start > 1:  # a prompt: its rows as they were computed
            self.running += received_attention(self.session, n, rows).double()
            return
        hidden = self.timeline.hidden(rows.start, n).to(lm.device)
        for layer in range(lm.layers):
            keys = lm.attention.keyed(*kv_cache.layer_kv(self.session.cache, layer))[0]  # (KV, n, D): what it saw
            query = self.session.queries.layer(layer)[:, rows]  # (H, 1, D)
            read = self.session.read_set(layer, rows.start)  # sparse selection: the slots the step read (None: all)
            unseen = hidden[layer] if read is None else hidden[layer] | ~read.to(hidden.device)
            weights = lm.attention.weights(query, keys, layer, unseen)[:, 0]  # (H, n)
            self.running[layer] += weights.double().cpu().view(lm.kv_heads, -1, n).sum(1)
