"""Run a registry agent in a sandbox, hermetically: ``run_agent``.

``run_agent`` asks the agent's spec to ``configure`` the run, writes the config files into the sandbox,
and runs the CLI there with an environment built from scratch: ``PATH``, locale, HOME and every XDG
directory under the sandbox's ``home``, and the agent's own variables. Nothing is read from or written to
the real ``$HOME``, and a host API key can never leak into a run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

from harness_grpo.agents.registry import agent_binary, get_agent
from harness_grpo.agents.spec import AgentLaunch
from harness_grpo.sandbox import ProcessResult, Sandbox

HOME_DIRS = {
    "XDG_CONFIG_HOME": ".config",
    "XDG_DATA_HOME": ".local/share",
    "XDG_STATE_HOME": ".local/state",
    "XDG_CACHE_HOME": ".cache",
    "TMPDIR": "tmp",
}
"""The directories under the agent's home that the hermetic environment points at (created before the run)."""

SMALL_MODEL_PROMPT = (
    "You are a coding agent in a terminal. Use the bash tool to run shell commands in the working "
    "directory. Answer briefly when the task is done."
)
"""A short system prompt for small models: every agent's own prompt and tool schemas fill 8-16k tokens."""


@dataclass
class AgentRun(ProcessResult):
    """What one agent run did: its process, plus the agent, its working tree and the files it left."""

    agent: str
    workdir: Path
    files: dict[str, Path]

    @property
    def label(self) -> str:
        return self.agent


def hermetic_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """A fresh environment whose HOME and XDG dirs are all under ``home``; nothing else is inherited."""
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "1",
        **{name: str(home / relative) for name, relative in HOME_DIRS.items()},
        **extra,
    }


def run_agent(
    agent: str,
    sandbox: Sandbox,
    *,
    base_url: str,
    api_key: str,
    model: str,
    task: str,
    timeout_s: float | None,
    max_steps: int | None = None,
    system_prompt: str | None = None,
) -> AgentRun:
    """Run ``agent`` on ``task`` in ``sandbox`` against the proxy at ``base_url`` (see ``AgentLaunch``).

    ``max_steps`` defaults to the spec's. Blocks until the agent exits or ``timeout_s`` passes (the whole
    process group is killed either way; ``AgentRun.timed_out``). ``FileNotFoundError`` when the CLI is
    not installed.
    """
    spec = get_agent(agent)
    binary = agent_binary(agent)
    if binary is None:
        raise FileNotFoundError(f"{agent} is not installed; run launchers/install_agents.sh")
    command = spec.configure(
        AgentLaunch(
            binary=str(binary),
            base_url=base_url,
            api_key=api_key,
            model=model,
            task=task,
            workdir=sandbox.workdir,
            home=sandbox.home,
            max_steps=spec.max_steps if max_steps is None else max_steps,
            system_prompt=system_prompt,
        )
    )
    for relative in HOME_DIRS.values():
        sandbox.mkdir(sandbox.home / relative)
    for path, text in command.files.items():
        sandbox.write_file(path, text)
    result = sandbox.run(command.argv, env=hermetic_env(sandbox.home, command.env), timeout_s=timeout_s)
    process = {f.name: getattr(result, f.name) for f in fields(ProcessResult)}
    return AgentRun(**process, agent=agent, workdir=sandbox.workdir, files=dict(command.outputs))
