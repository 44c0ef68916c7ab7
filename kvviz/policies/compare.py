"""Two (or more) policies at the same budget, side by side: their masks' overlap and what each does to the step."""

from __future__ import annotations

import torch

from kvviz.policies import POLICIES


def compare_policies(session, names: list[str], budget: int | float, at: int | None = None) -> dict:
    """Run each policy's Edit through :func:`~kvviz.whatif.what_if` at slot ``at``.

    Returns ``{"rows": [{policy, kept, kl, tv, top1_changed, mean_rho, edited_bytes}], "overlap": Jaccard index of the
    evicted (layer, KV head, slot) entries of the first two policies, "edits": {name: Edit}}``.
    """
    from kvviz.whatif import what_if

    lm = session.lm
    at = len(session) - 1 if at is None else at
    rows, masks, edits = [], {}, {}
    for name in names:
        edit = POLICIES[name]().edit(session, budget, at)
        result = what_if(session, edit, at=at, topk=5)
        masks[name], edits[name] = edit.evicted_mask(at, lm.layers, lm.kv_heads), edit
        rho = torch.tensor(result.heads["rho"])
        rows.append({"policy": name, "kept": int((~masks[name]).sum(-1).float().mean()),
                     "kl": result.next_token.kl, "tv": result.next_token.tv,
                     "top1_changed": result.next_token.top1_changed, "mean_rho": float(rho.mean()),
                     "edited_bytes": result.memory["edited_bytes"]})
    overlap = None
    if len(names) >= 2:
        first, second = masks[names[0]], masks[names[1]]
        union = (first | second).sum()
        overlap = float((first & second).sum() / union) if union else 1.0
    return {"rows": rows, "overlap": overlap, "edits": edits}
