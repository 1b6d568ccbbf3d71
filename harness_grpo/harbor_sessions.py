"""Harbor sessions: one rollout is one proxy session plus one Harbor trial of one task.

``HarborTrialSessionFactory`` is a ``TrainerBoundSessionFactory``: the trainer builds it with ``sampling`` and binds
its proxy (``bind_rollout``); per rollout, ``create_from_row(row, ...)`` maps the dataset row to its task (the
row's ``task_path``, else its ``task_name``, else its instruction text, looked up in ``tasks``) and leases a
proxy session whose key becomes the agent's API key. ``HarborSession.wait_for_completion(timeout_s)`` runs
the trial, ``await Trial.create(config)`` then ``await trial.run()``, on a private event loop in its own
thread, and blocks until it ends: the environment starts, the agent runs against the proxy, the verifier
runs, the environment is stopped and deleted. The agent's Harbor timeout is the shorter of the task's and
``timeout_s``; when it fires, Harbor still runs the verifier, and ``wait_for_completion`` raises
``TimeoutError`` afterwards, so the rollout keeps its captured tokens and its reward (``timed_out``).

The agent (``harness``):

- a registry CLI (opencode, claude-code, codex, mini-swe-agent): ``harness_grpo.harbor_agents.RegistryAgent``,
  the host-installed CLI run inside the environment, configured by its registry entry;
- ``terminus-2``: Harbor's own, run on the host, LiteLLM pointed at the proxy (``ProxyTerminus2``);
- any other Harbor agent, by name or ``module:Class`` import path, configured as Harbor's ``AgentConfig``
  configures one: ``model_name`` (default ``openai/<served name>``), ``base_url`` = proxy ``/v1`` and the
  session key in ``AgentConfig.env`` under ``model_api_key_name`` (agents without a model connection, such
  as ``oracle`` and ``nop``, get neither).

The environment (``sandbox``): ``local`` is ``harness_grpo.harbor_local:LocalEnvironment``, allowed to reach
only the proxy's port; ``docker``, ``e2b``, ``modal``, ``daytona`` (any Harbor ``EnvironmentType``) and
``module:Class`` import paths pass through to Harbor, and ``proxy_url`` must then be an address of the proxy
that those machines reach.

The reward (``verify``) is the verifier's ``reward.json``/``reward.txt`` value under ``reward_key``; None, never
0, when the trial never reached its verifier, the value is missing or not a finite number, or Harbor marks the
trial's reward invalid (``TrialResult.reward_valid``: any exception other than budget exhaustion, a non-zero
agent exit included). ``close`` cancels a running trial (Harbor then stops and deletes its environment),
releases the proxy session and removes the trial's directory unless ``trials_dir`` was given; from any
thread, more than once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harness_grpo.agents import REGISTRY, agent_binary
from harness_grpo.rollout_context import BoundSessionFactory, ProxySessionLease, RolloutContext
from harness_grpo.service_loop import ServiceLoop
from harness_grpo.session_protocol import VerifyResult, instruction_of
from proxy.trace import TrainingTrace

# Before Harbor (or LiteLLM, which it imports) is imported: no telemetry, no cost-map download.
os.environ["HARBOR_TELEMETRY"] = "0"
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from harbor.agents.factory import AgentFactory
from harbor.environments.factory import EnvironmentFactory
from harbor.models.agent.name import AgentName
from harbor.models.environment_type import EnvironmentType
from harbor.models.task.task import Task
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.models.trial.result import TrialResult
from harbor.trial.trial import Trial

from harness_grpo.harbor_agents import API_KEY_ENV
from harness_grpo.harbor_tasks import resolve_task_dirs

log = logging.getLogger(__name__)

LOCAL_ENVIRONMENT = "harness_grpo.harbor_local:LocalEnvironment"
REGISTRY_AGENT = "harness_grpo.harbor_agents:RegistryAgent"
TERMINUS_2 = "harness_grpo.harbor_terminus2:ProxyTerminus2"
CLOUD_CLIENTS = {"e2b": "e2b", "modal": "modal", "daytona": "daytona"}
"""The Python client each cloud sandbox needs, imported by Harbor only when a trial starts (its extras)."""
AGENT_TIMEOUT = "AgentTimeoutError"
"""Harbor's exception type for an agent stopped at its timeout (``harbor.trial.errors``)."""


