"""One row per architecture family kvviz supports, on tiny random models built from their configs (no download): a
warm what-if eviction at 512 slots against one plain transformers decode step of the same model on the same cache (a
hybrid's recurrent layers holding their state before the step, a DSA model's indexer its keys)."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from benchmarks.harness import Row, paired_times, row, token_ids
from kvviz import kv_cache, recurrent
from kvviz.edit.edit import Edit
from kvviz.model import LoadedModel, resolve_checkpoint
from kvviz.session import Session
from kvviz.whatif import what_if
from kvviz.tiny_models import ARCHITECTURES, tiny


def architecture_rows(bench, count: int = 512) -> list[Row]:
    tokenizer = AutoTokenizer.from_pretrained(resolve_checkpoint(None)[0])
    rows = []
    for kind in ARCHITECTURES:
        ours = tiny(kind).requires_grad_(False)  # transformers runs soft-capped attention (Gemma 2) and learned
        eager = ours.config.model_type in ("gemma2", "gpt_oss")  # sinks (gpt-oss) eagerly only
        plain = tiny(kind, attention="eager" if eager else "sdpa").requires_grad_(False)
        plain.load_state_dict(ours.state_dict())
        lm = LoadedModel(model=ours, tokenizer=tokenizer, name=f"tiny {kind}", device=torch.device("cpu"))
        session = Session(lm)
        session.add_ids(token_ids(lm, count))
        at = len(session) - 1
        edit = Edit.evict(range(at // 2, at // 2 + 10))
        prefix = [tuple(t[:, :, :at] for t in kv_cache.layer_kv(session.cache, layer)) for layer in range(lm.layers)]
        slot = session.transcript.slots[at]
        states = recurrent.states_at(ours, session.queries.inputs, at)  # a hybrid's recurrent layers before the step
        indexed = kv_cache.indexer_keys(session.cache, at)  # a DSA model's indexer keys

        def step(cache, slot=slot, plain=plain) -> None:
            with torch.no_grad():
                plain(input_ids=torch.tensor([[slot.id]]), position_ids=torch.tensor([[slot.position]]), cache=cache,
                      use_cache=True, logits_to_keep=1)

        ours_times, plain_times = paired_times(lambda _: what_if(session, edit), step, max(bench.repeats, 11),
                                               theirs_setup=lambda p=prefix, c=plain.config, s=states, i=indexed:
                                               _plain(c, p, s, i))
        rows.append(row(f"whatif evict {count}, tiny {kind}", ours_times, plain_times, 1.3))
    return rows


def _plain(config, prefix: list, states: dict, indexed: list | None = None):
    """transformers' cache holding ``prefix`` (per layer K/V) and, in a hybrid model, its recurrent layers' states (in
    a DSA model, its indexer keys ``indexed``)."""
    cache = kv_cache.build(config, prefix, indexed)
    recurrent.place(cache, recurrent.layers(states))
    return cache
