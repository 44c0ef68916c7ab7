"""File text shown in the page is never Markdown: ``app.plain`` escapes every character Markdown would read."""

from __future__ import annotations

from pathlib import Path


APP = str(Path(__file__).resolve().parents[2] / "app" / "main.py")


def test_plain_escapes_every_markdown_character():
    import sys

    sys.path.insert(0, str(Path(APP).parents[1]))
    from app.plain import plain

    assert plain("a_b*c`d[e](f)<g>$h$ #i |j| ~k~ :l: !m") == \
        r"a\_b\*c\`d\[e\]\(f\)\<g\>\$h\$ \#i \|j\| \~k\~ \:l\: \!m"
    assert plain("no punctuation here") == "no punctuation here"
    # web addresses go into code spans (GFM would make them links), with a fence longer than any backtick run
    assert plain("see http://e.com/a_b and www.x.org!") == r"see `http://e.com/a_b` and `www.x.org!`"
    assert plain("ftp://a`b") == "``ftp://a`b``"
