"""The grammar of quantization scheme names (:mod:`kvviz.schemes.catalogue` says what each one stores): which names exist, and
the one-line refusal of any other. Imports nothing heavy, so the command line refuses a bad ``--scheme`` before it
loads torch or runs a chat."""

from __future__ import annotations

import re

from kvviz.errors import KvvizError

PATTERNS = {
    "fp16": re.compile(r"fp16"),
    "int": re.compile(r"int(8|4|3|2)-(token|channel)"),
    "kivi": re.compile(r"kivi-(4|2)"),
    "fp8": re.compile(r"fp8-(e4m3|e5m2)-(head|tensor)"),
    "fp8static": re.compile(r"fp8-(e4m3|e5m2)-(head|tensor)-static|fp8-(e4m3|e5m2)-(?:head-|tensor-)?unit"),
    "quanto": re.compile(r"quanto-(4|2)"),
    "hqq": re.compile(r"hqq-(8|4|3|2)"),
    "mix": re.compile(r"mix([2-8](?:\.[0-9]+)?)-(uniform|keyerror)"),
    "fp4": re.compile(r"nvfp4|nvfp4-4over6|mxfp4|mxfp4-b16"),
    "tokenhead": re.compile(r"(?:(int8|int4|int2|fp8)|k(8|4|2)v(8|4|2))-token-head"),
    "dsmla": re.compile(r"fp8-ds-mla"),
}
SUFFIX = re.compile(r"hadamard|outliers([1-9][0-9]?)|prerope")
SKIP = re.compile(r"skip-(?:sliding|first([1-9][0-9]?)|last([1-9][0-9]?)|([0-9]{1,3}(?:,[0-9]{1,3})*))")
SKIPPING = ("int", "fp8", "fp8static", "fp4", "tokenhead")  # families whose layers a +skip rule can keep exact
EXAMPLES = ("fp16", "int4-token", "int2-channel", "kivi-2", "fp8-e4m3-head", "fp8-e5m2-tensor", "fp8-e4m3-head-static",
            "fp8-e4m3-unit", "mix3-keyerror", "quanto-4", "nvfp4", "mxfp4", "int4-token-head", "k8v4-token-head")
MIX_WIDTHS = (2, 8)  # the widths a mix scheme's allocation chooses from: its average lies between them


def check_names(names: list[str]) -> None:
    """Refuse an empty list of scheme names, a repeat, or any name :func:`scheme_family` refuses."""
    if not names:
        raise KvvizError(f"give at least one scheme, e.g. {', '.join(EXAMPLES[1:4])}")
    if len(set(names)) != len(names):
        raise KvvizError("a scheme is named twice")
    for name in names:
        scheme_family(name)


WRITTEN_FAMILIES = ("int", "fp8", "fp8static", "fp4", "tokenhead", "dsmla")  # rounded slot by slot as written
# (schemes.written)
RUN_FAMILIES = ("fp16", "kivi", "quanto", "hqq", *WRITTEN_FAMILIES)  # caches a policy run holds as it goes
RUN_ONLY = {"quantized-fp8": "quantized"}  # run caches that are no what-if scheme: transformers' fp8 QuantizedCache


def run_family(name: str) -> str:
    """The family of scheme ``name`` if a policy run can hold it as its cache (:data:`RUN_FAMILIES`; an int scheme
    per token, no outlier channels) or of a run-only cache (:data:`RUN_ONLY`); one line otherwise."""
    if name in RUN_ONLY:
        return RUN_ONLY[name]
    family = scheme_family(name)
    base, *suffixes = name.split("+")
    if family not in RUN_FAMILIES or (family == "int" and base.endswith("channel")) or any(
            s.startswith("outliers") for s in suffixes):
        raise KvvizError(f"{name} is not a cache a run writes slot by slot: its scales span the slots rounded "
                         "together (per channel, outlier channels, mixed widths); a run takes kivi-N for keys per "
                         "channel, quanto-N, hqq-N, or a per-slot scheme (int*-token, fp8-*, nvfp4, mxfp4, "
                         "*-token-head, quantized-fp8)")
    return family


def scheme_family(name: str) -> str:
    """The family of scheme ``name`` (a key of :data:`PATTERNS`); any other name is refused in one line."""
    if not isinstance(name, str):
        raise KvvizError(f"a scheme is named by text, got {name!r}")
    base, *suffixes = name.split("+")
    family = next((kind for kind, pattern in PATTERNS.items() if pattern.fullmatch(base)), None)
    if family is None:
        raise KvvizError(f"unknown quantization scheme {name!r}; schemes look like {', '.join(EXAMPLES)}, "
                         "int4-token+hadamard, int2-token+outliers4, int2-channel+prerope, nvfp4+skip-sliding")
    skips = [s for s in suffixes if s.startswith("skip")]
    if skips and (family not in SKIPPING or not all(SKIP.fullmatch(s) for s in skips) or len(set(skips)) != len(skips)):
        raise KvvizError(f"{name!r}: layers kept in 16 bits are +skip-sliding, +skip-firstN, +skip-lastN or "
                         "+skip-3,7 (a list), for the int, fp8, FP4 and token-head schemes, e.g. nvfp4+skip-sliding")
    suffixes = [s for s in suffixes if not s.startswith("skip")]
    kinds = [s if s in ("prerope", "hadamard") else "outliers" for s in suffixes]
    if suffixes and (not all(SUFFIX.fullmatch(s) for s in suffixes) or family not in ("int", "fp8")
                     or len(set(kinds)) != len(kinds) or {"hadamard", "outliers"} <= set(kinds)):
        raise KvvizError(f"{name!r}: an int or fp8 scheme takes +hadamard or +outliersK (K channels kept "
                         "exact), and +prerope (keys rounded before RoPE), e.g. int2-channel+prerope+outliers4")
    if family == "mix" and not MIX_WIDTHS[0] <= float(PATTERNS["mix"].fullmatch(base).group(1)) <= MIX_WIDTHS[1]:
        raise KvvizError(f"{name!r}: a mix scheme's average width must be from {MIX_WIDTHS[0]} to {MIX_WIDTHS[1]} "
                         "bits, e.g. mix3-keyerror")
    return family
