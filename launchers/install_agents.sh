#!/usr/bin/env bash
# Install the real coding-agent CLIs that tests/agents runs through the capture proxy.
# Idempotent: skips what is already installed at the pinned version.
#
#   npm  -> <repo>/.agents/node_modules/.bin/{opencode,codex,claude}
#   pip  -> .venv/bin/mini (mini-swe-agent, beside the project's own deps)
#
# Usage: launchers/install_agents.sh   (after launchers/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
PREFIX="$REPO/.agents"

OPENCODE=opencode-ai@1.18.33
CODEX=@openai/codex@0.169.0
CLAUDE=@anthropic-ai/claude-code@2.1.328
MINI=mini-swe-agent==2.4.6

command -v npm >/dev/null || { echo "install_agents: npm not found (install Node.js >= 20)" >&2; exit 1; }
[ -x .venv/bin/python ] || { echo "install_agents: .venv missing; run launchers/setup.sh first" >&2; exit 1; }

installed() {  # name version -> 0 when node_modules holds exactly that version
  local pkg="$PREFIX/node_modules/$1/package.json"
  [ -f "$pkg" ] && [ "$(node -p "require('$pkg').version")" = "$2" ]
}

npm_want=()
for spec in "$OPENCODE" "$CODEX" "$CLAUDE"; do
  name="${spec%@*}"; version="${spec##*@}"
  installed "$name" "$version" || npm_want+=("$spec")
done
if [ ${#npm_want[@]} -gt 0 ]; then
  mkdir -p "$PREFIX"
  # Install all three together so npm never prunes one while adding another.
  npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "$OPENCODE" "$CODEX" "$CLAUDE"
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
for bin in opencode codex claude; do
  hermetic "$PREFIX/node_modules/.bin/$bin" --version >/dev/null || { echo "install_agents: $bin does not run" >&2; exit 1; }
done

if ! .venv/bin/python -m pip show mini-swe-agent 2>/dev/null | grep -qx "Version: ${MINI#*==}"; then
  .venv/bin/python -m pip install --quiet "$MINI"
fi
.venv/bin/python -m pip check
hermetic .venv/bin/python -c "import transformers, openenv, harbor, minisweagent"
[ -x .venv/bin/mini ] || { echo "install_agents: .venv/bin/mini missing" >&2; exit 1; }

echo "install_agents: opencode $(hermetic "$PREFIX/node_modules/.bin/opencode" --version 2>/dev/null | tail -1)," \
  "codex $(hermetic "$PREFIX/node_modules/.bin/codex" --version 2>/dev/null | tail -1)," \
  "claude $(hermetic "$PREFIX/node_modules/.bin/claude" --version 2>/dev/null | tail -1)," \
  "mini-swe-agent ${MINI#*==}"
