#!/usr/bin/env bash
# Set up (if needed) and run the test suite on the real bundled model. The tiers are the folders of tests/
# (docs/tests.md):
#   1. tests/unit, tests/model, tests/app and tests/process as two processes of one thread each (pytest-xdist, a test
#      file per process at a time: a file's fixtures are built once);
#   2. tests/browser, one test at a time (each drives a live app: two at once would time each other out);
#   3. the numeric tiers, tests/unit and tests/model, again under every other ATen CPU capability this CPU has, at two
#      threads and then one, alternating, so a tolerance that holds only for this CPU's summation order (or one thread
#      count) fails here, not on the next machine; two processes as in part 1, their OpenMP threads sleeping when idle
#      (OMP_WAIT_POLICY=PASSIVE: two processes of two spinning threads on two cores ran ~4x slower).
# --fast: tests/unit and tests/model only, as in part 1 (the inner loop while you work).
# With other arguments: pytest alone, with them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
workers=$(( $(nproc) < 2 ? 1 : 2 ))
parallel=(-n "$workers" --dist loadfile)
if [ "${1:-}" = "--fast" ]; then
  shift
  OMP_NUM_THREADS=1 exec .venv/bin/python -m pytest tests/unit tests/model "${parallel[@]}" "$@"
fi
bash scripts/chromium.sh
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/unit tests/model tests/app tests/process "${parallel[@]}" \
  --durations=25
.venv/bin/python -m pytest tests/browser --durations=10
native=$(.venv/bin/python -c "import torch; print(torch.backends.cpu.get_cpu_capability().lower())")
case "$native" in avx2|avx512) ladder="default avx2 avx512";; *) ladder="default";; esac  # x86 has the ladder
threads=2
for capability in $ladder; do
  [ "$capability" = "$native" ] && break  # the suite ran under it; the ladder stops at what the CPU has
  echo "== tests/unit and tests/model under ATEN_CPU_CAPABILITY=$capability, $threads thread(s) (this CPU: $native)"
  ATEN_CPU_CAPABILITY=$capability OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=PASSIVE \
    .venv/bin/python -m pytest tests/unit tests/model "${parallel[@]}" -q
  threads=$((3 - threads))
done
