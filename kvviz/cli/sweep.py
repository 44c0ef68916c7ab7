"""``python -m kvviz sweep``: every prompt × policy × budget as a policy run; one summary row each, written
resumably to ``--out`` (a killed sweep continues where it stopped), then the worst cases. A flag value given twice
is one case; a line of ``rows.jsonl`` that is not a row is named on stderr and kept; a folder another sweep is
writing, or whose files are symbolic links, is refused with one line."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvviz.cli.common import budget, non_negative, positive, ratio, reply_tokens
from kvviz.errors import KvvizError
from kvviz.spelling import printable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", required=True, metavar="FILE|builtin:NAME",
                        help="a JSONL file ({\"prompt\" or \"turns\", \"expected\", \"id\"} per line), a kvpress-format "
                             "dataset (.parquet or JSONL with context, question, answer, task, max_new_tokens: scored "
                             "with RULER's string match) or builtin:needle / kv / vars / all, builtin:niah_multikey / "
                             "cwe / vt / multiturn / ruler")
    parser.add_argument("--policy", action="append", required=True, help="a policy (repeatable): a built-in, one from KVVIZ_POLICIES, or a kvpress press as kvpress:NAME")
    parser.add_argument("--budget", action="append", default=[], type=budget,
                        help="slots kept or a fraction of the prompt (repeatable)")
    parser.add_argument("--ratio", action="append", default=[], type=ratio,
                        help="kvpress' compression ratio, the fraction removed, as a budget (repeatable; "
                             "int(n·(1 − R)) kept, as kvpress rounds)")
    parser.add_argument("--scheme", action="append", default=[], metavar="NAME",
                        help="the run's cache as a quantization scheme (repeatable, an axis beside --policy): "
                             "fp16, kivi-4, kivi-2, quanto-4, quanto-2, hqq-8/4/3/2, or a per-slot scheme (int*-token, "
                             "fp8-*, nvfp4, mxfp4, *-token-head, +skip rules), quantized-fp8 (transformers' fp8 "
                             "QuantizedCache)")
    parser.add_argument("--mode", choices=("prefill", "decode", "both", "after_steps"), default="decode")
    parser.add_argument("--every", type=positive, default=1, help="compress every N decode steps")
    parser.add_argument("--max-new-tokens", type=reply_tokens, default=32, metavar="N")
    parser.add_argument("--limit", type=positive, default=None, metavar="N", help="the first N prompts only")
    parser.add_argument("--model", default=None, metavar="PATH", help="checkpoint folder, .gguf or hub id")
    parser.add_argument("--out", default="sweep", metavar="DIR",
                        help="folder of the table (default: ./sweep); one sweep writes a folder at a time")
    parser.add_argument("--workers", type=positive, default=1, help="local worker processes (or Ray actors)")
    parser.add_argument("--ray", default=None, metavar="ADDRESS",
                        help="run the cases as Ray tasks on this cluster (auto: the running one; local: a new one)")
    parser.add_argument("--batch", type=non_negative, default=4, metavar="N",
                        help="cases of a prompt decoded together as one batch beside one full run (default 4; 0: "
                             "each case alone, one step at a time)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> None:
    from kvviz.sweeps.folder import refuse_busy
    from kvviz.sweeps.sources import check_source

    check_source(args.prompts)  # refused before torch loads
    refuse_busy(Path(args.out))
    from kvviz.sweeps import SweepSpec, run_sweep

    from kvviz.policies.base import Ratio

    budgets = (*args.budget, *(Ratio(value) for value in args.ratio))
    if not budgets:
        raise KvvizError("give at least one --budget or --ratio")
    spec = SweepSpec(args.prompts, tuple(args.policy), budgets, args.mode, args.every, args.max_new_tokens,
                     args.limit, args.model, schemes=tuple(args.scheme))
    table = run_sweep(spec, args.out, args.workers, args.ray, progress=not args.no_progress, batch=args.batch)
    if table.empty:
        raise KvvizError("the sweep produced no rows")
    print(f"{len(table)} cases in {printable(args.out)}/table.csv (and .parquet); the worst by mean KL:")
    for line in worst_cases(table, bool(args.scheme)):
        print(line)


def worst_cases(table, schemes: bool, count: int = 10) -> list[str]:
    """The summary's lines: the ``count`` cases of the highest mean KL. Prompt ids, policies and schemes come from
    files someone else may have written: each is :func:`~kvviz.spelling.printable`."""
    lines = []
    for row in table.sort_values("kl_mean", ascending=False).head(count).itertuples():
        match = f"  answer {'kept' if row.policy_match else 'lost'}" if row.full_match in (True,) else ""
        scheme = f" {printable(str(row.scheme))}" if schemes else ""
        lines.append(f"  {printable(str(row.prompt_id)):<18} {printable(str(row.policy)):<14}{scheme} budget "
                     f"{printable(str(row.budget)):<5} KL {row.kl_mean:.3f}  top-1 {row.top1_agreement:.0%}{match}")
    return lines
