"""The Harbor agent for the registry CLIs: run inside the trial, talking to the capture proxy.

``RegistryAgent`` is a Harbor ``BaseAgent`` for any entry of the agent registry (``harness_grpo.agents``:
opencode, claude-code, codex, mini-swe-agent). It installs nothing: ``setup`` checks that the host-installed
CLI is reachable inside the environment (the local sandbox shows the host's ``.agents`` dir and Python
installation at their host paths) and fails with a clear error otherwise. ``run`` asks the entry's
``configure`` for the files, argv and environment of one run against the proxy (its base URL, the session
key, the served model name, an optional system prompt and step limit), writes the files into the
environment, and runs the CLI there with ``environment.exec`` in the task's working directory, with an
environment built from scratch (``hermetic_env``: HOME and the XDG dirs under ``home``). A non-zero exit is
Harbor's ``NonZeroAgentExitCodeError``, or its ``OutputTokenExceededError`` where the CLI stopped on a reply cut
at the output limit (the entry's ``output_limit_failure``; Harbor counts that as the agent's spent budget and
keeps the verifier's reward); Harbor's agent timeout cancels ``run``, and the environment kills the process.
Its kwargs (``AgentConfig.kwargs``): ``agent`` (the registry name), ``proxy_url`` (the proxy's root as the
environment reaches it), ``system_prompt``, ``max_steps``, ``home``; the session key comes from the
agent's environment (``AgentConfig.env[API_KEY_ENV]``), so Harbor scrubs it from the trial's files.

Terminus-2 is in ``harness_grpo.harbor_terminus2``, so that LiteLLM (seconds to import) loads only where it runs.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from harness_grpo.agents import agent_binary, get_agent
from harness_grpo.agents.run import HOME_DIRS, hermetic_env
from harness_grpo.agents.spec import AgentLaunch

# Before Harbor (or LiteLLM, which it imports) is imported: no telemetry, no cost-map download.
os.environ["HARBOR_TELEMETRY"] = "0"
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from harbor.agents.base import BaseAgent
from harbor.agents.installed.base import NonZeroAgentExitCodeError, OutputTokenExceededError
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from harbor.models.trial.paths import EnvironmentPaths
from harbor.models.trial.result import AgentInfo, ModelInfo

API_KEY_ENV = "HARNESS_API_KEY"
"""The variable of ``AgentConfig.env`` that carries the proxy session's key to every agent here."""
DEFAULT_HOME = "/tmp/harness-agent-home"
"""Where a registry agent's HOME is inside the environment (its configs, caches, trajectory)."""


class AgentUnavailableError(RuntimeError):
    """The agent's CLI (or a tool it needs) is not reachable inside the trial's environment."""


class RegistryAgent(BaseAgent):
    """A registry CLI run inside the trial's environment against the capture proxy (module docstring)."""

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        *args: Any,
        agent: str,
        proxy_url: str,
        system_prompt: str | None = None,
        max_steps: int | None = None,
        home: str = DEFAULT_HOME,
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir, model_name, *args, **kwargs)
        self.spec = get_agent(agent)
        binary = agent_binary(agent)
        if binary is None:
            raise FileNotFoundError(f"{agent} is not installed on this host; run launchers/install_agents.sh")
        self.binary = str(binary)
        self.proxy_url = proxy_url.rstrip("/")
        self.system_prompt = system_prompt
        self.max_steps = self.spec.max_steps if max_steps is None else max_steps
        self.home = PurePosixPath(home)
        if not self.model_name:
            raise ValueError(f"{agent}: model_name (the name the proxy serves) is required")

    @staticmethod
    def name() -> str:
        return "harness-registry-agent"

    def version(self) -> str | None:
        return self.spec.install.version

    def to_agent_info(self) -> AgentInfo:
        model = ModelInfo(name=self.model_name) if self.model_name else None
        return AgentInfo(name=self.spec.name, version=self.spec.install.version, model_info=model)

    async def setup(self, environment: BaseEnvironment) -> None:
        """Check the CLI is reachable in ``environment`` (``AgentUnavailableError`` naming it otherwise)."""
        result = await environment.exec(f"test -x {shlex.quote(self.binary)}")
        if result.return_code != 0:
            raise AgentUnavailableError(
                f"{self.spec.name}: {self.binary} is not reachable inside the {environment.type()} environment; "
                "the local sandbox shows host-installed agent CLIs, other backends need it in the task's image"
            )

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        api_key = self._extra_env.get(API_KEY_ENV)
        if not api_key:
            raise ValueError(f"{self.spec.name}: AgentConfig.env must carry the proxy session key as {API_KEY_ENV}")
        workdir = await working_directory(environment)
        command = self.spec.configure(
            AgentLaunch(
                binary=self.binary,
                base_url=self.proxy_url,
                api_key=api_key,
                model=str(self.model_name),
                task=instruction,
                workdir=Path(workdir),
                home=Path(self.home),
                max_steps=self.max_steps,
                system_prompt=self.system_prompt,
            )
        )
        folders = {str(self.home / relative) for relative in HOME_DIRS.values()}
        folders |= {str(PurePosixPath(path).parent) for path in command.files}
        await _checked(environment, f"mkdir -p {shlex.join(sorted(folders))}")
        for path, text in command.files.items():
            await upload_text(environment, str(path), text)
        env = hermetic_env(Path(self.home), command.env)
        result = await environment.exec(shlex.join(command.argv), cwd=workdir, env=env)
        stdout, stderr = result.stdout or "", result.stderr or ""
        (self.logs_dir / "stdout.txt").write_text(stdout)
        (self.logs_dir / "stderr.txt").write_text(stderr)
        context.metadata = {"agent": self.spec.name, "returncode": result.return_code}
        for name, path in command.outputs.items():  # the agent's own record, downloaded with /logs/agent
            target = EnvironmentPaths.agent_dir / f"{self.spec.name}-{name}{PurePosixPath(path).suffix}"
            await environment.exec(f"cp -f {shlex.quote(str(path))} {shlex.quote(str(target))} 2>/dev/null || true")
        if result.return_code != 0:
            limit = self.spec.output_limit_failure
            error = (
                OutputTokenExceededError
                if limit is not None and re.search(limit, stdout, re.MULTILINE)
                else NonZeroAgentExitCodeError
            )
            raise error(
                f"{self.spec.name} exited with status {result.return_code}\n"
                f"--- stdout\n{stdout[-2000:]}\n--- stderr\n{stderr[-2000:]}"
            )


async def working_directory(environment: BaseEnvironment) -> str:
    """The task's working directory: ``[environment].workdir``, else where the environment's shells start."""
    if environment.task_env_config.workdir:
        return environment.task_env_config.workdir
    return (await _checked(environment, "pwd")).strip() or "/"


async def upload_text(environment: BaseEnvironment, path: str, text: str) -> None:
    """Write ``text`` to ``path`` inside ``environment`` (its parent must exist)."""
    with tempfile.TemporaryDirectory(prefix="harness-upload-") as folder:
        local = Path(folder) / PurePosixPath(path).name
        local.write_text(text)
        await environment.upload_file(local, path)


async def _checked(environment: BaseEnvironment, command: str) -> str:
    result = await environment.exec(command)
    if result.return_code != 0:
        raise RuntimeError(f"{command!r} failed in the environment ({result.return_code}): {result.stderr}")
    return result.stdout or ""
