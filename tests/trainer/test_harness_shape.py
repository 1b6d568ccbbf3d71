"""The documented harness shape, unchanged: a factory with OpenEnv's ``HarborSessionFactory`` signature.

Users pass ``partial(HarborSessionFactory, server_url, split=..., harness=..., sandbox=..., llm_url=...,
model=...)`` and the trainer adds only ``sampling=``. ``HarborShapedFactory`` below has exactly that
constructor and exactly the session methods of OpenEnv's ``envs/harbor_env/harness.py`` (the session
offers the legacy ``fetch_proxy_trace`` only, as upstream's does), and it owns its whole rollout side
as upstream's does through ``openenv harbor serve``: here a capture proxy started alone
(``python -m proxy``) and the black-box agent program as a local process on the submit task. The
engine (``python -m harness_grpo.engine``, standing in for vLLM) runs in its own process; the trainer
gets only its URL, starts no proxy and no engine, trains two steps and pushes weights over HTTP.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from examples import submit_task
from harness_grpo import HarnessAsyncGRPOTrainer, HarnessGRPOConfig, HarnessRolloutOutcome
from harness_grpo.session_protocol import VerifyResult, instruction_of
from harness_grpo.weight_transports import HTTPEmbeddedWeightSync
from proxy.client import ProxyAdminClient, ProxyClientError, ProxySession
from tests.support.processes import ReadyProcess, start_engine

log = logging.getLogger(__name__)

# OpenEnv envs/harbor_env/harness.py (huggingface/OpenEnv), HarborSessionFactory.__init__ and create().
UPSTREAM_FACTORY_PARAMETERS = [
    ("server_url", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
    ("split", inspect.Parameter.KEYWORD_ONLY, ""),
    ("llm_url", inspect.Parameter.KEYWORD_ONLY, ""),
    ("model", inspect.Parameter.KEYWORD_ONLY, ""),
    ("harness", inspect.Parameter.KEYWORD_ONLY, "opencode"),
    ("sandbox", inspect.Parameter.KEYWORD_ONLY, "e2b"),
    ("reward_key", inspect.Parameter.KEYWORD_ONLY, ""),
    ("api_key", inspect.Parameter.KEYWORD_ONLY, ""),
    ("auth_header", inspect.Parameter.KEYWORD_ONLY, ""),
    ("agent_timeout_sec", inspect.Parameter.KEYWORD_ONLY, 600.0),
    ("agent_step_limit", inspect.Parameter.KEYWORD_ONLY, 0),
    ("sampling", inspect.Parameter.KEYWORD_ONLY, None),
    ("num_tasks", inspect.Parameter.KEYWORD_ONLY, None),
    ("indices", inspect.Parameter.KEYWORD_ONLY, None),
    ("max_message_size_mb", inspect.Parameter.KEYWORD_ONLY, 4096.0),
]
UPSTREAM_SESSION_METHODS = {
    "initial_messages",
    "list_tools",
    "call_tool",
    "verify",
    "close",
    "wait_for_completion",
    "fetch_proxy_trace",
}
SPLITS = {"submit": submit_task.PROMPTS}


class HarborShapedSession:
    """One rollout run by the "server" side: a proxy session, the agent process, the verifier."""

    def __init__(self, factory: HarborShapedFactory, task_index: int, instruction: str) -> None:
        self._factory = factory
        self._task_index = task_index
        self._instruction = instruction
        self._admin = ProxyAdminClient(factory.server_url, factory.api_key)
        self._session: ProxySession | None = None
        self._workdir = Path(tempfile.mkdtemp(prefix="harbor-shaped-"))
        self.reward: float | None = None

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self._instruction}]

    def list_tools(self) -> list[Any]:
        return []

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        raise NotImplementedError("the agent owns its loop")

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """0 for a usable rollout, 1 otherwise; never raises (upstream's contract)."""
        factory = self._factory
        try:
            self._session = self._admin.create_session(
                purpose="train",
                sampling=factory.sampling,
                llm_url=factory.llm_url or None,
                model=factory.model or None,
                max_model_calls=factory.agent_step_limit or None,
            )
            task = {"prompt": self._instruction}
            submit_task.setup(self._workdir, task)
            argv = [part.replace("{prompt}", self._instruction) for part in submit_task.agent_command()]
            env = {
                "PATH": "/usr/bin:/bin",
                "OPENAI_BASE_URL": f"{factory.server_url}/v1",
                "OPENAI_API_KEY": self._session.api_key,
            }
            agent = subprocess.run(
                argv, cwd=self._workdir, env=env, capture_output=True, timeout=timeout_s or factory.agent_timeout_sec
            )
            self.reward = submit_task.verifier(self._workdir, task)  # the server grades the workspace
            return 0 if agent.returncode == 0 else 1
        except (OSError, subprocess.SubprocessError, ProxyClientError) as exc:
            log.warning("rollout failed: %s", exc)
            return 1

    def fetch_proxy_trace(self) -> list[dict[str, Any]]:
        if self._session is None:
            return []
        return self._admin.trace(self._session.session_id).to_trace_entries()

    def verify(self, transcript: list[dict[str, Any]], final_state: Any | None = None) -> VerifyResult:
        return VerifyResult(env_reward=self.reward, done=True)

    def close(self) -> None:
        if self._session is not None:
            self._admin.delete(self._session.session_id)
            self._session = None
        shutil.rmtree(self._workdir, ignore_errors=True)


class HarborShapedFactory:
    """OpenEnv's ``HarborSessionFactory`` constructor and methods; tasks come from ``SPLITS``."""

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
    ) -> None:
        if harness != "tool-agent" or sandbox != "local":
            raise ValueError("this stand-in runs the tool-agent harness in a local directory only")
        self.server_url = server_url.rstrip("/")
        self.llm_url, self.model, self.api_key = llm_url, model, api_key
        self.agent_timeout_sec, self.agent_step_limit = agent_timeout_sec, agent_step_limit
        self.sampling = sampling
        self._split = split
        self._tasks = [{"instruction": p, "index": i, "task_name": f"{split}-{i}"} for i, p in enumerate(SPLITS[split])]

    def tasks(self) -> list[dict[str, Any]]:
        return self._tasks

    def prompt_rows(self) -> list[dict[str, Any]]:
        return [
            {"prompt": [{"role": "user", "content": t["instruction"]}], "task_name": t["task_name"], "task_index": i}
            for i, t in enumerate(self._tasks)
        ]

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> HarborShapedSession:
        instruction = instruction_of(task)
        index = next((t["index"] for t in self._tasks if t["instruction"] == instruction), None)
        if index is None:
            raise KeyError("this prompt does not match any task on the server")
        return HarborShapedSession(self, index, instruction)


