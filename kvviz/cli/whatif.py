"""``python -m kvviz whatif``: replay a chat, then compare the full and an edited cache at one step."""

from __future__ import annotations

import argparse
import json

from typing import TYPE_CHECKING

from kvviz.cli.common import add_chat_arguments, budget, replay_chat, some_text
from kvviz.errors import KvvizError
from kvviz.numbers import top_k
from kvviz.spelling import spell
from kvviz.quant.names import scheme_family

if TYPE_CHECKING:  # imported when the command runs (see kvviz/cli/common.py)
    from kvviz.edit.edit import Edit
    from kvviz.session import Session


MAX_LISTED = 1 << 20  # slots (layers, heads) one flag may name: more than any context kvviz runs


def parse_slots(spec: str, what: str = "slot", limit: int = MAX_LISTED) -> list[int]:
    """``"3,5-9"`` → ``[3, 5, 6, 7, 8, 9]``; each number below ``limit`` and at most ``limit`` in all, checked
    before any range is expanded (``0-400000000`` is refused in one line, not built)."""
    ranges: list[tuple[int, int]] = []
    try:
        for part in filter(None, (p.strip() for p in spec.split(","))):
            first, _, last = part.partition("-")
            if len(first) > 12 or len(last) > 12:
                raise ValueError(part)
            start, stop = int(first), int(last or first)
            if start < 0 or stop < start:
                raise ValueError(part)
            ranges.append((start, stop))
    except ValueError:
        raise KvvizError(f"bad {what} list {spec!r:.60}; use numbers and ranges like 3,5-9") from None
    over = next((stop for _, stop in ranges if stop >= limit), None)
    if over is not None:
        raise KvvizError(f"{what} {over:,} does not exist: {what}s run from 0 to {limit - 1:,}")
    if sum(stop - start + 1 for start, stop in ranges) > limit:
        raise KvvizError(f"the {what} list {spec!r:.60} names more than {limit:,} {what}s")
    return [number for start, stop in ranges for number in range(start, stop + 1)]


