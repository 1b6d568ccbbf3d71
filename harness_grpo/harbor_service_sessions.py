"""Sessions run by a Harbor rollout service: ``openenv harbor serve``, or ours (``python -m harness_grpo.serve``).

``HarborSessionFactory`` has the name, signature and meaning of OpenEnv's (``envs/harbor_env/harness.py`` in
huggingface/OpenEnv, not in the ``openenv`` wheel), written here to its contract, so a training script written for
OpenEnv's runs with only its import changed::

    factory = functools.partial(
        HarborSessionFactory, "http://127.0.0.1:8200", split="examples/tasks", harness="terminus-2",
        sandbox="local", llm_url="http://127.0.0.1:8000")
    dataset = factory(sampling={}).prompt_rows()   # {"prompt": [user message], "task_name", "task_index"}
    trainer = HarnessAsyncGRPOTrainer(model, factory, args, dataset)  # the trainer adds only sampling=

The service owns the sandboxes, the agents and the capture proxy; the trainer starts no proxy for this factory, and
the engine (``llm_url``) is the one the trainer syncs its weights into, named per rollout. What goes over the wire is
the env-server protocol of ``openenv harbor serve``, spoken through OpenEnv's own client (``openenv.harbor.client
.HarborEnv``): the Task API over HTTP for the task list (fetched once, on the factory's own client), and per session
its own client whose WebSocket carries one ``run_rollout`` call, which returns a ``HarborRolloutResult``.

Rows map back to tasks by their instruction text (TRL hands a factory only the row's ``prompt``): ``create`` looks the
last message's content up among the tasks' instructions; a prompt that matches none is a ``KeyError``.

A session (``HarborServiceSession``):

- ``wait_for_completion(timeout_s)`` runs the rollout (``timeout_s``, else the factory's ``agent_timeout_sec``, is the
  agent's timeout on the service; 0 defers to the task's) and returns 0 when the service reports it usable, else 1
  with the reason in ``error``. It never raises for a failed rollout, as OpenEnv's, with one exception: an agent
  stopped at its timeout raises ``TimeoutError`` after the service has verified it, so the trainer keeps its tokens
  and reward and marks it ``timed_out``. A service at its concurrency limit (its ``MAX_CONCURRENT_ENVS``) is waited
  on: the session reconnects with backoff for up to ``capacity_wait_s``.
- ``fetch_training_trace()`` is the rollout's ``TrainingTrace`` (OpenEnv's ``to_training_trace`` of the result, read
  into ours, which validates it); ``RolloutServiceError`` when the rollout has none to train on (it did not run, an
  eval-only engine, a capture the service found unusable). ``fetch_proxy_trace()`` is OpenEnv's legacy list.
- ``verify()`` is the service's verifier reward (None when it did not grade), its other rewards as
  ``verifier/<key>`` metrics.
- ``close()`` closes the session's connection (the service finishes a trial already running); any thread, any
  number of times. The connection, so the service's env session, is also released as soon as the result is in.

Not picklable live: ``__getstate__`` drops the factory's client (TRL spawns its rollout worker and pickles the
factory) and keeps the task list.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

from openenv.core.harness.capture.upstream import training_sampling
from openenv.harbor.client import HarborEnv
from openenv.harbor.contract import to_trace_entries, to_training_trace
from openenv.harbor.models import HarborRolloutResult

from harness_grpo.session_protocol import VerifyResult, instruction_of
from proxy.trace import TrainingTrace

log = logging.getLogger(__name__)

AGENT_TIMEOUT = "AgentTimeoutError"
"""Harbor's exception type for an agent stopped at its timeout, as the service reports it."""
AT_CAPACITY = ("CAPACITY_REACHED", "Server at capacity")
"""How the env server refuses an env session beyond its ``max_concurrent_envs`` (its WebSocket error code, its MCP
session error)."""
MESSAGE_GRACE_S = 900.0
"""How long a rollout's answer may take beyond its agent's timeout (sandbox start, install, verifier)."""


