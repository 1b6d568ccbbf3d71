"""Both ways with TRL: TRL's own harness rollout loop drives our session factories unchanged.

``test_trl_worker_builds_the_rows_our_trainer_builds`` runs trl 1.16's ``HarnessRolloutWorker`` to the rows it queues
(``tests/trl_interop/trl_worker.py``) on a ``LocalAgentSessionFactory`` whose agent is
``examples/agents/tool_agent.py``, a real program, talking to our capture proxy (``python -m proxy``) in front of the
real embedded engine serving the submit task's model, and checks TRL's rows of each group are exactly the rows our
trainer builds from what each session handed TRL. ``test_trl_harness_worker_on_our_service.py`` does the same for
``HarborSessionFactory`` on our rollout service.
"""

from __future__ import annotations

import functools
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
from openenv.core.harness import TrainableSession
from openenv.core.harness.capture.upstream import training_sampling
from transformers import AutoTokenizer
from trl.chat_template_utils import qwen3_template

from examples import submit_task
from harness_grpo.agent_sessions import LocalAgentSessionFactory, ProcessSession
from harness_grpo.harbor_service_sessions import HarborServiceSession, HarborSessionFactory
from harness_grpo.harbor_sessions import HarborSession, HarborTrialSessionFactory
from harness_grpo.rollout_context import ProxyEndpoint, RolloutContext
from proxy.sampling_policy import SamplingPolicy
from tests.support.processes import ReadyProcess, start_engine
from tests.trl_interop.recording import RecordingAgentSessionFactory
from tests.trl_interop.trl_worker import check_rows_are_ours, queued_rows

ADMIN_KEY = "trl-interop-admin-key"
TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"
GROUPS = 2
GENERATIONS = 3


@pytest.fixture(scope="module")
def capture_proxy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The embedded engine serving the submit task's model, and our capture proxy in front of it, as a TRL user
    runs them (``python -m harness_grpo.engine``, ``python -m proxy``); yields the proxy's endpoint."""
    model = str(submit_task.task_model_path())
    with start_engine("--model", model, "--served-model-name", "policy", timeout_s=180) as engine:
        argv = [sys.executable, "-m", "proxy", "--engine-url", engine.url, "--port", "0", "--admin-key", ADMIN_KEY]
        argv += ["--journal-dir", str(tmp_path_factory.mktemp("proxy-journal"))]
        with ReadyProcess(argv, r"proxy listening on (http://\S+)", timeout_s=60) as proxy:
            yield ProxyEndpoint(proxy.match.group(1), ADMIN_KEY), model


@pytest.mark.timeout(600)
def test_trl_worker_builds_the_rows_our_trainer_builds(
    capture_proxy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, model = capture_proxy
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    factory = functools.partial(
        RecordingAgentSessionFactory,
        record_dir=str(record_dir),
        command=submit_task.agent_command(max_turns=3, max_tokens=48),
        verifier=submit_task.verifier,
        setup=submit_task.setup,
        rollout_context=RolloutContext(endpoint, max_model_calls=3, model_name="policy"),
        agent_timeout_s=120.0,
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.response_template = qwen3_template  # the tiny model speaks Qwen3's tool-call format
    prompts = [[{"role": "user", "content": p}] for p in submit_task.PROMPTS[:GROUPS]]
    samples = queued_rows(factory, tokenizer, prompts, generations=GENERATIONS, monkeypatch=monkeypatch)
    records = check_rows_are_ours(samples, record_dir, GENERATIONS)
    turns = [len(r["trace"]["turns"]) for group in records.values() for r in group]
    print(f"TRL queued {sum(map(len, samples.values()))} rows of {len(samples)} groups; turns per rollout {turns}")
    assert max(turns) > 1, "no rollout chained a second turn: the multi-turn row path went untested"


def test_factories_pickle_with_their_binding_and_pass_trl_session_checks(tmp_path: Path) -> None:
    """TRL's worker pickles the factory into a spawned process and checks sessions against ``TrainableSession``."""
    context = RolloutContext(ProxyEndpoint("http://127.0.0.1:1", "k"), max_model_calls=4, model_name="policy")
    sampling = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
    local = LocalAgentSessionFactory(
        command=["true"], verifier=submit_task.verifier, sampling=sampling, rollout_context=context
    )
    harbor = HarborTrialSessionFactory(
        harness="nop", sampling=sampling, tasks=str(TASKS), rollout_context=context, trials_dir=tmp_path
    )
    harbor.task_for({"task_name": "create-hello-file"})  # fills the task index under the lock
    for factory in (local, harbor):
        copy = pickle.loads(pickle.dumps(factory))
        assert copy.bound_context() == RolloutContext(
            context.proxy, sampling=sampling, max_model_calls=4, model_name="policy"
        )
    copy = pickle.loads(pickle.dumps(harbor))
    assert copy.task_for({"task_name": "create-hello-file"}).name == "create-hello-file"
    service = pickle.loads(pickle.dumps(HarborSessionFactory("http://127.0.0.1:1", split="tasks", sampling=sampling)))
    assert (service.server_url, service.split, service.sampling) == (
        "http://127.0.0.1:1",
        "tasks",
        training_sampling(sampling),
    )
    for session_class in (ProcessSession, HarborSession, HarborServiceSession):
        assert issubclass(session_class, TrainableSession)
    unbound = LocalAgentSessionFactory(command=["true"], verifier=submit_task.verifier, sampling=sampling)
    with pytest.raises(RuntimeError, match="rollout_context=RolloutContext"):
        unbound.create([{"role": "user", "content": "x"}], seed=0, episode_id="e")


def test_the_proxy_takes_the_policy_trl_sends() -> None:
    """TRL's worker builds the factory with OpenEnv's ``training_sampling``, penalties spelled out as 0."""
    policy = training_sampling({"temperature": 0.7, "top_k": 0})
    assert SamplingPolicy.from_dict(policy) == SamplingPolicy(temperature=0.7)
    with pytest.raises(ValueError, match="presence_penalty must be 0"):
        SamplingPolicy.from_dict({**policy, "presence_penalty": 0.5})
