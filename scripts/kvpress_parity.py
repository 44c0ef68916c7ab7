"""kvviz's policies against kvpress itself, slot for slot: the kept set of every layer and KV head after a prompt's
compression, and the next-token logits of the first decode step on the compressed cache.

kvpress 0.5.5 pins transformers < 5.3, so it lives in a venv of its own and this script runs in three parts:

    .venv/bin/python scripts/kvpress_parity.py prompts OUT.json            # kvviz: chat-templated prompt ids
    KVPRESS_PYTHON scripts/kvpress_parity.py press OUT.json PRESS.json [PRESS_NAME | own]  # kvpress: kept sets, logits
    .venv/bin/python scripts/kvpress_parity.py compare OUT.json PRESS.json [PRESS_NAME]  # kvviz: the table

and the same for DecodingPress with ``decoding-press`` (kvpress) and ``decoding-compare`` (kvviz), for the presses that
change the cache (ThinKPress, MergingPress) with ``reshape-press`` and ``reshape-compare`` (kvviz's what-if);
``own-code OUT.json PRESS.json KVPRESS_PACKAGE`` runs kvpress' own press modules inside kvviz's venv.

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
    ("ObservedAttentionPress", {}), ("AdaKVPress", {"press": "SnapKVPress"}), ("KeyDiffPress", {}),
    ("LagKVPress", {}), ("LagKVPress", {"lag_size": 32, "n_sink": 8}), ("LagKVPress", {"cross_scoring": True}),
    ("ChunkKVPress", {"press": "KnormPress"}), ("ChunkKVPress", {"press": "KeyDiffPress", "chunk_length": 10}),
    ("ExpectedAttentionPress", {}), ("ExpectedAttentionPress", {"use_covariance": False, "n_future_positions": 64}),
    ("CURPress", {}), ("CURPress", {"leverage_type": "kv_avg", "local_window_size": 8}),
    ("CriticalKVPress", {"press": "KnormPress"}), ("CriticalKVPress", {"press": "CURPress", "first_stage_ratio": 0.3}),
    ("ChunkKVPress", {"press": "SnapKVPress"}), ("CriticalKVPress", {"press": "SnapKVPress"}),
    ("KVzipPress", {}), ("KVzipPress", {"layerwise": True}),
    ("KVzipPress", {"kvzip_plus_normalization": True, "chunk_size": 128}),
]
OWN_CASES = [  # presses kvviz runs through kvpress' own code (kvviz.policies.kvpress.own_code): `press … own`
    ("CapPress", {}), ("BlockPress", {"press": "KnormPress"}), ("BlockPress", {"press": "SnapKVPress", "block_size": 64}),
    ("ChunkPress", {"press": "KnormPress", "chunk_length": 128}), ("CompactorPress", {}), ("NonCausalAttnPress", {}),
    ("EntropyGatedChunkKVPress", {"press": "KnormPress"}), ("CriticalAdaKVPress", {"press": "SnapKVPress"}),
    ("LeverageScorePress", {}), ("AdaKVPress", {"press": "KnormPress"}), ("ChunkKVPress", {"press": "TOVAPress"}),
    ("CriticalKVPress", {"press": "TOVAPress"}), ("SimLayerKVPress", {"n_recent": 64, "lazy_threshold": 0.5}),
]
ROTATED_CASES = [("KeyRerotationPress", {"press": "StreamingLLMPress"})]  # kept keys re-rotated: `press … rotated`
FILE_CASES = [("file:assets/presses/far_keys_press.py:FarKeysPress", {"power": 2.0})]  # a user's file: `press … file`
RATIOS = (0.5, 0.75)
DECODING = [  # DecodingPress(base_press, compression_interval, target_size), teacher-forced on the full reply
    ("KnormPress", 4, 96), ("KnormPress", 1, 200), ("KeyDiffPress", 5, 128), ("KeyDiffPress", 2, 300),
    # over other scorers kvviz runs kvpress' own DecodingPress on a mirror of its cache
    ("TOVAPress", 3, 200), ("StreamingLLMPress", 4, 128), ("ExpectedAttentionPress", 4, 150)]
BUILT = [  # presses that act while decoding, built the same way on both sides from kvpress' names: `decoding-press … built`
    "PrefillDecodingPress(prefilling_press=KnormPress(compression_ratio=0.5), decoding_press=DecodingPress("
    "KeyDiffPress(), compression_interval=4, target_size=150))",
    "CompressionRatioDecodingPress(base_press=TOVAPress(), compression_interval=4, target_compression_ratio=0.5)",
    "DMSPress(press=KnormPress(), threshold=-4.0, sliding_window_size=32, decoding=True)",
    "ComposedPress([KnormPress(compression_ratio=0.3), SnapKVPress(compression_ratio=0.3)])",
    "PerLayerCompressionPress(press=KnormPress(), compression_ratios=[0.25, 0.75] * 15)",
]
STEPS = 14
RESHAPING = [  # presses that change the cache: ThinK(channel ratio, window), MergingPress(press, ratio, threshold)
    ("ThinKPress", {"key_channel_compression_ratio": 0.25}), ("ThinKPress", {"key_channel_compression_ratio": 0.5,
                                                                            "window_size": 16}),
    ("MergingPress", {"press": "KnormPress", "compression_ratio": 0.5}),
    ("MergingPress", {"press": "KeyDiffPress", "compression_ratio": 0.75, "similarity_threshold": 0.2}),
]
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


def press(data: str, out: str, only: str = "") -> None:
    """kvpress' venv (no kvviz import): each case's kept sets per layer and KV head, and the first decode step's
    logits on the compressed cache (position n, the token the full prefill chose)."""
    import torch
    import kvpress
    from transformers import AutoModelForCausalLM, DynamicCache

    spec = json.loads(Path(data).read_text())
    models = {}
    results = []
    for name, arguments in {"own": OWN_CASES, "file": FILE_CASES, "rotated": ROTATED_CASES}.get(only, CASES):
        if only and only not in ("own", "file", "rotated") and name != only:
            continue
        attention = "eager" if name == "ObservedAttentionPress" else "sdpa"
        if attention not in models:
            models[attention] = AutoModelForCausalLM.from_pretrained(spec["folder"], dtype=torch.float32,
                                                                     attn_implementation=attention).eval()
        model = models[attention]
        for ratio in RATIOS:
            for prompt, ids in enumerate(spec["ids"]):
                made = {k: getattr(kvpress, v)() if k == "press" else v for k, v in arguments.items()}
                instance = _press_class(kvpress, name)(**made)
                try:
                    instance.compression_ratio = ratio
                except AttributeError:  # an adaptive press (SimLayerKV) decides its own ratio
                    pass
                pressed = _rerotated if name == "KeyRerotationPress" else _pressed
                results.append({"press": name, "arguments": arguments, "ratio": ratio, "prompt": prompt,
                                **pressed(model, instance, ids, eager=attention == "eager")})
    Path(out).write_text(json.dumps(results))


def _press_class(kvpress, name: str) -> type:
    """kvpress' press ``name``, or ``file:PATH:CLASS``: a class in a file of its own."""
    if not name.startswith("file:"):
        return getattr(kvpress, name)
    import importlib.util

    path, _, cls = name.removeprefix("file:").rpartition(":")
    spec = importlib.util.spec_from_file_location("user_press", Path(__file__).resolve().parents[1] / path)
    sys.modules["user_press"] = module = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return getattr(module, cls)