def test_the_stand_in_has_exactly_the_upstream_shape() -> None:
    parameters = list(inspect.signature(HarborShapedFactory.__init__).parameters.values())[1:]
    assert [(p.name, p.kind, p.default) for p in parameters] == UPSTREAM_FACTORY_PARAMETERS
    methods = {n for n, v in vars(HarborShapedSession).items() if callable(v) and not n.startswith("_")}
    assert methods == UPSTREAM_SESSION_METHODS


def shaped_reward(outcome: HarnessRolloutOutcome) -> float | None:
    """Float or None, as a user writes it: the verifier's reward, None when it did not run."""
    if outcome.env_reward is None:
        return None
    return float(outcome.env_reward) - 0.01 * outcome.tool_call_count


@pytest.mark.timeout(900)
def test_a_harbor_shaped_factory_trains_with_no_wrapper(tmp_path: Path) -> None:
    model = submit_task.task_model_path()
    with (
        start_engine("--model", str(model)) as engine,
        ReadyProcess(
            [sys.executable, "-m", "proxy", "--engine-url", engine.url, "--journal-dir", str(tmp_path / "journal"),
             "--port", "0", "--admin-key", "trainer-test-admin"],
            r"proxy listening on (http://\S+)",
        ) as proxy,
    ):  # fmt: skip
        proxy_url = proxy.match.group(1)
        factory = functools.partial(
            HarborShapedFactory,
            proxy_url,
            split="submit",
            harness="tool-agent",
            sandbox="local",
            llm_url=engine.url,
            model="",
            api_key="trainer-test-admin",
            agent_step_limit=2,
        )
        dataset = HarborShapedFactory(proxy_url, split="submit", harness="tool-agent", sandbox="local").prompt_rows()
        args = HarnessGRPOConfig(
            output_dir=str(tmp_path / "run"),
            num_generations=4,
            max_concurrent_rollouts=4,
            vllm_server_base_url=engine.url,
            max_steps=2,
            learning_rate=3e-4,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
        )
        trainer = HarnessAsyncGRPOTrainer(str(model), factory, args, dataset, rollout_reward_fn=shaped_reward)
        assert not trainer.uses_own_proxy  # a third-party factory brings its own rollout side
        trainer.train()
        assert trainer.services is not None and trainer.services.proxy is None and trainer.services.engine is None
        assert isinstance(trainer.services.weight_sync, HTTPEmbeddedWeightSync)
        history = trainer.state.log_history
        assert [entry["step"] for entry in history] == [1, 2]
        for entry in history:
            assert entry["rollout/errors"] == 0 and entry["rollout/unscorable_frac"] == 0, entry
            assert entry["rollout/turns_mean"] >= 1
            assert 0.0 <= entry["rollout/correctness_mean"] <= 1.0
            assert entry["rewards/harness_reward/mean"] <= entry["rollout/correctness_mean"]  # the shaping ran
        assert trainer.state.policy_version == 2
        with urllib.request.urlopen(f"{engine.url}/health", timeout=30) as response:
            health = json.loads(response.read())
        assert health["weight_version"] == 2, health

        # A second run against the same engine server: the engine holds the first run's weights at version 2,
        # so the new trainer first gives it its own (its numbering restarts at 1), then trains.
        second_args = dataclasses.replace(args, output_dir=str(tmp_path / "second"), max_steps=1)
        second = HarnessAsyncGRPOTrainer(str(model), factory, second_args, dataset, rollout_reward_fn=shaped_reward)
        second.train()
        assert [entry["step"] for entry in second.state.log_history] == [1]
        assert second.state.policy_version == 2  # the sync at start, then the step's
        with urllib.request.urlopen(f"{engine.url}/health", timeout=30) as response:
            assert json.loads(response.read())["weight_version"] == 2
