"""Each harness runs as a real Harbor trial in the local sandbox against the proxy, on the warm tiny model.

For opencode, claude-code, codex, mini-swe-agent (the host-installed CLIs, run inside the sandbox) and
terminus-2 (Harbor's own loop on the host, its shell in the sandbox's tmux), one session of
``HarborTrialSessionFactory``: the trace holds exactly the calls the engine served for the session (ids, logprobs,
loss masks; the recording relay in front of the engine is the ground truth) and the reward is the one the
task's verifier wrote. An agent stopped at its timeout keeps its captured turns and its verifier reward
(``timed_out``), and a session closed from another thread mid-trial leaves no process of its trial running
and no proxy session behind. Sessions that run at once each capture exactly their own agent's calls.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness_grpo.agents import AGENTS, SMALL_MODEL_PROMPT, agent_binary
from harness_grpo.harbor_sessions import HarborSession, HarborTrialError, HarborTrialSessionFactory
from harness_grpo.rollouts import run_rollout
from proxy.trace import TrainingTrace
from tests.agents.conftest import AgentStack, ServedCall
from tests.harbor.conftest import bound_factory, make_task

SAMPLING = {"temperature": 0.2}
MAX_OUTPUT_TOKENS = 64
UNSOLVED = 0.25
VERIFIER = f"""\
#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then echo 1; else echo {UNSOLVED}; fi > /logs/verifier/reward.txt
"""
HARNESSES = [
    pytest.param(agent, marks=pytest.mark.skipif(agent_binary(agent) is None, reason=f"{agent} is not installed"))
    for agent in AGENTS
] + ["terminus-2"]


def _factory(
    stack: AgentStack,
    tmp_path: Path,
    harness: str,
    max_model_calls: int,
    max_output_tokens: int = MAX_OUTPUT_TOKENS,
    **kwargs,
) -> HarborTrialSessionFactory:
    return bound_factory(
        stack,
        harness=harness,
        sampling=SAMPLING,
        max_model_calls=max_model_calls,
        max_output_tokens=max_output_tokens,
        system_prompt=SMALL_MODEL_PROMPT,
        max_input_tokens=8192,
        trials_dir=tmp_path / "trials",
        **kwargs,
    )


def _session(factory: HarborTrialSessionFactory, tmp_path: Path, agent_timeout_s: float = 120.0) -> HarborSession:
    task = make_task(tmp_path, "answer", test=VERIFIER, agent_timeout_s=agent_timeout_s)
    return factory.create_from_row({"prompt": "x", "task_path": str(task)}, seed=0, episode_id=f"{factory.harness}-t")


def assert_trace_is_what_the_engine_served(trace: TrainingTrace, served: list[ServedCall], exact: bool = True) -> None:
    """Every turn is its own call the engine served (same ids, logprobs, request messages), with the completion as
    the only trained tokens; ``exact``: and every served call is a turn. Calls that sampled the same ids may differ
    in their logprobs' last digits (batched with other requests or not), so a turn claims the call equal in all."""
    assert trace.turns, "nothing was captured"
    unclaimed = list(served)
    for turn in trace.turns:
        same = [
            call
            for call in unclaimed
            if (call.prompt_ids, call.completion_ids, call.logprobs, call.request["messages"])
            == (turn.prompt_token_ids, turn.completion_token_ids, turn.per_token_logps, turn.request["messages"])
        ]
        assert same, f"turn {turn.node_id} is not a call the engine served"
        unclaimed.remove(same[0])
        assert turn.loss_mask == [0] * len(turn.prompt_token_ids) + [1] * len(turn.completion_token_ids)
    # a call in flight when an agent was stopped may have reached the engine but never the agent
    assert len(unclaimed) <= (0 if exact else 1), f"{len(unclaimed)} served calls are in no trace"


def _processes_holding(key: str) -> list[int]:
    """Host pids whose environment holds ``key`` (the session key every agent process carries)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if key.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.timeout(240)
@pytest.mark.parametrize("harness", HARNESSES)
def test_each_harness_runs_a_trial_captured_exactly(harness: str, warm_tiny_stack: AgentStack, tmp_path: Path) -> None:
    # The proxy's call budget ends the CLIs' loops (claude-code exits 1 at its own --max-turns); terminus-2,
    # which takes the budget reply as one more turn, stops at its max_turns.
    steps = {"max_steps": 2} if harness == "terminus-2" else {}
    factory = _factory(warm_tiny_stack, tmp_path, harness, max_model_calls=2, **steps)
    session = _session(factory, tmp_path)
    mark = len(warm_tiny_stack.relay.served)
    try:
        started = time.monotonic()
        exit_code = session.wait_for_completion(180)
        trace = session.fetch_training_trace()
        stats = warm_tiny_stack.session(session.lease.session_id)["stats"]
        verdict = session.verify()
    finally:
        session.close()
    served = warm_tiny_stack.served_since(mark)
    print(f"{harness}: {len(trace.turns)} turns, exit {exit_code}, {time.monotonic() - started:.1f}s")
    error = session.result.exception_info
    if error is not None and len(trace.turns[-1].completion_token_ids) == MAX_OUTPUT_TOKENS:
        # codex ends its run on a reply cut at the output limit (test below)
        assert (harness, error.exception_type) == ("codex", "OutputTokenExceededError"), error
    else:
        assert error is None and exit_code == 0, error
    assert stats["errors"] == 0, stats
    assert_trace_is_what_the_engine_served(trace, served)
    written = session.config.trials_dir / session.config.trial_name / "verifier" / "reward.txt"
    assert verdict.env_reward == float(written.read_text()) in (UNSOLVED, 1.0)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("harness", [agent for agent in HARNESSES if agent != "terminus-2"])
def test_a_reply_cut_at_the_output_limit_keeps_the_verifiers_reward(
    harness: str, warm_tiny_stack: AgentStack, tmp_path: Path
) -> None:
    """A 4-token limit cuts the first reply. codex fails its turn on a Responses ``incomplete`` and exits 1, as
    it does against OpenAI: that is the model's spent budget (Harbor's ``OutputTokenExceededError``), so the
    verifier's reward stands and the rollout is scored, not dropped. The other CLIs end their run normally."""
    factory = _factory(warm_tiny_stack, tmp_path, harness, max_model_calls=1, max_output_tokens=4)
    session = _session(factory, tmp_path)
    try:
        session.wait_for_completion(180)
        trace = session.fetch_training_trace()
        verdict = session.verify()
    finally:
        session.close()
    assert len(trace.turns) == 1 and len(trace.turns[0].completion_token_ids) == 4
    error = session.result.exception_info
    if harness == "codex":
        assert error is not None and error.exception_type == "OutputTokenExceededError", error
    assert error is None or error.exception_type == "OutputTokenExceededError", error
    assert verdict.env_reward == UNSOLVED