def _rerotated(model, instance, ids: list[int], eager: bool) -> dict:
    """KeyRerotationPress' kept sets (the positions it re-rotates from, recorded layer by layer: its keys are no
    longer the full forward's) and the first decode step's logits."""
    import torch
    from transformers import DynamicCache

    recorded, rerotate = [], type(instance)._rerotate_cos_sin

    def recording(x, inv_freq, selected_positions):
        recorded.append(selected_positions[0].tolist())
        return rerotate(x, inv_freq, selected_positions)

    type(instance)._rerotate_cos_sin = staticmethod(recording)
    try:
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            with instance(model):
                out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
            first = int(out.logits[0, -1].argmax())
            kept_count = cache.layers[0].keys.shape[2]
            step = model(input_ids=torch.tensor([[first]]), position_ids=torch.tensor([[kept_count]]),
                         past_key_values=cache, use_cache=True)
    finally:
        type(instance)._rerotate_cos_sin = staticmethod(rerotate)
    return {"kept": [[sorted(head) for head in layer] for layer in recorded], "first": first,
            "logits": step.logits[0, -1].tolist()}


def _pressed(model, instance, ids: list[int], eager: bool) -> dict:
    import torch
    from transformers import DynamicCache

    tokens = torch.tensor([ids])
    with torch.no_grad():
        full = model(input_ids=tokens, past_key_values=DynamicCache(config=model.config), use_cache=True,
                     output_attentions=eager)
        cache = DynamicCache(config=model.config)
        torch.manual_seed(0)  # a press that draws (LeverageScorePress' sketch): kvviz seeds 0 before each decision
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


