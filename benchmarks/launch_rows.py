"""Launch rows: ATen operations dispatched by a warm what-if ÷ those of one plain transformers decode step at the same
length. Counted with a ``TorchDispatchMode``: deterministic, so a stable proxy on any machine for what a GPU pays in
kernel launches (each operation is at least one launch)."""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.harness import Row, row, token_ids
from kvviz import kv_cache
from kvviz.edit.edit import Edit
from kvviz.session import Session
from kvviz.whatif import what_if


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations dispatched inside the block (by name in :attr:`ops`)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.views = 0  # of them, views (slice, unsqueeze, alias, …): metadata only, no kernel on a GPU

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        self.views += bool(func.is_view)
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def kernels(self) -> int:
        """The operations that are not views."""
        return self.total - self.views


def count(action) -> OpCounter:
    with torch.no_grad(), OpCounter() as counter:
        action()
    return counter


def launch_rows(bench, length: int = 1024) -> list[Row]:
    session = Session(bench.lm)
    session.add_ids(token_ids(bench.lm, length))
    at = len(session) - 1
    slot = session.transcript.slots[at]
    prefix = [tuple(t[:, :, :at] for t in kv_cache.layer_kv(session.cache, layer)) for layer in range(bench.lm.layers)]

    cache = kv_cache.build(bench.plain.config, prefix)  # built before counting: a plain decode loop has its cache

    def plain() -> None:
        bench.plain(input_ids=torch.tensor([[slot.id]], device=bench.lm.device),
                    position_ids=torch.tensor([[slot.position]], device=bench.lm.device),
                    cache=cache, use_cache=True, logits_to_keep=1)

    baseline = count(plain)
    rows = []
    for name, edit, target in (("evict", Edit.evict(range(at // 2, at // 2 + 10)), 1.05),
                               ("quant", Edit.quantize(range(at // 2), 4), 1.05)):
        what_if(session, edit, at=at)  # warm: the full run is kept
        ours = count(lambda: what_if(session, edit, at=at))
        launch = row(f"launches whatif {name} {length}", ours.total, baseline.total, target, unit="ops")
        launch.detail += (f"; views excluded (metadata only, no kernel): {ours.kernels} vs {baseline.kernels} = "
                          f"{ours.kernels / baseline.kernels:.2f}")
        rows.append(launch)
    return rows
