"""Rollout semantics (timeouts, unscorable failures, fatal contract errors) and the staleness filter."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest

from harness_grpo.outcomes import summarize_tools
from harness_grpo.rollouts import ProducerError, RolloutGroup, RolloutProducer, run_rollout
from harness_grpo.service_loop import ServiceLoop
from harness_grpo.session_protocol import SessionContractError, VerifyResult
from harness_grpo.white_box import ToolReport
from proxy.capture_graph import CaptureGraph
from proxy.trace import CaptureContractError, TrainingTrace
from tests.support.wait import until_blocking

ROW = {"prompt": [{"role": "user", "content": "fix it"}], "task_index": 3}


def _trace() -> TrainingTrace:
    graph = CaptureGraph()
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    graph.add_call(
        [1, 2],
        [3, 4],
        [-0.1, -0.2],
        {"messages": [], "tools": [{"x": 1}]},
        {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]},
    )
    request = {
        "messages": [
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "Traceback: boom"},
        ],
        "tools": [{"x": 1}],
    }
    graph.add_call(
        [1, 2, 3, 4, 5], [6], [-0.3], request, {"choices": [{"message": {"role": "assistant", "content": "done"}}]}
    )
    return graph.to_training_trace()


class Session:
    def __init__(self, *, wait: Any = 0, fetch: Any = None, verify: Any = 1.0) -> None:
        self._wait, self._fetch, self._verify = wait, fetch, verify
        self.closed = False

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        if isinstance(self._wait, BaseException):
            raise self._wait
        return self._wait

    def fetch_training_trace(self) -> TrainingTrace:
        if isinstance(self._fetch, BaseException):
            raise self._fetch
        return self._fetch or _trace()

    def verify(self, transcript: Any = None, final_state: Any = None) -> VerifyResult:
        self.transcript = transcript
        if isinstance(self._verify, BaseException):
            raise self._verify
        return VerifyResult(self._verify)

    def close(self) -> None:
        self.closed = True


class Factory:
    """A third-party factory: ``create(prompt, seed=None, episode_id=None)`` only."""

    def __init__(self, session: Session | Exception) -> None:
        self.session = session
        self.prompts: list[Any] = []

    def create(self, prompt: Any, seed: int | None = None, episode_id: str | None = None) -> Session:
        self.prompts.append(prompt)
        if isinstance(self.session, Exception):
            raise self.session
        return self.session


def test_successful_rollout_gives_the_documented_outcome() -> None:
    session, factory = Session(), Factory(Session())
    factory.session = session
    outcome = run_rollout(factory, ROW, seed=0, timeout_s=1)
    assert factory.prompts == [ROW["prompt"]]  # the row's prompt, not the row
    assert outcome.env_reward == 1.0 and outcome.error is None and not outcome.timed_out
    # completion: the final message history (the last request's messages + the reply), handed to verify
    assert outcome.completion[-1] == {"role": "assistant", "content": "done"}
    assert outcome.completion[:-1] == outcome.training_trace.turns[-1].request["messages"]
    assert session.transcript == outcome.completion
    # trace: TraceEntry dicts of the selected turns, node_id in metadata
    assert [e["metadata"]["node_id"] for e in outcome.trace] == [t.node_id for t in outcome.training_trace.turns]
    assert TrainingTrace.from_entries(outcome.trace) == outcome.training_trace
    assert (outcome.tool_call_count, outcome.tool_failure_count, outcome.tool_calls_by_name) == (1, 1, {"bash": 1})
    assert session.closed


def test_trace_selects_the_trained_roles_zero_masked_turns_included() -> None:
    graph = CaptureGraph()
    tools = {"messages": [], "tools": [{"x": 1}]}
    graph.add_call([1, 2], [3], None, tools, {"choices": []})  # no logprobs: an all-zero completion mask
    graph.add_call([1, 2, 3, 4], [5], [-0.5], tools, {"choices": []})
    graph.add_call([9], [8], [-0.1], {"messages": [], "tools": []}, {"choices": []})  # toolless: auxiliary
    trace = graph.to_training_trace()
    outcome = run_rollout(Factory(Session(fetch=trace)), ROW, seed=0, timeout_s=1)
    assert [e["prompt_token_ids"] for e in outcome.trace] == [[1, 2], [1, 2, 3, 4]]
    assert outcome.trace[0]["loss_mask"] == [0, 0, 0]
    auxiliary = run_rollout(Factory(Session(fetch=trace)), ROW, seed=0, timeout_s=1, roles=("auxiliary",))
    assert [e["prompt_token_ids"] for e in auxiliary.trace] == [[9]]


def test_a_legacy_session_with_only_fetch_proxy_trace_is_read_exactly() -> None:
    source = _trace()
    entries = source.to_trace_entries()

    class Legacy:
        def wait_for_completion(self, timeout_s: float | None = None) -> int:
            return 0

        def fetch_proxy_trace(self) -> list[dict[str, Any]]:
            return entries

        def verify(self, transcript: Any, final_state: Any = None) -> VerifyResult:
            return VerifyResult(0.25)

        def close(self) -> None:
            pass

    outcome = run_rollout(Factory(Legacy()), ROW, seed=0, timeout_s=1)
    assert outcome.error is None and outcome.env_reward == 0.25
    assert outcome.training_trace == source


def test_a_session_missing_protocol_methods_is_fatal_and_named() -> None:
    class Incomplete:
        def wait_for_completion(self, timeout_s: float | None = None) -> int:
            return 0

        def close(self) -> None:
            self.closed = True

    session = Incomplete()
    with pytest.raises(SessionContractError, match="missing verify, fetch_training_trace"):
        run_rollout(Factory(session), ROW, seed=0, timeout_s=1)
    assert session.closed


def test_a_turn_sampled_under_another_policy_is_fatal() -> None:
    graph = CaptureGraph()
    graph.add_call([1], [2], [-0.1], {}, {}, metadata={"sampling_params": {"temperature": 0.7}})
    session = Session(fetch=graph.to_training_trace())
    with pytest.raises(CaptureContractError, match="sampling_policy_changed"):
        run_rollout(Factory(session), ROW, seed=0, timeout_s=1, sampling={"temperature": 1.0})
    ok = run_rollout(
        Factory(Session(fetch=graph.to_training_trace())), ROW, seed=0, timeout_s=1, sampling={"temperature": 0.7}
    )
    assert ok.error is None


def test_timeout_keeps_tokens_and_verifier_reward() -> None:
    session = Session(wait=TimeoutError("slow"), verify=0.5)
    outcome = run_rollout(Factory(session), ROW, seed=0, timeout_s=1)
    assert outcome.timed_out and outcome.env_reward == 0.5 and outcome.trace and outcome.error is None
    assert session.closed


@pytest.mark.parametrize(
    ("factory_session", "stage"),
    [
        (ConnectionError("no sandbox"), "create"),
        (Session(wait=OSError("killed")), "wait"),
        (Session(fetch=ConnectionError("proxy down")), "fetch"),
        (Session(verify=RuntimeError("verifier crashed")), "verify"),
    ],
)
def test_transport_failures_are_unscorable(factory_session: Any, stage: str) -> None:
    outcome = run_rollout(Factory(factory_session), ROW, seed=0, timeout_s=1)
    assert outcome.env_reward is None and outcome.error is not None and outcome.error.startswith(stage)
    if isinstance(factory_session, Session):
        assert factory_session.closed


def test_contract_violation_is_fatal_and_still_closes() -> None:
    session = Session(fetch=CaptureContractError([]))
    with pytest.raises(CaptureContractError):
        run_rollout(Factory(session), ROW, seed=0, timeout_s=1)
    assert session.closed


def test_a_loop_that_reports_the_calls_it_ran_is_counted_by_them_not_by_the_trace() -> None:
    session = Session()  # its trace holds one bash call, which failed
    session.tool_report = ToolReport(calls=Counter(), failures=0)  # a last reply's call that never ran
    outcome = run_rollout(Factory(session), ROW, seed=0, timeout_s=1)
    assert (outcome.tool_call_count, outcome.tool_failure_count, outcome.tool_calls_by_name) == (0, 0, {})
    session = Session()
    session.tool_report = ToolReport(calls=Counter(read=2, bash=1), failures=1)
    outcome = run_rollout(Factory(session), ROW, seed=0, timeout_s=1)
    assert (outcome.tool_call_count, outcome.tool_failure_count) == (3, 1)
    assert outcome.tool_calls_by_name == {"read": 2, "bash": 1}


def test_summarize_tools_reads_the_last_request() -> None:
    assert summarize_tools(_trace().turns) == (1, 1, {"bash": 1})


def _producer(factory: Any, **kw: Any) -> RolloutProducer:
    defaults = dict(num_generations=3, max_concurrent_rollouts=4, max_groups_ahead=2, rollout_timeout_s=5)
    return RolloutProducer(factory, [{"prompt": "a"}, {"prompt": "b"}], policy_version=lambda: 0, **{**defaults, **kw})


def test_take_drops_stale_groups_counting_them() -> None:
    producer = _producer(Factory(Session()))
    for version in (0, 3, 1, 4):
        producer._done.put(RolloutGroup(f"g{version}", version, {}, version, 0.0))
    groups = producer.take(2, current_version=5, max_staleness=2, timeout_s=1)
    assert [g.policy_version for g in groups] == [3, 4]
    assert producer.dropped_stale == 2


def test_producer_runs_groups_and_bounds_concurrency() -> None:
    """The first four sessions meet at a barrier (so four run at once, or the barrier breaks), and
    no fifth is ever in flight beside them (the peak is counted under a lock)."""
    lock, live, peak, started = threading.Lock(), [0], [0], [0]
    first_four = threading.Barrier(4, timeout=20)

    class Slow(Session):
        def wait_for_completion(self, timeout_s: float | None = None) -> int:
            with lock:
                live[0] += 1
                peak[0] = max(peak[0], live[0])
                started[0] += 1
                meets = started[0] <= 4
            if meets:
                first_four.wait()  # BrokenBarrierError (-> wait failed, reward None) unless 4 run at once
            with lock:
                live[0] -= 1
            return 0

    class SlowFactory:
        def create(self, prompt: Any, seed: int | None = None, episode_id: str | None = None) -> Session:
            return Slow()

    services = ServiceLoop()
    producer = _producer(SlowFactory())
    producer.start(services.loop)
    try:
        groups = producer.take(4, current_version=0, max_staleness=0, timeout_s=20)
    finally:
        producer.stop()
        services.close()
    assert all(len(g.outcomes) == 3 and all(o.env_reward == 1.0 for o in g.outcomes) for g in groups)
    assert sorted(g.row["prompt"] for g in groups) == ["a", "a", "b", "b"]
    assert peak[0] == 4


def test_producer_surfaces_fatal_errors() -> None:
    services = ServiceLoop()
    producer = _producer(Factory(Session(fetch=CaptureContractError([]))))
    producer.start(services.loop)
    try:
        with pytest.raises(ProducerError):
            producer.take(1, current_version=0, max_staleness=0, timeout_s=10)
    finally:
        producer.stop()
        services.close()


def test_stop_closes_running_sessions_and_waits_for_their_threads(caplog: pytest.LogCaptureFixture) -> None:
    """An agent that would run for minutes is closed (killed) by ``stop``; no worker thread or loop task
    outlives it."""
    sessions: list[Session] = []

    class Endless(Session):
        def __init__(self) -> None:
            super().__init__()
            self.killed = threading.Event()

        def wait_for_completion(self, timeout_s: float | None = None) -> int:
            self.killed.wait(120)
            return -9

        def close(self) -> None:
            self.killed.set()
            super().close()

    class EndlessFactory:
        def create(self, prompt: Any, seed: int | None = None, episode_id: str | None = None) -> Session:
            sessions.append(Endless())
            return sessions[-1]

    async def pending_tasks() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    before = set(threading.enumerate())
    services = ServiceLoop()
    producer = _producer(EndlessFactory(), rollout_timeout_s=120)
    producer.start(services.loop)
    try:
        until_blocking(lambda: len(sessions) >= 4, "max_concurrent_rollouts sessions running", timeout_s=10)
        in_flight = services.run(pending_tasks(), 5)
        assert len(in_flight) >= 2  # the producing task and the running groups
        producer.stop(timeout_s=60)
        # Neither the loop's tasks nor the worker threads needed the stop's timeout (it logs when they do).
        assert not [r for r in caplog.records if "did not end" in r.message or "still running" in r.message]
        assert all(s.closed for s in sessions)
        assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("rollout")]
        # Cancelled and awaited on the loop, not left pending when the loop stops.
        assert services.run(pending_tasks(), 5) == []
        assert all(task.done() for task in in_flight)
    finally:
        services.close()


def test_an_error_of_the_producer_itself_reaches_the_consumer() -> None:
    services = ServiceLoop()
    producer = RolloutProducer(
        Factory(Session()),
        ["not a mapping"],  # dict(row) fails inside the producing task
        num_generations=2,
        max_concurrent_rollouts=2,
        max_groups_ahead=1,
        rollout_timeout_s=5,
        policy_version=lambda: 0,
    )
    producer.start(services.loop)
    try:
        with pytest.raises(ProducerError, match="dictionary update sequence"):
            producer.take(1, current_version=0, max_staleness=0, timeout_s=10)
    finally:
        producer.stop()
        services.close()