def slot_list(text: str) -> str:
    """An argparse type: a slot (layer, head) list, checked as :func:`parse_slots` does before the chat runs."""
    try:
        parse_slots(text)
    except KvvizError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def table_rows(text: str) -> int:
    """An argparse type: ``--topk``, checked as the library checks it (:func:`kvviz.numbers.top_k`)."""
    try:
        return top_k(text)
    except KvvizError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def bits_for(text: str) -> str:
    """An argparse type: ``SLOTS=BITS`` (``--bits-for 0-9=4``), checked before the chat runs."""
    spec, equals, bits = text.rpartition("=")
    if not equals:
        raise argparse.ArgumentTypeError(f"give slots=bits such as 0-9=4, got {text!r:.60}")
    try:
        parse_slots(spec)
        _bits(bits)
    except KvvizError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _bits(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise KvvizError(f"bit-width must be a number (16, 8, 4, 3 or 2), got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_chat_arguments(parser)
    parser.add_argument("--at", type=int, default=None, help="slot whose step is re-run (default: the newest)")
    parser.add_argument("--evict", default="", type=slot_list, metavar="SPEC", help="slots to evict, e.g. 3,5-9")
    parser.add_argument("--evict-layers", default=None, type=slot_list, metavar="SPEC",
                        help="evict only in these layers")
    parser.add_argument("--evict-heads", default=None, type=slot_list, metavar="SPEC",
                        help="evict only in these KV heads")
    parser.add_argument("--bits", default=None, help="bit-width of keys and values of all slots before --at")
    parser.add_argument("--key-bits", default=None, help="bit-width of all keys before --at")
    parser.add_argument("--value-bits", default=None, help="bit-width of all values before --at")
    parser.add_argument("--bits-for", action="append", default=[], type=bits_for, metavar="SPEC=B",
                        help="bits for some slots")
    parser.add_argument("--group-size", type=int, default=None, help="channels per quantization group")
    parser.add_argument("--key-axis", choices=("channel", "token", "head", "tensor"), default="channel")
    parser.add_argument("--value-axis", choices=("channel", "token", "head", "tensor"), default="token")
    parser.add_argument("--format", choices=("int", "e4m3", "e5m2"), default="int",
                        help="number format of the quantized slots: integer codes, or FP8 (with --bits 8)")
    parser.add_argument("--symmetric", action="store_true")
    parser.add_argument("--pre-rope", action="store_true",
                        help="round the keys before RoPE and rotate them back (KVQuant), with the model's frequencies")
    parser.add_argument("--scheme", default=None, metavar="NAME",
                        help="store the slots before --at as a named scheme does (int4-token, kivi-2, fp8-e4m3-head, "
                             "quanto-4, …: see quant-compare), instead of the bit and axis flags")
    parser.add_argument("--calibration", default=None, type=some_text, metavar="TEXT",
                        help="the text a static FP8 scheme (fp8-e4m3-head-static, …) calibrates its scales on "
                             "(default: a built-in paragraph)")
    parser.add_argument("--window", type=int, default=0, help="most recent slots kept at full precision")
    parser.add_argument("--policy", default=None,
                        help="eviction policy: streaming_llm, h2o, snapkv, tova, pyramid_kv, ada_kv, key_norm, random, "
                             "observed_attention, key_diff, lag_kv, chunk_kv, expected_attention, cur, critical_kv, "
                             "kv_zip, r_kv, rocket_kv; one from KVVIZ_POLICIES; or a kvpress press, "
                             "kvpress:SnapKVPress")
    parser.add_argument("--budget", default=None, type=budget, help="slots (or fraction) the policy keeps")
    parser.add_argument("--think", type=float, default=None, metavar="RATIO",
                        help="prune this share of key channels per layer and KV head as ThinK does")
    parser.add_argument("--think-window", type=int, default=32, metavar="W", help="ThinK's scoring queries")
    parser.add_argument("--merge", action="store_true",
                        help="merge the evicted slots into their most similar kept slot (D2O, kvpress' MergingPress)")
    parser.add_argument("--merge-rule", choices=("average", "add"), default="average",
                        help="average (D2O, MergingPress) or add (CaM)")
    parser.add_argument("--merge-threshold", type=float, default=0.0, help="least key similarity to merge")
    parser.add_argument("--layer", type=int, default=0, help="detail layer")
    parser.add_argument("--head", type=int, default=0, help="detail query head")
    parser.add_argument("--topk", type=table_rows, default=10, help="next tokens listed (1 to 1,024)")
    parser.add_argument("--continue", dest="continuation", type=int, default=0, metavar="N",
                        help="greedy N tokens with both caches")


def build_edit(args: argparse.Namespace, session: Session, at: int) -> Edit:
    """The Edit the flags describe (policy first, hand edits on top)."""
    from kvviz.edit.edit import Edit
    from kvviz.quant.quantizer import Quantizer

    edit = Edit()
    if args.policy is not None:
        from kvviz.policies.registry import make_policy
        from kvviz.policies.user import available

        if args.budget is None:
            raise KvvizError("--policy needs --budget (slots or a fraction kept)")
        try:
            policy = make_policy(available(), args.policy)
        except KvvizError as exc:
            raise KvvizError(f"--policy needs a policy of the table (kvviz's, KVVIZ_POLICIES', kvpress:NAME): {exc}") \
                from None
        edit = policy.edit(session, args.budget, at)
    key_bits: dict[int, int] = {}
    value_bits: dict[int, int] = {}
    for flag, tables in ((args.bits, (key_bits, value_bits)), (args.key_bits, (key_bits,)),
                         (args.value_bits, (value_bits,))):
        if flag is not None:
            for table in tables:
                table.update(dict.fromkeys(range(at), _bits(flag)))
    lm, slots = session.lm, len(session)
    for item in args.bits_for:
        spec, _, bits = item.rpartition("=")
        for slot in parse_slots(spec, limit=slots):
            key_bits[slot] = value_bits[slot] = _bits(bits)
    evictions = ()
    if args.evict:
        layers = None if args.evict_layers is None else parse_slots(args.evict_layers, "layer", lm.layers)
        heads = None if args.evict_heads is None else parse_slots(args.evict_heads, "KV head", lm.kv_heads)
        evictions = Edit.evict(parse_slots(args.evict, limit=slots), layers, heads).evictions
    rope = {}
    if args.pre_rope:
        from kvviz.rope import pre_rope

        rope = pre_rope(session.lm)
    hand = Edit(
        evictions=evictions, key_bits=key_bits, value_bits=value_bits, full_precision_window=args.window,
        keys=Quantizer(args.key_axis, args.group_size, args.symmetric, format=args.format, **rope),
        values=Quantizer(args.value_axis, args.group_size, args.symmetric, format=args.format),
    )
    if args.scheme is not None:
        from dataclasses import replace

        from kvviz.schemes.catalogue import Scheme

        if key_bits or value_bits or args.window or args.pre_rope:
            raise KvvizError("--scheme says how every slot is stored; drop --bits, --key-bits, --value-bits, "
                             "--bits-for, --window and --pre-rope (a scheme takes +prerope)")
        from kvviz.schemes.calibration import CALIBRATION_TEXT
        from kvviz.schemes.compare import scheme_edits

        stored = scheme_edits(session, [Scheme(args.scheme)], at, args.calibration or CALIBRATION_TEXT)[0]
        hand = replace(stored, evictions=hand.evictions)
    edit = edit.merged(hand)
    if args.merge:
        from dataclasses import replace

        from kvviz.policies.reshaping import merge_evicted

        edit = replace(merge_evicted(session, edit, at, args.merge_threshold), merge_rule=args.merge_rule)
    if args.think is not None:
        from dataclasses import replace

        from kvviz.policies.reshaping import think

        edit = replace(edit, prunings=think(session, args.think, args.think_window, at))
    return edit


def run(args: argparse.Namespace) -> None:
    if args.scheme is not None:
        scheme_family(args.scheme)  # refused before torch loads and the chat runs
    from kvviz.whatif import what_if

    session = replay_chat(args)
    at = len(session) - 1 if args.at is None else args.at
    result = what_if(session, build_edit(args, session, at), at, args.layer, args.head, args.topk, args.continuation)
    document = {"tokens": session.transcript.rows()} | result.to_dict()
    if args.json:
        print(json.dumps(document, ensure_ascii=False))
        return
    _print_summary(document)


def _print_summary(doc: dict) -> None:
    nt = doc["next_token"]
    print(f"step of slot {doc['at']} (position {doc['position']}): KL {nt['kl']:.6g} nats, TV {nt['tv']:.6g}, "
          f"top-1 {'FLIPS' if nt['top1_changed'] else 'unchanged'}")
    print(f"{'full':<32} {'edited':<32}")
    for full, edited in zip(nt["full"], nt["edited"]):
        left = f"{spell(full['text'])} {full['prob']:.4f} (#{full['rank_other'] + 1})"
        right = f"{spell(edited['text'])} {edited['prob']:.4f} (#{edited['rank_other'] + 1})"
        print(f"{left:<32} {right:<32}")
    memory = doc["memory"]
    print(f"cache bytes: full {memory['full_bytes']:,} · fp16 {memory['fp16_bytes']:,} · edited {memory['edited_bytes']:,}")
    rho = [max(row) for row in doc["heads"]["rho"]]
    print("max ρ by layer:", " ".join(f"{r:.3f}" for r in rho))
    if doc["continuation"]:
        cont = doc["continuation"]
        where = cont["first_divergence"]
        where = "none (the same tokens)" if where is None else f"token {where}"
        print(f"full:   {cont['full']!r}\nedited: {cont['edited']!r}\nfirst divergence: {where}")
