"""``python -m kvviz policy-run``: answer turns with the full cache and with a policy compressing it as it runs;
print the aligned replies, the divergence, per-step KL / agreement, the eviction log and the blame table."""

from __future__ import annotations

import argparse
from pathlib import Path
import json
import math
import sys

from kvviz.cli.common import add_chat_arguments, budget, positive, ratio
from kvviz.errors import KvvizError
from kvviz.numbers import press_budgets
from kvviz.quant.names import WRITTEN_FAMILIES, run_family
from kvviz.spelling import spell


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_chat_arguments(parser)
    parser.add_argument("--policy", default=None,
                        help="eviction policy (built-in, from KVVIZ_POLICIES, or a kvpress press: kvpress:SnapKVPress)")
    parser.add_argument("--press-file", default=None, metavar="FILE.py:NAME",
                        help="a kvpress press class in your own file (a BasePress / ScorerPress subclass), run with "
                             "kvpress' own code; --param takes its arguments, --ratio is its compression_ratio")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a policy parameter (a press's: kvpress' argument names, e.g. window_size=64)")
    parser.add_argument("--budget", default=None, type=budget, help="slots kept (e.g. 64) or a fraction (e.g. 0.5)")
    parser.add_argument("--ratio", default=None, type=ratio,
                        help="kvpress' compression ratio instead of a budget: the fraction removed, int(n·(1 − R)) kept")
    parser.add_argument("--mode", choices=("prefill", "decode", "both", "after_steps"), default=None,
                        help="when to compress (default: prefill for a kvpress press, else decode)")
    parser.add_argument("--every", type=positive, default=1, help="compress every N decode steps (decode mode)")
    parser.add_argument("--read-with", default=None, metavar="POLICY",
                        help="keep the cache; before each decode step this policy's scores choose the slots the step "
                             "reads (sparse attention, as Quest or RocketKV's second stage); with --reads")
    parser.add_argument("--reads", type=positive, default=None, metavar="N",
                        help="slots each decode step reads per layer and KV head (with --read-with)")
    parser.add_argument("--positions", choices=("original", "rerotated"), default="original",
                        help="keep original positions, or re-rotate kept keys to their order (streaming_llm, random)")
    parser.add_argument("--kivi-bits", type=int, default=None, help="quantize as KIVI does, keys and values at B bits")
    parser.add_argument("--kivi-group", type=positive, default=32, help="KIVI's group of slots (G)")
    parser.add_argument("--kivi-residual", type=int, default=128, help="KIVI's full-precision recent slots (R)")
    parser.add_argument("--kivi-grouping", choices=("blocks", "shared"), default="blocks",
                        help="key scales per group of G slots (KIVI) or one shared by all quantized slots")
    parser.add_argument("--think", type=float, default=0.0, metavar="R",
                        help="prune the share R of key channels at each prompt, as ThinK (kvpress' ThinKPress)")
    parser.add_argument("--think-window", type=positive, default=32, help="ThinK's scoring queries")
    parser.add_argument("--merge", action="store_true", help="merge what each prompt's compression evicts into the "
                        "most similar kept slots (kvpress' MergingPress; modes prefill, both)")
    parser.add_argument("--merge-rule", choices=("average", "add"), default="average")
    parser.add_argument("--merge-threshold", type=float, default=0.0, help="least key similarity to merge")
    parser.add_argument("--scheme", default=None, metavar="NAME",
                        help="the run's cache as a scheme: quanto-4 / quanto-2 (transformers' QuantizedCache, quanto "
                             "backend, with --residual, --q-group-size and --axis), hqq-8/4/3/2 (its HQQ backend), "
                             "kivi-4 / kivi-2 (KIVI, G 32, R 128), or a per-slot scheme rounded as each slot is "
                             "written: int*-token, fp8-* (a dynamic scale fixed by the first pass), nvfp4, mxfp4, "
                             "*-token-head, with +skip rules; quantized-fp8: transformers' QuantizedCache with its "
                             "fp8 backend (one scale per layer frozen at the first pass, each step's own K/V rounded "
                             "before it attends)")
    parser.add_argument("--round-own", action="store_true",
                        help="a per-slot --scheme: every pass after the first attends to its own K/V rounded, as the "
                             "engines write, then attend (default: as computed, as a what-if of the scheme)")
    parser.add_argument("--residual", type=positive, default=128, help="QuantizedCache's residual_length")
    parser.add_argument("--q-group-size", type=positive, default=64, help="QuantizedCache's q_group_size")
    parser.add_argument("--axis", type=int, choices=(0, -1, 1), default=0,
                        help="QuantizedCache's axis_key and axis_value (quanto: 0 or -1, HQQ: 0 or 1; default 0)")
    parser.add_argument("--blame-step", type=int, default=None, help="step to blame, -1 for the prefill's last row (default: the divergence)")
    parser.add_argument("--blame-unit", choices=("slot", "word"), default="slot")
    parser.add_argument("--why", type=int, action="append", default=[], metavar="SLOT",
                        help="why SLOT left the cache in the last turn: its score, the threshold (the lowest kept "
                             "score) and its rank at the decision, per layer and KV head (repeatable)")
    parser.add_argument("--blame-limit", type=positive, default=32, help="candidates re-run by the blame")


