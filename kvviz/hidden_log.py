"""The attention layers' input hidden states of a run's slots — what kvpress' ``ScorerPress.score`` receives as
``hidden_states`` — recorded only for policies that read them (``Policy.reads_hidden``).

One forward pre-hook per attention module, installed once per model (marked on the module itself: a model freed and
another made at its address must get hooks of its own), copies batch row 0 of the module's
``hidden_states`` (after the layer's input norm) into the :class:`HiddenLog` of the forward passes inside
:func:`recording` — this thread's only (a ContextVar), so other sessions on the same model record nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from kvviz.model import LoadedModel

_log: ContextVar[HiddenLog | None] = ContextVar("kvviz_hidden_log", default=None)
HOOKED = "_kvviz_records_hidden"  # set on an attention module that carries the hook


class HiddenLog:
    """Per layer, the input hidden states ``(n, hidden)`` of the slots recorded so far."""

    def __init__(self, layers: int):
        self._parts: list[list[torch.Tensor]] = [[] for _ in range(layers)]

    def layer(self, layer: int) -> torch.Tensor:
        """``(n, hidden)``: every recorded slot's input to ``layer``'s attention."""
        parts = self._parts[layer]
        if len(parts) > 1:
            parts[:] = [torch.cat(parts)]
        return parts[0]

    def __len__(self) -> int:
        return sum(part.shape[0] for part in self._parts[0])

    def _cut(self, length: int) -> None:
        for layer in range(len(self._parts)):
            if self._parts[layer]:
                self._parts[layer][:] = [self.layer(layer)[:length]]


@contextmanager
def recording(lm: LoadedModel, log: HiddenLog) -> Iterator[HiddenLog]:
    """Record the forward passes inside this block into ``log``; a pass that fails leaves ``log`` as it was."""
    for index, module in enumerate(lm.attention_modules):
        if not getattr(module, HOOKED, False):
            module.register_forward_pre_hook(_hook(index), with_kwargs=True)
            setattr(module, HOOKED, True)
    before, token = len(log), _log.set(log)
    try:
        yield log
    except BaseException:
        log._cut(before)
        raise
    finally:
        _log.reset(token)


def _hook(layer: int):
    def record(module, args, kwargs) -> None:
        log = _log.get()
        if log is not None:
            states = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            log._parts[layer].append(states[0].detach().clone())
    return record
