"""Hostile files and values, third round (issue #61), the parts that need no bundled model: escape sequences never
reach the terminal, prompt files that are not UTF-8 / nested too deeply / hold huge numbers / wrong kvpress fields are
refused naming file and line, ranges are bounded before they are expanded, a refused sweep writes nothing and pins no
folder, tables are replaced together, a device or a model kvviz cannot use is refused at load, and the hidden-state
hooks follow the model, not its address. The crafted files are in ``tests/unit/hostile/``."""

from __future__ import annotations

import errno
import gc
import json
import os
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest
import torch

from kvviz.errors import KvvizError, ModelLoadError
from kvviz.spelling import printable
from kvviz.sweeps import SweepSpec, run_sweep
from kvviz.sweeps import sweep as sweep_module
from kvviz.sweeps.folder import LOCK, MANIFEST, locked, replace_all
from kvviz.sweeps.sources import load_prompts, uploaded_prompts
from tests.support.cli import cli
from tests.support.sweeps import PROMPTS, fake_row, prompts_file

HOSTILE = Path(__file__).parent / "hostile"
CONTROL = {chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))} - {"\n"}  # what a terminal may act on


def _acts_on_terminal(text: str) -> bool:
    return any(c in CONTROL or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069" for c in text)


# --- 1. no escape sequence reaches the terminal ---------------------------------------------------------------------

def test_printable_shows_every_control_character_and_keeps_the_rest():
    hostile = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07\x9b31m\u202etxt.exe\x00 é 漢字 🙂"
    shown = printable(hostile)
    assert not _acts_on_terminal(shown)
    assert "\\u001b]0;pwned\\u0007" in shown and "\\u009b" in shown and "\\u202e" in shown
    assert shown.endswith(" é 漢字 🙂")  # text is left as it is
    assert json.loads(f'"{shown}"') == hostile  # the escapes read back (JSON's and Python's notation)
    assert printable("a\nb\tc") == "a\\u000ab\\u0009c" and printable("a\nb\tc", lines=True) == "a\nb\tc"


def test_the_sweep_summary_prints_a_hostile_prompt_id_escaped(tmp_path, monkeypatch):
    """A prompt id from someone else's JSONL set the terminal's title and cleared it, at every rerun of the folder."""
    spec = SweepSpec(str(HOSTILE / "escapes.jsonl"), ("h2o",), (8,), max_new_tokens=6)
    monkeypatch.setattr(sweep_module, "_rows", lambda model, todo, *_: iter(fake_row(case) for case in todo))
    for _ in range(2):  # the run, then a rerun of the folder (its rows read back)
        done = cli("sweep", "--prompts", spec.prompts, "--policy", "h2o", "--budget", "8", "--max-new-tokens", "6",
                   "--out", str(tmp_path / "out"), "--no-progress")
        assert done.returncode == 0, done.stderr
        assert "\\u001b]0;pwned\\u0007" in done.stdout
        assert not _acts_on_terminal(done.stdout + done.stderr)


def test_a_refusal_naming_a_hostile_path_is_printed_escaped(tmp_path):
    done = cli("sweep", "--prompts", str(tmp_path / "a\x1b]0;pwned\x07.jsonl"), "--policy", "h2o", "--budget", "8",
               "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "does not exist" in done.stderr
    assert "\\u001b]0;pwned\\u0007" in done.stderr and not _acts_on_terminal(done.stderr)


# --- 3. a refusal writes nothing and pins no folder -------------------------------------------------------------------

@pytest.mark.parametrize("flags, words", [
    (["--budget", "nan"], "must be a number, got NaN"),
    (["--budget", "0"], "must be at least 1"),
    (["--budget", "8", "--model", "/nonexistent/model"], "does not exist"),
    (["--budget", "8", "--policy", "nonesuch"], "unknown policy"),
])
def test_a_refused_sweep_writes_nothing(tmp_path, flags, words):
    out = tmp_path / "out"
    done = cli("sweep", "--prompts", prompts_file(tmp_path), "--policy", "h2o", *flags, "--out", str(out))
    assert done.returncode == 2 and words in done.stderr.strip().splitlines()[-1]  # argparse's usage lines above it
    assert not out.exists()


def test_a_manifest_beside_no_row_does_not_pin_the_folder(tmp_path, monkeypatch):
    """An earlier version wrote manifest.json before its refusal; the corrected rerun was refused ("holds a sweep
    with other settings") although the folder held no row."""
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST).write_text(json.dumps({"format": sweep_module.FORMAT, "settings": {
        "model": "/nonexistent", "mode": "decode", "every": 1, "max_new_tokens": 32, "extra": {}}}))
    spec = SweepSpec(prompts_file(tmp_path), ("h2o",), (8,), max_new_tokens=6)
    monkeypatch.setattr(sweep_module, "_rows", lambda model, todo, *_: iter(fake_row(case) for case in todo))
    table = run_sweep(spec, out, progress=False)
    assert len(table) == len(PROMPTS)
    assert json.loads((out / MANIFEST).read_text())["settings"]["max_new_tokens"] == 6  # now the rows' settings
    assert not (out / LOCK).exists()  # the lock goes with the sweep that held it


def test_a_second_sweep_into_a_busy_folder_is_refused_before_any_work(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()

    def no_work(self):
        raise AssertionError("the prompts were read for a folder another sweep is writing")

    monkeypatch.setattr(SweepSpec, "cases", no_work)
    with locked(out):
        done = cli("sweep", "--prompts", "builtin:needle", "--policy", "h2o", "--budget", "8", "--out", str(out))
    assert done.returncode == 2 and "is being written by another sweep" in done.stderr
    assert not (out / LOCK).exists()


def test_the_tables_are_replaced_together(tmp_path):
    """A full disk while the second table is written leaves both old tables (they were replaced one after the other,
    so a failure between left them from different runs)."""
    first, second = tmp_path / "table.csv", tmp_path / "table.parquet"
    first.write_text("old csv")
    second.write_text("old parquet")

    def full_disk(handle):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(KvvizError, match="No space left on device"):
        replace_all({first: lambda handle: handle.write(b"new csv"), second: full_disk})
    assert first.read_text() == "old csv" and second.read_text() == "old parquet"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.csv", "table.parquet"]  # no staged file left


def test_a_folder_that_refuses_the_lock_file_is_refused_in_one_line(tmp_path, monkeypatch):
    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).endswith(LOCK) and flags & os.O_CREAT:
            raise PermissionError(errno.EROFS, os.strerror(errno.EROFS))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(KvvizError, match="cannot write .*sweep.lock .*Read-only file system"):
        with locked(tmp_path):
            pass


# --- 4. every range is bounded before it is expanded ----------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--evict", "--evict-layers", "--evict-heads"])
def test_a_huge_range_is_refused_before_it_is_built(flag):
    tracemalloc.start()
    done = cli("whatif", "--turn", "hi", "--evict", "1", flag, "0-400000000")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert done.returncode == 2 and "does not exist" in done.stderr
    assert peak < 50 * 2**20  # the 400-million-element list took ~11 GB


def test_a_huge_bits_for_range_is_refused_before_it_is_built():
    done = cli("whatif", "--turn", "hi", "--bits-for", "0-400000000=4")
    assert done.returncode == 2 and "slot 400,000,000 does not exist" in done.stderr


def test_slot_lists_are_bounded_by_what_they_name():
    from kvviz.cli.whatif import parse_slots

    assert parse_slots("3,5-9", limit=10) == [3, 5, 6, 7, 8, 9]
    with pytest.raises(KvvizError, match="layer 30 does not exist: layers run from 0 to 29"):
        parse_slots("0-30", "layer", 30)
    with pytest.raises(KvvizError, match="names more than 10 slots"):
        parse_slots("0-9,0-9", limit=10)
    with pytest.raises(KvvizError, match="bad slot list"):
        parse_slots("1-" + "9" * 5000)


# --- 5, 6. prompt files that crashed sweeps, or were silently wrong ---------------------------------------------------

@pytest.mark.parametrize("name, words", [
    ("latin1.jsonl", r"latin1.jsonl:1: not UTF-8 text"),
    ("utf16.jsonl", r"utf16.jsonl:1: not UTF-8 text"),
    ("binary.jsonl", r"binary.jsonl:2: not UTF-8 text \(byte 128\)"),  # its first line is bytes 0–9
    ("deep.jsonl", r"deep.jsonl:1: nested too deeply"),
    ("huge_integer.jsonl", r"huge_integer.jsonl:1: holds a number of more than 4,300 digits"),
    ("kvpress_tokens_text.jsonl", r"row 1: max_new_tokens must be an integer in \[1, 4096\], got 'lots'"),
    ("kvpress_tokens_list.jsonl", r"row 1: max_new_tokens must be an integer, got \[8, 16\]"),
    ("kvpress_empty_answer.jsonl", r"row 1: answer must be a non-empty text"),
    ("kvpress_empty_answers.jsonl", r"row 1: answer must be a non-empty text"),
    ("kvpress_id_false.jsonl", r"row 1: id must be a non-empty text or an integer, got False"),
    ("kvpress_id_list.jsonl", r"row 1: id must be a non-empty text or an integer, got \[1, 2\]"),
])
def test_a_hostile_prompt_file_is_refused_naming_it(name, words):
    with pytest.raises(KvvizError, match=words):
        load_prompts(str(HOSTILE / name))


@pytest.mark.parametrize("name, words", [
    ("latin1.jsonl", "latin1.jsonl:1: not UTF-8 text"), ("utf16.jsonl", "utf16.jsonl:1: not UTF-8 text"),
    ("deep.jsonl", "deep.jsonl:1: nested too deeply"),
    ("huge_integer.jsonl", "huge_integer.jsonl:1: holds a number of more than 4,300 digits"),
])
def test_a_hostile_upload_is_refused_naming_it(name, words):
    """The Sweeps tab's upload: the whole view was replaced by "could not be drawn"."""
    with pytest.raises(KvvizError, match=words):
        uploaded_prompts(name, (HOSTILE / name).read_bytes())


def test_a_kvpress_id_zero_keeps_its_name():
    """``0`` was renamed to ``kvpress-1`` (``row.get("id") or …``); kvviz's own JSONL keeps it as "0"."""
    assert [p.id for p in load_prompts(str(HOSTILE / "kvpress_id_zero.jsonl"))] == ["0"]


def test_a_sweep_of_a_hostile_prompt_file_exits_2_in_one_line(tmp_path):
    done = cli("sweep", "--prompts", str(HOSTILE / "deep.jsonl"), "--policy", "h2o", "--budget", "8",
               "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "nested too deeply" in done.stderr
    assert not (tmp_path / "out").exists()


# --- 8, 9. a device or a model kvviz cannot use is refused at load --------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA has a cuda:0")
@pytest.mark.parametrize("device", ["cuda:7", "cuda"])
def test_a_cuda_device_on_a_cpu_build_is_refused_in_one_line(device, monkeypatch):
    monkeypatch.setenv("KVVIZ_DEVICE", device)
    done = cli("chat", "--turn", "hi", "--max-new-tokens", "1")
    assert done.returncode == 2 and "asks for CUDA, which this machine's torch cannot use" in done.stderr
    assert "AssertionError" not in done.stderr and done.stderr.count("\n") == 1


def test_a_cuda_index_past_the_last_gpu_is_refused(monkeypatch):
    from kvviz.model import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ModelLoadError, match=r"'cuda:7' does not exist: this machine has 2 CUDA devices"):
        pick_device("cuda:7")


def test_a_multi_head_latent_attention_checkpoint_loads_and_answers_as_the_model(tmp_path, tokenizer):
    """A DeepSeek-V3 checkpoint loaded ("ready") and crashed at its first turn inside the recorder (the geometry took
    config.head_dim for the 24-wide query); it was then refused at load, and now runs (kvviz/latent.py): its first
    turn equals a forward without cache within the logit rounding."""
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    from kvviz.model import load_model
    from kvviz.session import Session
    from tests.support.rounding import logit_rounding

    config = DeepseekV3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                              moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
                              kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=8,
                              max_position_embeddings=256, n_group=1, topk_group=1)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    lm = load_model(tmp_path)
    session = Session(lm)
    session.add_user_turn("Hello there")
    session.generate(3)
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([session.transcript.ids]), use_cache=False)
    assert (lm.kv_heads, lm.head_dim) == (1, 16 + 8)  # one latent and one RoPE key per token
    assert (out.logits[0, -1] - session.logits).abs().max() <= logit_rounding(lm.config, out.logits[0, -1])