def reshape_press(data: str, target: str) -> None:
    """kvpress' venv: each RESHAPING case on prompt 0: the pruned key channels (ThinK: the channels zero in every
    key) or the kept slots (MergingPress) per layer and KV head, and the first decode step's probabilities."""
    import torch
    import kvpress
    from transformers import AutoModelForCausalLM, DynamicCache

    spec = json.loads(Path(data).read_text())
    model = AutoModelForCausalLM.from_pretrained(spec["folder"], dtype=torch.float32, attn_implementation="sdpa").eval()
    results = []
    for prompt, ids in enumerate(spec["ids"]):
        for name, arguments in RESHAPING:
            made = {k: getattr(kvpress, v)() if k == "press" else v for k, v in arguments.items() if k != "compression_ratio"}
            instance = getattr(kvpress, name)(**made)
            if "compression_ratio" in arguments:
                instance.compression_ratio = arguments["compression_ratio"]
            case = {"press": name, "arguments": arguments, "prompt": prompt}
            if name == "MergingPress":
                case |= _pressed(model, instance, ids, eager=False)
            else:
                cache = DynamicCache(config=model.config)
                with torch.no_grad():
                    with instance(model):
                        out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
                    first = int(out.logits[0, -1].argmax())
                    step = model(input_ids=torch.tensor([[first]]), position_ids=torch.tensor([[len(ids)]]),
                                 past_key_values=cache, use_cache=True)
                case |= {"first": first, "logits": step.logits[0, -1].tolist(),
                         "pruned": [[(layer.keys[0, h, : len(ids)] == 0).all(0).nonzero()[:, 0].tolist()
                                     for h in range(layer.keys.shape[1])] for layer in cache.layers]}
            results.append(case)
    Path(target).write_text(json.dumps(results))


