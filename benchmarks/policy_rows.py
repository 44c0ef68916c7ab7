"""The policy-run rows of the benchmark, each against plain transformers doing comparable work in the same run:

- ``policy run decode 64, h2o, 1k``: a prompt of 1k tokens and 64 new tokens with H2O (budget 256) compressing the
  cache before every step (the compressed session alone: the free run a deployment would make) vs plain
  ``generate`` of the same prompt and length.
- ``policy run decode 64, key_diff, 1k``, ``… lag_kv, 1k``, ``… chunk_kv, 1k`` and ``… expected_attention, 1k``: the
  same with the newer policies (KeyDiff; LagKV with partitions of 64 slots; ChunkKV over key norms in chunks of 20;
  expected attention over 512 future positions), each scoring every alive slot before every step; also ``… cur, 1k``
  and ``… critical_kv, 1k`` (over key norms).
- ``run nvfp4 decode 64, 1k`` and ``run int4-token-head decode 64, 1k``: no policy, the cache in that format, each
  slot rounded when written (kvviz.schemes.written), vs plain ``generate``; ``run quantized-fp8 decode 64, 1k``:
  transformers' fp8 QuantizedCache, each step's own K/V rounded as the cache writes them.
- ``policy run prefill 64, kv_zip, 1k``: KVzip compressing the prompt once (its reconstruction pass over the 1k
  context included), then 64 decode steps, vs plain ``generate``.
- ``blame 32 slots at 1k``: ranking the evicted slots of one step and re-running it with each of the 32 most attended
  restored (batched) vs one plain decode step at 1k.
- ``timeline draw 1k × 256``: the eviction timeline of a 256-step run at 1k slots drawn by plotly.js in headless
  Chromium (``Plotly.newPlot`` until the next frame), absolute seconds.
"""

from __future__ import annotations

import json
import statistics

import torch

from benchmarks.harness import Row, paired_times, row, token_ids
from kvviz.policies import CUR, H2O, ChunkKV, CriticalKV, ExpectedAttention, KeyDiff, KVZip, LagKV, Policy
from kvviz.runs.blame import blame
from kvviz.schemes.cache_format import CacheFormat
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.runs.policy_run import run_policy
from kvviz.session import Session


def policy_run(bench, context: int = 1024, tokens: int = 64, budget: int | float | None = 256,
               policy: Policy | None = H2O(), mode: str = "decode", name: str | None = None,
               cache: CacheFormat | None = None
               ) -> Row:
    ids = token_ids(bench.lm, context)
    tensor = torch.tensor([ids], device=bench.lm.device)

    def ours(_) -> None:
        run = CompressedSession(bench.lm, RunSettings(policy, budget, mode, cache_format=cache))
        run.add_ids(ids)
        for _ in range(tokens - 1):
            run.step()

    def plain(_) -> None:
        bench.plain.generate(tensor, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=2)

    return row(name or f"policy run {mode} {tokens}, {policy.name}, {context // 1024}k",
               *paired_times(ours, plain, bench.repeats), 1.5)


def scheme_run(bench, scheme: str) -> Row:
    """A run whose cache is ``scheme`` written slot by slot (kvviz.schemes.written), no policy, vs plain generate."""
    from kvviz.schemes.written import run_cache

    return policy_run(bench, budget=None, policy=None, cache=run_cache(scheme), name=f"run {scheme} decode 64, 1k")


def key_diff_run(bench) -> Row:
    return policy_run(bench, policy=KeyDiff())


def lag_kv_run(bench) -> Row:
    return policy_run(bench, policy=LagKV(lag=64))


def chunk_kv_run(bench) -> Row:
    return policy_run(bench, policy=ChunkKV())


def expected_attention_run(bench) -> Row:
    return policy_run(bench, policy=ExpectedAttention())


def cur_run(bench) -> Row:
    return policy_run(bench, policy=CUR())


def critical_kv_run(bench) -> Row:
    return policy_run(bench, policy=CriticalKV(inner="key_norm"))


def kv_zip_run(bench) -> Row:
    return policy_run(bench, policy=KVZip(), mode="prefill")  # query-agnostic: compressed once, as in its paper


def _run(bench, context: int, tokens: int, budget: int):
    text = bench.lm.tokenizer.decode(token_ids(bench.lm, context - 40))  # ~context slots with the chat template
    return run_policy(bench.lm, [text], RunSettings(H2O(), budget, "decode"), max_new_tokens=tokens)


def blame_row(bench, context: int = 1024, slots: int = 32) -> Row:
    result = _run(bench, context, 4, 256)
    session = Session(bench.lm)
    session.add_ids(result.last.forced.session.transcript.ids[: result.last.steps[0].slot + 1])
    step, cache = bench._plain_step(session)
    ours, plain = paired_times(lambda _: blame(result, step=0, limit=slots), step, bench.repeats, theirs_setup=cache)
    return row(f"blame {slots} slots at {context // 1024}k", ours, plain, 2.0)


def timeline_draw(bench, context: int = 1024, steps: int = 256) -> Row:
    from playwright.sync_api import sync_playwright

    from benchmarks.browser import CHROMIUM, CHROMIUM_ARGS
    from plotly.offline import get_plotlyjs

    from kvviz import figures  # here, not at the top: the GPU check's machine runs the other rows without plotly

    result = _run(bench, context, steps + 1, 256)
    pieces = [slot.text for slot in result.last.forced.session.transcript.slots]
    spec = json.loads(figures.timeline(result, pieces).to_json())  # what Streamlit sends the page
    draws = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_content(f"<html><body><div id='t'></div><script>{get_plotlyjs()}</script></body></html>")
        for _ in range(bench.repeats + 1):
            seconds = page.evaluate("""async (fig) => {
                const div = document.getElementById('t'); Plotly.purge(div);
                const start = performance.now();
                await Plotly.newPlot(div, fig.data, fig.layout);
                await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
                return (performance.now() - start) / 1000; }""", spec)
            draws.append(seconds)
        browser.close()
    draws = draws[1:]
    median = statistics.median(draws)
    shape = f"{len(pieces)} slots × {len(result.last.steps)} steps"
    return Row(f"timeline draw {context // 1024}k × {steps}", median, 1.0, False, median <= 1.0,
               f"Plotly.newPlot → next frame, {shape}, median of {len(draws)} ({min(draws):.2f}–{max(draws):.2f}), "
               "absolute seconds")