@pytest.mark.timeout(240)
def test_an_agent_timeout_keeps_the_tokens_and_the_verifiers_reward(
    warm_tiny_stack: AgentStack, tmp_path: Path
) -> None:
    """terminus-2, which re-prompts the tiny model after every unparsable reply, stopped by the rollout's timeout."""
    factory = _factory(warm_tiny_stack, tmp_path, "terminus-2", max_model_calls=200, max_steps=200)
    task = make_task(tmp_path, "answer", test=VERIFIER, agent_timeout_s=300)
    mark = len(warm_tiny_stack.relay.served)
    outcome = run_rollout(factory, {"prompt": "x", "task_path": str(task)}, seed=0, timeout_s=15, sampling=SAMPLING)
    assert outcome.timed_out and outcome.error is None, outcome.error
    assert outcome.env_reward == UNSOLVED
    assert_trace_is_what_the_engine_served(outcome.training_trace, warm_tiny_stack.served_since(mark), exact=False)


@pytest.mark.timeout(240)
def test_a_session_closed_from_another_thread_ends_its_trial(warm_tiny_stack: AgentStack, tmp_path: Path) -> None:
    factory = _factory(warm_tiny_stack, tmp_path, "mini-swe-agent", max_model_calls=100, max_steps=100)
    session = _session(factory, tmp_path, agent_timeout_s=300)
    key = session.lease.key
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            session.wait_for_completion(300)
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 120
    while not session.fetch_training_trace().turns and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_holding(key), "the agent is not running"
    session.close()
    waiter.join(30)
    assert not waiter.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], HarborTrialError), errors
    assert _processes_holding(key) == []
    assert session.lease.key is None
    status, _ = warm_tiny_stack._call("GET", f"/sessions/{session.lease.session_id}")
    assert status == 404
    result = (session.config.trials_dir / session.config.trial_name / "result.json").read_text()
    assert '"exception_type": "CancelledError"' in result and '"finished_at": null' not in result
    session.close()  # twice is fine


@pytest.mark.timeout(120)
def test_a_trial_that_outlives_its_limit_says_where_it_waits(agent_stack: AgentStack, tmp_path: Path) -> None:
    """A verifier that sleeps keeps the trial running past its agent's timeout plus ``trial_grace_s``: the
    ``TimeoutError`` (and the log) name the coroutines it waits in, down to the sandbox's exec of the sleep."""
    factory = _factory(agent_stack, tmp_path, "mini-swe-agent", max_model_calls=1, trial_grace_s=5.0)
    task = make_task(tmp_path, "answer", test="#!/bin/bash\nsleep 60\n")
    session = factory.create_from_row({"prompt": "x", "task_path": str(task)}, seed=0, episode_id="outlives")
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"did not end within 10\.0 s; it waited at ") as raised:
            session.wait_for_completion(5)
    finally:
        session.close()
    waited = str(raised.value)
    assert "harbor/verifier/verifier.py" in waited and "harbor_local.py" in waited, waited
    assert time.monotonic() - started < 40


@pytest.mark.timeout(240)
def test_concurrent_sessions_capture_their_own_calls(warm_tiny_stack: AgentStack, tmp_path: Path) -> None:
    """Three opencode trials at once, each on its own event loop: every served call is in exactly one trace."""
    factory = _factory(warm_tiny_stack, tmp_path, "opencode", max_model_calls=2)
    task = make_task(tmp_path, "answer", test=VERIFIER)
    sessions = [
        factory.create_from_row({"prompt": "x", "task_path": str(task)}, seed=i, episode_id=f"concurrent-{i}")
        for i in range(3)
    ]
    mark = len(warm_tiny_stack.relay.served)
    try:
        with ThreadPoolExecutor(len(sessions)) as pool:
            exit_codes = list(pool.map(lambda session: session.wait_for_completion(180), sessions))
        traces = [session.fetch_training_trace() for session in sessions]
        rewards = [session.verify().env_reward for session in sessions]
    finally:
        for session in sessions:
            session.close()
    assert exit_codes == [0, 0, 0] and rewards == [UNSOLVED] * 3
    merged = TrainingTrace(turns=[turn for trace in traces for turn in trace.turns])
    assert all(trace.turns for trace in traces)
    assert_trace_is_what_the_engine_served(merged, warm_tiny_stack.served_since(mark))
