"""Asynchronous rollout production: groups of agent sessions in flight while the trainer trains.

Contract: ``RolloutProducer`` runs on an asyncio loop (the trainer's service
thread). It walks the dataset from ``start_position``, and for each row starts
a group of ``num_generations`` sessions (same task, same seed) as soon as a
slot is free, keeping at most ``max_concurrent_rollouts`` sessions in flight
and at most ``max_groups_ahead`` finished-but-unconsumed or running groups.
Each group is stamped with the policy version current when it started; the
consumer (``get``) receives complete groups in completion order.

One rollout (``run_rollout``, on a worker thread, blocking calls only):
create (``create_session``: the row's ``prompt``, or the whole row for a
trainer-bound factory) → wait (``TimeoutError``: ``timed_out``, tokens and
reward kept) → fetch trace → verify(completion) → close (always). A failure
to create, wait, fetch or verify makes the rollout unscorable (``error`` set,
reward None). A trace that breaks the capture contract (``CaptureContractError``,
a turn sampled under another policy included), a session missing a protocol
method (``SessionContractError``) and any error of the producer itself are
fatal: it stops and ``get`` raises ``ProducerError`` from it. ``stop`` closes
the sessions still running (their agents are killed), so no rollout outlives
the producer by more than its session's ``close``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness_grpo.outcomes import HarnessRolloutOutcome, final_messages, selected_turns, summarize_tools
from harness_grpo.service_loop import cancel_and_wait
from harness_grpo.session_protocol import TrainerBoundSessionFactory, check_session, fetch_trace
from proxy.capture_graph import AGENT
from proxy.trace import CaptureContractError, TrainingTrace, Violation

log = logging.getLogger(__name__)


class ProducerError(RuntimeError):
    """The rollout producer stopped on a fatal error (see ``__cause__``)."""


@dataclass
class RolloutGroup:
    """All rollouts of one dataset row."""

    group_id: str
    row_index: int
    row: dict[str, Any]
    policy_version: int
    started_at: float
    outcomes: list[HarnessRolloutOutcome] = field(default_factory=list)
    finished_at: float = 0.0


class LiveSessions:
    """The sessions of the rollouts in progress, so that another thread can close them all at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: set[Any] = set()
        self._closed = False

    def add(self, session: Any) -> bool:
        """Track ``session``; False once ``close_all`` ran (the caller must not run it)."""
        with self._lock:
            if not self._closed:
                self._sessions.add(session)
            return not self._closed

    def discard(self, session: Any) -> None:
        with self._lock:
            self._sessions.discard(session)

    def close_all(self) -> None:
        """Close every tracked session (killing its agent) and refuse new ones."""
        with self._lock:
            self._closed = True
            sessions, self._sessions = list(self._sessions), set()
        for session in sessions:
            try:
                session.close()
            except Exception as exc:
                log.warning("session close failed: %s", exc)


def create_session(factory: Any, row: Mapping[str, Any], *, seed: int, episode_id: str) -> Any:
    """A trainer-bound factory gets the whole row; any other factory the row's ``prompt`` (TRL's contract)."""
    if isinstance(factory, TrainerBoundSessionFactory):
        return factory.create_from_row(row, seed=seed, episode_id=episode_id)
    return factory.create(row["prompt"], seed=seed, episode_id=episode_id)


def check_sampling(trace: TrainingTrace, sampling: Mapping[str, Any]) -> None:
    """Raise ``CaptureContractError`` unless every trainable turn was sampled with ``sampling``
    (its ``metadata.sampling_params`` holds each of the policy's keys with the policy's value)."""
    for i, turn in enumerate(trace.turns):
        n_prompt = len(turn.prompt_token_ids)
        if not any(turn.loss_mask[n_prompt:]):
            continue
        captured = turn.metadata.get("sampling_params") or {}
        wrong = {key: captured.get(key) for key, value in sampling.items() if captured.get(key) != value}
        if wrong:
            raise CaptureContractError(
                [
                    Violation(
                        "sampling_policy_changed",
                        f"turns[{i}].metadata.sampling_params",
                        f"sampled with {wrong}, the trainer's policy is {dict(sampling)}",
                    )
                ]
            )


