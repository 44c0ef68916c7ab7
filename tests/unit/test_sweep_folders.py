"""Sweep folders never lose or overwrite a file (issue #46): reading writes nothing and names each damaged line; a
resumed sweep cuts off only a torn last line; no file is followed through a symbolic link; a flag value given twice
is one case; bad folders are refused with one line. Synthetic rows (every case already done): no model runs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest

from kvviz.cli import main
from kvviz.errors import KvvizError
from kvviz.policies.base import Ratio
from kvviz.sweeps import SweepSpec, read_table, run_sweep
from kvviz.sweeps.folder import replace
from kvviz.sweeps.table import load_sweep, row_problem, usable
from tests.support.sweeps import fake_row, folder_with, lines_of, no_model, table_keys


def test_reading_a_damaged_rows_file_writes_nothing_and_names_each_line(folder_spec, tmp_path):
    """Today's reader cut a 5-row file at its first bad line, for good; now it reads on and only reports."""
    rows = lines_of(folder_spec)
    folder = folder_with(tmp_path, [rows[0], b"{not json\n", rows[1], b"[1, 2]\n", rows[2], b'{"no": "key"}\n',
                                    rows[3], b'{"key": "to'])
    before = (folder / "rows.jsonl").read_bytes()
    path = folder / "rows.jsonl"
    with pytest.warns(UserWarning) as caught:
        table = read_table(folder)
    said = [str(w.message) for w in caught]
    assert said[0].startswith(f"{path}:2: not JSON") and said[1].startswith(f"{path}:4: not a row")
    assert said[2].startswith(f"{path}:6: not a row") and said[3].startswith(f"{path}:8: torn")
    assert len(said) == 4 and len(table) == 4
    assert list(table["key"]) == [json.loads(r)["key"] for r in rows]
    assert (folder / "rows.jsonl").read_bytes() == before  # nothing cut, nothing added
    sweep = load_sweep(folder)
    assert len(sweep.table) == 4 and sweep.problems == tuple(said)
    assert sorted(p.name for p in folder.iterdir()) == ["rows.jsonl"]  # no lock, no table: reading writes nothing


def test_a_resumed_sweep_keeps_a_damaged_line_and_cuts_only_a_torn_last_line(folder_spec, tmp_path):
    rows = lines_of(folder_spec)
    folder = folder_with(tmp_path, [rows[0], b"{not json\n", *rows[1:], b'{"key": "to'])
    said: list[str] = []
    table = run_sweep(folder_spec, folder, progress=False, on_row=no_model, warn=said.append)
    assert (folder / "rows.jsonl").read_bytes() == b"".join([rows[0], b"{not json\n", *rows[1:]])
    assert said[0] == f"{folder / 'rows.jsonl'}:2: not JSON (Expecting property name enclosed in double quotes) " \
                      "(kept in the file; skipped)"
    assert said[1].startswith(f"{folder / 'rows.jsonl'}:6: torn") and said[1].endswith("; cut off") and len(said) == 2
    # the table is the rows
    assert list(table["key"]) == table_keys(folder) == [case.key for case in folder_spec.cases()]


def test_a_whole_last_row_without_its_newline_is_kept_and_ended(folder_spec, tmp_path):
    rows = lines_of(folder_spec)
    folder = folder_with(tmp_path, [*rows[:-1], rows[-1].rstrip(b"\n")])
    assert len(read_table(folder)) == 4  # read as a row
    said: list[str] = []
    run_sweep(folder_spec, folder, progress=False, on_row=no_model, warn=said.append)
    assert (folder / "rows.jsonl").read_bytes() == b"".join(rows) and said == []
    assert len(table_keys(folder)) == 4


@pytest.mark.parametrize("name", ["rows.jsonl", "table.csv", "table.parquet", "manifest.json", "sweep.lock"])
def test_a_file_of_the_folder_that_is_a_symbolic_link_is_refused_and_not_followed(folder_spec, tmp_path, name):
    folder = folder_with(tmp_path, lines_of(folder_spec))
    victim = tmp_path / "precious.txt"
    victim.write_bytes(b"the user's own file\n")
    if name == "rows.jsonl":
        (folder / name).unlink()
    (folder / name).symlink_to(victim)
    with pytest.raises(KvvizError, match=f"{name} is a symbolic link"):
        run_sweep(folder_spec, folder, progress=False, on_row=no_model)
    assert victim.read_bytes() == b"the user's own file\n"
    assert (folder / name).is_symlink()


def test_reading_refuses_a_linked_rows_file_and_tables_replace_a_link(folder_spec, tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_bytes(b"the user's own file\n")
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "rows.jsonl").symlink_to(victim)
    for read in (read_table, load_sweep):
        with pytest.raises(KvvizError, match="rows.jsonl is a symbolic link"):
            read(folder)
    (folder / "table.csv").symlink_to(victim)  # as if linked after the check: the write replaces the link
    replace(folder / "table.csv", lambda handle: handle.write(b"key\n"))
    assert victim.read_bytes() == b"the user's own file\n"
    assert not (folder / "table.csv").is_symlink() and (folder / "table.csv").read_bytes() == b"key\n"
    assert sorted(p.name for p in folder.iterdir()) == ["rows.jsonl", "table.csv"]  # no staging file left


