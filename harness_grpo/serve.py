"""``python -m harness_grpo.serve``: our rollout service, speaking the env-server protocol of ``openenv harbor serve``.

    python -m harness_grpo.serve --dataset examples/tasks --llm-url http://127.0.0.1:8000 \
        --port 8200 --capture-port 8300

Our capture proxy, our sandboxes (``local`` included) and Harbor task datasets behind the interface ``openenv harbor
serve`` offers, so any client of that protocol (OpenEnv's ``HarborEnv``, ``HarborSessionFactory``, the trainer's
``--env_url``) drives either, and rollouts can run on another machine than the trainer's. Served, as there:

- the Task API under ``/harbor_env/`` (``splits``, ``num_tasks``, ``task``, ``task_range``, ``tasks``): a split is a
  ``--dataset`` spec (a directory of tasks, ``hf://owner/name``, a Harbor dataset name; ``harness_grpo.harbor_tasks``),
  its tasks in name order, a task's index its identity;
- over ``WS /ws`` (one connection, one env session; at most ``--max-concurrent-envs`` at once, default
  ``$MAX_CONCURRENT_ENVS`` else 4, beyond which a connection is refused with ``CAPACITY_REACHED``) the MCP tools
  ``run_rollout`` (OpenEnv's parameters; returns a ``HarborRolloutResult`` as JSON), ``capabilities`` and
  ``list_tasks``;
- the capture proxy on ``--capture-port`` (``python -m proxy``'s service: a session per rollout whose key is its
  agent's API key, unknown keys refused, the session routes behind the admin key, ``$HARNESS_PROXY_ADMIN_KEY`` or
  ``$OPENENV_CAPTURE_ADMIN_KEY`` else minted); or, with ``--proxy-base-url``, none: a capture proxy running alone
  (``python -m proxy``) holds the sessions, its admin key ``$HARNESS_PROXY_ADMIN_KEY``, checked before the service
  serves (a missing or refused key, or a proxy that cannot open a train session, exits 2 saying so); the local
  sandbox reaches it only at ``http://127.0.0.1:PORT`` (or ``localhost``: a proxy on this machine), so a local
  rollout is refused by name otherwise.

One ``run_rollout`` is one ``HarborTrialSessionFactory`` session: a train session on the proxy pinning ``sampling``
(OpenEnv's validation: finite positive temperature, full vocabulary) and the engine ``llm_url``/``model`` (default
``--llm-url``/``--model``, else the external proxy's), with ``agent_step_limit`` as its call budget and
``--max-output-tokens`` per call; one Harbor trial of the task by ``harness`` in ``sandbox`` (``local``: the proxy's
port is the sandbox's only way out; another sandbox reaches the proxy at ``--proxy-url``), the agent's timeout
``agent_timeout_sec`` (0: the task's);
then the proxy's trace as the result's turns (each turn's ids, logprobs, loss mask, request, sampling params and
role as captured) and the verifier's reward: the one ``reward_key`` names (comma-separated: the first present), else
the only key, else ``reward``; None when Harbor marks the trial's reward invalid or it is not a finite number. A
failed rollout is a result (``ok=False``, ``error``), never an exception. Not offered: ``purpose="eval"``,
``eval_sampling``, another ``provider`` than ``openai``, a per-rollout upstream ``api_key`` or ``auth_header``
(``--api-key`` is sent as ``Authorization: Bearer``); each is refused by name.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import logging
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Observation
from openenv.core.harness.capture.upstream import training_sampling
from openenv.harbor.models import HarborRolloutResult, HarborState, HarborTaskRef, HarborTurn

from harness_grpo.agents import AGENTS
from harness_grpo.harbor_local import LocalSandboxUnavailable, check_prerequisites
from harness_grpo.harbor_sessions import HarborTask, HarborTrialError, HarborTrialSessionFactory
from harness_grpo.harbor_tasks import resolve_task_dirs
from harness_grpo.openenv_harbor import LOOPBACK
from harness_grpo.rollout_context import ProxyEndpoint, RolloutContext, ServicesError, connect_proxy
from harness_grpo.rollouts import LiveSessions
from harness_grpo.service_loop import ServiceLoop
from proxy.capture_graph import AGENT, DISCARDED
from proxy.server import CaptureProxy, ProxyConfig
from proxy.trace import TrainingTrace, TrainingTurn

log = logging.getLogger(__name__)

ENV_NAME = "harbor_env"
"""The env name ``openenv harbor serve`` serves under (its clients' Task API paths are ``/harbor_env/...``)."""
ROLLOUT_TIMEOUT_S = 1800.0
"""A ``run_rollout`` call's limit when the caller gives none (OpenEnv's MCP default is 30 s)."""
AGENT_TIMEOUT = "AgentTimeoutError"
POLICY_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


class TaskSplits:
    """The served datasets as splits: each ``--dataset`` spec's tasks, resolved once, in name order."""

    def __init__(self, datasets: list[str]) -> None:
        self.datasets = list(datasets)
        self._tasks: dict[str, list[HarborTask]] = {}
        self._lock = threading.Lock()

    def tasks(self, split: str) -> list[HarborTask]:
        """The tasks of ``split`` (``""``: the first dataset); ``ValueError`` for a split not served."""
        if not self.datasets:
            raise ValueError("this service was started with no datasets; pass --dataset")
        split = split or self.datasets[0]
        if split not in self.datasets:
            raise ValueError(f"unknown split {split!r}; served splits are {self.datasets}")
        with self._lock:
            if split not in self._tasks:
                self._tasks[split] = [HarborTask.load(path) for path in resolve_task_dirs(split)]
            return self._tasks[split]

    def task(self, split: str, index: int) -> HarborTask:
        tasks = self.tasks(split)
        if not 0 <= index < len(tasks):
            raise IndexError(f"task index {index} out of range for {split or self.datasets[0]!r} ({len(tasks)} tasks)")
        return tasks[index]

    def ref(self, split: str, index: int) -> dict[str, Any]:
        """The Task API's record of one task (``HarborTaskRef``)."""
        task = self.task(split, index)
        spec = split or self.datasets[0]
        return HarborTaskRef(
            index=index,
            task_id=str(task.path),
            task_name=task.name,
            dataset=spec,
            instruction=task.instruction.strip(),
        ).model_dump()

    def refs(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        indices = range(len(self.tasks(split)))[start:stop]
        return [self.ref(split, index) for index in indices]

    def list_splits(self) -> list[dict[str, Any]]:
        splits = []
        for spec in self.datasets:
            try:
                splits.append({"name": spec, "num_tasks": len(self.tasks(spec))})
            except Exception as exc:  # one broken dataset must not hide the others
                splits.append({"name": spec, "num_tasks": 0, "error": str(exc)[:200]})
        return splits


@dataclass(frozen=True)
class RolloutRequest:
    """One ``run_rollout`` call's parameters (OpenEnv's names and defaults)."""

    split: str = ""
    task_index: int = 0
    harness: str = "opencode"
    sandbox: str = "e2b"
    reward_key: str = ""
    keep_sandbox: bool = False
    force_build: bool = False
    llm_url: str = ""
    model: str = ""
    api_key: str = ""
    auth_header: str = ""
    agent_timeout_sec: float = 0.0
    agent_step_limit: int = 0
    sampling: dict[str, Any] | None = None
    provider: str = "openai"
    purpose: str = "auto"
    eval_sampling: dict[str, Any] | None = None


class RolloutService:
    """The service's long-lived part: the datasets, the capture proxy (on its own loop, unless ``proxy_base_url``
    names one running elsewhere) and the rollout workers.

    ``run(request)`` runs one rollout to its ``HarborRolloutResult`` (blocking; on one of ``max_concurrent`` worker
    threads when called through ``run_async``).
    """

    def __init__(
        self,
        *,
        datasets: list[str],
        llm_url: str = "",
        model: str = "",
        host: str = "127.0.0.1",
        capture_port: int = 8100,
        proxy_url: str | None = None,
        proxy_base_url: str | None = None,
        api_key: str | None = None,
        max_output_tokens: int | None = 8192,
        max_concurrent: int = 4,
        journal_dir: Path | None = None,
        trials_dir: Path | None = None,
    ) -> None:
        self.splits = TaskSplits(datasets)
        self.llm_url = llm_url
        self.model = model
        self.host = host
        self.capture_port = capture_port
        self.proxy_url = proxy_url
        self.proxy_base_url = proxy_base_url
        self.api_key = api_key
        self.max_output_tokens = max_output_tokens
        self.max_concurrent = max_concurrent
        self.trials_dir = trials_dir
        self.admin_key = (
            os.environ.get("HARNESS_PROXY_ADMIN_KEY")
            or os.environ.get("OPENENV_CAPTURE_ADMIN_KEY")
            or secrets.token_urlsafe(32)
        )
        self._own_journal = journal_dir is None and proxy_base_url is None
        if self._own_journal:
            journal_dir = Path(tempfile.mkdtemp(prefix="harness-serve-journal-"))
        self.journal_dir = journal_dir
        self.endpoint: ProxyEndpoint | None = None
        self._loop: ServiceLoop | None = None
        self._proxy: CaptureProxy | None = None
        self._workers = concurrent.futures.ThreadPoolExecutor(max_concurrent, thread_name_prefix="rollout")
        self._live = LiveSessions()

    def start(self) -> str:
        """Start the capture proxy, or check the external one (``ServicesError``, ``connect_proxy``); its URL as
        this machine reaches it."""
        if self.proxy_base_url is not None:
            self.endpoint = connect_proxy(
                self.proxy_base_url,
                sampling={},
                name="--proxy-base-url",
                probe="rollout service start",
                llm_url=self.llm_url or None,
            )
            return self.endpoint.base_url
        assert self.journal_dir is not None
        self._loop = ServiceLoop("rollout-service-proxy")
        config = ProxyConfig(
            engine_url=self.llm_url,
            journal_dir=self.journal_dir,
            host=self.host,
            port=self.capture_port,
            admin_key=self.admin_key,
            model=self.model or None,
            engine_api_key=self.api_key,
        )
        self._proxy = CaptureProxy(config)
        port = self._loop.run(self._proxy.start())
        self.endpoint = ProxyEndpoint(f"http://127.0.0.1:{port}", self.admin_key)
        return self.endpoint.base_url

    def stop(self) -> None:
        """Close the rollouts still running (their trials cancelled, sandboxes deleted), then the proxy."""
        self._live.close_all()
        self._workers.shutdown(wait=False, cancel_futures=True)
        if self._loop is not None:
            if self._proxy is not None:
                self._loop.run(self._proxy.stop(), 30)
            self._loop.close()
            self._loop = None
        if self._own_journal and self.journal_dir is not None:
            shutil.rmtree(self.journal_dir, ignore_errors=True)

    async def run_async(self, request: RolloutRequest) -> HarborRolloutResult:
        return await asyncio.get_running_loop().run_in_executor(self._workers, self.run, request)

    def run(self, request: RolloutRequest) -> HarborRolloutResult:
        """One rollout (module docstring); never raises."""
        started = time.monotonic()
        result = HarborRolloutResult(harness=request.harness, sandbox=request.sandbox, dataset=request.split)
        try:
            self._run(request, result)
        except Exception as exc:  # a failed rollout is a result, never an exception across the wire
            result.ok = False
            result.error = result.error or f"{type(exc).__name__}: {exc}"[:600]
            result.exception_type = result.exception_type or type(exc).__name__
        result.wall_s = round(time.monotonic() - started, 2)
        return result

    def _run(self, request: RolloutRequest, result: HarborRolloutResult) -> None:
        refused = unsupported(request, self.api_key)
        if refused:
            result.ok, result.error = False, refused
            return
        assert self.endpoint is not None, "the service is not started"
        if not (request.llm_url or self.llm_url or self.proxy_base_url):
            result.ok, result.error = False, "this service has no default engine: pass llm_url, or serve with --llm-url"
            return
        if request.sandbox == "local" and not self._sandbox_reaches_proxy():
            result.ok = False
            result.error = (
                f"the local sandbox reaches only this machine's loopback, not the capture proxy at "
                f"{self.endpoint.base_url}: serve with --proxy-base-url http://127.0.0.1:PORT of a proxy on this "
                "machine, or run the rollout in another sandbox"
            )
            return
        result.dataset = request.split or self.splits.datasets[0]
        task = self.splits.task(request.split, int(request.task_index))
        result.task_id, result.task_name = str(task.path), task.name
        policy = training_policy(request.sampling)
        step_limit = request.agent_step_limit or None
        factory = HarborTrialSessionFactory(
            harness=request.harness,
            sampling=policy,
            sandbox=request.sandbox,
            proxy_url=None if request.sandbox == "local" else self.proxy_url,
            max_steps=step_limit,
            max_output_tokens=self.max_output_tokens or 4096,
            trials_dir=self.trials_dir,
        )
        factory.environment.delete = not request.keep_sandbox
        factory.environment.force_build = request.force_build
        served = request.model or self.model
        factory.bind_rollout(
            RolloutContext(
                self.endpoint,
                sampling=policy,
                max_model_calls=step_limit,
                max_output_tokens=self.max_output_tokens,
                model_name=served.rsplit("/", 1)[-1] if served else "policy",
                engine_url=request.llm_url or self.llm_url or None,
                engine_model=request.model or None,
            )
        )
        session = factory.create_from_row({"task_path": str(task.path)}, seed=0, episode_id=uuid.uuid4().hex)
        try:
            if not self._live.add(session):
                raise RuntimeError("the service is stopping")
            result.session_id, result.trial_name = session.lease.session_id, session.config.trial_name
            try:
                session.wait_for_completion(request.agent_timeout_sec or None)
            except TimeoutError as exc:
                result.ok, result.error, result.exception_type = False, str(exc), AGENT_TIMEOUT
            except HarborTrialError as exc:
                cause = exc.__cause__
                result.ok, result.error = False, str(exc)[:600]
                result.exception_type = type(cause).__name__ if cause is not None else type(exc).__name__
            trial = session.result
            if trial is not None and trial.exception_info is not None and result.ok:
                result.ok = False
                result.exception_type = trial.exception_info.exception_type
                result.error = trial.exception_info.exception_message[:600]
            add_reward(result, trial, request.reward_key)
            add_turns(result, session.fetch_training_trace())
        finally:
            self._live.discard(session)
            session.close()

    def _sandbox_reaches_proxy(self) -> bool:
        """Whether the local sandbox, which relays only ports of its host's 127.0.0.1, reaches the proxy."""
        assert self.endpoint is not None
        url = urlsplit(self.endpoint.base_url)
        return url.hostname in LOOPBACK and url.port is not None

    def capabilities(self) -> dict[str, Any]:
        """What this service runs: its engine, sandboxes, datasets and harnesses (``openenv harbor`` keys)."""
        try:
            check_prerequisites()
            local = {"name": "local", "available": True, "detail": "namespaces on this machine"}
        except LocalSandboxUnavailable as exc:
            local = {"name": "local", "available": False, "detail": str(exc)}
        return {
            "llm": {"url": self.llm_url, "model": self.model, "capture_level": "tokens"},
            "sandboxes": [local],
            "datasets": {split["name"]: split for split in self.splits.list_splits()},
            "harnesses": [*AGENTS, "terminus-2"],
        }


def unsupported(request: RolloutRequest, api_key: str | None) -> str | None:
    """Why this service refuses ``request`` (a parameter it does not offer), or None."""
    if request.purpose not in ("auto", "train"):
        return f"purpose={request.purpose!r} is not offered: this service runs train rollouts"
    if request.eval_sampling is not None:
        return "eval_sampling is not offered: this service runs train rollouts"
    if request.provider != "openai":
        return f"provider={request.provider!r} is not offered: the engine must speak OpenAI chat completions"
    if request.auth_header not in ("", "Authorization"):
        return f"auth_header={request.auth_header!r} is not offered: the engine key goes as Authorization: Bearer"
    if request.api_key and request.api_key != api_key:
        return "a per-rollout api_key is not offered: the service sends its own --api-key to the engine"
    return None


def training_policy(sampling: dict[str, Any] | None) -> dict[str, Any]:
    """OpenEnv's training sampling (``training_sampling``: finite positive temperature, full vocabulary) as our
    proxy's policy fields; {} (the proxy's default policy) when none was given."""
    if not sampling:
        return {}
    checked = training_sampling(sampling)
    return {key: checked[key] for key in POLICY_KEYS}


def pick_reward_key(rewards: dict[str, Any], reward_key: str) -> str | None:
    """The verifier key that is the reward: the first of ``reward_key``'s comma-separated names present, else the
    only key, else ``reward``; None when there is none. ``ValueError`` when several keys leave it ambiguous or a
    named key is absent."""
    if reward_key:
        for key in (reward_key, *(name.strip() for name in reward_key.split(","))):
            if key in rewards:
                return key
        raise ValueError(f"reward_key {reward_key!r} is not among the verifier's rewards {sorted(rewards)}")
    if not rewards:
        return None
    if len(rewards) == 1:
        return next(iter(rewards))
    if "reward" in rewards:
        return "reward"
    raise ValueError(f"the verifier wrote several rewards {sorted(rewards)}, none named reward: pass reward_key")


def add_reward(result: HarborRolloutResult, trial: Any, reward_key: str) -> None:
    """The verifier's rewards (finite ones) and the reward (module docstring) into ``result``."""
    verifier = trial.verifier_result if trial is not None else None
    rewards = (verifier.rewards or {}) if verifier is not None else {}
    result.rewards = {
        key: float(value)
        for key, value in rewards.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }
    dropped = sorted(set(rewards) - set(result.rewards))
    if dropped:
        result.findings.append(f"[WARN] verifier keys dropped as not finite numbers: {dropped}")
    try:
        key = pick_reward_key(rewards, reward_key)
    except ValueError as exc:
        result.ok, result.error = False, result.error or str(exc)
        return
    result.reward_key = key or ""
    if key is not None and key in result.rewards and trial.reward_valid:
        result.reward = result.rewards[key]
    elif key is not None and not trial.reward_valid:
        result.findings.append("[WARN] Harbor marks this trial's reward invalid; reward is None")


def add_turns(result: HarborRolloutResult, trace: TrainingTrace) -> None:
    """The trace's turns, as captured, into ``result`` (and its counts)."""
    result.turns = [harbor_turn(index, turn) for index, turn in enumerate(trace.turns)]
    result.n_turns = len(result.turns)
    result.n_roots = sum(1 for turn in trace.turns if turn.metadata.get("parent_id") is None)
    result.multi_turn = result.n_turns > result.n_roots
    result.n_trainable_tokens = sum(sum(turn.loss_mask) for turn in result.turns if turn.role == AGENT)


def harbor_turn(index: int, turn: TrainingTurn) -> HarborTurn:
    """One captured turn on the wire (``HarborTurn``), ids, logprobs and mask unchanged."""
    choice = (turn.response.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    role = str(turn.metadata.get("role") or AGENT)
    content = message.get("content")
    return HarborTurn(
        turn=index,
        role=role,
        finish_reason=choice.get("finish_reason"),
        prompt_token_ids=turn.prompt_token_ids,
        completion_token_ids=turn.completion_token_ids,
        per_token_logps=turn.per_token_logps,
        loss_mask=turn.loss_mask,
        node_id=turn.node_id,
        n_tools=len(turn.request.get("tools") or []),
        discarded=role == DISCARDED,
        trainable=any(turn.loss_mask),
        sampling_params=dict(turn.metadata.get("sampling_params") or {}),
        requested_sampling_params=dict(turn.metadata.get("requested_sampling_params") or {}),
        text=content if isinstance(content, str) else "",
        tool_calls=[
            {"name": call["function"]["name"], "arguments": call["function"].get("arguments", "")}
            for call in message.get("tool_calls") or []
            if isinstance(call, dict) and isinstance(call.get("function"), dict) and call["function"].get("name")
        ],
        request_messages=list(turn.request.get("messages") or []),
        request_tools=turn.request.get("tools"),
    )


class RolloutServiceEnvironment(MCPEnvironment):
    """The env session a client's WebSocket gets: the Task API and the ``run_rollout`` tool over the service."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    service: ClassVar[RolloutService | None] = None

    def __init__(self) -> None:
        from fastmcp import FastMCP

        self._state = HarborState(episode_id=str(uuid.uuid4()))
        mcp = FastMCP(ENV_NAME)

        @mcp.tool
        async def run_rollout(
            split: str = "",
            task_index: int = 0,
            harness: str = "opencode",
            sandbox: str = "e2b",
            reward_key: str = "",
            keep_sandbox: bool = False,
            force_build: bool = False,
            llm_url: str = "",
            model: str = "",
            api_key: str = "",
            auth_header: str = "",
            agent_timeout_sec: float = 0.0,
            agent_step_limit: int = 0,
            sampling: dict[str, Any] | None = None,
            provider: str = "openai",
            purpose: str = "auto",
            eval_sampling: dict[str, Any] | None = None,
        ) -> str:
            """Run one Harbor rollout of a task and return its ``HarborRolloutResult`` as JSON."""
            request = RolloutRequest(
                split=split,
                task_index=task_index,
                harness=harness,
                sandbox=sandbox,
                reward_key=reward_key,
                keep_sandbox=keep_sandbox,
                force_build=force_build,
                llm_url=llm_url,
                model=model,
                api_key=api_key,
                auth_header=auth_header,
                agent_timeout_sec=agent_timeout_sec,
                agent_step_limit=agent_step_limit,
                sampling=sampling,
                provider=provider,
                purpose=purpose,
                eval_sampling=eval_sampling,
            )
            result = await self._service().run_async(request)
            self._state.rollouts_completed += 1
            self._state.last_reward = result.reward
            self._state.last_task_id = result.task_id
            self._state.last_trial_name = result.trial_name
            return result.model_dump_json()

        @mcp.tool
        def capabilities() -> str:
            """Engine, sandboxes, datasets and harnesses of this service."""
            return json.dumps(self._service().capabilities())

        @mcp.tool
        def list_tasks(split: str = "", start: int = 0, stop: int = 20) -> str:
            """A window of a split's tasks."""
            return json.dumps(self._service().splits.refs(split, start, stop))

        super().__init__(mcp)

    @classmethod
    def _service(cls) -> RolloutService:
        if cls.service is None:
            raise RuntimeError("the rollout service is not started")
        return cls.service

    def list_splits(self) -> list[dict[str, Any]]:
        return self._service().splits.list_splits()

    def num_tasks(self, split: str) -> int:
        return len(self._service().splits.tasks(split))

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return self._service().splits.refs(split)

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        return self._service().splits.ref(split, index)

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        return self._service().splits.refs(split, start, stop)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Observation:
        self._state = HarborState(episode_id=episode_id or str(uuid.uuid4()), llm_url=self._service().llm_url)
        metadata = {"status": "ready", "datasets": self._service().splits.datasets}
        return Observation(done=False, reward=None, metadata=metadata)

    def _step_impl(self, action: Any, timeout_s: float | None = None, **_: Any) -> Observation:
        message = f"unknown action {type(action).__name__}; use CallToolAction(tool_name='run_rollout', ...)"
        return Observation(done=False, reward=None, metadata={"error": message})

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return super().step(action, timeout_s=timeout_s or ROLLOUT_TIMEOUT_S, **kwargs)

    async def step_async(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return await super().step_async(action, timeout_s=timeout_s or ROLLOUT_TIMEOUT_S, **kwargs)

    @property
    def state(self) -> HarborState:
        return self._state


def build_app(service: RolloutService) -> Any:
    """The env server's FastAPI app over ``service`` (OpenEnv's ``create_app``)."""
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.mcp_environment import CallToolAction, CallToolObservation

    RolloutServiceEnvironment.service = service
    return create_app(
        RolloutServiceEnvironment,
        CallToolAction,
        CallToolObservation,
        state_cls=HarborState,
        env_name=ENV_NAME,
        max_concurrent_envs=service.max_concurrent,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m harness_grpo.serve",
        description="Serve Harbor task rollouts (our proxy and sandboxes) over openenv harbor serve's protocol.",
    )
    p.add_argument("--dataset", action="append", required=True, help="a task dataset to serve as a split (repeatable)")
    p.add_argument("--llm-url", default="", help="the default engine (a rollout may name its own llm_url)")
    p.add_argument("--model", default="", help="the engine's served model (default: its first)")
    p.add_argument("--host", default="0.0.0.0", help="where the env server and its own capture proxy listen")
    p.add_argument("--port", type=int, default=8000, help="the env server's port (faces the trainer)")
    p.add_argument(
        "--capture-port", type=int, default=None, help="the capture proxy's port (faces the sandboxes); default 8100"
    )
    p.add_argument(
        "--proxy-base-url",
        default=None,
        help="use the capture proxy running at this URL (python -m proxy; its admin key in $HARNESS_PROXY_ADMIN_KEY) "
        "instead of starting one",
    )
    p.add_argument(
        "--proxy-url",
        default=None,
        help="the capture proxy as sandboxes on other machines reach it (default: the local sandbox's loopback)",
    )
    p.add_argument("--expose", default="direct", choices=["direct"], help="as openenv harbor serve; only direct")
    p.add_argument(
        "--api-key",
        default=os.environ.get("OPENENV_LLM_API_KEY"),
        help="the engine's key, if it has one (sent by the service's own proxy)",
    )
    p.add_argument("--max-output-tokens", type=int, default=8192, help="most tokens a call may sample (0: no cap)")
    p.add_argument(
        "--max-concurrent-envs",
        type=int,
        default=int(os.environ.get("MAX_CONCURRENT_ENVS", "4")),
        help="env sessions (WebSocket connections, so rollouts) at once; $MAX_CONCURRENT_ENVS, default 4",
    )
    p.add_argument("--trials-dir", type=Path, default=None, help="keep each trial's Harbor directory here")
    p.add_argument("--journal-dir", type=Path, default=None, help="the proxy's session journals (default: temporary)")
    args = p.parse_args(argv)
    if args.proxy_base_url is not None:
        for flag, value in (("--capture-port", args.capture_port), ("--journal-dir", args.journal_dir)):
            if value is not None:
                p.error(f"{flag} configures the service's own capture proxy; --proxy-base-url uses another")
    return args


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    service = RolloutService(
        datasets=args.dataset,
        llm_url=args.llm_url,
        model=args.model,
        host=args.host,
        capture_port=8100 if args.capture_port is None else args.capture_port,
        proxy_url=args.proxy_url,
        proxy_base_url=args.proxy_base_url,
        api_key=args.api_key,
        max_output_tokens=args.max_output_tokens or None,
        max_concurrent=args.max_concurrent_envs,
        journal_dir=args.journal_dir,
        trials_dir=args.trials_dir,
    )
    for split in service.splits.list_splits():  # a dataset that names no task stops the service before it serves
        if "error" in split:
            raise SystemExit(f"--dataset {split['name']}: {split['error']}")
    try:
        capture = service.start()
    except ServicesError as exc:  # before the service serves: one line, the parser's exit status
        service.stop()
        print(f"python -m harness_grpo.serve: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    try:
        where = "external" if args.proxy_base_url else "its own"
        sandboxes = args.proxy_url or "local, through its loopback"
        print(f"capture   {capture} ({where}; sandboxes: {sandboxes})", flush=True)
        print(f"server    http://{args.host}:{args.port}  (Task API at /{ENV_NAME}/splits, MCP over /ws)", flush=True)
        # uvicorn re-raises SIGTERM once it has shut down: as SystemExit, so stop() below cancels the rollouts still
        # running (their sandboxes deleted) and stops the proxy, instead of the process dying with them.
        signal.signal(signal.SIGTERM, _exit_on_signal)
        uvicorn.run(build_app(service), host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=5)
    finally:
        service.stop()


if __name__ == "__main__":
    main()
