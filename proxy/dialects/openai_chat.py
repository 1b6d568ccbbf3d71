"""OpenAI Chat Completions (``POST /v1/chat/completions``): opencode, mini-swe-agent, terminus-2.

The engine speaks this dialect, so translation is pass-through with normalisation:

- ``developer`` messages become ``system``; content-part lists of ``text`` parts are
  joined with newlines (as vLLM does for string templates); any other part
  (image, audio, file) is a 400.
- ``max_completion_tokens`` becomes ``max_tokens``; ``n`` other than 1 is a 400.
- ``stream``, ``stream_options``, ``logprobs``, ``top_logprobs`` and
  ``return_token_ids`` are lifted out of the body (the proxy sets its own). The
  reply echoes logprobs only if the agent asked for ``logprobs`` and ids only if it
  asked for ``return_token_ids`` (LiteLLM/terminus-2 rollout details).
- Every other field passes through untouched for the proxy's policy to judge, and the
  messages' other fields (``tool_calls``, ``tool_call_id``, ``name``, ...) for the engine
  to validate: its 4xx reaches the agent as the request's error.

A stream is ``chat.completion.chunk`` frames: a role chunk (with ``prompt_token_ids``
when asked for), reasoning and text deltas as the engine samples them, then, once the
engine is done, per tool call one header chunk (id, name) followed by argument
deltas, a finish chunk (carrying ``logprobs``/``token_ids`` when asked for), a usage
chunk when ``stream_options.include_usage`` is set, and ``[DONE]``.
"""

from __future__ import annotations

from typing import Any

from proxy.dialects.base import (
    SSE_COMMENT_KEEPALIVE,
    SSE_DONE,
    ChatRequest,
    DialectError,
    MessageMemo,
    StreamRenderer,
    chunks,
    drop_empty_tools,
    engine_choice,
    engine_created,
    engine_tool_calls,
    engine_usage,
    expect,
    expect_object,
    id_suffix,
    join_text_parts,
    model_name,
    one_of,
    optional_bool,
    replay,
    sse_frame,
    status_error_type,
)

NAME = "openai_chat"
KEEPALIVE = SSE_COMMENT_KEEPALIVE

