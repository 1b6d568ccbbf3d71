"""The sampling policy a session pins, and the engine request it produces.

Contract: ``engine_request(chat, model=, policy=, max_output_tokens=, stream=)`` turns a dialect-neutral chat
request into the exact body sent upstream. For training sessions the sampled
distribution is the policy's, whatever the agent asked: temperature pinned,
full vocabulary (``top_p=1, top_k=-1, min_p=0``), no penalties; fields that
would change the distribution in ways the loss can't see are refused with
``PolicyError`` (a 400 in the agent's dialect). Eval sessions pass the agent's
sampling through. Every request asks for ids and processed logprobs.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any

# Fields that change the sampled distribution beyond what the behaviour
# logprobs describe; refused for training sessions (REFERENCE §1.2).
REFUSED_FIELDS = (
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "structured_outputs",
    "min_tokens",
)
# Sampling knobs the agent may send; the policy decides their values.
POLICY_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
)
# Engine-side fields the agent may pass through unchanged.
PASSTHROUGH_FIELDS = ("stop", "seed", "chat_template_kwargs", "parallel_tool_calls", "response_format", "user")


class PolicyError(ValueError):
    """A request the session's sampling policy can't serve (HTTP 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingPolicy:
    """The distribution a training session samples from (full vocabulary)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError("sampling policy temperature must be > 0 (greedy logprobs can't train)")
        if self.top_p != 1.0 or self.top_k != -1 or self.min_p != 0.0 or self.repetition_penalty != 1.0:
            raise ValueError("training samples the full vocabulary: top_p=1, top_k=-1, min_p=0, repetition_penalty=1")

    def as_engine_params(self) -> dict[str, Any]:
        """The sampling fields sent upstream, penalties explicitly neutral (a fresh dict per call)."""
        return dict(self._engine_params)

    @functools.cached_property
    def _engine_params(self) -> dict[str, Any]:
        return {**asdict(self), "frequency_penalty": 0.0, "presence_penalty": 0.0}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SamplingPolicy:
        """Build from a JSON dict; unknown keys are an error. ``frequency_penalty`` and ``presence_penalty`` may be
        given as 0 (OpenEnv's ``training_sampling``, hence TRL's harness worker, spells the whole policy out)."""
        data = dict(data or {})
        for penalty in ("frequency_penalty", "presence_penalty"):
            if data.pop(penalty, 0.0) != 0.0:
                raise ValueError(f"training samples the full vocabulary: {penalty} must be 0")
        unknown = set(data) - {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"}
        if unknown:
            raise ValueError(f"unknown sampling fields: {sorted(unknown)}")
        return cls(**data)


def engine_request(
    chat: dict[str, Any],
    *,
    model: str,
    policy: SamplingPolicy | None,
    max_output_tokens: int | None,
    stream: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Build the upstream chat-completions body from a dialect-neutral ``chat``.

    ``policy`` None means eval: the agent's sampling passes through. ``stream`` asks for vLLM's stream (ids
    and logprobs per chunk, a usage chunk at the end) instead of one reply.
    Returns ``(body, requested_sampling)`` where the second records what the
    agent asked for, for the trace's metadata.
    """
    if chat.get("n", 1) != 1:
        raise PolicyError("n must be 1: each call is one sampled completion", "n")
    _check_types(chat)
    requested = {k: chat[k] for k in POLICY_FIELDS if chat.get(k) is not None}
    body: dict[str, Any] = {"model": model, "messages": chat["messages"]}
    tools = chat.get("tools")
    if tools:
        body["tools"] = tools
        tool_choice = chat.get("tool_choice")
        if tool_choice is not None:
            if policy is not None and tool_choice not in ("auto", "none"):
                raise PolicyError("tool_choice must be 'auto' or 'none' in a training session", "tool_choice")
            body["tool_choice"] = tool_choice
    for key in PASSTHROUGH_FIELDS:
        if chat.get(key) is not None and not (key == "parallel_tool_calls" and not tools):
            body[key] = chat[key]
    if policy is None:
        body.update(requested)
    else:
        for key in REFUSED_FIELDS:
            if chat.get(key) is not None:
                raise PolicyError(f"'{key}' changes the sampled distribution; refused in a training session", key)
        response_format = chat.get("response_format")
        if response_format is not None and (
            not isinstance(response_format, dict) or response_format.get("type", "text") != "text"
        ):
            raise PolicyError("only a text response_format is allowed in a training session", "response_format")
        body.update(policy.as_engine_params())
    asked = chat.get("max_tokens")
    if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int) or asked < 1):
        raise PolicyError(f"'max_tokens' must be a positive integer, got {asked!r}", "max_tokens")
    if max_output_tokens is not None:
        asked = max_output_tokens if asked is None else min(asked, max_output_tokens)
    if asked is not None:
        body["max_tokens"] = asked
    body.update({"stream": stream, "logprobs": True, "top_logprobs": 0, "return_token_ids": True})
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body, requested


def _is_number(value: Any) -> bool:
    return type(value) is int or type(value) is float


def _is_stop(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(s, str) for s in value))


_FIELD_TYPES: tuple[tuple[str, Any, str], ...] = (
    *((key, _is_number, "a number") for key in POLICY_FIELDS),
    ("seed", lambda v: type(v) is int, "an integer"),
    ("stop", _is_stop, "a string or an array of strings"),
    ("user", lambda v: isinstance(v, str), "a string"),
    ("parallel_tool_calls", lambda v: isinstance(v, bool), "a boolean"),
    ("response_format", lambda v: isinstance(v, dict), "an object"),
    ("chat_template_kwargs", lambda v: isinstance(v, dict), "an object"),
    ("tool_choice", lambda v: isinstance(v, str | dict), "a string or an object"),
)


def _check_types(chat: dict[str, Any]) -> None:
    """Every field the engine request or the trace's metadata takes from ``chat`` has the type the engine expects.

    A wrong type is the agent's error (400), not the engine's (which would answer it as a 4xx or a 5xx), and
    a value the policy overrides is still recorded as requested, so it must be what it claims to be.
    """
    for key, valid, kind in _FIELD_TYPES:
        value = chat.get(key)
        if value is not None and not valid(value):
            raise PolicyError(f"'{key}' must be {kind}, got {type(value).__name__}", key)