def sweep_command(folder_spec: SweepSpec, out: Path, *flags: str) -> list[str]:
    return ["sweep", "--prompts", folder_spec.prompts, "--policy", "h2o", "--policy", "streaming_llm", "--budget", "8",
            "--max-new-tokens", "6", "--out", str(out), "--no-progress", *flags]


@pytest.mark.parametrize("kind", ["file", "dangling link"])
def test_an_out_that_is_a_file_or_a_dangling_link_is_refused_with_one_line(folder_spec, tmp_path, capsys, kind):
    out = tmp_path / "out"
    if kind == "file":
        out.write_bytes(b"not a folder\n")
    else:
        out.symlink_to(tmp_path / "nowhere")
    assert main(sweep_command(folder_spec, out)) == 2
    error = capsys.readouterr().err
    assert error == f"error: {out} is {'a file' if kind == 'file' else 'a dangling symbolic link'}, not a folder; " \
                    "pass another --out\n"
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("kind, words", [
    ("folder", "manifest.json is not a plain file"),
    ("latin-1", "holds another sweep (its manifest.json is not a kvviz-sweep/2 one)"),
])
def test_a_bad_manifest_is_refused_with_one_line(folder_spec, tmp_path, capsys, kind, words):
    folder = folder_with(tmp_path, lines_of(folder_spec))
    if kind == "folder":
        (folder / "manifest.json").mkdir()
    else:
        (folder / "manifest.json").write_bytes('{"format": "café"}'.encode("latin-1"))
    assert main(sweep_command(folder_spec, folder)) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and words in error and error.count("\n") == 1


def test_the_command_names_damaged_lines_and_keeps_them(folder_spec, tmp_path, capsys):
    rows = lines_of(folder_spec)
    folder = folder_with(tmp_path, [rows[0], b"[1, 2]\n", b'"text"\n', *rows[1:]])
    assert main(sweep_command(folder_spec, folder)) == 0
    error = capsys.readouterr().err.splitlines()
    path = folder / "rows.jsonl"
    assert error == [f"kvviz: {path}:2: not a row (a JSON object with a key) but a JSON list (kept in the file; skipped)",
                     f"kvviz: {path}:3: not a row (a JSON object with a key) but a JSON str (kept in the file; skipped)"]
    assert (folder / "rows.jsonl").read_bytes() == b"".join([rows[0], b"[1, 2]\n", b'"text"\n', *rows[1:]])
    assert len(table_keys(folder)) == 4


def test_a_flag_value_given_twice_is_one_case(folder_spec, tmp_path, capsys):
    twice = SweepSpec(folder_spec.prompts, ("h2o", "h2o"), (8, 8, Ratio(0.5), Ratio(0.50), 0.5, 1, 1.0),
                      schemes=("fp16", "fp16"))
    keys = [case.key for case in twice.cases()]
    assert len(keys) == len(set(keys)) == 2 * 5  # 8, ratio 0.5, the fraction 0.5, 1 slot, the whole prompt (1.0)
    once = SweepSpec(folder_spec.prompts, ("h2o",), (8, Ratio(0.5)), max_new_tokens=6)
    folder = folder_with(tmp_path, lines_of(once))
    argv = ["sweep", "--prompts", folder_spec.prompts, "--policy", "h2o", "--budget", "8", "--budget", "8", "--ratio",
            "0.5", "--ratio", "0.50", "--max-new-tokens", "6", "--out", str(folder), "--no-progress"]
    assert main(argv) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("4 cases in")
    assert table_keys(folder) == [case.key for case in once.cases()] and len(set(table_keys(folder))) == 4


@pytest.mark.parametrize("change, words", [
    ({"ratio": 1.5}, "a compression ratio must be in [0, 1), got 1.5"),
    ({"every": "abc"}, "every must be a whole number of at least 1, not 'abc'"),
    ({"turns": "not json"}, "turns is not JSON"),
    ({"turns": '"one text"'}, "turns must be a JSON list of non-empty texts"),
    ({"budget": 2.5, "fraction": True}, "a fractional budget must be in (0, 1], got 2.5"),
    ({"kl_mean": None}, "no kl_mean"),
])
def test_a_row_that_cannot_be_opened_says_why(folder_spec, change, words):
    row = fake_row(folder_spec.cases()[0])
    assert row_problem(row) is None
    assert row_problem({**row, **change}).startswith(words)


def test_an_uploaded_table_keeps_its_good_rows_and_names_the_bad(folder_spec):
    rows = [fake_row(case) for case in folder_spec.cases()]
    rows[1]["every"] = "abc"  # in a .csv, the whole column becomes text
    table = pd.read_csv(io.StringIO(pd.DataFrame(rows).to_csv(index=False)))
    sweep = usable(table, name="table.csv")
    assert sweep.problems == ("table.csv row 2: every must be a whole number of at least 1, not 'abc'",)
    assert list(sweep.table["key"]) == [rows[i]["key"] for i in (0, 2, 3)]
    with pytest.raises(KvvizError, match="table.csv is not a kvviz sweep table \\(missing turns\\)"):
        usable(table.drop(columns=["turns"]), name="table.csv")
