"""Rollout semantics (timeouts, unscorable failures, fatal contract errors) and the staleness filter."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from harness_grpo.rollouts import ProducerError, RolloutGroup, RolloutProducer, run_rollout
from harness_grpo.session_protocol import VerifyResult, summarize_tools
from proxy.capture_graph import CaptureGraph
from proxy.trace import CaptureContractError, TrainingTrace


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

    def verify(self, transcript: str | None = None, final_state: Any = None) -> VerifyResult:
        if isinstance(self._verify, BaseException):
            raise self._verify
        return VerifyResult(self._verify)

    def close(self) -> None:
        self.closed = True


class Factory:
    def __init__(self, session: Session | Exception) -> None:
        self.session = session

    def create(self, task: dict, *, seed: int, episode_id: str) -> Session:
        if isinstance(self.session, Exception):
            raise self.session
        return self.session


def test_successful_rollout_counts_tools_and_failures() -> None:
    session = Session()
    outcome = run_rollout(Factory(session), {}, seed=0, timeout_s=1)
    assert outcome.env_reward == 1.0 and outcome.error is None and not outcome.timed_out
    assert outcome.completion == "done"
    assert (outcome.tool_call_count, outcome.tool_failure_count, outcome.tool_calls_by_name) == (1, 1, {"bash": 1})
    assert session.closed


def test_timeout_keeps_tokens_and_verifier_reward() -> None:
    session = Session(wait=TimeoutError("slow"), verify=0.5)
    outcome = run_rollout(Factory(session), {}, seed=0, timeout_s=1)
    assert outcome.timed_out and outcome.env_reward == 0.5 and outcome.trace is not None and outcome.error is None
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
    outcome = run_rollout(Factory(factory_session), {}, seed=0, timeout_s=1)
    assert outcome.env_reward is None and outcome.error is not None and outcome.error.startswith(stage)
    if isinstance(factory_session, Session):
        assert factory_session.closed


def test_contract_violation_is_fatal_and_still_closes() -> None:
    session = Session(fetch=CaptureContractError([]))
    with pytest.raises(CaptureContractError):
        run_rollout(Factory(session), {}, seed=0, timeout_s=1)
    assert session.closed


def test_summarize_tools_reads_the_last_request() -> None:
    assert summarize_tools(_trace()) == (1, 1, {"bash": 1})


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
    lock, live, peak = threading.Lock(), [0], [0]

    class Slow(Session):
        def wait_for_completion(self, timeout_s: float | None = None) -> int:
            with lock:
                live[0] += 1
                peak[0] = max(peak[0], live[0])
            time.sleep(0.05)
            with lock:
                live[0] -= 1
            return 0

    class SlowFactory:
        def create(self, task: dict, *, seed: int, episode_id: str) -> Session:
            return Slow()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    producer = _producer(SlowFactory())
    producer.start(loop)
    try:
        groups = producer.take(4, current_version=0, max_staleness=0, timeout_s=20)
    finally:
        producer.stop()
        loop.call_soon_threadsafe(loop.stop)
    assert all(len(g.outcomes) == 3 and all(o.env_reward == 1.0 for o in g.outcomes) for g in groups)
    assert sorted(g.task["prompt"] for g in groups) == ["a", "a", "b", "b"]
    assert peak[0] <= 4


def test_producer_surfaces_fatal_errors() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    producer = _producer(Factory(Session(fetch=CaptureContractError([]))))
    producer.start(loop)
    try:
        with pytest.raises(ProducerError):
            producer.take(1, current_version=0, max_staleness=0, timeout_s=10)
    finally:
        producer.stop()
        loop.call_soon_threadsafe(loop.stop)


def _loop_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return loop, thread


def test_stop_closes_running_sessions_and_waits_for_their_threads() -> None:
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
        def create(self, task: dict, *, seed: int, episode_id: str) -> Session:
            sessions.append(Endless())
            return sessions[-1]

    async def pending_tasks() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    before = set(threading.enumerate())
    loop, thread = _loop_thread()
    producer = _producer(EndlessFactory(), rollout_timeout_s=120)
    producer.start(loop)
    try:
        deadline = time.monotonic() + 10
        while len(sessions) < 4:  # max_concurrent_rollouts sessions running
            assert time.monotonic() < deadline
            time.sleep(0.01)
        in_flight = asyncio.run_coroutine_threadsafe(pending_tasks(), loop).result(5)
        assert len(in_flight) >= 2  # the producing task and the running groups
        started = time.monotonic()
        producer.stop(timeout_s=10)
        assert time.monotonic() - started < 5
        assert all(s.closed for s in sessions)
        assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("rollout")]
        # Cancelled and awaited on the loop, not left pending when the loop stops.
        assert asyncio.run_coroutine_threadsafe(pending_tasks(), loop).result(5) == []
        assert all(task.done() for task in in_flight)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    loop.close()


def test_an_error_of_the_producer_itself_reaches_the_consumer() -> None:
    loop, thread = _loop_thread()
    producer = RolloutProducer(
        Factory(Session()),
        ["not a mapping"],  # dict(row) fails inside the producing task
        num_generations=2,
        max_concurrent_rollouts=2,
        max_groups_ahead=1,
        rollout_timeout_s=5,
        policy_version=lambda: 0,
    )
    producer.start(loop)
    try:
        with pytest.raises(ProducerError, match="dictionary update sequence"):
            producer.take(1, current_version=0, max_staleness=0, timeout_s=10)
    finally:
        producer.stop()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    loop.close()
