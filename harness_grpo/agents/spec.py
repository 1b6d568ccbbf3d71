"""What an agent registry entry is: ``AgentSpec``, and what its ``configure`` takes and gives.

An entry says everything the trainer needs to run one coding-agent CLI: its name, its executable, the
dialect it speaks to the capture proxy, how it is installed (package manager and pinned version), its
default step limit, and ``configure``, which turns one run (``AgentLaunch``) into the files, argv and
environment variables of that run (``AgentCommand``). ``configure`` is pure: it writes nothing and starts
nothing (``harness_grpo.agents.run.run_agent`` does, in a ``Sandbox``), so a test can read what an agent
would be given.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Dialect = Literal["openai_chat", "openai_responses", "anthropic_messages"]
"""The API an agent speaks, named as the proxy names its dialects (``proxy.dialects.DIALECTS``)."""
Manager = Literal["npm", "pip"]

REPO = Path(__file__).resolve().parents[2]
BIN_DIRS: dict[str, Path] = {
    "npm": REPO / ".agents" / "node_modules" / ".bin",  # launchers/install_agents.sh: npm --prefix .agents
    "pip": Path(sys.prefix) / "bin",  # the project's own environment
}
"""Where each package manager puts the executables it installs."""


@dataclass(frozen=True)
class Install:
    """How ``launchers/install_agents.sh`` installs an agent: ``manager`` installs ``package`` at ``version``."""

    manager: Manager
    package: str
    version: str

    @property
    def spec(self) -> str:
        """The pinned requirement as the manager spells it (``pkg@1.2.3``, ``pkg==1.2.3``)."""
        return f"{self.package}@{self.version}" if self.manager == "npm" else f"{self.package}=={self.version}"


@dataclass(frozen=True)
class AgentLaunch:
    """One run of an agent, in the sandbox's paths.

    ``base_url`` is the proxy's root (no ``/v1``); ``api_key`` the proxy session's key, so every call the
    agent makes lands in that session; ``model`` the name it sends; ``task`` the instruction text;
    ``max_steps`` bounds its loop where the CLI has a flag for it; ``system_prompt`` (e.g.
    ``SMALL_MODEL_PROMPT``) replaces the agent's own prompt and keeps its shell tool only.
    """

    binary: str
    base_url: str
    api_key: str
    model: str
    task: str
    workdir: Path
    home: Path
    max_steps: int | None = None
    system_prompt: str | None = None


@dataclass
class AgentCommand:
    """What ``configure`` gives: the process to run and what to put in the sandbox first.

    ``env`` holds the agent's own variables (the hermetic base, HOME and XDG dirs under ``home``, is added
    by ``run_agent``); ``files`` are written before the run; ``outputs`` name files the agent leaves
    (a trajectory, its last message), found on ``AgentRun.files`` afterwards.
    """

    argv: list[str]
    env: dict[str, str]
    files: dict[Path, str] = field(default_factory=dict)
    outputs: dict[str, Path] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentSpec:
    """One coding-agent CLI: see the module docstring. ``max_steps`` None: the CLI has no step limit
    (the proxy's call budget bounds it). ``output_limit_failure``: a regular expression (multi-line) that
    the stdout of a failed run matches when the CLI ended it because a model reply hit the output-token
    limit: the model spent its budget, so the run's reward still stands."""

    name: str
    binary: str
    dialect: Dialect
    install: Install
    configure: Callable[[AgentLaunch], AgentCommand]
    max_steps: int | None
    output_limit_failure: str | None = None

    @property
    def binary_path(self) -> Path:
        """Where ``install`` puts the executable (it may not be installed yet)."""
        return BIN_DIRS[self.install.manager] / self.binary