def reshape_compare(data: str, pressed: str) -> None:
    """kvviz's venv: each RESHAPING case as a what-if at the first decode step (ThinK's prunings, or the press's
    evictions merged), against kvpress: the channel or kept sets, and the top-10 probabilities."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from kvviz.edit.edit import Edit
    from kvviz.model import load_model
    from kvviz.policies.base import Ratio
    from kvviz.policies.kvpress.presses import from_kvpress
    from kvviz.policies.reshaping import merge_evicted, think
    from kvviz.session import Session
    from kvviz.whatif import what_if

    lm = load_model()
    spec = json.loads(Path(data).read_text())
    print("| press | arguments | prompt | sets equal (layer × KV head) | merges | max abs Δp over the top 10 |")
    print("|---|---|---|---|---|---|")
    for case in json.loads(Path(pressed).read_text()):
        session = Session(lm)
        session.add_ids(spec["ids"][case["prompt"]])
        session.force(case["first"])
        session.step()
        at, arguments = len(session) - 1, dict(case["arguments"])
        if case["press"] == "ThinKPress":
            prunings = think(session, arguments["key_channel_compression_ratio"], arguments.get("window_size", 32), at)
            edit, ours, theirs = Edit(prunings=prunings), [list(p.channels) for p in prunings], \
                [heads for layer in case["pruned"] for heads in layer]
        else:
            press = from_kvpress(arguments.pop("press"), compression_ratio=arguments.pop("compression_ratio"))
            evicted = press.policy.decision(session, Ratio(press.ratio.ratio), at).evicted
            edit = merge_evicted(session, Edit.from_evicted(evicted), at,
                                 threshold=arguments.get("similarity_threshold", 0.0))
            ours = [(~evicted[layer, head]).nonzero()[:, 0].tolist() for layer in range(lm.layers)
                    for head in range(lm.kv_heads)]
            theirs = [heads for layer in case["kept"] for heads in layer]
        result = what_if(session, edit, at=at, topk=10)
        probabilities = torch.softmax(torch.tensor(case["logits"], dtype=torch.float64), -1)
        gap = max(abs(c.prob - float(probabilities[c.id])) for c in result.next_token.edited)
        same = sum(sorted(a) == sorted(b) for a, b in zip(ours, theirs))
        print(f"| {case['press']} | {case['arguments']} | {case['prompt']} | {same}/{len(ours)} | {len(edit.merges)} | "
              f"{gap:.1e} |")


def decoding_press(data: str, target: str, only: str = "") -> None:
    """kvpress' venv: each DECODING case teacher-forced for STEPS decode steps on the full model's greedy reply:
    every step's logits, and layer 0's kept slots at the end (layer 0's keys depend on the token and position only,
    so they name their slots; deeper layers' keys depend on what the compressed cache let them see)."""
    import torch
    import kvpress
    from transformers import AutoModelForCausalLM, DynamicCache

    spec = json.loads(Path(data).read_text())
    model = AutoModelForCausalLM.from_pretrained(spec["folder"], dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = spec["ids"][0]
    with torch.no_grad():
        forced, cache, tokens = [], DynamicCache(config=model.config), torch.tensor([ids])
        for _ in range(STEPS):  # the full model's greedy reply
            out = model(input_ids=tokens, past_key_values=cache, use_cache=True)
            forced.append(int(out.logits[0, -1].argmax()))
            tokens = torch.tensor([[forced[-1]]])
        whole = model(input_ids=torch.tensor([ids + forced]), use_cache=True).past_key_values.layers[0].keys[0]
        results = []
        cases = [(expression, eval(expression, vars(kvpress)), None) for expression in BUILT] if only == "built" \
            else [(base, kvpress.DecodingPress(getattr(kvpress, base)(), compression_interval=interval,
                                               target_size=size), (interval, size)) for base, interval, size in DECODING]
        for base, instance, settings in cases:
            cache, logits = DynamicCache(config=model.config), []
            with instance(model):
                out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
                for step, token in enumerate(forced[:-1]):
                    out = model(input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[len(ids) + step]]),
                                past_key_values=cache, use_cache=True)
                    logits.append(out.logits[0, -1].tolist())
            # each kept key's slot: the nearest key of the full forward (computed in another batch shape, so equal
            # only to rounding; keys of other tokens or positions are far apart)
            rows = [torch.cdist(cache.layers[0].keys[0, h], whole[h]).argmin(-1) for h in range(whole.shape[0])]
            masked = getattr(model.model.layers[0].self_attn, "masked_key_indices", None)  # DMS, AdaKV: masked rows
            gone = [set() for _ in rows] if masked is None else [
                {int(r) for m, r in zip(masked[1].tolist(), masked[2].tolist()) if m == h} for h in range(len(rows))]
            kept = [sorted(int(slot) for row, slot in enumerate(rows[h].tolist()) if row not in gone[h])
                    for h in range(len(rows))]
            interval, size = settings or (None, None)
            results.append({"base": base, "interval": interval, "target": size, "forced": forced,
                            "logits": logits, "kept_layer0": kept})
    Path(target).write_text(json.dumps(results))