def _params(pairs: list[str]) -> dict[str, str]:
    params = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise KvvizError(f"bad --param {pair!r}; use NAME=VALUE, e.g. --param window=16")
        params[name.strip()] = value.strip()
    return params


def _press(args: argparse.Namespace) -> str | None:
    """The kvpress press named by ``--policy kvpress:NAME``, if any."""
    prefix = "kvpress:"
    return args.policy[len(prefix):] if args.policy and args.policy.startswith(prefix) else None


def _check_press_file(args: argparse.Namespace) -> None:
    """Refuse a ``--press-file`` that is not ``FILE.py:CLASS`` or names no file (before torch loads)."""
    if args.policy:
        raise KvvizError("give --policy or --press-file, not both")
    file, _, name = args.press_file.rpartition(":")
    if not file.endswith(".py") or not name:
        raise KvvizError(f"--press-file takes FILE.py:CLASS, got {args.press_file!r}")
    path = Path(file).expanduser()
    if not path.is_file():
        raise KvvizError(f"--press-file: no file {path}")


def run(args: argparse.Namespace) -> None:
    if any(not text.strip() for text in args.turn):
        raise KvvizError("a turn is empty; type some text")
    _params(args.param)  # a malformed one is refused before torch loads
    if args.press_file:
        _check_press_file(args)
    if (args.read_with is None) != (args.reads is None):
        raise KvvizError("--read-with POLICY and --reads N go together")
    if args.policy is None and args.press_file is None and args.kivi_bits is None and args.scheme is None \
            and args.read_with is None:
        raise KvvizError("give --policy (with --budget), --read-with (with --reads), --kivi-bits or --scheme, or "
                         "several")
    if args.scheme is not None:
        run_family(args.scheme)  # the flags are refused before torch loads
        if args.scheme.startswith("kivi") and args.kivi_bits is not None:
            raise KvvizError("give --scheme kivi-N or --kivi-bits, not both")
    if args.round_own and (args.scheme is None or run_family(args.scheme) not in WRITTEN_FAMILIES):
        raise KvvizError("--round-own is for a per-slot --scheme (int*-token, fp8-*, nvfp4, mxfp4, *-token-head)")
    rounds = args.kivi_bits is not None or args.scheme is not None and run_family(args.scheme) in (
        "kivi", "quantized", *WRITTEN_FAMILIES)  # slot by slot: blame can put rounded slots back
    if args.blame_step is not None and args.policy is None and args.press_file is None and not rounds \
            and args.read_with is None:
        raise KvvizError("--blame-step needs a policy (blame puts evicted slots back) or a cache that rounds slot by "
                         "slot (KIVI, a per-slot --scheme: blame puts rounded slots back at full precision)")
    if _press(args):
        press_budgets(_params(args.param), f"kvpress' {_press(args)}")
    from kvviz.edit.reshape import Reshape
    from kvviz.model import load_model
    from kvviz.runs.blame import blame
    from kvviz.runs.forecast import first_compression
    from kvviz.runs.from_names import from_names
    from kvviz.runs.policy_run import run_policy
    from kvviz.runs.report import document
    from kvviz.schemes.kivi import Kivi

    kivi = None if args.kivi_bits is None else Kivi(args.kivi_bits, args.kivi_bits, args.kivi_group,
                                                    args.kivi_residual, args.kivi_grouping)
    reshape = Reshape(args.think, args.think_window, args.merge, args.merge_rule, args.merge_threshold) \
        if args.think or args.merge else None
    settings = from_names(args.policy, _params(args.param), budget=args.budget, ratio=args.ratio, mode=args.mode,
                          every=args.every, positions=args.positions, schemes=[args.scheme] if args.scheme else [],
                          kivi=kivi, reshape=reshape, press_file=args.press_file, q_group_size=args.q_group_size,
                          residual=args.residual, axis=args.axis, round_own=args.round_own, reader=args.read_with,
                          reads=args.reads)
    lm = load_model(args.model)
    forecast = first_compression(lm, args.turn, settings)
    if forecast is not None and forecast.recency_only:  # said before the run (which then says it again)
        from kvviz.policies.base import Ratio

        window = next(((f"--param {k}", v) for k, v in _params(args.param).items() if "window" in k), None)
        advice = forecast.advice(isinstance(settings.budget, Ratio), "--budget", "--ratio", window)
        print(f"kvviz: warning: {forecast} {advice}", file=sys.stderr)
    result = run_policy(lm, args.turn, settings, args.max_new_tokens)
    last = result.last
    if args.blame_step is not None:
        last.record(args.blame_step)  # refuses a step the turn does not have, in one line
    ranked = blame(result, step=args.blame_step, unit=args.blame_unit, limit=args.blame_limit) \
        if settings.policy is not None or settings.reader is not None or args.blame_step is not None else None
    report = document(result, ranked)
    cached = len(last.forced.session)
    if any(not 0 <= slot < cached for slot in args.why):
        raise KvvizError(f"--why takes a slot of the run: 0..{cached - 1}")
    if args.why and settings.policy is None:
        raise KvvizError("--why needs a policy: it explains the policy's evictions")
    report["why"] = {str(slot): _finite(result.why(slot)) for slot in args.why}
    if args.json:
        print(json.dumps(report))
        return
    print(f"{result.model} · {settings.label}")
    for index, turn in enumerate(report["turns"]):
        print(f"\nturn {index + 1}: {turn['user']}")
        print(f"  full:   {turn['full']['text']}")
        print(f"  policy: {turn['policy_run']['text']}")
        print(f"  divergence: {_step_name(turn['divergence'])}")
        only, decisions = turn["recency_only"]
        if only:
            print(f"  warning: at {only} of its {decisions} compressions the budget held only the slots "
                  f"{settings.policy.name} always keeps (recent window, sinks): its scores chose nothing")
    print("\nstep  slot  visible      KL  top-1   (step -1: the prefill's last row, which chooses the first token)")
    for s in report["steps"]:
        print(f"{s['step']:>4}  {s['slot']:>4}  {s['visible']:>7}  {s['kl']:>6.3f}  {'=' if s['top1_agree'] else '≠'}")
    print(f"\n{len(report['evictions'])} evictions in the last turn")
    for slot, rows in report["why"].items():
        _print_why(int(slot), rows, result)
    if ranked is not None:
        transcript = last.forced.session.transcript
        back = {"evicted": "evicted slot back", "rounded": "rounded slot at full precision",
                "unread": "unread slot read"}[ranked.of]
        print(f"\nblame at {_step_name(ranked.step)} (KL {ranked.kl:.3f} with nothing restored, "
              f"{ranked.kl_all_restored:.3f} with every {back}): restoring one candidate at a time")
        for row in ranked.rows[:10]:
            words = transcript.text_of(row.slots)
            print(f"  {spell(words)} (slots {row.slots}): KL {row.kl_after_restore:.3f}, "
                  f"top-1 {'back' if row.top1_restored else 'not back'}")


def _step_name(step: int | None) -> str:
    if step is None:
        return "none"
    return "step -1 (the prefill's last row: the first reply token)" if step == -1 else f"step {step}"


def _finite(rows: list[dict]) -> list[dict]:
    """JSON has no infinity: a protected slot's score (``+inf``) becomes null (its ``reason`` says it)."""
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()} for row in rows]


def _print_why(slot: int, rows: list[dict], result) -> None:
    session = result.last.forced.session
    lm = session.lm
    print(f"\nwhy slot {slot} {spell(session.transcript.slots[slot].text)} went: evicted in {len(rows)} of "
          f"{lm.layers * lm.kv_heads} (layer, KV head) pairs this turn")
    if rows:
        print("  layer  kv  step      score  threshold     margin  rank/cands  budget")
    for r in rows:
        number = (lambda v: f"{v:>10.4g}" if v is not None else f"{'protected':>10}")  # noqa: E731
        print(f"  {r['layer']:>5}  {r['kv_head']:>2}  {r['step']:>4} {number(r['score'])} {number(r['threshold'])} "
              f"{number(r['margin'])}  {r['rank']:>4}/{r['candidates']:<5}  {r['budget']:>6}")
