"""Sessions that run a black-box agent as a process in a sandbox: any agent program, or a registry CLI.

``ProcessSession`` is one rollout: a fresh ``Sandbox`` (its working tree prepared by the factory's
``setup(workdir, task)``), a proxy session (``RolloutContext.lease``) whose key is the agent's API key, and
the agent process, run by ``wait_for_completion``. The agent owns its loop and talks only HTTP;
``fetch_training_trace`` is what the proxy captured under the key; ``verify`` runs the task's verifier on
the working tree after the agent ended (the reward comes from the end state, never from what the agent
reports); ``close`` kills the agent's process group, releases the proxy session and removes the sandbox,
from any thread and more than once.

Factories differ only in how the agent is run (``ProcessSessionFactory.execute``):

- ``LocalAgentSessionFactory``: any program, ``command`` with ``{prompt}`` replaced by the task's text,
  with the host's environment plus the proxy's (``OPENAI_BASE_URL`` = proxy ``/v1``,
  ``ANTHROPIC_BASE_URL`` = proxy root, both API keys = the session key, ``HARNESS_MODEL``,
  ``HARNESS_SEED``);
- ``CLIAgentSessionFactory``: a coding-agent CLI from the registry (``harness_grpo.agents``), configured
  for the proxy and run hermetically (``run_agent``).

Both are ``TrainerBoundSessionFactory``s. Build them through the trainer, which supplies ``sampling`` and
then binds its proxy (``bind_rollout``)::

    factory = functools.partial(LocalAgentSessionFactory, command=[...], verifier=my_verifier)
    factory = functools.partial(CLIAgentSessionFactory, agent="opencode", verifier=my_verifier)

Outside our trainer (TRL's ``HarnessRolloutWorker``, which builds the factory with ``sampling=`` and calls
``create(prompt, seed=, episode_id=)`` and ``wait_for_completion()`` without a timeout), add
``rollout_context=RolloutContext(ProxyEndpoint(proxy_url, admin_key))`` and, for a bound on each agent run,
``agent_timeout_s``. The factories pickle (module-level ``verifier`` and ``setup`` assumed).
"""

from __future__ import annotations

import abc
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness_grpo.agents import agent_binary, get_agent, run_agent
from harness_grpo.rollout_context import BoundSessionFactory, ProxySessionLease, RolloutContext
from harness_grpo.sandbox import ProcessResult, Sandbox, TempDirSandbox
from harness_grpo.session_protocol import VerifyResult, instruction_of
from proxy.trace import TrainingTrace

Verifier = Callable[[Path, Mapping[str, Any]], float | None]
"""``verifier(workdir, task) -> reward`` (None: could not score)."""
Setup = Callable[[Path, Mapping[str, Any]], None]
"""``setup(workdir, task)`` prepares the working tree before the agent starts."""


class ProcessSession:
    """One agent process on one task, in its own sandbox and proxy session (see the module docstring)."""

    def __init__(
        self,
        factory: ProcessSessionFactory,
        task: Mapping[str, Any],
        context: RolloutContext,
        *,
        seed: int,
        episode_id: str,
    ) -> None:
        self.task = task
        self.context = context
        self.seed = seed
        self._factory = factory
        self.sandbox = factory.make_sandbox(episode_id)
        self.lease: ProxySessionLease | None = None
        self.result: ProcessResult | None = None
        self._close_lock = threading.Lock()
        try:
            if factory.setup is not None:
                factory.setup(self.sandbox.workdir, task)
            self.lease = context.lease({"episode_id": episode_id, "seed": seed, **factory.metadata})
            self.api_key = self.lease.key  # the agent's API key: its calls land in this proxy session
        except BaseException:
            self.close()
            raise

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """Run the agent to its end (blocking); its exit status. ``TimeoutError`` when killed at ``timeout_s``
        (None: the factory's ``agent_timeout_s``)."""
        if timeout_s is None:
            timeout_s = self._factory.agent_timeout_s
        self.result = self._factory.execute(self, timeout_s)
        if self.result.timed_out:
            raise TimeoutError(f"{self._factory.name} did not finish within {timeout_s} s")
        return self.result.returncode

    def fetch_training_trace(self) -> TrainingTrace:
        assert self.lease is not None
        return self.lease.trace()

    def verify(self, transcript: Any = None, final_state: Any = None) -> VerifyResult:
        return VerifyResult(env_reward=self._factory.verifier(self.sandbox.workdir, self.task))

    def close(self) -> None:
        """Kill the agent's process group, delete its proxy session and its sandbox; any thread, twice."""
        with self._close_lock:
            self.sandbox.close()
            if self.lease is not None:
                self.lease.release()


