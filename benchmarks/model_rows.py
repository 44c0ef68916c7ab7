"""The model rows of the benchmark: loading, prefill, generation, what-ifs and memory, each against plain
transformers doing the same work in the same run."""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from benchmarks.harness import Row, paired_times, row, token_ids
from kvviz import kv_cache
from kvviz.edit.edit import Edit
from kvviz.model import load_model, resolve_checkpoint
from kvviz.quant.quantizer import Quantizer
from kvviz.session import Session
from kvviz.whatif import what_if


class Bench:
    def __init__(self, repeats: int):
        self.repeats = repeats
        self.lm = load_model()
        folder, _ = resolve_checkpoint(None)
        self.folder = folder
        self.plain = AutoModelForCausalLM.from_pretrained(folder, dtype=self.lm.dtype, attn_implementation="sdpa")
        self.plain.to(self.lm.device).eval().requires_grad_(False)
        self.warmed = False

    def warm(self, count: int = 4096) -> None:
        """One untimed plain prefill of ``count`` tokens, so that every row runs with the allocator in the state a
        long-running app is in: glibc hands out large tensors as fresh pages (page faults on first touch) until a large
        free raises its threshold. Without it the plain 1k decode step measured ~93 ms instead of ~79 ms, flattering
        the what-if ratios by up to 0.3. Once per bench."""
        if self.warmed:
            return
        self.warmed = True
        with torch.no_grad():
            self.plain(input_ids=torch.tensor([token_ids(self.lm, count)], device=self.lm.device),
                       cache=DynamicCache(config=self.plain.config), use_cache=True, logits_to_keep=1)

    def load(self) -> Row:
        def plain(_) -> None:
            AutoTokenizer.from_pretrained(self.folder)
            AutoModelForCausalLM.from_pretrained(self.folder, dtype=self.lm.dtype, attn_implementation="sdpa").to(
                self.lm.device)

        # 9 pairs: with 5 this row measured 0.91–1.22x across runs of unchanged loading code (one load is ~0.35 s,
        # and one slow load moves a median of 5); paired runs of 7 put it at ~1.07x (the custom attention's name
        # alone cost plain transformers ~1.07x)
        return row("load", *paired_times(lambda _: load_model(), plain, max(self.repeats, 9)), 1.2)

    def prefill(self, count: int) -> Row:
        """One turn of ``count`` tokens (chunked beyond :data:`kvviz.prefill.CHUNK`) vs one plain pass."""
        ids = token_ids(self.lm, count)
        tensor = torch.tensor([ids], device=self.lm.device)

        def plain(_) -> None:
            with torch.no_grad():
                self.plain(input_ids=tensor, cache=DynamicCache(config=self.plain.config), use_cache=True, logits_to_keep=1)

        repeats = self.repeats if count <= 4096 else min(self.repeats, 3)  # ~20 s a side at 8k on 2 CPU cores
        return row(f"prefill {count}", *paired_times(lambda _: Session(self.lm).add_ids(ids), plain, repeats), 1.3)

    def generate(self, count: int = 64) -> Row:
        ids = token_ids(self.lm, 32)
        tensor = torch.tensor([ids], device=self.lm.device)

        def ours(_) -> None:
            session = Session(self.lm)
            session.add_ids(ids)  # the prefill chooses the first token; each step decodes one more
            for _ in range(count - 1):
                session.step()

        def plain(_) -> None:
            self.plain.generate(tensor, max_new_tokens=count, min_new_tokens=count, do_sample=False, pad_token_id=2)

        rates = ([count / t for t in times] for times in paired_times(ours, plain, self.repeats))
        return row(f"generate {count}", *rates, 0.85, higher_is_better=True, unit="tok/s")

    def _context(self, count: int) -> Session:
        session = Session(self.lm)
        session.add_ids(token_ids(self.lm, count))
        return session

    def _plain_step(self, session: Session) -> tuple[Callable[[Any], object], Callable[[], Any]]:
        """One plain decode step of the newest slot on its cache (the action and its untimed cache setup)."""
        at = len(session) - 1
        prefix = [tuple(t[:, :, :at] for t in kv_cache.layer_kv(session.cache, layer)) for layer in range(self.lm.layers)]
        slot = session.transcript.slots[at]

        def step(cache) -> None:
            with torch.no_grad():
                self.plain(input_ids=torch.tensor([[slot.id]], device=self.lm.device), cache=cache, use_cache=True,
                           position_ids=torch.tensor([[slot.position]], device=self.lm.device), logits_to_keep=1)

        return step, lambda: kv_cache.build(self.plain.config, prefix)

    def whatif(self, count: int, quantize: bool = False, cold: bool = False, fp8: bool = False,
               scheme: str | None = None) -> Row:
        """A what-if at the newest slot. Warm (the interactive path): the full run of that step is already kept by
        the session, as after the first click. Cold: the session's memo is cleared before each run, so it runs the
        full and the edited pass (two decode steps by design; its target is twice the warm one's). ``fp8``: the
        quantization is an FP8 e4m3 cache with one scale per KV head, at 8 bits; ``scheme``: a named scheme's
        quantizers and bit-width (kvviz.schemes.catalogue), on the whole history."""
        session = self._context(count)
        at = len(session) - 1
        fp8_settings = {"keys": Quantizer("head", format="e4m3"), "values": Quantizer("head", format="e4m3")}
        bits, settings = ((8, 8), fp8_settings) if fp8 else ((4, 4), {})
        if scheme is not None:
            from kvviz.schemes.catalogue import Scheme

            shown = Scheme(scheme).edit([at], at)  # one pass before the step: the whole history as the scheme stores it
            bits = (max(shown.key_bits.values()), max(shown.value_bits.values()))
            settings = {"keys": shown.keys, "values": shown.values}
        edit = Edit.quantize(range(at), *bits, **settings) if quantize else Edit.evict(range(at // 2, at // 2 + 10))
        # quantizing: the history at 4 bits, every other run all but slot 0, so that each run quantizes (a run on the
        # quantization the previous one left in the session's kept cache would reuse it)
        edits = itertools.cycle([edit, Edit.quantize(range(1, at), *bits, **settings)] if quantize else [edit])
        step, cache = self._plain_step(session)
        ours, plain = paired_times(lambda _: what_if(session, next(edits)), step, max(self.repeats, 11),  # short
                                    ours_setup=session.memo.clear if cold else lambda: None, theirs_setup=cache)
        kind = scheme or ('fp8' if fp8 else 'quant' if quantize else 'evict')
        name = f"whatif {kind} {count}{' cold' if cold else ''}"
        return row(name, ours, plain, (1.5 if quantize else 1.3) * (2 if cold else 1))

    def click_during_prefill(self, count: int = 1024, long: int = 8000) -> Row:
        """Fairness: a first click's what-if (cold) at ``count`` slots while another session prefills ``long`` tokens
        in a thread (as two browser sessions on one server), against the same click alone."""
        session = self._context(count)
        at = len(session) - 1
        edit = Edit.evict(range(at // 2, at // 2 + 10))

        def click() -> float:
            session.memo.clear()
            start = time.perf_counter()
            what_if(session, edit)
            return time.perf_counter() - start

        alone = [click() for _ in range(self.repeats + 1)][1:]
        ids, during, took = token_ids(self.lm, long), [], []
        other = threading.Thread(target=lambda: took.append(_timed(lambda: Session(self.lm).add_ids(ids))))
        other.start()
        while other.is_alive():
            during.append(click())
        other.join()
        during = during[:-1] or during  # the last one may have run partly alone
        ratio = statistics.median(during) / statistics.median(alone)
        return Row(f"click during prefill {long}", ratio, 2.0, False, ratio <= 2.0,
                   f"what-if at {count} slots: {statistics.median(during):.3g} s ({min(during):.3g}–{max(during):.3g})"
                   f" × {len(during)} while another session's {long}-token prefill ran ({took[0]:.1f} s) vs "
                   f"{statistics.median(alone):.3g} s alone; 2.0 = an even share of the machine")

    def memory(self, count: int) -> Row:
        usage = self._context(count).memory()
        ratio = usage.recorded_bytes / usage.kv_bytes
        return Row(f"memory {count}", ratio, 2.0, False, ratio <= 2.0,
                   f"recorded {usage.recorded_bytes:,} B vs KV cache {usage.kv_bytes:,} B")


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start