def refused_for_capacity(error: BaseException) -> bool:
    """Whether ``error`` (or one it was raised from or while handling: OpenEnv's client can mask the server's answer
    with its own failure to clean up) is the service refusing a session at its concurrency limit."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if any(sign in str(current) for sign in AT_CAPACITY):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class RolloutServiceError(RuntimeError):
    """The service gave no trainable rollout: it did not run, or what it captured cannot be trained on."""


class HarborServiceSession:
    """One rollout of task ``task_index`` on the service (module docstring); ``result`` is its
    ``HarborRolloutResult`` once ``wait_for_completion`` returned (None when the call itself failed), ``waited_s``
    how long it waited for a free slot on the service."""

    def __init__(self, factory: HarborSessionFactory, task_index: int, instruction: str) -> None:
        self.task_index = task_index
        self.instruction = instruction
        self.result: HarborRolloutResult | None = None
        self.error: str | None = None
        self.waited_s = 0.0
        self._factory = factory
        self._env: HarborEnv | None = None
        self._closed = False
        self._lock = threading.Lock()

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.instruction}]

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """Run the rollout on the service; 0: usable, 1: not (``error`` says why). ``TimeoutError`` when the agent
        was stopped at its timeout (the service still verified it)."""
        factory = self._factory
        agent_timeout = factory.agent_timeout_sec if timeout_s is None else timeout_s
        deadline = time.monotonic() + factory.capacity_wait_s
        backoff = 0.5
        while True:
            try:
                self.result = self._connection(agent_timeout).run_rollout(
                    split=factory.split,
                    task_index=self.task_index,
                    harness=factory.harness,
                    sandbox=factory.sandbox,
                    reward_key=factory.reward_key,
                    llm_url=factory.llm_url,
                    model=factory.model,
                    api_key=factory.api_key,
                    auth_header=factory.auth_header,
                    agent_timeout_sec=agent_timeout or 0.0,
                    agent_step_limit=factory.agent_step_limit,
                    sampling=factory.sampling,
                )
                self._drop_connection()  # the result is here: the service's env session is free for the next
                break
            except Exception as exc:  # a failed call is an outcome to score around, never a crash of the loop
                self._drop_connection()
                if refused_for_capacity(exc) and time.monotonic() + backoff < deadline and not self._closed:
                    time.sleep(backoff)
                    self.waited_s += backoff
                    backoff = min(backoff * 2, 5.0)
                    continue
                self.error = f"run_rollout failed: {type(exc).__name__}: {exc}"
                log.warning("rollout of %s[%d] failed: %s", factory.split, self.task_index, self.error)
                return 1
        result = self.result
        if result.ok:
            return 0
        self.error = result.error or "the service reported the rollout unusable"
        if result.exception_type == AGENT_TIMEOUT:
            raise TimeoutError(f"{factory.harness} did not finish within {agent_timeout} s: {self.error}")
        log.warning("rollout of %s[%d] not usable: %s", factory.split, self.task_index, self.error)
        return 1

    def fetch_training_trace(self) -> TrainingTrace:
        """The rollout's exact-token trace (module docstring); ``RolloutServiceError`` when it has none."""
        result = self.result
        if result is None:
            raise RolloutServiceError(f"the rollout did not run: {self.error or 'wait_for_completion was not called'}")
        try:
            trace = to_training_trace(result)
        except ValueError as exc:
            raise RolloutServiceError(
                f"the service's rollout cannot be trained on ({result.rollout_type}, capture level "
                f"{result.capture_level}): {exc}"
            ) from exc
        return TrainingTrace.from_json(trace.model_dump_json())

    def fetch_proxy_trace(self) -> list[dict[str, Any]]:
        """OpenEnv's legacy trace: one TRL ``TraceEntry`` per trainable turn; empty without a train rollout."""
        if self.result is None or self.result.rollout_type != "train":
            return []
        return to_trace_entries(self.result)

    def verify(self, transcript: Any = None, final_state: Any = None) -> VerifyResult:
        """The service's verifier reward (None: not graded), never recomputed here."""
        result = self.result
        if result is None:
            return VerifyResult(env_reward=None, artifacts={"error": self.error})
        metrics = {
            f"verifier/{key}": float(value)
            for key, value in result.rewards.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        }
        artifacts = {"trial_name": result.trial_name, "session_id": result.session_id, "findings": result.findings}
        if result.exception_type:
            artifacts["exception_type"] = result.exception_type
        return VerifyResult(env_reward=result.reward, metrics=metrics, artifacts=artifacts)

    def close(self) -> None:
        """Close this session's connection; any thread, any number of times."""
        self._closed = True
        self._drop_connection()

    def _connection(self, agent_timeout: float | None) -> HarborEnv:
        with self._lock:
            if self._closed:
                raise RuntimeError("the session is closed")
            if self._env is None:
                self._env = self._factory.new_client(agent_timeout)
            return self._env

    def _drop_connection(self) -> None:
        with self._lock:
            env, self._env = self._env, None
        if env is not None:
            try:
                env.close()
            except Exception:  # a client that will not close must not fail the rollout
                log.warning("closing a rollout service client failed", exc_info=True)


