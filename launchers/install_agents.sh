#!/usr/bin/env bash
# Install the real coding-agent CLIs that tests/agents runs through the capture proxy.
# Idempotent: skips what is already installed at the pinned version.
#
# What to install comes from the agent registry (harness_grpo/agents/, one module per agent):
#   npm  -> <repo>/.agents/node_modules/.bin/   (opencode, codex, claude)
#   pip  -> .venv/bin/                          (mini, beside the project's own deps)
#
# Usage: launchers/install_agents.sh   (after launchers/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
PREFIX="$REPO/.agents"

command -v npm >/dev/null || { echo "install_agents: npm not found (install Node.js >= 20)" >&2; exit 1; }
[ -x .venv/bin/python ] || { echo "install_agents: .venv missing; run launchers/setup.sh first" >&2; exit 1; }
# The venv's real path: pip writes it into the scripts it installs, and a symlinked .venv (a worktree sharing
# another checkout's venv) must not leave them pointing through a link that may go away.
VENV="$(cd .venv && pwd -P)"

registry() { "$VENV/bin/python" -m harness_grpo.agents "$@"; }  # run from the repo root: this checkout's registry
NPM_SPECS="$(registry --install-specs npm)"
NPM_BINS="$(registry --binaries npm)"
PIP_SPECS="$(registry --install-specs pip)"
PIP_BINS="$(registry --binaries pip)"

installed() {  # name version -> 0 when node_modules holds exactly that version
  local pkg="$PREFIX/node_modules/$1/package.json"
  [ -f "$pkg" ] && [ "$(node -p "require('$pkg').version")" = "$2" ]
}

npm_want=()
for spec in $NPM_SPECS; do
  name="${spec%@*}"; version="${spec##*@}"
  installed "$name" "$version" || npm_want+=("$spec")
done
if [ ${#npm_want[@]} -gt 0 ]; then
  mkdir -p "$PREFIX"
  # Install them all together so npm never prunes one while adding another.
  # shellcheck disable=SC2086
  npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error $NPM_SPECS
fi
# Smoke-run each CLI with a throwaway HOME, so nothing lands in the real ~/.config, ~/.codex, ~/.claude.
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
hermetic() {
  env HOME="$SCRATCH" XDG_CONFIG_HOME="$SCRATCH/.config" XDG_DATA_HOME="$SCRATCH/.local/share" \
    XDG_CACHE_HOME="$SCRATCH/.cache" XDG_STATE_HOME="$SCRATCH/.local/state" CODEX_HOME="$SCRATCH/.codex" \
    MSWEA_GLOBAL_CONFIG_DIR="$SCRATCH/mini" MSWEA_SILENT_STARTUP=1 "$@"
}
mkdir -p "$SCRATCH/.codex"
for bin in $NPM_BINS; do
  hermetic "$PREFIX/node_modules/.bin/$bin" --version >/dev/null || { echo "install_agents: $bin does not run" >&2; exit 1; }
done

pip_want=()
for spec in $PIP_SPECS; do
  name="${spec%%==*}"; version="${spec##*==}"
  "$VENV/bin/python" -m pip show "$name" 2>/dev/null | grep -qx "Version: $version" || pip_want+=("$spec")
done
if [ ${#pip_want[@]} -gt 0 ]; then
  "$VENV/bin/python" -m pip install --quiet "${pip_want[@]}"
fi
"$VENV/bin/python" -m pip check
hermetic "$VENV/bin/python" -c "import transformers, openenv, harbor"
for bin in $PIP_BINS; do
  [ -x "$VENV/bin/$bin" ] || { echo "install_agents: $VENV/bin/$bin missing" >&2; exit 1; }
done

summary=()
for bin in $NPM_BINS; do
  summary+=("$bin $(hermetic "$PREFIX/node_modules/.bin/$bin" --version 2>/dev/null | tail -1)")
done
for spec in $PIP_SPECS; do
  summary+=("${spec%%==*} ${spec##*==}")
done
line=""
for part in "${summary[@]}"; do line+="${line:+, }$part"; done
echo "install_agents: $line"
