"""kvpress' own evaluation loop over a file of cases, timed — run by kvpress' Python (a venv with kvpress 0.5.5 and the
transformers it supports; never kvviz's), for the ``sweep beside kvpress' pipeline`` row:

    KVPRESS_PYTHON benchmarks/kvpress_pipeline.py CASES.json MODEL_FOLDER PRESS RATIO MAX_NEW_TOKENS

CASES.json is a list of ``{"context", "question"}``; it prints one JSON object: the cases per minute of kvpress'
``kv-press-text-generation`` pipeline answering each with ``PRESS(compression_ratio=RATIO)``, greedy, on the CPU
(the model loaded before the clock starts, one warm-up case first)."""

import json
import sys
import time

import torch
from transformers import pipeline

import kvpress


def main(cases: str, folder: str, press: str, ratio: str, tokens: str) -> None:
    items = json.loads(open(cases, encoding="utf-8").read())
    pipe = pipeline("kv-press-text-generation", model=folder, device="cpu", dtype=torch.float32)
    instance = getattr(kvpress, press)(compression_ratio=float(ratio))

    def answer(item: dict) -> str:
        return pipe(item["context"], question=item["question"], press=instance, max_new_tokens=int(tokens),
                    do_sample=False)["answer"]

    answer(items[0])
    start = time.perf_counter()
    answers = [answer(item) for item in items]
    seconds = time.perf_counter() - start
    print(json.dumps({"cases_per_min": len(items) / seconds * 60, "seconds": seconds, "answers": answers}))


if __name__ == "__main__":
    main(*sys.argv[1:])
