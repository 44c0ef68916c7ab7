#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite on the real bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the browser tests drive Debian's chromium through Playwright (no browser download)
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi
fi
exec .venv/bin/python -m pytest "$@"
