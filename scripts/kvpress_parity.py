"""kvviz's policies against kvpress itself, slot for slot: the kept set of every layer and KV head after a prompt's
compression, and the next-token logits of the first decode step on the compressed cache.

kvpress 0.5.5 pins transformers < 5.3, so it lives in a venv of its own and this script runs in three parts:

    .venv/bin/python scripts/kvpress_parity.py prompts OUT.json            # kvviz: chat-templated prompt ids
    KVPRESS_PYTHON scripts/kvpress_parity.py press OUT.json PRESS.json      # kvpress: kept sets and logits
    .venv/bin/python scripts/kvpress_parity.py compare OUT.json PRESS.json [PRESS_NAME]  # kvviz: the table

with KVPRESS_PYTHON a venv made by ``python3 -m venv V && V/bin/pip install torch==2.13.0 kvpress==0.5.5``. The
prompts are made from a seed when the script runs (none is in the repository); the presses and ratios are CASES.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

CASES = [  # (press, kvpress arguments); each at every ratio of RATIOS
    ("StreamingLLMPress", {}), ("KnormPress", {}), ("TOVAPress", {}), ("RandomPress", {"seed": 0}),
    ("SnapKVPress", {}), ("SnapKVPress", {"window_size": 32, "kernel_size": 7}), ("PyramidKVPress", {}),
    ("ObservedAttentionPress", {}), ("AdaKVPress", {"press": "SnapKVPress"}),
]
RATIOS = (0.5, 0.75)
WORDS = ("harbour lantern keeper ship noon dusk ledger tide compass anchor rope gull storm chart island beacon "
         "captain cargo mast sail wave reef fog bell").split()


def make_prompts(count: int = 2, seed: int = 2026) -> list[str]:
    """Chat messages of about 300 tokens: a log of facts and a question about one of them."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        facts = [f"The {rng.choice(WORDS)} of {rng.choice(WORDS)} {i} was {rng.choice(WORDS)} at {rng.randint(1, 99)}."
                 for i in range(26)]
        prompts.append(" ".join(facts) + f" What was the {facts[7].split()[1]} of {facts[7].split()[3]} 7?")
    return prompts


def prompts(out: str) -> None:
    """kvviz's venv: the prompts' ids as kvviz's chat session prefills them, and the model folder."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kvviz.model import load_model, resolve_checkpoint
    from kvviz.session import Session

    lm = load_model()
    ids = []
    for text in make_prompts():
        session = Session(lm)
        session.add_user_turn(text)
        ids.append(session.transcript.ids)
    Path(out).write_text(json.dumps({"folder": str(resolve_checkpoint(None)[0]), "ids": ids}))


def press(data: str, out: str) -> None:
    """kvpress' venv (no kvviz import): each case's kept sets per layer and KV head, and the first decode step's
    logits on the compressed cache (position n, the token the full prefill chose)."""
    import torch
    import kvpress
    from transformers import AutoModelForCausalLM, DynamicCache

    spec = json.loads(Path(data).read_text())
    models = {}
    results = []
    for name, arguments in CASES:
        attention = "eager" if name == "ObservedAttentionPress" else "sdpa"
        if attention not in models:
            models[attention] = AutoModelForCausalLM.from_pretrained(spec["folder"], dtype=torch.float32,
                                                                     attn_implementation=attention).eval()
        model = models[attention]
        for ratio in RATIOS:
            for prompt, ids in enumerate(spec["ids"]):
                made = {k: getattr(kvpress, v)() if k == "press" else v for k, v in arguments.items()}
                instance = getattr(kvpress, name)(**made)
                instance.compression_ratio = ratio
                results.append({"press": name, "arguments": arguments, "ratio": ratio, "prompt": prompt,
                                **_pressed(model, instance, ids, eager=attention == "eager")})
    Path(out).write_text(json.dumps(results))


def _pressed(model, instance, ids: list[int], eager: bool) -> dict:
    import torch
    from transformers import DynamicCache

    tokens = torch.tensor([ids])
    with torch.no_grad():
        full = model(input_ids=tokens, past_key_values=DynamicCache(config=model.config), use_cache=True,
                     output_attentions=eager)
        cache = DynamicCache(config=model.config)
        with instance(model):
            out = model(input_ids=tokens, past_key_values=cache, use_cache=True, output_attentions=eager)
        kept = []
        for layer, (whole, pressed) in enumerate(zip(full.past_key_values.layers, cache.layers)):
            index = {}
            for head in range(whole.keys.shape[1]):
                for slot in range(whole.keys.shape[2]):
                    index.setdefault((head, whole.keys[0, head, slot].numpy().tobytes()), slot)
            masked = getattr(model.model.layers[layer].self_attn, "masked_key_indices", None)
            heads = []
            for head in range(pressed.keys.shape[1]):
                slots = {index[(head, row.numpy().tobytes())] for row in pressed.keys[0, head]}
                if masked is not None:  # AdaKV masks instead of removing
                    slots -= {int(s) for h, s in zip(masked[1].tolist(), masked[2].tolist()) if h == head}
                heads.append(sorted(slots))
            kept.append(heads)
        first = int(out.logits[0, -1].argmax())
        step = model(input_ids=torch.tensor([[first]]), position_ids=torch.tensor([[len(ids)]]),
                     past_key_values=cache, use_cache=True)
    return {"kept": kept, "first": first, "logits": step.logits[0, -1].tolist()}


def compare(data: str, pressed: str, only: str = "") -> None:
    """kvviz's venv: each case (of the press ``only``, if given) through :func:`kvviz.policies.kvpress.from_kvpress`
    in prefill mode, against kvpress."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from kvviz.model import load_model
    from kvviz.policies.base import Ratio
    from kvviz.policies.kvpress import from_kvpress
    from kvviz.runs.compressed import CompressedSession, RunSettings

    lm = load_model()
    spec = json.loads(Path(data).read_text())
    print("| press | arguments | ratio | prompt | slots | kept sets equal (layer × KV head) | "
          "slots kept differently | max abs Δ logit |")
    print("|---|---|---|---|---|---|---|---|")
    for case in json.loads(Path(pressed).read_text()):
        if only and case["press"] != only:
            continue
        ids = spec["ids"][case["prompt"]]
        ours = from_kvpress(case["press"], **case["arguments"])
        run = CompressedSession(lm, RunSettings(ours.policy, Ratio(case["ratio"]), "prefill", positions=ours.positions))
        run.add_ids(ids)
        alive = run.alive()
        kept = [[alive[layer, head].nonzero()[:, 0].tolist() for head in range(lm.kv_heads)] for layer in range(lm.layers)]
        pairs = [(set(a), set(b)) for la, lb in zip(kept, case["kept"]) for a, b in zip(la, lb)]
        same = sum(a == b for a, b in pairs)
        moved = sum(len(a ^ b) for a, b in pairs) // 2
        logits = run.step(case["first"])
        gap = float((logits - torch.tensor(case["logits"])).abs().max())
        print(f"| {case['press']} | {case['arguments'] or ''} | {case['ratio']} | {case['prompt']} | {len(ids)} | "
              f"{same}/{len(pairs)} | {moved} | {gap:.1e} |")


if __name__ == "__main__":
    {"prompts": prompts, "press": press, "compare": compare}[sys.argv[1]](*sys.argv[2:])
