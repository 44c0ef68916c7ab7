#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs on a CUDA machine that can download nothing (the lent H200: Python 3.12 with
# CUDA torch, no network) into .gpu/1, .gpu/2, … — each small enough for one call of the device tool (64 MiB with the
# working tree): the wheels of the packages pinned here that such a machine lacks or has in another version, and the
# bundled model's GGUF in parts. Carry .gpu/1 in the first call, .gpu/2 in the next, …; each call runs
# scripts/gpu_check.sh --stage, the last one scripts/gpu_check.sh (docs/performance.md#the-gpu-check).
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
[ -x "$py" ] || { echo "run scripts/setup.sh first (the bundled model and the pinned versions come from .venv)" >&2; exit 2; }
rm -rf .gpu && mkdir -p .gpu/wheels .gpu/parts
# the pinned versions of this .venv: transformers and what it needs that the machine's image lacks, gguf (the bundled
# model is a GGUF), tokenizers and huggingface_hub in the versions transformers was tested with
pins=$("$py" -m pip freeze | grep -iE '^(transformers|tokenizers|huggingface[-_]hub|httpx2|httpcore2|gguf)==')
# shellcheck disable=SC2086
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/wheels $pins
gguf=$("$py" -c "from kvviz.checkpoint import bundled_gguf; print(bundled_gguf())")
split -b 30M -d "$gguf" .gpu/parts/model.gguf.part-
# bundles of at most 56 MB: the wheels with the first part, then a part each
bundle=1 && size=0 && mkdir -p .gpu/$bundle
for file in .gpu/wheels/* .gpu/parts/*; do
  bytes=$(stat -c %s "$file")
  if [ $((size + bytes)) -gt 56000000 ]; then bundle=$((bundle + 1)) && size=0 && mkdir -p .gpu/$bundle; fi
  mv "$file" .gpu/$bundle/ && size=$((size + bytes))
done
rmdir .gpu/wheels .gpu/parts
du -sh .gpu/*
echo "carry .gpu/1 … .gpu/$bundle, one per call, in order (docs/performance.md#the-gpu-check)"
