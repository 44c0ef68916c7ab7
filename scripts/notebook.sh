#!/usr/bin/env bash
# Set up (if needed) and start JupyterLab on the example notebooks (examples/), on 127.0.0.1 with a token; the
# widget's front end is in the installed packages, nothing is fetched. Arguments go to `jupyter lab`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
root=()
[ "$(id -u)" = 0 ] && root=(--allow-root)  # Jupyter refuses root unless told (a container's usual user)
exec .venv/bin/jupyter lab --ip=127.0.0.1 --ServerApp.root_dir=examples "${root[@]}" "$@"