def environment_config(sandbox: str, kwargs: dict[str, Any]) -> EnvironmentConfig:
    """Harbor's ``EnvironmentConfig`` for ``sandbox``: ``local`` (``LocalEnvironment``), a ``module:Class`` import
    path, or a Harbor ``EnvironmentType`` value; ``ValueError`` naming the choices for anything else."""
    if sandbox == "local":
        return EnvironmentConfig(import_path=LOCAL_ENVIRONMENT, kwargs=kwargs)
    if ":" in sandbox:
        return EnvironmentConfig(import_path=sandbox, kwargs=kwargs)
    if sandbox not in {kind.value for kind in EnvironmentType}:
        raise ValueError(
            f"unknown sandbox {sandbox!r}: choose local, a Harbor environment type "
            f"({', '.join(kind.value for kind in EnvironmentType)}) or a module:Class import path"
        )
    return EnvironmentConfig(type=EnvironmentType(sandbox), kwargs=kwargs)


def missing_prerequisites(harness: str, sandbox: str) -> list[str]:
    """What this machine lacks to run ``harness`` in ``sandbox``: one message per missing piece, saying how to get
    it (empty: ready). Checked before a run loads anything: the agent CLI installed on the host, tmux for
    terminus-2 in the local sandbox, and the sandbox's own preflight (Harbor's: credentials such as
    ``E2B_API_KEY``, a running Docker daemon; the local sandbox's: root, namespaces, util-linux)."""
    problems = []
    if harness in REGISTRY and agent_binary(harness) is None:
        problems.append(f"{harness} is not installed on this host: run `bash launchers/install_agents.sh`")
    if harness == "terminus-2" and sandbox == "local" and shutil.which("tmux") is None:
        problems.append(
            "terminus-2 drives a tmux session in the sandbox, and the local sandbox has the host's: install tmux"
        )
    try:
        config = environment_config(sandbox, {})
    except ValueError as error:
        return [*problems, str(error)]
    try:
        EnvironmentFactory.run_preflight(type=config.type, import_path=config.import_path)
    except (ImportError, AttributeError, ValueError) as error:  # an environment class that does not import
        problems.append(f"sandbox {sandbox!r}: cannot load it ({error})")
    except (SystemExit, RuntimeError) as error:
        problems.append(f"sandbox {sandbox!r}: {error}")
    client = CLOUD_CLIENTS.get(sandbox)
    if client is not None and importlib.util.find_spec(client) is None:
        problems.append(
            f"sandbox {sandbox!r} needs its client package {client!r}: pip install 'harbor[{sandbox}]==0.25.0'"
        )
    return problems


class HarborTrialError(RuntimeError):
    """The trial failed before its agent ran (task, environment or agent setup); names Harbor's exception."""


@dataclass(frozen=True)
class HarborTask:
    """One Harbor-format task directory: its name, instruction text and agent timeout (None: unlimited)."""

    path: Path
    name: str
    instruction: str
    agent_timeout_s: float | None

    @classmethod
    def load(cls, path: str | Path) -> HarborTask:
        """The task at ``path``; ``FileNotFoundError`` when it holds no ``task.toml``."""
        path = Path(path).resolve()
        if not (path / "task.toml").is_file():
            raise FileNotFoundError(f"{path} is not a Harbor task: it has no task.toml")
        task = Task(task_dir=path)
        return cls(path, task.name, task.instruction, task.config.agent.timeout_sec)