_LIFTED = frozenset(
    {"stream", "stream_options", "n", "logprobs", "top_logprobs", "return_token_ids", "max_completion_tokens"}
)
_ENGINE_ONLY = frozenset({"prompt_token_ids", "prompt_logprobs", "kv_transfer_params"})
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_AS_SENT_ROLES = _ROLES - {"developer"}
_TEXT_CONTENT = frozenset({str, type(None)})
_TEXT_PARTS = frozenset({"text"})
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def parse_request(body: Any, memo: MessageMemo | None = None) -> ChatRequest:
    """Validate a chat-completions body and normalise it for the engine (see the module docstring). Messages pass
    through, checked in one pass, so ``memo`` is not used."""
    body = expect_object(body)
    model = model_name(body)
    stream = optional_bool(body, "stream")
    n = body.get("n")
    expect(n is None or (type(n) is int and n == 1), "only n=1 is supported", "n")
    stream_options = body.get("stream_options")
    expect(stream_options is None or isinstance(stream_options, dict), "'stream_options' must be an object")
    messages = body.get("messages")
    expect(isinstance(messages, list) and bool(messages), "'messages' must be a non-empty array", "messages")
    expect(body.get("tools") is None or isinstance(body["tools"], list), "'tools' must be an array", "tools")

    out = {key: value for key, value in body.items() if key not in _LIFTED}
    out["messages"] = (
        list(messages) if _all_as_sent(messages) else [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    )
    max_completion_tokens = body.get("max_completion_tokens")
    if max_completion_tokens is not None:
        max_tokens = body.get("max_tokens")
        expect(
            max_tokens is None or max_tokens == max_completion_tokens,
            "'max_tokens' and 'max_completion_tokens' disagree",
            "max_completion_tokens",
        )
        out["max_tokens"] = max_completion_tokens
    drop_empty_tools(out)
    return ChatRequest(
        dialect=NAME,
        body=out,
        model=model,
        stream=stream,
        include_usage=bool(stream_options and stream_options.get("include_usage")),
        return_logprobs=optional_bool(body, "logprobs"),
        return_token_ids=optional_bool(body, "return_token_ids"),
    )


def _all_as_sent(messages: list[Any]) -> bool:
    """Whether every message goes to the engine as the agent sent it (what ``_message`` returns unchanged), in one
    pass without a call per message: an agent resends its whole history on every call."""
    try:
        return all(
            type(m) is dict and m.get("role") in _AS_SENT_ROLES and type(m.get("content")) in _TEXT_CONTENT
            for m in messages
        )
    except TypeError:  # an unhashable role: ``_message`` says what is wrong with it
        return False


def _message(message: Any, param: str) -> dict[str, Any]:
    expect(isinstance(message, dict), "each message must be an object", param)
    role = message.get("role")
    if not one_of(role, _ROLES):
        raise DialectError(400, f"unknown message role {role!r}", f"{param}.role")
    content = message.get("content")
    if role != "developer" and not isinstance(content, list):
        expect(content is None or isinstance(content, str), "message content must be a string or an array", param)
        return message
    out = dict(message)
    if role == "developer":
        out["role"] = "system"
    if isinstance(content, list):
        out["content"] = join_text_parts(content, _TEXT_PARTS, f"{param}.content")
    return out


def render_response(engine: dict[str, Any], request: ChatRequest) -> dict[str, Any]:
    """The engine's completion as the agent sees it: capture-only fields stripped unless the agent asked for them,
    and an id minted for a tool call without one (``engine_tool_calls``'s, as the stream's)."""
    out = {key: value for key, value in engine.items() if key not in _ENGINE_ONLY}
    if request.return_token_ids and "prompt_token_ids" in engine:
        out["prompt_token_ids"] = engine["prompt_token_ids"]
    out["model"] = request.model or engine.get("model", "")
    out["choices"] = [_choice(choice, request, engine) for choice in engine["choices"]]
    return out


def _choice(choice: dict[str, Any], request: ChatRequest, engine: dict[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in choice.items() if key != "token_ids" or request.return_token_ids}
    if not request.return_logprobs:
        out["logprobs"] = None
    calls = (choice.get("message") or {}).get("tool_calls")
    if calls and not all(call.get("id") for call in calls):  # minted as the stream and the other dialects mint it
        ids = [call["id"] for call in engine_tool_calls(engine)]
        out["message"] = {
            **choice["message"],
            "tool_calls": [{**call, "id": call_id} for call, call_id in zip(calls, ids, strict=True)],
        }
    return out


def stream_renderer(request: ChatRequest) -> StreamRenderer:
    """``chat.completion.chunk`` SSE frames as the engine samples (see the module docstring)."""
    return _ChunkStream(request)


def render_stream(engine: dict[str, Any], request: ChatRequest) -> list[bytes]:
    """The completion as ``chat.completion.chunk`` SSE frames ending in ``data: [DONE]``."""
    return replay(_ChunkStream(request), engine)


class _ChunkStream:
    """The chunks of one reply: ``id``, ``created`` and ``model`` come from the engine's head."""

    def __init__(self, request: ChatRequest) -> None:
        self.request = request
        self.head: dict[str, Any] = {}
        self.tail = {"usage": None} if request.include_usage else {}

    def _chunk(self, delta: dict[str, Any], **choice_fields: Any) -> dict[str, Any]:
        fields = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **choice_fields}
        return {**self.head, "choices": [fields], **self.tail}

    def _frame(self, delta: dict[str, Any], **choice_fields: Any) -> bytes:
        return sse_frame(self._chunk(delta, **choice_fields))

    def start(self, head: dict[str, Any]) -> list[bytes]:
        self.head = {
            "id": head.get("id") or f"chatcmpl-{id_suffix(head)}",
            "object": "chat.completion.chunk",
            "created": engine_created(head),
            "model": self.request.model or head.get("model", ""),
        }
        if head.get("system_fingerprint"):
            self.head["system_fingerprint"] = head["system_fingerprint"]
        first = self._chunk({"role": "assistant", "content": ""})
        if self.request.return_token_ids and "prompt_token_ids" in head:
            first["prompt_token_ids"] = head["prompt_token_ids"]
        return [sse_frame(first)]

    def delta(self, fields: dict[str, str]) -> list[bytes]:
        return [self._frame({key: piece}) for key, text in fields.items() for piece in chunks(text)]

    def finish(self, engine: dict[str, Any]) -> list[bytes]:
        choice = engine_choice(engine)
        frames = []
        for index, call in enumerate(engine_tool_calls(engine)):
            function = {"name": call["name"], "arguments": ""}
            frames.append(
                self._frame(
                    {"tool_calls": [{"index": index, "id": call["id"], "type": "function", "function": function}]}
                )
            )
            frames.extend(
                self._frame({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                for piece in chunks(call["arguments"])
            )
        finish: dict[str, Any] = {"finish_reason": choice.get("finish_reason")}
        if self.request.return_logprobs:
            finish["logprobs"] = choice.get("logprobs")
        if self.request.return_token_ids and "token_ids" in choice:
            finish["token_ids"] = choice["token_ids"]
        frames.append(self._frame({}, **finish))
        if self.request.include_usage:
            usage = engine.get("usage")
            if usage is None:
                prompt, completion, _ = engine_usage(engine)
                usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
            frames.append(sse_frame({**self.head, "choices": [], "usage": usage}))
        frames.append(SSE_DONE)
        return frames


def render_error(
    status: int, message: str, type: str | None = None, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``; ``type`` defaults from the status."""
    return {
        "error": {
            "message": message,
            "type": type or status_error_type(status, _ERROR_TYPES, "invalid_request_error", "server_error"),
            "param": param,
            "code": code,
        }
    }


def render_stream_error(
    status: int,
    message: str,
    type: str | None = None,
    *,
    code: str | None = None,
    param: str | None = None,
    request: ChatRequest | None = None,
) -> bytes:
    """A ``data: {"error": ...}`` frame, which OpenAI clients raise on mid-stream."""
    return sse_frame(render_error(status, message, type, code=code, param=param))