# --- 10. the hidden-state hooks follow the model, not its address -----------------------------------------------------

def test_every_model_records_hidden_states_even_at_a_freed_models_address():
    """kvviz marked a model hooked by ``id(model)``: a model freed and another made at its address (a notebook or a
    sweep calling ``main()`` once per case) got no hooks and recorded nothing ("IndexError: list index out of range"
    in layer 0 of a press reading hidden states, one run in three under load)."""
    from kvviz.hidden_log import HiddenLog, recording
    from kvviz.model import LoadedModel
    from kvviz.tiny_models import tiny

    seen, reused = set(), 0
    for _ in range(60):
        lm = LoadedModel(model=tiny("llama"), tokenizer=None, name="tiny", device=torch.device("cpu"))
        reused += id(lm.model) in seen
        seen.add(id(lm.model))
        log = HiddenLog(lm.layers)
        with torch.no_grad(), recording(lm, log):
            lm.model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=False)
        assert [log.layer(layer).shape[0] for layer in range(lm.layers)] == [3] * lm.layers
        del lm, log
        gc.collect()
        if reused >= 2:
            break
    if not reused:
        pytest.skip("no model was made at a freed model's address in 60 tries")


# --- 11. smaller ----------------------------------------------------------------------------------------------------

def test_an_unknown_kvpress_press_is_named_as_unknown():
    from kvviz.policies.kvpress.presses import from_kvpress

    with pytest.raises(KvvizError, match=r"kvpress has no press called 'SnapKVPres'; did you mean SnapKVPress"):
        from_kvpress("SnapKVPres")
    with pytest.raises(KvvizError, match=r"kvpress has no press called 'NoSuchPress'; its presses: "):
        from_kvpress("NoSuchPress")


