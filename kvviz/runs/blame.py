"""Blame: at one step of a policy run, which evicted slots mattered (docs/math.md §9).

Each candidate — an evicted slot, or a word of evicted slots — is put back alone into the policy's cache of that step,
and the step is re-run; the report says how much KL to the full run's next-token distribution is left after each
restore and whether the full run's token comes back on top. All variants of the step run in one batched forward pass
(kvviz.step_variants): the step's token is fed once per variant, at its true position, on the step's cache (shared,
not copied), and a probe gives every variant its own mask — its restored slots visible, and of the new slots only
its own.

Any step of :attr:`~kvviz.runs.policy_run.TurnRun.records` can be blamed, the prefill's last row (step -1, which
chose the first reply token) too: it is re-run the same way, on the cache its prompt was prefilled on. Restoring
nothing gives the run's own KL at that step. Restoring everything gives KL 0 at the first step after a
compression of the prompt; later, the slots the run wrote itself hold K/V computed on the compressed cache, and the
KL left with everything restored (``kl_all_restored``) is what eviction at this step cannot explain. Quantization, if
the run had any, stays as the run had it.

On a model with sparse selection (DSA) the candidates may be the slots the step saw but did not read (``of="unread"``:
its indexer picked others in some layer): each is put into the step's read set alone, in every layer, beside the
slots its indexer picks ("everything back": every slot it saw read).

In a run that rounds its cache (KIVI, a written scheme) the candidates may be the rounded slots instead
(``of="rounded"``): each is put back at full precision alone. The step's cache then holds its slots as the run stored
them followed by a copy of each as computed (keys are cached after RoPE, so a copy attends as its slot does), and each
variant's mask picks, per slot, which of the two it sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz import kv_cache
from kvviz.errors import KvvizError
from kvviz.runs.policy_run import PolicyRun, TurnRun
from kvviz.step_variants import rerun
from kvviz.whatif.full_step import layer_views, prefix_kv, stacked
from kvviz.whatif.metrics import kl_divergence


@dataclass(frozen=True)
class BlameRow:
    slots: list[int]
    kl_after_restore: float
    top1_restored: bool
    mass: float  # attention the step's query pays these slots with nothing hidden (sum over layers and query heads)


@dataclass(frozen=True)
class Blame:
    turn: int
    step: int
    slot: int
    kl: float  # the policy's KL at this step, nothing restored
    kl_all_restored: float  # every evicted slot back (see the module doc)
    top1_full: int
    top1_policy: int
    rows: list[BlameRow]  # best restore first
    unit: str = "slot"  # what a row restores: one slot, or a word
    of: str = "evicted"  # what is restored: evicted slots, or rounded ones at full precision


def _slot_of(run: TurnRun, step: int) -> int:
    return run.record(step).slot


def variants(run: TurnRun, step: int, restores: list[set[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-run decode step ``step`` once with every slot restored and once per set in ``restores``, batched.
    Returns the logits ``(1 + len(restores), V)`` and the evicted mask of the step ``(L, KV, at)``.

    When the run never rewrote its cache (no quantization, moved keys, pruning or merging), its own cache is lent (its
    slots before ``at`` are what the step saw; the variants' slots are written into its spare room and cut off
    afterwards); otherwise the step's cache is rebuilt as it stood."""
    session = run.forced.session
    at = _slot_of(run, step)
    hidden = session.commits.hidden(at, at).cpu()  # (L, KV, at)
    visible = (~hidden)[None].repeat(1 + len(restores), 1, 1, 1)
    visible[0] = True
    for row, slots in enumerate(restores, start=1):
        visible[row, :, :, sorted(slots)] = True
    timeline, cache = run.forced.timeline, None  # None: the session's own
    if run.forced.settings.cache_format is not None or timeline.rotary or timeline.parts:
        cache = kv_cache.over(layer_views(stacked(prefix_kv(session, at, session.commits.edit_at(at)), len(visible))),
                              at, written=session.commits.writes(at), indexed=kv_cache.indexer_keys(session.cache, at))
    return rerun(session, at, visible, cache), hidden


def unread_slots(run: TurnRun, step: int) -> torch.Tensor:
    """Bool ``(L, KV, at)``: the slots the step saw but did not read (sparse selection: its indexer picked others)."""
    session, at = run.forced.session, _slot_of(run, step)
    read = torch.stack([session.read_set(layer, at)[:at] for layer in range(session.lm.layers)])  # (L, at)
    return run.forced.visible_to(at).cpu() & ~read[:, None].cpu()


