"""White-box rollouts: the trainer owns the tool loop, and talks to the model through the capture proxy.

A ``harness_adapter`` turns any session factory into a white-box one. For each rollout the user's
factory still creates the session (the task's environment and its verifier, from the row's
``prompt``); instead of waiting for an agent, ``WhiteBoxSession.wait_for_completion`` runs
``adapter.run_white_box(model_step, session, limits)``, where ``model_step(messages, tools)`` is one
chat completion through the proxy under this rollout's own session key, rendered with the run's
``chat_template_kwargs``. The trace therefore comes from the same capture path as a loop-owning
agent's, and rows, loss and metrics need nothing else. The adapter executes tools however it likes
(an environment class, a sandbox); a failed tool is a tool message saying so. ``ProxySession`` is the
part shared with the built-in tool loop (``harness_grpo.tool_loop``).

Limits: ``HarnessRunLimits.max_turns`` model calls at most (also the proxy's call budget), and the
rollout timeout: ``model_step`` raises ``TimeoutError`` once it has passed, which the trainer counts
as a timed-out rollout that keeps its tokens and reward.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from harness_grpo.proxy_chat import post_chat_completion
from harness_grpo.rollout_context import BoundSessionFactory, RolloutContext
from harness_grpo.rollouts import create_session
from harness_grpo.session_protocol import TrainerBoundSessionFactory, VerifyResult
from proxy.trace import TrainingTrace

ModelStep = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], dict[str, Any]]
"""``model_step(messages, tools)`` -> the assistant message (``content``, ``tool_calls``) of one call."""


@dataclass(frozen=True)
class HarnessRunLimits:
    """What a white-box loop may spend: model calls, and the sampling policy the session pins."""

    max_turns: int = 8
    sampling: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class HarnessAdapter(Protocol):
    """Runs the tool loop of one rollout; returns when the episode is over."""

    def run_white_box(self, model_step: ModelStep, session: Any, limits: HarnessRunLimits) -> None: ...


@dataclass
class ToolReport:
    """What a white-box loop knows about its tool calls: which ran, how many failed, and seconds per call.

    Calls: the calls that ran, per tool name (the built-in tool loop's; None: the calls in the trace
    count, including any in a last reply that never ran). Failures: the calls the harness reported as
    failed (a ``tool_trace`` entry whose ``result.error`` is set, when ``run_white_box`` returns such a
    trace; else TRL's keyword rule on the last request applies). Latency: the time between a model reply
    and the next model request, split evenly over that reply's tool calls (the last reply is unmeasured).
    """

    calls: Counter[str] | None = None
    failures: int | None = None
    latency_s: list[tuple[str, float]] = field(default_factory=list)


class ProxySession:
    """A rollout whose model calls the trainer makes itself, through the capture proxy under the rollout's own key.

    The shared part of the trainer's own loops (``WhiteBoxSession``, ``harness_grpo.tool_loop``):
    one proxy session (``lease``) per rollout, the rollout's deadline, the trace, the release on close.
    """

    def __init__(self, context: RolloutContext, metadata: dict[str, Any], *, max_model_calls: int | None) -> None:
        self._context = context
        self.lease = context.lease(metadata, max_model_calls=max_model_calls)
        self._deadline: float | None = None
        self.tool_report = ToolReport()

    def start_clock(self, timeout_s: float | None) -> None:
        """The rollout's time starts: ``chat_completion`` raises ``TimeoutError`` ``timeout_s`` from now."""
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` (``model`` filled in) to the proxy's chat route as this rollout; the whole reply.

        Raises ``TimeoutError`` once the rollout's time is up, ``ModelCallError`` when the call fails.
        """
        assert self.lease.key is not None, "the session was closed"
        body = {"model": self._context.model_name, **body}
        return post_chat_completion(f"{self._context.proxy.base_url}/v1", self.lease.key, body, self._deadline)

    def fetch_training_trace(self) -> TrainingTrace:
        return self.lease.trace()

    def close(self) -> None:
        self.lease.release()


class WhiteBoxSession(ProxySession):
    """One white-box rollout: the user's session plus a proxy session that records the model calls."""

    def __init__(
        self, factory: WhiteBoxSessionFactory, inner: Any, context: RolloutContext, *, seed: int, episode_id: str
    ) -> None:
        super().__init__(
            context,
            {"episode_id": episode_id, "seed": seed, "mode": "white-box"},
            max_model_calls=factory.limits.max_turns,
        )
        self.inner = inner
        self._factory = factory
        self._last_reply: tuple[float, list[str]] | None = None  # when the last reply came, its tool names

    def model_step(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """One chat completion through the proxy as this rollout's session; the assistant message."""
        now = time.monotonic()
        if self._last_reply is not None and self._last_reply[1]:
            replied_at, names = self._last_reply
            share = (now - replied_at) / len(names)
            self.tool_report.latency_s += [(name, share) for name in names]
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        if self._factory.chat_template_kwargs:
            body["chat_template_kwargs"] = self._factory.chat_template_kwargs
        message = self.chat_completion(body)["choices"][0]["message"]
        names = [(c.get("function") or {}).get("name", "") for c in message.get("tool_calls") or []]
        self._last_reply = (time.monotonic(), names)
        return message

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        self.start_clock(timeout_s)
        result = self._factory.adapter.run_white_box(self.model_step, self.inner, self._factory.limits)
        tool_trace = getattr(result, "tool_trace", None)
        if tool_trace is not None:
            self.tool_report.failures = sum(getattr(e.result, "error", None) is not None for e in tool_trace)
        return 0

    def verify(self, transcript: Any = None, final_state: Any = None) -> VerifyResult:
        return self.inner.verify(transcript, final_state)

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            super().close()


class WhiteBoxSessionFactory(BoundSessionFactory):
    """Wraps the user's factory (built by the trainer like any other) so that ``adapter`` runs each rollout.

    A ``TrainerBoundSessionFactory``: the trainer binds it to its proxy; the user's factory creates
    the environment session (from the row's prompt, or the whole row if it is trainer-bound too).
    """

    def __init__(
        self,
        inner: Any,
        adapter: HarnessAdapter,
        *,
        max_turns: int,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(adapter, HarnessAdapter):
            raise TypeError(f"{type(adapter).__name__} has no run_white_box(model_step, session, limits)")
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        self.inner = inner
        self.adapter = adapter
        self.max_turns = max_turns
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.limits = HarnessRunLimits(max_turns=max_turns)

    def bind_rollout(self, context: RolloutContext) -> None:
        super().bind_rollout(context)
        self.limits = HarnessRunLimits(max_turns=self.max_turns, sampling=dict(context.sampling))
        if isinstance(self.inner, TrainerBoundSessionFactory):
            self.inner.bind_rollout(context)

    def create_from_row(self, row: Mapping[str, Any], *, seed: int, episode_id: str) -> WhiteBoxSession:
        context = self.bound_context()
        inner = create_session(self.inner, row, seed=seed, episode_id=episode_id)
        try:
            return WhiteBoxSession(self, inner, context, seed=seed, episode_id=episode_id)
        except BaseException:
            inner.close()
            raise
