#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite on the real bundled model, in three parts:
#   1. every test but the browser's, as two processes of one thread each (pytest-xdist, a test file per process at a
#      time: a file's fixtures are built once), on this CPU's own ATen capability;
#   2. the browser tests, one at a time (each drives a live app: two at once would time each other out);
#   3. the numeric tier (pytest -m numeric) again under every other ATen CPU capability this CPU has, at two threads
#      and then one, alternating, so a tolerance that holds only for this CPU's summation order (or one thread count)
#      fails here, not on the next machine.
# With arguments: pytest alone, with them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the browser tests drive Debian's chromium through Playwright (no browser download)
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi
fi
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
workers=$(( $(nproc) < 2 ? 1 : 2 ))
OMP_NUM_THREADS=1 .venv/bin/python -m pytest -m "not browser" -n "$workers" --dist loadfile
.venv/bin/python -m pytest -m browser
native=$(.venv/bin/python -c "import torch; print(torch.backends.cpu.get_cpu_capability().lower())")
case "$native" in avx2|avx512) ladder="default avx2 avx512";; *) ladder="default";; esac  # x86 has the ladder
threads=2
for capability in $ladder; do
  [ "$capability" = "$native" ] && break  # the suite ran under it; the ladder stops at what the CPU has
  echo "== numeric tier under ATEN_CPU_CAPABILITY=$capability, $threads thread(s) (this CPU: $native)"
  ATEN_CPU_CAPABILITY=$capability OMP_NUM_THREADS=$threads .venv/bin/python -m pytest -m numeric -q
  threads=$((3 - threads))
done
