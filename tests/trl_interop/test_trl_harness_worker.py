"""Both ways with TRL: TRL's own harness rollout loop drives our session factories unchanged.

``test_trl_worker_builds_the_rows_our_trainer_builds`` runs trl 1.16's ``HarnessRolloutWorker`` (its spawned
child process, its ``TrainableSession`` check, ``_turns_from_training_trace`` and its row builder) on a
``LocalAgentSessionFactory`` whose agent is ``examples/agents/tool_agent.py``, a real program, talking to our
capture proxy (``python -m proxy``) in front of the real embedded engine serving the submit task's model. No GPU:
the loop-owning worker never calls vLLM itself (the agent's calls go through our proxy), so the test lets TRL's
worker start without vLLM installed and stops at the rows it queues. Each session also writes down the trace and
reward it handed TRL (``tests/trl_interop/recording.py``); from those the test builds the rows our trainer builds
(``sequences_from_trace`` → ``rollout_rows`` with ``group_advantages``) and checks TRL's rows of each group are
exactly ours: token ids, loss masks, behaviour logprobs (TRL stores them as float32) and advantages.
"""

from __future__ import annotations

import functools
import json
import pickle
import queue
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from accelerate.state import PartialState
from datasets import Dataset
from openenv.core.harness import TrainableSession
from openenv.core.harness.capture.upstream import training_sampling
from transformers import AutoTokenizer
from trl.chat_template_utils import qwen3_template
from trl.experimental.async_grpo import async_rollout_worker
from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker

from examples import submit_task
from harness_grpo.advantages import group_advantages
from harness_grpo.agent_sessions import LocalAgentSessionFactory, ProcessSession
from harness_grpo.harbor_sessions import HarborSession, HarborTrialSessionFactory
from harness_grpo.rollout_context import ProxyEndpoint, RolloutContext
from harness_grpo.rows import rollout_rows
from proxy.capture_graph import sequences_from_trace
from proxy.sampling_policy import SamplingPolicy
from proxy.trace import TrainingTrace
from tests.support.processes import ReadyProcess, start_engine
from tests.trl_interop.recording import RecordingAgentSessionFactory

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


def _our_rows(records: list[dict[str, Any]]) -> list[tuple[list[int], list[int], list[float], float]]:
    """The rows our trainer builds for one group's rollouts (``HarnessAsyncGRPOTrainer._rows_and_metrics``)."""
    advantages, _ = group_advantages([record["reward"] for record in records])
    rows = []
    for index, (record, advantage) in enumerate(zip(records, advantages, strict=True)):
        trace = TrainingTrace.from_json(json.dumps(record["trace"]))
        for row in rollout_rows(
            sequences_from_trace(trace), advantage, policy_version=0, rollout_id=str(index), group_id="g"
        ):
            rows.append((row.input_ids, row.loss_mask, row.behaviour_logprobs, row.advantage))
    return rows


def _key(ids: Any, mask: Any, logprobs: Any) -> tuple[tuple[int, ...], tuple[int, ...], bytes]:
    """A row as TRL keeps it: int64 ids and mask, float32 logprobs."""
    return (
        tuple(np.asarray(ids, dtype=np.int64).tolist()),
        tuple(np.asarray(mask, dtype=np.int64).tolist()),
        np.asarray(logprobs, dtype=np.float32).tobytes(),
    )


@pytest.mark.timeout(600)
def test_trl_worker_builds_the_rows_our_trainer_builds(
    capture_proxy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, model = capture_proxy
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    # TRL's worker refuses to start without vLLM installed; in loop-owning mode it never calls it.
    monkeypatch.setattr(async_rollout_worker, "is_vllm_available", lambda: True)
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
    prompts = submit_task.PROMPTS[:GROUPS]
    worker = HarnessRolloutWorker(
        harness_session_factory=factory,
        model_name="policy",
        dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts]),
        reward_funcs=[],
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        num_generations=GENERATIONS,
        max_inflight_tasks=GENERATIONS,
        temperature=1.0,
        vllm_server_url="http://127.0.0.1:9",  # never called
        child_ready_timeout=240,
    )
    samples: dict[int, list[Any]] = defaultdict(list)
    PartialState()  # as TRL's trainer has it: the worker logs through accelerate
    try:
        worker.start()
        deadline = time.monotonic() + 300
        while len(samples) < GROUPS:
            worker.check_health(stale_after_s=300)
            assert time.monotonic() < deadline, f"TRL queued rows of {len(samples)} groups in time"
            try:
                sample = worker.rollout_buffer.get(timeout=1.0)
            except queue.Empty:
                continue
            samples[sample.group_id].append(sample)
    finally:
        worker.stop()
    while True:  # rows of a group are queued together: take the rest of the groups already seen
        try:
            sample = worker.rollout_buffer.get(timeout=1.0)
        except queue.Empty:
            break
        samples[sample.group_id].append(sample)

    records: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for path in record_dir.glob("*.json"):
        record = json.loads(path.read_text())
        records[record["seed"]].append(record)
    for group_id, group_samples in samples.items():
        group_records = records[group_id]
        assert len(group_records) == GENERATIONS  # every rollout of a queued group handed TRL its trace
        ours = _our_rows(group_records)
        assert sorted(_key(ids, mask, logprobs) for ids, mask, logprobs, _ in ours) == sorted(
            _key(s.input_ids, s.completion_mask, s.old_log_probs) for s in group_samples
        )
        by_row = {_key(ids, mask, logprobs): advantage for ids, mask, logprobs, advantage in ours}
        for s in group_samples:
            assert s.advantage == pytest.approx(by_row[_key(s.input_ids, s.completion_mask, s.old_log_probs)])
            trained = s.completion_mask.astype(bool)
            assert trained.any() and np.all(s.old_log_probs[trained] <= 0.0)
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
    for session_class in (ProcessSession, HarborSession):
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
