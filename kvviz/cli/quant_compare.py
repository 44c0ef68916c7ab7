"""``python -m kvviz quant-compare``: replay a chat, then several quantization schemes at one step, one row each."""

from __future__ import annotations

import argparse
import json

from kvviz.cli.common import add_chat_arguments, replay_chat, some_text
from kvviz.errors import KvvizError
from kvviz.quant.names import check_names

COLUMNS = ("scheme", "kl", "tv", "top1", "bytes", "vs_16bit", "nominal", "delta_o", "weight_term", "content_term",
           "saturated")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_chat_arguments(parser)
    parser.add_argument("--scheme", action="append", default=[], metavar="NAME",
                        help="a scheme (repeatable): fp16, int{8,4,3,2}-token, int{8,4,3,2}-channel, kivi-{4,2}, "
                             "fp8-{e4m3,e5m2}-{head,tensor}[-static], fp8-{e4m3,e5m2}-unit, mix{B}-{uniform,keyerror}, "
                             "quanto-{4,2}, nvfp4, nvfp4-4over6, mxfp4, mxfp4-b16, {int8,int4,int2,fp8}-token-head, "
                             "k{8,4,2}v{8,4,2}-token-head; int and fp8 take +prerope, +hadamard, +outliersK; int, fp8, "
                             "fp4 and token-head +skip-sliding, +skip-firstN, +skip-lastN, +skip-3,7")
    parser.add_argument("--calibration", default=None, type=some_text, metavar="TEXT",
                        help="the text static FP8 schemes calibrate their scales on (default: a built-in paragraph)")
    parser.add_argument("--at", type=int, default=None, help="slot whose step is re-run (default: the newest)")


def run(args: argparse.Namespace) -> None:
    check_names(args.scheme)  # refused before torch loads
    from kvviz.schemes.catalogue import schemes

    chosen = schemes(args.scheme)
    session = replay_chat(args)
    from kvviz.schemes.compare import compare_schemes

    at = len(session) - 1 if args.at is None else args.at
    if not 0 <= at < len(session):
        raise KvvizError(f"slot {at} is not cached (the cache holds slots 0..{len(session) - 1})")
    from kvviz.schemes.calibration import CALIBRATION_TEXT

    rows = compare_schemes(session, chosen, at, calibration_text=args.calibration or CALIBRATION_TEXT)
    if args.json:
        print(json.dumps({"at": at, "rows": [row.to_dict() for row in rows]}, ensure_ascii=False))
        return
    print(f"step of slot {at}: {len(rows)} scheme{'s' if len(rows) != 1 else ''}, KL in nats; the cache as computed "
          f"takes {rows[0].full_bytes:,} bytes")
    widths = (max(14, *(len(row.scheme) for row in rows)), *(14,) * (len(COLUMNS) - 1))  # schemes fit their column
    print("  ".join(f"{name:>{width}}" for name, width in zip(COLUMNS, widths)))
    for row in rows:
        cells = (row.scheme, f"{row.kl:.4g}", f"{row.tv:.4g}", row.top1, f"{row.bytes:,}", f"{row.ratio:.3g}×",
                 f"{row.nominal:.3g}×", f"{row.delta_o:.4g}",
                 f"{row.weight_term:.4g}", f"{row.content_term:.4g}", f"{row.saturated:,}")
        print("  ".join(f"{cell:>{width}}" for cell, width in zip(cells, widths)))
