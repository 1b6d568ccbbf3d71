#!/usr/bin/env bash
# Create .venv with Python 3.12 and install the project (editable, with the dev
# extra) with uv, from the package sources pip is configured with
# (launchers/uv_install.py). Idempotent: re-runs only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.12}"
command -v "$PYTHON" >/dev/null || { echo "setup: $PYTHON not found; install Python 3.12 or set PYTHON=" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=".venv/.harness-grpo-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip uv
  .venv/bin/python launchers/uv_install.py --quiet -e ".[dev]"
  echo "$want" > "$stamp"
fi
