"""quant-compare refuses bad scheme names in one line (no model)."""

from __future__ import annotations

import pytest

from kvviz.cli import main


@pytest.mark.parametrize("argv, message", [
    (["--scheme", "int5-token"], "unknown quantization scheme 'int5-token'"),
    ([], "give at least one scheme"),
    (["--scheme", "fp16", "--scheme", "fp16"], "a scheme is named twice"),
])
def test_quant_compare_refuses_bad_schemes_in_one_line(capsys, argv, message):
    assert main(["quant-compare", "--turn", "hi", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