def test_what_the_library_reads_is_what_the_table_holds(tmp_path, monkeypatch):
    """The kvpress id ``0`` reaches the table as "0" and the summary prints it."""
    spec = SweepSpec(str(HOSTILE / "kvpress_id_zero.jsonl"), ("h2o",), (8,), max_new_tokens=6)
    monkeypatch.setattr(sweep_module, "_rows", lambda model, todo, *_: iter(fake_row(case) for case in todo))
    table = run_sweep(spec, tmp_path / "out", progress=False)
    assert list(pd.read_csv(tmp_path / "out" / "table.csv", dtype=str)["prompt_id"]) == ["0"]
    assert list(table["prompt_id"]) == ["0"]


def test_a_number_of_5000_digits_is_refused_in_one_line():
    """``number()`` crashed on it: NaN's check converts to float ("int too large to convert to float")."""
    from kvviz.numbers import number

    with pytest.raises(KvvizError, match="x must be finite .* got an integer of about 5,000 digits"):
        number(10**5000, "x", integer=True)
    with pytest.raises(KvvizError, match=r"x must be an integer, got '9999.*…"):
        number("9" * 5000, "x", integer=True)


def test_a_sys_exit_inside_a_command_is_never_a_silent_success(monkeypatch):
    """Where kvviz calls a user's code it names it (tests/model/test_hostile_third_round.py); anything that still
    raises ``SystemExit`` inside a command (a user's Policy overriding ``decide``) ended it with exit 0 and no output."""
    from kvviz.cli import chat

    def exits(args):
        raise SystemExit(0)

    monkeypatch.setattr(chat, "run", exits)
    done = cli("chat", "--turn", "hi")
    assert done.returncode == 2 and "called sys.exit(0)" in done.stderr and "did not finish" in done.stderr


def test_a_sweep_that_fails_before_its_first_row_leaves_no_folder(tmp_path, monkeypatch):
    """A model that loads no further than its files (a damaged checkpoint) fails inside the sweep: the folder it made
    goes, with its empty rows.jsonl (no lock, no manifest were left either)."""
    def broken(model, todo, *_):
        raise KvvizError("cannot load the model in /models/x (HeaderTooLarge)")
        yield

    monkeypatch.setattr(sweep_module, "_rows", broken)
    spec = SweepSpec(prompts_file(tmp_path), ("h2o",), (8,), max_new_tokens=6)
    with pytest.raises(KvvizError, match="HeaderTooLarge"):
        run_sweep(spec, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(KvvizError, match="HeaderTooLarge"):
        run_sweep(spec, kept, progress=False)
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt", "rows.jsonl"]  # a folder it did not make stays
