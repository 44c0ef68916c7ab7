"""The docs hold together, without loading a model: every relative link and image of README.md and docs/*.md resolves
(a ``#anchor`` to a heading of its target, by GitHub's slugs), every ``python -m kvviz …`` line of their fenced code
blocks names a real subcommand and only flags its argparse parser accepts, and the README stays short."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

from kvviz.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")

COMMAND = re.compile(r"\bpython3?\s+-m\s+(kvviz|benchmarks)(?=\s|$)")
END_OF_COMMAND = re.compile(r"&&|\|\||;|\s\|\s|\)|`|>")
QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")
COMMENT = re.compile(r"(?:^|\s)#.*$")
OPTION = re.compile(r"^(--?[A-Za-z][\w-]*)")


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def lines_with_fences(text: str) -> Iterator[tuple[int, str, bool]]:
    """``(line number, line, inside a fenced code block)`` for every line; fence lines themselves count as inside."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
            yield number, line, True
        elif fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            yield number, line, True
        else:
            yield number, line, False


# --- links ------------------------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text as rendered (code marks, links, emphasis stars and HTML tags gone),
    lowercased, every character that is not a letter, digit, ``_``, ``-`` or space dropped, spaces → ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (a repeated heading's next ones get ``-1``, ``-2``…)."""
    seen: dict[str, int] = {}
    found = set()
    for _, line, code in lines_with_fences(path.read_text(encoding="utf-8")):
        match = None if code else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, target)`` of every inline link, image and reference definition outside code."""
    for number, line, code in lines_with_fences(text):
        if code:
            continue
        prose = INLINE_CODE.sub(lambda m: " " * len(m.group()), line)
        for match in LINK.finditer(prose):
            yield number, match.group(1)
        if match := REFERENCE.match(prose):
            yield number, match.group(1)


def link_problems(path: Path, root: Path = ROOT) -> list[str]:
    """One line per relative link of ``path`` that does not resolve: ``file:line: link → why``."""
    problems = []
    name = path.relative_to(root)
    for number, target in links(path.read_text(encoding="utf-8")):
        if not target:
            problems.append(f"{name}:{number}: an empty link target")
            continue
        if SCHEME.match(target):  # http:, https:, mailto: … are not files of the repository
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / unquote(file_part)).resolve() if file_part else path
        if root.resolve() not in (destination, *destination.parents):
            problems.append(f"{name}:{number}: link {target!r} points outside the repository")
        elif not destination.exists():
            problems.append(f"{name}:{number}: link {target!r}: no such file {destination.relative_to(root.resolve())}")
        elif anchor and destination.suffix == ".md" and unquote(anchor) not in anchors(destination):
            problems.append(f"{name}:{number}: link {target!r}: {destination.name} has no heading whose anchor is "
                            f"#{anchor}")
    return problems


# --- commands ---------------------------------------------------------------------------------------------------


def accepted_options() -> dict[str | None, set[str]]:
    """The option strings of ``python -m kvviz`` (key ``None``) and of each of its subcommands, from the parser the
    CLI itself builds (no model, no torch)."""
    parser = build_parser()
    options: dict[str | None, set[str]] = {None: set(parser._option_string_actions)}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            options |= {name: set(sub._option_string_actions) for name, sub in action.choices.items()}
    return options


def code_lines(text: str) -> Iterator[list[tuple[int, str]]]:
    """The logical lines of fenced code blocks (``\\`` continuations joined), each as its physical lines' numbers and
    texts: quoted strings and comments blanked, ``[`` and ``]`` as spaces (so placeholders are no flags)."""
    pending: list[tuple[int, str]] = []
    for number, line, code in lines_with_fences(text):
        if not code or FENCE.match(line):
            if pending:
                yield pending
            pending = []
            continue
        cleaned = COMMENT.sub(lambda m: " " * len(m.group()), QUOTED.sub(lambda m: '"' + " " * (len(m.group()) - 2)
                                                                            + '"', line))
        cleaned = cleaned.replace("[", " ").replace("]", " ")
        continued = cleaned.rstrip().endswith("\\")
        pending.append((number, cleaned.rstrip().removesuffix("\\") if continued else cleaned))
        if not continued:
            yield pending
            pending = []
    if pending:
        yield pending


def commands(text: str) -> Iterator[tuple[int, str | None, list[tuple[int, str]]]]:
    """Every ``python -m kvviz …`` (and ``python -m benchmarks …``, the bench's own entry) in the fenced code of
    ``text``: ``(line, subcommand or None, [(line, option)])``."""
    for pieces in code_lines(text):
        joined, starts = "", []
        for number, piece in pieces:
            starts.append((len(joined), number))
            joined += piece + " "

        def line_of(offset: int) -> int:
            return max((start, number) for start, number in starts if start <= offset)[1]

        for match in COMMAND.finditer(joined):
            rest = joined[match.end():]
            end = END_OF_COMMAND.search(rest)
            rest = rest[: end.start()] if end else rest
            tokens = [(match.end() + t.start(), t.group()) for t in re.finditer(r"\S+", rest)]
            subcommand = None
            if not tokens and match.group(1) == "kvviz":  # the entry point named alone, as in the module map
                continue
            if match.group(1) == "benchmarks":
                subcommand = "bench"
            elif tokens and not tokens[0][1].startswith("-"):
                subcommand = tokens.pop(0)[1]
            options = [(line_of(offset), m.group(1)) for offset, token in tokens if (m := OPTION.match(token))]
            yield line_of(match.start()), subcommand, options


def command_problems(name: str, text: str, options: dict[str | None, set[str]]) -> list[str]:
    """One line per command of ``text`` whose subcommand does not exist or that shows a flag its parser refuses."""
    problems = []
    for line, subcommand, shown in commands(text):
        if subcommand is None and not {"-h", "--help"} & {flag for _, flag in shown}:
            problems.append(f"{name}:{line}: `python -m kvviz` without a subcommand (one of: "
                            f"{', '.join(k for k in options if k)})")
            continue
        if subcommand not in options:
            problems.append(f"{name}:{line}: `python -m kvviz {subcommand}`: no such subcommand (the subcommands: "
                            f"{', '.join(k for k in options if k)})")
            continue
        for flag_line, flag in shown:
            if flag not in options[subcommand]:
                problems.append(f"{name}:{flag_line}: `python -m kvviz {subcommand or ''}` has no flag {flag} (its "
                                f"flags: {', '.join(sorted(options[subcommand]))})")
    return problems


# --- the checks -------------------------------------------------------------------------------------------------


def test_the_readme_is_at_most_200_lines():
    count = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines, over {README_MAX_LINES}: move depth to docs/"


def test_every_relative_link_and_image_of_the_docs_resolves():
    problems = [problem for path in doc_files() for problem in link_problems(path)]
    assert not problems, "broken links:\n" + "\n".join(problems)
    assert sum(1 for path in doc_files() for _ in links(path.read_text(encoding="utf-8"))) > 20  # links were found


def test_every_command_line_in_the_docs_is_one_the_cli_accepts():
    options = accepted_options()
    problems, checked = [], 0
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        problems += command_problems(str(path.relative_to(ROOT)), text, options)
        checked += sum(1 for _ in commands(text))
    assert not problems, "commands the CLI would refuse:\n" + "\n".join(problems)
    assert checked >= 10, f"only {checked} commands found in the docs' code blocks: is the extractor broken?"


def test_every_subcommand_has_its_section_in_the_cli_page():
    documented = anchors(ROOT / "docs" / "cli.md")
    missing = [name for name in accepted_options() if name and name not in documented]
    assert not missing, f"docs/cli.md has no section for: {', '.join(missing)}"


# --- the checkers can fail --------------------------------------------------------------------------------------


def test_slugs_are_githubs():
    assert slug("§3 Eviction") == "3-eviction"
    assert slug("What-if, side by side") == "what-if-side-by-side"
    assert slug("Safe by default, nothing lost") == "safe-by-default-nothing-lost"
    assert slug("The `chat --json` document") == "the-chat---json-document"
    assert slug("Use it from Python") == "use-it-from-python"
    assert slug("key_norm and α′") == "key_norm-and-α"


def test_the_link_checker_rejects_a_missing_file_a_missing_anchor_and_a_way_out(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "pic.png").write_bytes(b"")
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## Real heading, here\n\n```\n## not a heading\n```\n")
    (tmp_path / "README.md").write_text(
        "See [b](docs/b.md#real-heading-here), ![pic](pic.png) and [the web](https://example.org/x.md).\n"
        "Broken: [gone](docs/missing.md).\n"
        "Anchor: [nope](docs/b.md#no-such-heading), [in code](docs/b.md#not-a-heading).\n"
        "`[not a link](nowhere.md)` and\n```\n[also not](nowhere.md)\n```\n"
        "![missing image](assets/none.png) [out](../../etc/passwd) [self](#b)\n")
    problems = link_problems(tmp_path / "README.md", tmp_path)
    assert len(problems) == 6, problems
    assert problems[0].startswith("README.md:2: link 'docs/missing.md'")
    assert problems[1].startswith("README.md:3: link 'docs/b.md#no-such-heading'")
    assert problems[2].startswith("README.md:3: link 'docs/b.md#not-a-heading'")
    assert problems[3].startswith("README.md:8: link 'assets/none.png'")
    assert "outside the repository" in problems[4] and "README.md has no heading" in problems[5]
    assert link_problems(tmp_path / "docs" / "b.md", tmp_path) == []


def test_the_command_checker_rejects_a_made_up_flag_and_subcommand():
    options = accepted_options()
    text = "\n".join([
        "Prose: python -m kvviz chat --no-such-flag is not in a code block.",
        "```",
        '.venv/bin/python -m kvviz chat --turn "a --fake flag inside quotes" --max-new-tokens 8 [--json]',
        ".venv/bin/python -m kvviz policy-run --turn \"…\" --policy h2o --budget 64 --mode decode|prefill|both \\",
        "    [--every 1] --no-such-flag",
        "python -m kvviz no-such-command --json",
        "python -m kvviz whatif --turn x --evict 3 && python -m kvviz replay S.json --jsn  # a comment --ignored",
        "python -m benchmarks --only quant --quick",
        "python -m kvviz --help",
        "python -m kvviz --json",
        "```",
    ])
    problems = command_problems("X.md", text, options)
    assert len(problems) == 4, problems
    assert problems[0].startswith("X.md:5: `python -m kvviz policy-run` has no flag --no-such-flag")
    assert problems[1].startswith("X.md:6: `python -m kvviz no-such-command`: no such subcommand")
    assert problems[2].startswith("X.md:7: `python -m kvviz replay` has no flag --jsn")
    assert problems[3].startswith("X.md:10: `python -m kvviz` without a subcommand")
    good = "```\npython -m kvviz sweep --prompts builtin:kv --policy h2o --budget 0.5 --workers 2\n```"
    assert command_problems("Y.md", good, options) == []
