"""The agent registry: one ``AgentSpec`` per coding-agent CLI, looked up by name.

``REGISTRY`` maps each agent's name to its spec, in the order below; ``AGENTS`` is its names.
``get_agent`` raises a ``ValueError`` naming the choices for an unknown name; ``agent_binary`` is the
installed executable, or None before ``launchers/install_agents.sh`` ran (it installs every spec's
``install`` pin: ``python -m harness_grpo.agents --install-specs npm`` lists them).
"""

from __future__ import annotations

import os
from pathlib import Path

from harness_grpo.agents import claude_code, codex, mini_swe_agent, opencode
from harness_grpo.agents.spec import AgentSpec

REGISTRY: dict[str, AgentSpec] = {
    module.SPEC.name: module.SPEC for module in (opencode, codex, claude_code, mini_swe_agent)
}
AGENTS: tuple[str, ...] = tuple(REGISTRY)


def get_agent(name: str) -> AgentSpec:
    """The spec registered as ``name``; ``ValueError`` naming the registered agents otherwise."""
    spec = REGISTRY.get(name)
    if spec is None:
        raise ValueError(f"unknown agent {name!r}; choose from {', '.join(REGISTRY)}")
    return spec


def agent_binary(name: str) -> Path | None:
    """The installed executable of agent ``name``, or None when ``launchers/install_agents.sh`` has not run."""
    path = get_agent(name).binary_path
    return path if path.exists() and os.access(path, os.X_OK) else None


def install_specs(manager: str) -> list[str]:
    """The pinned requirements ``manager`` installs, in registry order."""
    return [spec.install.spec for spec in REGISTRY.values() if spec.install.manager == manager]
