#!/usr/bin/env bash
# Set up (if needed) and start the dashboard on the bundled model at http://127.0.0.1:8501
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# two glibc malloc arenas, not glibc's 8 per core: memory the sessions' threads free is then trimmed back to the system
# (six closed sessions left ~25 MB resident instead of ~90-130 MB, docs/serving.md); a value set by the caller is kept
MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}" exec .venv/bin/streamlit run app/main.py "$@"