class ProcessSessionFactory(BoundSessionFactory, abc.ABC):
    """Creates ``ProcessSession``s; the trainer passes ``sampling`` and binds its proxy (``bind_rollout``).

    A subclass says how the agent runs (``execute``), its ``name`` (sandbox prefix, error messages) and what
    it adds to the proxy session's ``metadata``. ``make_sandbox`` is where each session's ``Sandbox`` comes
    from (another backend overrides it); ``workdir_root`` is where temp-dir sandboxes are made (default: the
    system's temporary directory). ``rollout_context`` binds a proxy when no trainer of ours will
    (``BoundSessionFactory``); ``agent_timeout_s`` bounds an agent run whose caller gives no timeout.
    """

    name = "agent"

    def __init__(
        self,
        *,
        verifier: Verifier,
        sampling: dict[str, Any],
        setup: Setup | None = None,
        workdir_root: str | None = None,
        rollout_context: RolloutContext | None = None,
        agent_timeout_s: float | None = None,
    ) -> None:
        self.verifier = verifier
        self.setup = setup
        self.sampling = dict(sampling)
        self.workdir_root = workdir_root
        self.agent_timeout_s = agent_timeout_s
        self.bind_standalone(rollout_context, self.sampling)

    @property
    def metadata(self) -> dict[str, Any]:
        return {}

    def create_from_row(self, row: Mapping[str, Any], *, seed: int, episode_id: str) -> ProcessSession:
        """A session on the task ``row``: its sandbox set up and its proxy session created; the agent runs
        in ``wait_for_completion``."""
        return ProcessSession(self, row, self.bound_context(), seed=seed, episode_id=episode_id)

    @abc.abstractmethod
    def execute(self, session: ProcessSession, timeout_s: float | None) -> ProcessResult:
        """Run the agent in ``session.sandbox`` until it exits or ``timeout_s`` passes (``Sandbox.run``)."""

    def make_sandbox(self, episode_id: str) -> Sandbox:
        """Where one session's agent runs: a fresh ``TempDirSandbox`` under ``workdir_root``."""
        return TempDirSandbox(prefix=f"{self.name}-{episode_id[:8]}-", dir=self.workdir_root)


class LocalAgentSessionFactory(ProcessSessionFactory):
    """Any agent program: ``command`` is its argv, ``{prompt}`` in any part replaced by the task's prompt
    text; it gets the host's environment, ``env``, and the proxy's variables (module docstring)."""

    def __init__(
        self,
        *,
        command: Sequence[str],
        verifier: Verifier,
        sampling: dict[str, Any],
        setup: Setup | None = None,
        env: Mapping[str, str] | None = None,
        workdir_root: str | None = None,
        rollout_context: RolloutContext | None = None,
        agent_timeout_s: float | None = None,
    ) -> None:
        super().__init__(
            verifier=verifier,
            sampling=sampling,
            setup=setup,
            workdir_root=workdir_root,
            rollout_context=rollout_context,
            agent_timeout_s=agent_timeout_s,
        )
        self.command = list(command)
        self.env = dict(env or {})

    def execute(self, session: ProcessSession, timeout_s: float | None) -> ProcessResult:
        base_url, key = session.context.proxy.base_url, session.api_key
        env = {
            **os.environ,
            **self.env,
            "OPENAI_BASE_URL": f"{base_url}/v1",
            "OPENAI_API_KEY": key,
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": key,
            "HARNESS_MODEL": session.context.model_name,
            "HARNESS_SEED": str(session.seed),
        }
        prompt = instruction_of(session.task.get("prompt", ""))
        argv = [part.replace("{prompt}", prompt) for part in self.command]
        return session.sandbox.run(argv, env=env, timeout_s=timeout_s)


class CLIAgentSessionFactory(ProcessSessionFactory):
    """A coding-agent CLI from the registry (``agent``, one of ``harness_grpo.agents.AGENTS``), run hermetically.

    ``system_prompt`` (e.g. ``SMALL_MODEL_PROMPT`` for the tiny model) replaces the agent's own prompt and
    keeps its shell tool only; the agent gets the task's prompt text. An unknown ``agent`` is a
    ``ValueError`` naming the choices, one not installed a ``FileNotFoundError``.
    """

    def __init__(
        self,
        *,
        agent: str,
        verifier: Verifier,
        sampling: dict[str, Any],
        setup: Setup | None = None,
        system_prompt: str | None = None,
        workdir_root: str | None = None,
        rollout_context: RolloutContext | None = None,
        agent_timeout_s: float | None = None,
    ) -> None:
        get_agent(agent)
        if agent_binary(agent) is None:
            raise FileNotFoundError(f"{agent} is not installed; run launchers/install_agents.sh")
        super().__init__(
            verifier=verifier,
            sampling=sampling,
            setup=setup,
            workdir_root=workdir_root,
            rollout_context=rollout_context,
            agent_timeout_s=agent_timeout_s,
        )
        self.agent = self.name = agent
        self.system_prompt = system_prompt

    @property
    def metadata(self) -> dict[str, Any]:
        return {"agent": self.agent}

    def execute(self, session: ProcessSession, timeout_s: float | None) -> ProcessResult:
        return run_agent(
            self.agent,
            session.sandbox,
            base_url=session.context.proxy.base_url,
            api_key=session.api_key,
            model=session.context.model_name,
            task=instruction_of(session.task["prompt"]),
            timeout_s=timeout_s,
            system_prompt=self.system_prompt,
        )
