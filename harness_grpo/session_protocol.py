"""The session protocol between the trainer and whatever runs an agent, and its outcome.

A session factory is built by the trainer from a user callable with the
trainer's sampling policy and proxy, so sampling settings can't diverge:
``harness_session_factory(sampling=..., proxy=ProxyEndpoint(...))`` returns an
object with ``create(task: dict, *, seed: int, episode_id: str) -> HarnessSession``.
A session runs one agent on one task; the trainer always calls ``close()``.

Semantics the trainer applies (REFERENCE §3.3): ``TimeoutError`` from
``wait_for_completion`` marks the rollout ``timed_out`` and keeps its tokens
and verifier reward; any other failure to create, wait, fetch or verify makes
it unscorable (reward None); a trace that breaks the capture contract raises
``CaptureContractError`` and aborts training.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from proxy.client import ProxyAdminClient, ProxyClientError
from proxy.trace import TrainingTrace


@dataclass(frozen=True)
class ProxyEndpoint:
    """Where agents reach the capture proxy and how the trainer controls it."""

    base_url: str  # http://host:port (agents append /v1 or the dialect's path)
    admin_key: str


class ProxySessionLease:
    """One rollout's train session on the proxy: created with the trainer's sampling policy and budget.

    ``key`` is what the model client sends as its API key; ``trace()`` is everything captured under
    it; ``release()`` deletes the session and never raises (closing must not mask the rollout's outcome).
    """

    def __init__(
        self,
        admin: ProxyAdminClient,
        *,
        sampling: dict[str, Any],
        max_model_calls: int | None,
        max_output_tokens: int | None,
        metadata: dict[str, Any],
    ) -> None:
        self._admin = admin
        self.key: str | None = admin.create_session(
            purpose="train",
            sampling=sampling,
            max_model_calls=max_model_calls,
            max_output_tokens=max_output_tokens,
            metadata=metadata,
        )

    def trace(self) -> TrainingTrace:
        assert self.key is not None, "the session was released"
        return self._admin.trace(self.key)

    def release(self) -> None:
        if self.key is not None:
            with contextlib.suppress(ProxyClientError):
                self._admin.delete(self.key)
            self.key = None


@dataclass
class VerifyResult:
    """The task verifier's verdict; ``env_reward`` None means it could not score."""

    env_reward: float | None
    done: bool = True
    metrics: dict[str, float] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class HarnessSession(Protocol):
    """One agent run on one task."""

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """Block until the agent ends; its exit status. Raises ``TimeoutError`` past ``timeout_s``."""
        ...

    def fetch_training_trace(self) -> TrainingTrace:
        """Everything the proxy captured for this session."""
        ...

    def verify(self, transcript: str | None = None, final_state: Any = None) -> VerifyResult:
        """Score the task's end state with its own verifier (never the agent's word)."""
        ...

    def close(self) -> None:
        """Release the sandbox and the proxy session; idempotent."""
        ...


@dataclass
class HarnessRolloutOutcome:
    """Everything known about one finished rollout; what ``rollout_reward_fn`` receives."""

    env_reward: float | None
    completion: str
    trace: TrainingTrace | None
    tool_call_count: int = 0
    tool_failure_count: int = 0
    tool_calls_by_name: dict[str, int] = field(default_factory=dict)
    timed_out: bool = False
    error: str | None = None  # why the rollout is unscorable, if it is
    exit_code: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)


FAILURE_WORDS = ("error", "failed", "traceback", "exception")


def summarize_tools(trace: TrainingTrace) -> tuple[int, int, dict[str, int]]:
    """``(calls, failures, calls by name)`` from a loop-owning trace.

    Calls are the tool calls the model made (``message.tool_calls`` of every
    turn). Failures follow TRL's loop-owning rule: tool messages in the *last*
    request that mention error/failed/traceback/exception, deduplicated by
    ``(name, content[:200])``, names resolved through ``tool_call_id``.
    """
    by_name: Counter[str] = Counter()
    for turn in trace.turns:
        for choice in turn.response.get("choices", []):
            for call in (choice.get("message") or {}).get("tool_calls") or []:
                by_name[(call.get("function") or {}).get("name", "")] += 1
    failures: set[tuple[str, str]] = set()
    if trace.turns:
        last = max(trace.turns, key=lambda t: t.metadata.get("index", 0))
        messages = last.request.get("messages") or []
        names = {
            call.get("id"): (call.get("function") or {}).get("name", "")
            for m in messages
            if m.get("role") == "assistant"
            for call in m.get("tool_calls") or []
        }
        for m in messages:
            content = m.get("content")
            if m.get("role") == "tool" and isinstance(content, str):
                lowered = content.lower()
                if any(word in lowered for word in FAILURE_WORDS):
                    failures.add((names.get(m.get("tool_call_id"), ""), content[:200]))
    return sum(by_name.values()), len(failures), dict(by_name)


def last_completion(trace: TrainingTrace) -> str:
    """The text of the last assistant reply in arrival order ('' if none)."""
    if not trace.turns:
        return ""
    last = max(trace.turns, key=lambda t: t.metadata.get("index", 0))
    choices = last.response.get("choices") or [{}]
    return (choices[0].get("message") or {}).get("content") or ""
