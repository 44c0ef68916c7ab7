#!/usr/bin/env bash
# The browser tests under load: tests/browser RUNS times in a row (5 unless given) while the numeric tiers run in a
# loop beside them, so the CPU is busy the whole time; stops at the first run that fails. A browser test waits on the
# states the page exposes (docs/tests.md), so none may fail by timing here.
#   bash scripts/stress_browser.sh [RUNS] [pytest arguments…]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh > /dev/null
bash scripts/chromium.sh
runs=${1:-5}
shift || true
setsid bash -c 'while :; do OMP_NUM_THREADS=2 .venv/bin/python -m pytest tests/unit tests/model -q -p no:cacheprovider \
  > /dev/null 2>&1; done' &
busy=$!
trap 'kill -- "-$busy" 2> /dev/null || true' EXIT
for run in $(seq 1 "$runs"); do
  echo "== tests/browser, run $run of $runs, beside the numeric tiers (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  .venv/bin/python -m pytest tests/browser -q -p no:cacheprovider "$@"
done
echo "== $runs of $runs runs of tests/browser passed beside a busy CPU"