def reading_variants(run: TurnRun, step: int, reads: list[set[int]]) -> torch.Tensor:
    """Re-run step ``step`` once reading every slot it saw and once per set in ``reads`` with those slots read
    besides its indexer's picks (in every layer where it saw them), batched; returns the logits ``(1 + len(reads),
    V)``."""
    session = run.forced.session
    lm, at = session.lm, _slot_of(run, step)
    seen = run.forced.visible_to(at).cpu()  # (L, KV, at)
    extra = torch.zeros(1 + len(reads), lm.layers, at, dtype=torch.bool)
    extra[0] = True
    for row, slots in enumerate(reads, start=1):
        extra[row, :, sorted(slots)] = True
    return rerun(session, at, seen[None].repeat(len(extra), 1, 1, 1), reads=extra & seen.any(1))


def rounding_variants(run: TurnRun, step: int, restores: list[set[int]]) -> torch.Tensor:
    """Re-run step ``step`` once with every slot it saw at full precision and once per set in ``restores`` with those
    slots at full precision, the others as the run stored them (rounded), batched; returns the logits
    ``(1 + len(restores), V)``."""
    session = run.forced.session
    lm, at = session.lm, _slot_of(run, step)
    seen = run.forced.visible_to(at).cpu()  # (L, KV, at)
    both = [(torch.cat([sk, k], 1), torch.cat([sv, v], 1)) for (sk, sv), (k, v) in
            zip(prefix_kv(session, at, session.commits.edit_at(at)), prefix_kv(session, at))]
    visible = torch.zeros(1 + len(restores), lm.layers, lm.kv_heads, 2 * at, dtype=torch.bool)
    visible[0, :, :, at:] = seen  # everything as computed
    for row, slots in enumerate(restores, start=1):
        back = sorted(slots)
        visible[row, :, :, :at] = seen
        visible[row, :, :, back] = False
        visible[row, :, :, [at + s for s in back]] = seen[:, :, back]
    indexed = kv_cache.indexer_keys(session.cache, at)  # DSA: each slot's indexer key, for both copies of it
    cache = kv_cache.over(layer_views(stacked(both, len(visible))), 2 * at, written=session.commits.writes(at),
                          indexed=None if indexed is None else [torch.cat([keys, keys], 1) for keys in indexed])
    return rerun(session, at, visible, cache)


def rounded_slots(run: TurnRun, step: int) -> torch.Tensor:
    """Bool ``(L, KV, at)``: the slots the step saw rounded (KIVI's or a written scheme's), in the layers it rounds."""
    session, at = run.forced.session, _slot_of(run, step)
    edit = session.commits.edit_at(at)
    mask = torch.zeros(session.lm.layers, session.lm.kv_heads, at, dtype=torch.bool)
    slots = sorted(s for s in set(edit.key_bits) | set(edit.value_bits) if s < at)
    layers = [layer for layer in range(session.lm.layers) if layer not in edit.exact_layers]
    mask[torch.tensor(layers, dtype=torch.long)[:, None], :, torch.tensor(slots, dtype=torch.long)[None]] = True
    return mask & run.forced.visible_to(at).cpu()


def attention_mass(run: TurnRun, step: int) -> torch.Tensor:
    """Attention the step's query would pay each earlier slot with nothing hidden, summed over layers and query
    heads: ``(at,)`` (from the recorded queries; it ranks the candidates of a blame)."""
    session = run.forced.session
    at, lm = _slot_of(run, step), run.forced.session.lm
    queries = torch.stack([session.queries.layer(layer)[:, at : at + 1] for layer in range(lm.layers)])  # (L, H, 1, D)
    keys = torch.stack([session.commits.keys_at(layer, at, at + 1) for layer in range(lm.layers)])  # (L, KV, at+1, D)
    if lm.attention.latent is not None:  # the latent and the RoPE key, each as the step saw it
        keys = lm.attention.keyed(keys, torch.stack([session.commits.values_at(layer, at, at + 1)
                                                     for layer in range(lm.layers)]))
    return lm.attention.weights(queries, keys, None)[..., 0, :at].sum((0, 1)).cpu()


def units(run: TurnRun, hidden: torch.Tensor, unit: str) -> list[list[int]]:
    """The candidate slots of a step (evicted or rounded: True anywhere in ``hidden`` ``(L, KV, at)``): one per slot,
    or per word (a word starts at a piece that begins with a space or a line break)."""
    slots = hidden.any(0).any(0).nonzero()[:, 0].tolist()
    if unit == "slot":
        return [[s] for s in slots]
    if unit != "word":
        raise KvvizError(f"unit must be 'slot' or 'word', got {unit!r}")
    pieces = run.forced.session.transcript.slots
    words: list[list[int]] = []
    for s in slots:
        text = pieces[s].text
        if words and words[-1][-1] == s - 1 and not text[:1].isspace():
            words[-1].append(s)
        else:
            words.append([s])
    return words