def decoding_compare(data: str, pressed: str) -> None:
    """kvviz's venv: each DECODING case as ``from_kvpress("DecodingPress", …)`` (mode after_steps), against kvpress."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from kvviz.model import load_model
    from kvviz.policies.kvpress.presses import from_kvpress
    from kvviz.runs.compressed import CompressedSession, RunSettings

    lm = load_model()
    ids = json.loads(Path(data).read_text())["ids"][0]
    print("| DecodingPress base_press | compression_interval | target_size | decode steps | layer 0 kept sets equal "
          "| … with the same key norms | max abs Δ logit over the steps |")
    print("|---|---|---|---|---|---|---|")
    from kvviz.policies.kvpress.own_code import kvpress
    from kvviz.policies.kvpress.presses import from_press

    cases = []
    for case in json.loads(Path(pressed).read_text()):
        if case["interval"] is None:  # a BUILT case: the same expression over kvpress' names
            cases.append((case, from_press(eval(case["base"], vars(kvpress())))))
            continue
        cases.append((case, from_kvpress("DecodingPress", base_press=case["base"], compression_interval=case["interval"],
                                         target_size=case["target"])))
        if case["base"] in ("KnormPress", "KeyDiffPress"):  # native above; kvpress' own code on the mirror here
            own = kvpress().DecodingPress(getattr(kvpress(), case["base"])(), compression_interval=case["interval"],
                                          target_size=case["target"])
            cases.append(({**case, "base": case["base"] + " (own code)"}, from_press(own)))
    for case, ours in cases:
        run = CompressedSession(lm, RunSettings(ours.policy, ours.ratio, ours.mode, ours.every))
        run.add_ids(ids)
        gap = 0.0
        for token, theirs in zip(case["forced"][:-1], case["logits"]):
            gap = max(gap, float((run.step(token) - torch.tensor(theirs)).abs().max()))
        run._compress(run.steps % run.settings.every == 0)  # kvpress compresses after the last step too
        alive = run.alive()
        ours_kept = [alive[0, h].nonzero()[:, 0].tolist() for h in range(lm.kv_heads)]
        same = sum(a == b for a, b in zip(ours_kept, case["kept_layer0"]))
        keys = run.session.layer_kv(0)[0]  # layer 0's keys name their slots: equal norms are ties
        norms = lambda h, slots: torch.linalg.vector_norm(keys[h, slots], dim=-1).sort().values  # noqa: E731
        tied = sum(torch.equal(norms(h, a), norms(h, b)) for h, (a, b) in enumerate(zip(ours_kept, case["kept_layer0"])))
        print(f"| {case['base']} | {case['interval']} | {case['target']} | {len(case['logits'])} | "
              f"{same}/{lm.kv_heads} | {tied}/{lm.kv_heads} | {gap:.1e} |")


def compare(data: str, pressed: str, only: str = "") -> None:
    """kvviz's venv: each case (of the press ``only``, if given) through :func:`kvviz.policies.kvpress.presses.from_kvpress`
    in prefill mode, against kvpress."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from kvviz.model import load_model
    from kvviz.policies.base import Ratio
    from kvviz.policies.kvpress.presses import from_kvpress
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
        if case["press"].startswith("file:"):  # the file's class as --press-file runs it
            from kvviz.policies.by_name import policy_named
            from kvviz.policies.kvpress.presses import KvpressPolicy
            from kvviz.policies.user import load

            path, _, cls = case["press"].removeprefix("file:").rpartition(":")
            root = Path(__file__).resolve().parents[1]
            ours = KvpressPolicy(policy_named(load(f"{root / path}:{cls}"), cls, case["arguments"]), None)
        else:
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


def own_code(data: str, pressed: str, package: str) -> None:
    """kvviz's venv: kvpress' own press modules (from the kvpress ``package`` folder of the other venv, loaded
    without kvpress' ``__init__``, which patches transformers' attention) run through
    :mod:`kvviz.policies.kvpress.score_code`, against kvpress' kept sets."""
    import importlib
    import types

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    for name, path in (("kvpress", Path(package)), ("kvpress.presses", Path(package) / "presses")):
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    from kvviz.model import load_model
    from kvviz.policies.kvpress.presses import from_kvpress
    from kvviz.runs.compressed import CompressedSession, RunSettings

    modules = {"SnapKVPress": "snapkv_press", "KnormPress": "knorm_press", "KeyDiffPress": "keydiff_press",
               "StreamingLLMPress": "streaming_llm_press"}
    lm = load_model()
    spec = json.loads(Path(data).read_text())
    print("| kvpress' own code | ratio | prompt | kept sets equal to kvpress' (layer × KV head) |")
    print("|---|---|---|---|")
    for case in json.loads(Path(pressed).read_text()):
        if case["press"] not in modules or case["arguments"]:
            continue
        press = getattr(importlib.import_module(f"kvpress.presses.{modules[case['press']]}"), case["press"])
        ours = from_kvpress(press(), compression_ratio=case["ratio"])
        run = CompressedSession(lm, RunSettings(ours.policy, ours.ratio, "prefill"))
        run.add_ids(spec["ids"][case["prompt"]])
        alive = run.alive()
        same = sum(set(alive[layer, head].nonzero()[:, 0].tolist()) == set(case["kept"][layer][head])
                   for layer in range(lm.layers) for head in range(lm.kv_heads))
        print(f"| {case['press']} | {case['ratio']} | {case['prompt']} | {same}/{lm.layers * lm.kv_heads} |")


if __name__ == "__main__":
    {"prompts": prompts, "press": press, "compare": compare, "decoding-press": decoding_press,
     "decoding-compare": decoding_compare, "own-code": own_code, "reshape-press": reshape_press,
     "reshape-compare": reshape_compare}[sys.argv[1]](*sys.argv[2:])
