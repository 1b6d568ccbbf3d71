"""The session protocol between the trainer and whatever runs an agent (TRL's and OpenEnv's contract).

The trainer builds the factory once, with the sampling policy every session must pin, then asks it
for one session per rollout::

    factory = harness_session_factory(sampling={"temperature": T, "top_p": 1.0, "top_k": -1,
                                                "min_p": 0.0, "repetition_penalty": 1.0})
    session = factory.create(row["prompt"], seed=group_seed, episode_id=uuid)
    session.wait_for_completion(timeout_s)     # the agent runs its own loop
    trace = session.fetch_training_trace()     # what the capture proxy recorded
    verdict = session.verify(completion)       # the task's own verifier
    session.close()                            # always, in ``finally``

That is all a third-party factory sees (OpenEnv's ``HarborSessionFactory`` plugs in unchanged;
sessions that offer only the legacy ``fetch_proxy_trace() -> list[TraceEntry]`` are read through
``TrainingTrace.from_entries``). Our own factories need more (the trainer's proxy, call and token
budgets, the whole dataset row): they implement ``TrainerBoundSessionFactory``, and the trainer then
calls ``bind_rollout(context)`` once its services run and ``create_from_row(row, ...)`` per rollout.

Semantics the trainer applies (REFERENCE §3.3): ``TimeoutError`` from ``wait_for_completion``
marks the rollout ``timed_out`` and keeps its tokens and verifier reward; any other failure to
create, wait, fetch or verify makes it unscorable (reward None); a trace that breaks the capture
contract, or a session missing a protocol method, aborts training.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from proxy.trace import TrainingTrace

if TYPE_CHECKING:
    from harness_grpo.rollout_context import RolloutContext

SESSION_METHODS = ("wait_for_completion", "verify", "close")
TRACE_METHODS = ("fetch_training_trace", "fetch_proxy_trace")


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

    def verify(self, transcript: Any = None, final_state: Any = None) -> VerifyResult:
        """Score the task's end state with its own verifier (never the agent's word)."""
        ...

    def close(self) -> None:
        """Release the sandbox and the proxy session; idempotent."""
        ...


@runtime_checkable
class HarnessSessionFactory(Protocol):
    """What ``harness_session_factory(sampling=...)`` returns."""

    def create(self, prompt: Any, seed: int | None = None, episode_id: str | None = None) -> HarnessSession:
        """A session running one agent on the task ``prompt`` (the dataset row's ``prompt``) names."""
        ...


@runtime_checkable
class TrainerBoundSessionFactory(HarnessSessionFactory, Protocol):
    """A factory that runs its sessions against the trainer's own proxy (our factories).

    ``bind_rollout`` is called once, before any session, with the proxy endpoint and the budgets;
    ``create_from_row`` receives the whole dataset row instead of only its prompt.
    """

    def bind_rollout(self, context: RolloutContext) -> None: ...

    def create_from_row(self, row: Mapping[str, Any], *, seed: int, episode_id: str) -> HarnessSession: ...


class SessionContractError(TypeError):
    """A factory or session lacks a method of the protocol; names what is missing."""


def check_factory(factory: Any, built_by: Any) -> None:
    """Raise ``SessionContractError`` unless ``factory`` (what ``built_by(sampling=...)`` returned) has ``create``."""
    if not callable(getattr(factory, "create", None)):
        name = getattr(built_by, "__name__", type(built_by).__name__)
        raise SessionContractError(
            f"harness_session_factory {name}(sampling=...) returned {type(factory).__name__}, "
            "which has no create(prompt, seed=..., episode_id=...) method"
        )


def check_session(session: Any) -> None:
    """Raise ``SessionContractError`` naming every protocol method ``session`` lacks."""
    missing = [name for name in SESSION_METHODS if not callable(getattr(session, name, None))]
    if not any(callable(getattr(session, name, None)) for name in TRACE_METHODS):
        missing.append("fetch_training_trace")
    if missing:
        raise SessionContractError(
            f"session {type(session).__name__} does not implement the harness session protocol: "
            f"missing {', '.join(missing)}"
        )


def fetch_trace(session: Any) -> TrainingTrace:
    """The session's ``TrainingTrace``; a legacy ``fetch_proxy_trace`` list of entries is converted exactly."""
    fetch = getattr(session, "fetch_training_trace", None)
    trace = fetch() if callable(fetch) else TrainingTrace.from_entries(session.fetch_proxy_trace())
    if not isinstance(trace, TrainingTrace):  # e.g. OpenEnv's own model class: same JSON schema
        trace = TrainingTrace.from_json(trace.model_dump_json())
    return trace


def instruction_of(prompt: Any) -> str:
    """The task text of a dataset ``prompt``: a string, or the last message's content of a message list."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], Mapping):
        return str(prompt[-1].get("content") or "")
    return "" if prompt is None else str(prompt)