def run_rollout(
    factory: Any,
    row: Mapping[str, Any],
    *,
    seed: int,
    timeout_s: float,
    live: LiveSessions | None = None,
    roles: Container[str] = (AGENT,),
    sampling: Mapping[str, Any] | None = None,
) -> HarnessRolloutOutcome:
    """One session from create to close (see the module contract); tracked in ``live`` while it runs.

    ``roles`` selects the turns the outcome's ``trace``, ``completion`` and tool counts describe;
    ``sampling``, when given, is checked against every trainable turn (``check_sampling``).
    """
    episode_id = uuid.uuid4().hex
    try:
        session = create_session(factory, row, seed=seed, episode_id=episode_id)
    except Exception as exc:
        return _failed(f"create failed: {type(exc).__name__}: {exc}")
    try:
        check_session(session)
        if live is not None and not live.add(session):
            return _failed("the producer stopped")
        timed_out, exit_code = False, None
        try:
            exit_code = session.wait_for_completion(timeout_s)
        except TimeoutError:
            timed_out = True
        except Exception as exc:
            return _failed(f"wait failed: {type(exc).__name__}: {exc}")
        try:
            trace = fetch_trace(session)
        except CaptureContractError:
            raise
        except Exception as exc:
            return _failed(f"fetch failed: {type(exc).__name__}: {exc}", timed_out=timed_out)
        if sampling is not None:
            check_sampling(trace, sampling)
        turns = selected_turns(trace, roles)
        completion = final_messages(turns)
        entries = trace.to_trace_entries(turns)
        try:
            verdict = session.verify(completion)
        except Exception as exc:
            return _failed(
                f"verify failed: {type(exc).__name__}: {exc}",
                completion=completion,
                trace=entries,
                training_trace=trace,
                timed_out=timed_out,
            )
        calls, failures, by_name = summarize_tools(turns)
        report = getattr(session, "tool_report", None)
        if report is not None and report.calls is not None:  # the built-in tool loop knows which calls ran
            calls, by_name = sum(report.calls.values()), dict(report.calls)
        if report is not None and report.failures is not None:  # a white-box loop knows which calls failed
            failures = report.failures
        env_reward = verdict.env_reward
        return HarnessRolloutOutcome(
            env_reward=None if env_reward is None else float(env_reward),
            completion=completion,
            trace=entries,
            tool_call_count=calls,
            tool_failure_count=failures,
            tool_calls_by_name=by_name,
            timed_out=timed_out,
            training_trace=trace,
            exit_code=exit_code,
            metrics=dict(getattr(verdict, "metrics", None) or {}),
            tool_latency_s=list(report.latency_s) if report is not None else [],
            extra_fields=dict(getattr(session, "extra_fields", None) or {}),  # a rollout_func's output
            episode=getattr(session, "tool_loop_episode", None),
        )
    finally:
        if live is not None:
            live.discard(session)
        try:
            session.close()
        except Exception as exc:  # a failed close must not hide the rollout's outcome
            log.warning("session close failed: %s", exc)


def _failed(error: str, **known: Any) -> HarnessRolloutOutcome:
    """An unscorable outcome (reward None) carrying whatever was known when it failed."""
    return HarnessRolloutOutcome(None, known.pop("completion", []), known.pop("trace", []), error=error, **known)


