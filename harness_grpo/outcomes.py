"""``HarnessRolloutOutcome``: what ``rollout_reward_fn`` receives, with TRL's field names and types.

    env_reward          the verifier's reward (None: it could not score)
    completion          the final message history: the last selected turn's request messages plus
                        the assistant message the engine returned for it
    trace               the selected capture entries (TRL/OpenEnv ``TraceEntry`` dicts: ids,
                        logprobs, loss mask, request, response, metadata with ``node_id``), in
                        arrival order; turns of the trained roles, zero-masked turns included
    tool_call_count     tool calls the model made over the selected turns
    tool_failure_count  failed tool calls (loop-owning: TRL's keyword rule, see ``summarize_tools``;
                        white-box: the calls the harness reported as failed)
    tool_calls_by_name  calls per tool name
    timed_out           the agent was stopped at the rollout timeout (tokens and reward kept)

Ours, beside them: ``training_trace`` (the whole ``TrainingTrace``), ``error`` (why the rollout is
unscorable), ``exit_code``, ``metrics`` (the verifier's), ``tool_latency_s`` (white-box only),
``extra_fields`` (what a ``rollout_func`` returned beside its reward and ids),
``episode`` (the built-in tool loop's ``harness_grpo.tool_loop.Episode``: prompt, completion
messages, environment instance, per-call counts; None for agents and ``harness_adapter``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

from proxy.trace import TrainingTrace, TrainingTurn

Message = dict[str, Any]
FAILURE_WORDS = ("error", "failed", "traceback", "exception")


@dataclass
class HarnessRolloutOutcome:
    """One finished rollout (see the module docstring for each field)."""

    env_reward: float | None
    completion: list[Message]
    trace: list[dict[str, Any]]
    tool_call_count: int = 0
    tool_failure_count: int = 0
    tool_calls_by_name: dict[str, int] = field(default_factory=dict)
    timed_out: bool = False
    training_trace: TrainingTrace | None = None
    error: str | None = None
    exit_code: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    tool_latency_s: list[tuple[str, float]] = field(default_factory=list)
    extra_fields: dict[str, Any] = field(default_factory=dict)
    episode: Any = None


@dataclass
class HarnessTurn:
    """One captured turn as a turn-selection rule sees it (TRL's ``HarnessTurn``)."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    content: str
    tool_calls: list[dict[str, Any]]

    @classmethod
    def of(cls, turn: TrainingTurn) -> HarnessTurn:
        message = _reply(turn)
        return cls(
            messages=list(turn.request.get("messages") or []),
            tools=turn.request.get("tools") or None,
            content=message.get("content") or "",
            tool_calls=list(message.get("tool_calls") or []),
        )


def _reply(turn: TrainingTurn) -> Message:
    choices = turn.response.get("choices") or [{}]
    return choices[0].get("message") or {}


def _arrival(turns: list[TrainingTurn]) -> list[TrainingTurn]:
    order = {id(t): i for i, t in enumerate(turns)}
    return sorted(turns, key=lambda t: (t.metadata.get("index", order[id(t)]), order[id(t)]))


def selected_turns(trace: TrainingTrace, roles: Container[str]) -> list[TrainingTurn]:
    """The turns whose capture-graph role is in ``roles``, in arrival order; a turn without a role
    (a foreign trace) is selected."""
    return _arrival([t for t in trace.turns if t.metadata.get("role") is None or t.metadata["role"] in roles])


def final_messages(turns: list[TrainingTurn]) -> list[Message]:
    """The last turn's request messages followed by the assistant message it received ([] if no turn)."""
    if not turns:
        return []
    last = turns[-1]
    return [*(last.request.get("messages") or []), {"role": "assistant", **_reply(last)}]


def summarize_tools(turns: list[TrainingTurn]) -> tuple[int, int, dict[str, int]]:
    """``(calls, failures, calls by name)`` of loop-owning turns (given in arrival order).

    Calls are the tool calls the model made (``message.tool_calls`` of every turn). Failures follow
    TRL's loop-owning rule: tool messages in the *last* request that mention error/failed/traceback/
    exception, deduplicated by ``(name, content[:200])``, names resolved through ``tool_call_id``.
    """
    by_name: Counter[str] = Counter()
    for turn in turns:
        for call in _reply(turn).get("tool_calls") or []:
            by_name[(call.get("function") or {}).get("name", "")] += 1
    failures: set[tuple[str, str]] = set()
    if turns:
        messages = turns[-1].request.get("messages") or []
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
