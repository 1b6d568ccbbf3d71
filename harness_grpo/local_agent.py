"""Sessions that run a black-box agent program as a local process.

``LocalAgentSessionFactory`` is the simplest loop-owning harness: each session
gets a fresh scratch directory and a proxy session whose key is handed to the
agent as its API key (``OPENAI_API_KEY``/``ANTHROPIC_API_KEY``, with
``OPENAI_BASE_URL`` = proxy ``/v1`` and ``ANTHROPIC_BASE_URL`` = proxy root);
the agent owns its loop and talks only HTTP. ``verify`` runs the task's
verifier on the scratch directory after the agent ended: the reward comes
from the end state, never from what the agent reports.

Build it through the trainer, which supplies ``sampling`` and then binds it to its proxy
(``bind_rollout``, a ``TrainerBoundSessionFactory``)::

    factory = functools.partial(LocalAgentSessionFactory, command=[...], verifier=my_verifier)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness_grpo.rollout_context import ProxySessionLease, RolloutContext
from harness_grpo.session_protocol import VerifyResult, instruction_of
from proxy.trace import TrainingTrace

Verifier = Callable[[Path, Mapping[str, Any]], float | None]
"""``verifier(workdir, task) -> reward`` (None: could not score)."""
Setup = Callable[[Path, Mapping[str, Any]], None]
"""``setup(workdir, task)`` prepares the scratch directory before the agent starts."""


class LocalAgentSession:
    """One agent process on one task (see the module docstring)."""

    def __init__(
        self,
        factory: LocalAgentSessionFactory,
        task: Mapping[str, Any],
        context: RolloutContext,
        *,
        seed: int,
        episode_id: str,
    ) -> None:
        self.task = task
        self._factory = factory
        self.workdir = Path(tempfile.mkdtemp(prefix=f"agent-{episode_id[:8]}-", dir=factory.workdir_root))
        self.lease: ProxySessionLease | None = None
        self._log = None
        self.process: subprocess.Popen | None = None
        self._close_lock = threading.Lock()
        try:
            if factory.setup is not None:
                factory.setup(self.workdir, task)
            self.lease = context.lease({"episode_id": episode_id, "seed": seed})
            env = {
                **os.environ,
                **factory.env,
                "OPENAI_BASE_URL": f"{context.proxy.base_url}/v1",
                "OPENAI_API_KEY": self.lease.key,
                "ANTHROPIC_BASE_URL": context.proxy.base_url,
                "ANTHROPIC_API_KEY": self.lease.key,
                "HARNESS_MODEL": context.model_name,
                "HARNESS_SEED": str(seed),
            }
            prompt = instruction_of(task.get("prompt", ""))
            command = [part.replace("{prompt}", prompt) for part in factory.command]
            self._log = (self.workdir.parent / f"{self.workdir.name}.log").open("wb")
            self.process = subprocess.Popen(
                command, cwd=self.workdir, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
            )
        except BaseException:
            self.close()
            raise

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()
            raise TimeoutError(f"agent did not finish within {timeout_s} s") from None

    def fetch_training_trace(self) -> TrainingTrace:
        assert self.lease is not None
        return self.lease.trace()

    def verify(self, transcript: str | None = None, final_state: Any = None) -> VerifyResult:
        return VerifyResult(env_reward=self._factory.verifier(self.workdir, self.task))

    def _kill(self) -> None:
        """SIGKILL the agent's process group: the agent and anything it left running."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def close(self) -> None:
        """Kill the agent, delete its proxy session and scratch files; safe from any thread, and twice."""
        with self._close_lock:
            self._kill()
            if self._log is not None:
                self._log.close()
                Path(self._log.name).unlink(missing_ok=True)
                self._log = None
            if self.lease is not None:
                self.lease.release()
            shutil.rmtree(self.workdir, ignore_errors=True)


class LocalAgentSessionFactory:
    """Creates ``LocalAgentSession``s; the trainer passes ``sampling`` and binds its proxy.

    ``command`` is the agent's argv; ``{prompt}`` in any part is replaced by the task's prompt
    text. ``env`` adds variables for the agent process.
    """

    def __init__(
        self,
        *,
        command: Sequence[str],
        verifier: Verifier,
        sampling: dict[str, Any],
        setup: Setup | None = None,
        env: Mapping[str, str] | None = None,
        workdir_root: str | None = None,
    ) -> None:
        self.command = list(command)
        self.verifier = verifier
        self.setup = setup
        self.sampling = dict(sampling)
        self.env = dict(env or {})
        self.workdir_root = workdir_root
        self.context: RolloutContext | None = None

    def bind_rollout(self, context: RolloutContext) -> None:
        self.context = context

    def create(self, prompt: Any, seed: int | None = None, episode_id: str | None = None) -> LocalAgentSession:
        """Start the agent on ``prompt`` (a task row holding only it)."""
        return self.create_from_row({"prompt": prompt}, seed=seed or 0, episode_id=episode_id or uuid.uuid4().hex)

    def create_from_row(self, row: Mapping[str, Any], *, seed: int, episode_id: str) -> LocalAgentSession:
        """Start the agent on the task ``row`` (its proxy session is created first)."""
        if self.context is None:
            raise RuntimeError("LocalAgentSessionFactory is not bound to a proxy: the trainer calls bind_rollout")
        return LocalAgentSession(self, row, self.context, seed=seed, episode_id=episode_id)