class HarborSessionFactory:
    """Rollouts of a Harbor rollout service's tasks (module docstring), with OpenEnv's signature.

    ``server_url``: the service's env server (``--port``). ``split``: the dataset (a ``--dataset`` spec of the
    service; default its first). ``llm_url``/``model``: the engine the service's agents call (default the service's
    own). ``harness``/``sandbox``: which agent, and where, per rollout. ``reward_key``: the verifier key that is the
    reward (default: the only one, else ``reward``). ``api_key``/``auth_header``: the engine's credential, handed to
    the service. ``agent_timeout_sec``: the agent's timeout when ``wait_for_completion`` gets none (0: the task's).
    ``agent_step_limit``: the proxy's model-call budget per rollout (0: none). ``sampling``: the training policy every
    call is sampled under (the trainer passes its own). ``num_tasks``/``indices``: the first N tasks, or these.
    ``max_message_size_mb``: the largest result a connection takes. ``capacity_wait_s`` (ours): how long a session
    waits for a free slot on a service at its concurrency limit.
    """

    def __init__(
        self,
        server_url: str,
        *,
        split: str = "",
        llm_url: str = "",
        model: str = "",
        harness: str = "opencode",
        sandbox: str = "e2b",
        reward_key: str = "",
        api_key: str = "",
        auth_header: str = "",
        agent_timeout_sec: float = 600.0,
        agent_step_limit: int = 0,
        sampling: dict[str, Any] | None = None,
        num_tasks: int | None = None,
        indices: list[int] | None = None,
        max_message_size_mb: float = 4096.0,
        capacity_wait_s: float = 600.0,
    ) -> None:
        if indices is not None and not list(indices):
            raise ValueError("indices is empty: no task would be selected (None selects the whole split)")
        self.server_url = server_url.rstrip("/")
        self.split = split
        self.llm_url = llm_url
        self.model = model
        self.harness = harness
        self.sandbox = sandbox
        self.reward_key = reward_key
        self.api_key = api_key
        self.auth_header = auth_header
        self.agent_timeout_sec = agent_timeout_sec
        self.agent_step_limit = agent_step_limit
        self.sampling = training_sampling(sampling) if sampling else None
        self.num_tasks = num_tasks
        self.indices = None if indices is None else list(indices)
        self.max_message_size_mb = max_message_size_mb
        self.capacity_wait_s = capacity_wait_s
        self._env: HarborEnv | None = None
        self._tasks: list[dict[str, Any]] = []
        self._by_instruction: dict[str, int] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_env"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def new_client(self, agent_timeout_s: float | None = None) -> HarborEnv:
        """A fresh client (its own WebSocket) for one rollout, waiting long enough for an agent of that timeout."""
        timeout = max(1800.0, (agent_timeout_s or self.agent_timeout_sec or 0.0) + MESSAGE_GRACE_S)
        return HarborEnv(self.server_url, message_timeout_s=timeout, max_message_size_mb=self.max_message_size_mb)

    def tasks(self) -> list[dict[str, Any]]:
        """The tasks this factory runs, fetched once from the service (``index``, ``task_name``, ``instruction``...)."""
        with self._lock:
            if not self._tasks:
                self._tasks = self._fetch_tasks()
                self._by_instruction = {}
                shadowed = 0
                for task in self._tasks:
                    key = (task.get("instruction") or "").strip()
                    if key in self._by_instruction:
                        shadowed += 1
                    else:
                        self._by_instruction[key] = int(task["index"])
                if shadowed:
                    log.warning("%d task(s) share an instruction with an earlier task; the first one wins", shadowed)
            return self._tasks

    def _fetch_tasks(self) -> list[dict[str, Any]]:
        if self._env is None:
            self._env = HarborEnv(self.server_url)
        env = self._env
        if not self.split:
            splits = env.splits()
            if not splits:
                raise RuntimeError(f"{self.server_url} serves no splits")
            self.split = splits[0]["name"]
        total = env.num_tasks(self.split)
        if self.indices is not None:
            bad = [i for i in self.indices if not 0 <= i < total]
            if bad:
                raise IndexError(f"task indices {bad[:5]} out of range for {self.split!r} ({total} tasks)")
            return [env.get_task(self.split, i).model_dump() for i in self.indices]
        stop = min(total, self.num_tasks) if self.num_tasks else total
        return [task.model_dump() for task in env.get_task_range(self.split, 0, stop)]

    def prompt_rows(self) -> list[dict[str, Any]]:
        """Dataset rows, one per task: ``{"prompt": [user message], "task_name", "task_index"}``."""
        return [
            {
                "prompt": [{"role": "user", "content": task.get("instruction") or ""}],
                "task_name": task.get("task_name") or "",
                "task_index": int(task["index"]),
            }
            for task in self.tasks()
        ]

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> HarborServiceSession:
        """A session on the task whose instruction ``task`` (a row's prompt) holds; ``KeyError`` when none does."""
        instruction = (
            str(task.get("instruction") or task.get("content") or "")
            if isinstance(task, Mapping)
            else instruction_of(task)
        )
        self.tasks()
        index = self._by_instruction.get(instruction.strip())
        if index is None:
            raise KeyError(
                f"no task of {self.split!r} on {self.server_url} has the instruction {instruction[:80]!r}: build the "
                "dataset from prompt_rows() so the prompts are the service's instructions"
            )
        return HarborServiceSession(self, index, instruction)