def blame(result: PolicyRun, turn: int = -1, step: int | None = None, unit: str = "slot", limit: int = 32,
          of: str | None = None) -> Blame:
    """Rank the evicted candidates of ``step`` (-1: the prefill's last row; default: the divergence, else the step of
    largest KL) by the KL left after restoring each alone — or, ``of="rounded"``, the rounded slots by the KL left
    with each at full precision (default: evicted in a policy's run, rounded in a quantized cache's alone); the
    ``limit`` candidates the step's query attends to most with nothing hidden are re-run, all in one batched pass
    with the variants "everything back" and "nothing back"."""
    run = result.turns[turn]
    of = _restorable(result, of or ("rounded" if restorable(result)[:1] == ["rounded"] else "evicted"))
    if step is None:
        step = run.divergence if run.divergence is not None else max(run.records, key=lambda r: r.kl).step
    at = _slot_of(run, step)
    candidates = rounded_slots(run, step) if of == "rounded" else unread_slots(run, step) if of == "unread" else \
        run.forced.session.commits.hidden(at, at)
    mass = attention_mass(run, step)
    paid = mass.tolist()
    candidates = sorted(units(run, candidates, unit), key=lambda slots: -sum(paid[s] for s in slots))[:limit]
    logits = _variants(run, step, [set(), *(set(c) for c in candidates)], of)
    kl = kl_divergence(run.full_logits[step + 1], logits).tolist()  # all variants at once
    top1 = logits.argmax(-1).tolist()
    target = run.full_ids[step + 1]
    rows = [BlameRow(sorted(c), kl[2 + i], top1[2 + i] == target, sum(paid[s] for s in c))
            for i, c in enumerate(candidates)]
    rows.sort(key=lambda r: (r.kl_after_restore, -r.mass))
    return Blame(turn if turn >= 0 else len(result.turns) + turn, step, at, kl[1], kl[0], target, top1[1], rows, unit,
                 of)


def restorable(result: PolicyRun) -> list[str]:
    """What a blame of this run can put back: ``evicted`` slots (a policy's run), ``rounded`` ones (KIVI's or a
    written cache format's, at full precision), ``unread`` ones into the read set (sparse selection)."""
    settings = result.settings
    rounds = settings.cache_format is not None and settings.cache_format.per_slot
    reads = bool(result.turns and result.turns[-1].forced.session.lm.attention.reads)
    evicts = settings.policy is not None or settings.reader is not None  # a reader hides what a step did not read
    return ["evicted"] * evicts + ["rounded"] * rounds + ["unread"] * reads


def _restorable(result: PolicyRun, of: str) -> str:
    """``of`` if the run has such slots to put back (:func:`restorable`); why not in one line otherwise."""
    settings = result.settings
    if of in restorable(result):
        return of
    if of not in ("evicted", "rounded", "unread"):
        raise KvvizError(f"blame restores 'evicted', 'rounded' or 'unread' slots, got {of!r}")
    if of == "unread":
        raise KvvizError("this model reads every slot it sees (no sparse selection): no slot is unread")
    if of == "evicted" and settings.policy is None and settings.reader is None:
        raise KvvizError("this run evicts nothing: blame its rounded slots (of='rounded')")
    if of == "rounded" and settings.cache_format is not None:
        raise KvvizError(f"{settings.cache_format.name} rounds the whole prefix again together at each flush: a slot's "
                         "rounding cannot be put back alone")
    raise KvvizError("this run rounds nothing (KIVI or a written cache format do): blame its evicted slots")


def _row(run: TurnRun, step: int, slots: list[int], logits: torch.Tensor, mass: torch.Tensor) -> BlameRow:
    """One restore measured against the full run's next-token distribution at ``step``."""
    return BlameRow(sorted(slots), float(kl_divergence(run.full_logits[step + 1], logits)),
                    int(logits.argmax()) == run.full_ids[step + 1], float(mass[sorted(slots)].sum()))


def restore(result: PolicyRun, slots: list[int], turn: int = -1, step: int = 0, of: str = "evicted") -> BlameRow:
    """The step re-run with ``slots`` restored together (e.g. the top 3 of a blame; ``of="rounded"``: at full
    precision)."""
    run = result.turns[turn]
    _restorable(result, of)
    logits = _variants(run, step, [set(slots)], of)
    return _row(run, step, slots, logits[1], attention_mass(run, step))


def _variants(run: TurnRun, step: int, restores: list[set[int]], of: str) -> torch.Tensor:
    """The logits of the step with everything put back, then with each of ``restores`` (evicted slots back, rounded
    ones at full precision, or unread ones read)."""
    if of == "rounded":
        return rounding_variants(run, step, restores)
    return reading_variants(run, step, restores) if of == "unread" else variants(run, step, restores)[0]