def trial_reward(result: TrialResult | None, reward_key: str = "reward") -> float | None:
    """The verifier's ``reward_key`` value; None when the trial has no valid reward or it is not a finite number."""
    if result is None or not result.reward_valid or result.verifier_result is None:
        return None
    value = (result.verifier_result.rewards or {}).get(reward_key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


_TRIAL_LOOP: ServiceLoop | None = None
_TRIAL_LOOP_LOCK = threading.Lock()


def _trial_loop() -> ServiceLoop:
    """The one event loop every Harbor trial of this process runs on (created at the first trial, a daemon).

    One loop, not one per trial: LiteLLM (terminus-2's client) keeps process-wide asyncio state (its logging
    worker's queue) bound to the loop that first used it, and breaks on any other loop.
    """
    global _TRIAL_LOOP
    with _TRIAL_LOOP_LOCK:
        if _TRIAL_LOOP is None:
            _TRIAL_LOOP = ServiceLoop("harbor-trials")
        return _TRIAL_LOOP


class _TrialRun:
    """One Harbor trial, a task on the trials' shared loop (``_trial_loop``); ``cancel`` works from any thread and
    ``join`` returns once the task has really ended (Harbor's clean-up after a cancel included)."""

    def __init__(self, config: TrialConfig) -> None:
        self.config = config
        self.result: TrialResult | None = None
        self.error: BaseException | None = None
        self._ended = threading.Event()
        self._loop = _trial_loop()
        self._task: asyncio.Task = self._loop.run(self._start())

    async def _start(self) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._trial())
        task.add_done_callback(self._finished)
        return task

    async def _trial(self) -> TrialResult:
        trial = await Trial.create(self.config)
        return await trial.run()

    def _finished(self, task: asyncio.Task) -> None:
        if task.cancelled():
            self.error = asyncio.CancelledError()
        elif task.exception() is not None:
            self.error = task.exception()
        else:
            self.result = task.result()
        self._ended.set()

    def join(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` (None: no limit); True when the trial has ended (``result`` or ``error`` set)."""
        return self._ended.wait(timeout_s)

    def cancel(self) -> None:
        self._loop.loop.call_soon_threadsafe(self._task.cancel)

    def waiting_at(self) -> str:
        """Where the trial's task is suspended, innermost first (``file:line function`` per awaiting coroutine):
        what a trial that outlives its limit is waiting for."""
        try:
            return self._loop.run(_awaiting(self._task), timeout_s=10.0)
        except TimeoutError:
            return "(unknown: the trials' event loop did not answer within 10 s, something blocks it)"


async def _awaiting(task: asyncio.Task) -> str:
    """The chain of coroutines ``task`` awaits through (``Task.get_stack`` shows only the outermost one)."""
    frames, awaited = [], task.get_coro()
    while awaited is not None and getattr(awaited, "cr_frame", None) is not None:
        frame = awaited.cr_frame
        frames.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        awaited = awaited.cr_await
    if awaited is not None:
        frames.append(repr(awaited)[:300])
    return " <- ".join(reversed(frames)) or "(ended)"


class HarborSession:
    """One rollout: a proxy session and one Harbor trial of ``task`` (see the module docstring)."""

    def __init__(
        self,
        factory: HarborTrialSessionFactory,
        task: HarborTask,
        context: RolloutContext,
        *,
        seed: int,
        episode_id: str,
    ) -> None:
        self.task = task
        self.seed = seed
        self.episode_id = episode_id
        self.result: TrialResult | None = None
        self._factory = factory
        self._run: _TrialRun | None = None
        self._closed = False
        self._lock = threading.Lock()
        self.lease: ProxySessionLease = context.lease(
            {"episode_id": episode_id, "seed": seed, "task": task.name, "harness": factory.harness}
        )
        try:
            assert self.lease.key is not None
            self.config = factory.trial_config(task, context, self.lease.key, episode_id)
        except BaseException:
            self.lease.release()
            raise

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """Run the trial to its end (blocking); the agent's exit status.

        ``TimeoutError`` when the agent was stopped at its timeout (the verifier has run; ``verify`` reads it)
        or the whole trial outlived that timeout by ``factory.trial_grace_s``; ``HarborTrialError`` when the
        trial failed before its agent ran.
        """
        agent_timeout = min((t for t in (self.task.agent_timeout_s, timeout_s) if t is not None), default=None)
        config = self.config.model_copy(deep=True)
        config.agent.override_timeout_sec = agent_timeout
        with self._lock:
            if self._closed:
                raise RuntimeError("the session is closed")
            if self._run is not None:
                raise RuntimeError("the trial already ran")
            self._run = run = _TrialRun(config)
        limit = None if agent_timeout is None else agent_timeout + self._factory.trial_grace_s
        if not run.join(limit):
            waiting = run.waiting_at()
            log.warning("trial %s did not end within %s s; it waits at %s", config.trial_name, limit, waiting)
            run.cancel()
            run.join(self._factory.trial_grace_s)
            raise TimeoutError(f"the trial did not end within {limit} s; it waited at {waiting}")
        if run.error is not None:
            raise HarborTrialError(f"the trial failed: {type(run.error).__name__}: {run.error}") from run.error
        self.result = result = run.result
        assert result is not None
        error = result.exception_info
        if error is not None and error.exception_type == AGENT_TIMEOUT:
            raise TimeoutError(f"{self._factory.harness} did not finish within {agent_timeout} s")
        if error is not None and result.agent_execution is None:
            raise HarborTrialError(
                f"the trial failed before its agent ran: {error.exception_type}: {error.exception_message}"
            )
        metadata = (result.agent_result.metadata if result.agent_result is not None else None) or {}
        return int(metadata.get("returncode", 0 if error is None else 1))

    def fetch_training_trace(self) -> TrainingTrace:
        return self.lease.trace()

    def verify(self, transcript: Any = None, final_state: Any = None) -> VerifyResult:
        """The verifier's reward under the factory's ``reward_key`` (``trial_reward``); the trial's other finite
        rewards as metrics."""
        result = self.result
        rewards = result.verifier_result.rewards if result is not None and result.verifier_result else None
        metrics = {
            f"verifier/{key}": float(value)
            for key, value in (rewards or {}).items()
            if not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
        }
        artifacts: dict[str, Any] = {}
        if result is not None:
            artifacts["trial_uri"] = result.trial_uri
            if result.exception_info is not None:
                artifacts["exception_type"] = result.exception_info.exception_type
        return VerifyResult(
            env_reward=trial_reward(result, self._factory.reward_key), metrics=metrics, artifacts=artifacts
        )

    def close(self) -> None:
        """Cancel a running trial (Harbor stops and deletes its environment), release the proxy session and
        remove the trial's directory when the factory owns it; any thread, any number of times."""
        with self._lock:
            self._closed = True
            run = self._run
        ended = True
        if run is not None:
            run.cancel()
            ended = run.join(self._factory.trial_grace_s)
            if not ended:
                log.warning(
                    "trial %s did not end within %s s of its cancellation",
                    self.config.trial_name,
                    self._factory.trial_grace_s,
                )
        self.lease.release()
        if ended and self._factory.trials_dir is None:  # the session's own temporary directory
            shutil.rmtree(self.config.trials_dir, ignore_errors=True)


class HarborTrialSessionFactory(BoundSessionFactory):
    """Creates ``HarborSession``s (module docstring).

    ``harness``: a registry agent, ``terminus-2``, or any Harbor agent name or ``module:Class`` import path.
    ``tasks``: where rows without a ``task_path`` find their task: a dataset source as
    ``harness_grpo.harbor_tasks.load_task_dataset`` takes it (a task or a directory of tasks, ``hf://...``, a
    Harbor dataset name), read at the first lookup, or a list of task directories. ``sandbox``: ``local``, a
    Harbor ``EnvironmentType`` value, or an environment import path; ``environment_kwargs`` go to it.
    ``proxy_url``: the proxy's root as the sandboxed agent reaches it (default: the bound proxy's own; required
    for any other sandbox than ``local`` unless the agent runs on the host).
    ``system_prompt`` and ``max_steps`` configure registry agents (``max_steps`` is terminus-2's
    ``max_turns``, default the proxy's call budget); ``agent_kwargs`` are added to the agent's
    ``AgentConfig.kwargs``; ``agent_model_name`` is the model name of an agent Harbor configures (default
    ``openai/<served name>``). ``max_input_tokens``/``max_output_tokens`` are terminus-2's ``model_info``.
    ``trials_dir`` keeps each trial's Harbor directory (default: a temporary one per session, removed when it
    closes). ``trial_grace_s`` bounds what a trial may take beyond its agent's timeout (environment start,
    verifier) and how long ``close`` waits for a cancelled trial. ``rollout_context`` binds a capture proxy when no
    trainer of ours will (TRL's ``HarnessRolloutWorker``; see ``BoundSessionFactory``); the factory pickles.
    """

    def __init__(
        self,
        *,
        harness: str,
        sampling: dict[str, Any],
        tasks: str | Path | Sequence[str | Path] | None = None,
        sandbox: str = "local",
        reward_key: str = "reward",
        proxy_url: str | None = None,
        environment_kwargs: Mapping[str, Any] | None = None,
        system_prompt: str | None = None,
        max_steps: int | None = None,
        agent_kwargs: Mapping[str, Any] | None = None,
        agent_model_name: str | None = None,
        max_input_tokens: int = 32768,
        max_output_tokens: int = 4096,
        trials_dir: str | Path | None = None,
        trial_grace_s: float = 900.0,
        rollout_context: RolloutContext | None = None,
    ) -> None:
        self.harness = harness
        self.sampling = dict(sampling)
        self.environment = environment_config(sandbox, dict(environment_kwargs or {}))
        self.sandbox = sandbox
        self.reward_key = reward_key
        self.proxy_url = proxy_url
        self.system_prompt = system_prompt
        self.max_steps = max_steps
        self.agent_kwargs = dict(agent_kwargs or {})
        self.agent_model_name = agent_model_name
        self.max_input_tokens = max_input_tokens
        self.max_output_tokens = max_output_tokens
        self.trial_grace_s = trial_grace_s
        self.trials_dir = None if trials_dir is None else Path(trials_dir)
        self._tasks = tasks
        self._by_name: dict[str, HarborTask] | None = None
        self._by_instruction: dict[str, HarborTask] | None = None
        self._connects = self._check_harness()
        runs_on_the_host = harness == "terminus-2" or not self._connects
        if sandbox != "local" and proxy_url is None and not runs_on_the_host:
            raise ValueError(
                f"sandbox {sandbox!r} runs {harness} on another machine, where 127.0.0.1 is not the proxy: "
                "pass proxy_url, an address of the proxy that machine reaches"
            )
        self._lookup_lock = threading.Lock()
        self.bind_standalone(rollout_context, self.sampling)

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the lookup lock (a spawned worker process gets a new one)."""
        state = dict(self.__dict__)
        del state["_lookup_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lookup_lock = threading.Lock()

    def _check_harness(self) -> bool:
        """Whether a Harbor-configured harness takes a model connection; ``ValueError`` for an unknown one."""
        known = (*REGISTRY, "terminus-2")
        if self.harness in known:
            return True
        if ":" not in self.harness and self.harness not in AgentName.values():
            raise ValueError(
                f"unknown harness {self.harness!r}: choose from {', '.join(known)}, "
                "a Harbor agent name, or a module:Class import path"
            )
        by_path = ":" in self.harness
        config = AgentConfig(name=None if by_path else self.harness, import_path=self.harness if by_path else None)
        return AgentFactory.get_agent_class_from_config(config).MODEL_CONNECTION is not None

    def create_from_row(self, row: Mapping[str, Any], *, seed: int, episode_id: str) -> HarborSession:
        """A session on the row's task, its proxy session leased; the trial runs in ``wait_for_completion``."""
        return HarborSession(self, self.task_for(row), self.bound_context(), seed=seed, episode_id=episode_id)

    def task_for(self, row: Mapping[str, Any]) -> HarborTask:
        """The row's task: its ``task_path``, else its ``task_name`` or instruction text among ``tasks``."""
        if row.get("task_path"):
            return HarborTask.load(row["task_path"])
        if self._tasks is None:
            raise ValueError("the row has no task_path and the factory was given no tasks to look it up in")
        with self._lookup_lock:  # rollouts start from several threads; the tasks are read (or downloaded) once
            if self._by_name is None or self._by_instruction is None:
                if isinstance(self._tasks, str | Path):
                    paths = resolve_task_dirs(self._tasks)
                else:
                    paths = [Path(path) for path in self._tasks]
                loaded = [HarborTask.load(path) for path in paths]
                self._by_name = {task.name: task for task in loaded}
                self._by_instruction = {task.instruction.strip(): task for task in loaded}
        name = row.get("task_name")
        if name:
            if name not in self._by_name:
                raise ValueError(f"no task named {name!r} among {len(self._by_name)} tasks")
            return self._by_name[name]
        instruction = instruction_of(row.get("prompt")).strip()
        if instruction not in self._by_instruction:
            raise ValueError(f"no task has the instruction {instruction[:80]!r}")
        return self._by_instruction[instruction]

    def trial_config(self, task: HarborTask, context: RolloutContext, api_key: str, episode_id: str) -> TrialConfig:
        """The Harbor trial of ``task`` whose agent talks to the proxy under ``api_key``."""
        environment = self.environment.model_copy(deep=True)
        if self.sandbox == "local":
            port = urlsplit(context.proxy.base_url).port
            environment.kwargs = {"allow_ports": [port], **environment.kwargs}
        return TrialConfig(
            task=TaskConfig(path=task.path),
            trial_name=f"{task.name[:32]}__{episode_id[:12]}",
            trials_dir=self.trials_dir or Path(tempfile.mkdtemp(prefix="harbor-trial-")),
            agent=self.agent_config(context, api_key),
            environment=environment,
        )

    def agent_config(self, context: RolloutContext, api_key: str) -> AgentConfig:
        """The agent of one trial, wired to the proxy (module docstring)."""
        proxy_url = (self.proxy_url or context.proxy.base_url).rstrip("/")
        env = {API_KEY_ENV: api_key}
        if self.harness in REGISTRY:
            kwargs = {"agent": self.harness, "proxy_url": proxy_url, "system_prompt": self.system_prompt}
            if self.max_steps is not None:
                kwargs["max_steps"] = self.max_steps
            return AgentConfig(
                import_path=REGISTRY_AGENT,
                model_name=context.model_name,
                kwargs={**kwargs, **self.agent_kwargs},
                env=env,
            )
        if self.harness == "terminus-2":  # runs on the host: the proxy's own address
            from harness_grpo.harbor_terminus2 import terminus2_kwargs  # LiteLLM: imported where it is used

            kwargs = terminus2_kwargs(
                context.proxy.base_url,
                max_input_tokens=self.max_input_tokens,
                max_output_tokens=self.max_output_tokens,
            )
            # Past its session's call budget the proxy answers every call itself, and terminus-2 would loop on
            # those answers until its timeout: its turns end with the budget unless max_steps says otherwise.
            max_turns = self.max_steps if self.max_steps is not None else context.max_model_calls
            if max_turns is not None:
                kwargs["max_turns"] = max_turns
            return AgentConfig(
                import_path=TERMINUS_2,
                model_name=f"hosted_vllm/{context.model_name.replace('/', '_')}",  # LiteLLM allows one '/'
                model_api_key_name=API_KEY_ENV,
                kwargs={**kwargs, **self.agent_kwargs},
                env=env,
            )
        by_path = ":" in self.harness
        connection: dict[str, Any] = {}
        if self._connects:  # agents without a model (oracle, nop) refuse a connection
            connection = {"base_url": f"{proxy_url}/v1", "model_api_key_name": API_KEY_ENV, "env": env}
        return AgentConfig(
            name=None if by_path else self.harness,
            import_path=self.harness if by_path else None,
            model_name=self.agent_model_name or f"openai/{context.model_name}",
            kwargs=dict(self.agent_kwargs),
            **connection,
        )