class RolloutProducer:
    """Keeps groups of sessions in flight on an event loop; see the module contract."""

    def __init__(
        self,
        factory: Any,
        dataset: Sequence[dict[str, Any]],
        *,
        num_generations: int,
        max_concurrent_rollouts: int,
        max_groups_ahead: int,
        rollout_timeout_s: float,
        policy_version: Callable[[], int],
        start_position: int = 0,
        seed: int = 0,
        roles: Container[str] = (AGENT,),
        sampling: Mapping[str, Any] | None = None,
    ) -> None:
        if len(dataset) == 0:
            raise ValueError("the training dataset is empty")
        self.factory = factory
        self.dataset = dataset
        self.num_generations = num_generations
        self.max_concurrent_rollouts = max_concurrent_rollouts
        self.max_groups_ahead = max_groups_ahead
        self.rollout_timeout_s = rollout_timeout_s
        self.policy_version = policy_version
        self.position = start_position
        self.seed = seed
        self.roles = roles
        self.sampling = sampling
        self._done: queue.Queue[RolloutGroup] = queue.Queue()
        self._pending_groups = 0  # running or finished and not yet consumed
        self._pending_lock = threading.Lock()
        self._error: BaseException | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_concurrent_rollouts, thread_name_prefix="rollout")
        self._stopping = False
        self.dropped_stale = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()  # the producing task and its group runners, on the loop
        self._live = LiveSessions()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin producing on ``loop`` (which runs on another thread)."""
        self._loop = loop
        asyncio.run_coroutine_threadsafe(self._produce(), loop).add_done_callback(self._produce_ended)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Start no new sessions, close the running ones (their outcomes are discarded) and cancel the
        loop's tasks, waiting up to ``timeout_s`` for them and for the worker threads to end."""
        self._stopping = True
        self._live.close_all()
        if self._loop is not None and self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._cancel_tasks(), self._loop).result(timeout_s)
            except TimeoutError:
                log.warning("rollout tasks did not end within %s s of the stop", timeout_s)
        shutdown = threading.Thread(target=self._executor.shutdown, kwargs={"cancel_futures": True}, daemon=True)
        shutdown.start()
        shutdown.join(timeout_s)
        if shutdown.is_alive():
            log.warning("rollout worker threads still running %s s after the stop", timeout_s)

    def _produce_ended(self, future: concurrent.futures.Future) -> None:
        if not future.cancelled() and future.exception() is not None and self._error is None:
            self._error = future.exception()
            self._stopping = True

    async def _cancel_tasks(self) -> None:
        await cancel_and_wait(list(self._tasks))  # the set is read here, on the loop that changes it

    def _track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def get(self, timeout_s: float) -> RolloutGroup:
        """The next complete group; raises ``ProducerError`` if production failed, ``TimeoutError`` if none came."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._error is not None:
                raise ProducerError(f"rollout production stopped: {self._error}") from self._error
            try:
                group = self._done.get(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"no rollout group finished within {timeout_s} s") from None
                continue
            with self._pending_lock:
                self._pending_groups -= 1
            return group

    def take(self, n: int, *, current_version: int, max_staleness: int, timeout_s: float) -> list[RolloutGroup]:
        """``n`` fresh groups, dropping (and counting in ``dropped_stale``) any whose policy version is more
        than ``max_staleness`` behind ``current_version``; queue time counts, since the version is the one
        stamped when the group started."""
        groups: list[RolloutGroup] = []
        while len(groups) < n:
            group = self.get(timeout_s)
            if current_version - group.policy_version > max_staleness:
                self.dropped_stale += 1
                continue
            groups.append(group)
        return groups

    async def _produce(self) -> None:
        self._track(asyncio.current_task())
        slots = asyncio.Semaphore(self.max_concurrent_rollouts)
        while not self._stopping:
            while self._pending_groups >= self.max_groups_ahead and not self._stopping:
                await asyncio.sleep(0.02)
            if self._stopping:
                break
            row_index = self.position
            self.position += 1
            row = dict(self.dataset[row_index % len(self.dataset)])
            group = RolloutGroup(
                group_id=f"g{row_index}",
                row_index=row_index,
                row=row,
                policy_version=self.policy_version(),
                started_at=time.monotonic(),
            )
            with self._pending_lock:
                self._pending_groups += 1
            self._track(asyncio.ensure_future(self._run_group(group, slots)))
            await asyncio.sleep(0)

    async def _run_group(self, group: RolloutGroup, slots: asyncio.Semaphore) -> None:
        loop = asyncio.get_running_loop()
        seed = self.seed * 1_000_003 + group.row_index

        async def one() -> HarnessRolloutOutcome:
            async with slots:
                return await loop.run_in_executor(
                    self._executor,
                    lambda: run_rollout(
                        self.factory,
                        group.row,
                        seed=seed,
                        timeout_s=self.rollout_timeout_s,
                        live=self._live,
                        roles=self.roles,
                        sampling=self.sampling,
                    ),
                )

        try:
            group.outcomes = list(await asyncio.gather(*(one() for _ in range(self.num_generations))))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # CaptureContractError or a bug: fatal for training
            self._error = exc
            self._stopping = True
            return
        group.finished_at = time.monotonic()
        self._done.put(group)
