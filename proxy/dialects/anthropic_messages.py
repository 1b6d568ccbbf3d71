"""Anthropic Messages (``POST /v1/messages``, ``/v1/messages/count_tokens``): claude-code, opencode.

claude-code appends ``/v1/messages`` to ``ANTHROPIC_BASE_URL``, so the proxy's
root (no ``/v1``) is the base URL.

Request translation:

- ``system`` (a string or a list of text blocks; ``cache_control`` ignored)
  becomes one system message, blocks joined with newlines. A ``system`` entry in
  ``messages`` after the first (a mid-conversation system message, which
  claude-code sends) becomes a system message at its place, the same way.
- User content: ``text`` blocks join into one user message; ``tool_result``
  blocks become ``tool`` messages placed before that user message (OpenAI
  requires tool results right after the assistant's calls). A ``tool_result``'s
  content is a string or text blocks; ``is_error`` is not forwarded, since the
  text already says what failed. ``image`` and ``document`` blocks are a 400.
- Assistant content: ``text`` blocks join into the content; ``tool_use`` blocks
  become ``tool_calls`` (id kept, ``arguments`` = compact JSON of ``input``);
  ``thinking`` blocks become ``reasoning_content`` (the mirror of how engine
  reasoning is returned), ``redacted_thinking`` is dropped (opaque).
- Tools ``{name, description, input_schema}`` become functions; versioned
  Anthropic tools (``type`` other than ``custom``, e.g. ``web_search_20250305``)
  are skipped, since nobody here runs them.
- ``tool_choice``: ``auto`` -> ``auto``, ``none`` -> ``none``, ``any`` ->
  ``required``, ``tool`` -> the named function; ``disable_parallel_tool_use`` ->
  ``parallel_tool_calls: false``. The mapping is returned as is: the proxy's
  training policy decides what it accepts.
- ``max_tokens`` is required; ``stop_sequences`` -> ``stop``; ``temperature``,
  ``top_p``, ``top_k`` are kept. ``metadata``, ``thinking``, ``service_tier`` and
  ``cache_control`` are ignored (whether the engine thinks is its own setting).

Response: ``content`` holds an optional ``thinking`` block (empty signature), a
``text`` block when there is text, and one ``tool_use`` block per tool call
(``id`` = the engine's tool call id; ``input`` = the parsed arguments, ``{}`` when
they are not a JSON object). ``stop_reason``: ``max_tokens`` for a length stop,
``tool_use`` when there are tool calls, ``stop_sequence`` when the engine stopped
on one of ``stop_sequences``, else ``end_turn``.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.base import (
    ChatRequest,
    DialectError,
    MessageMemo,
    StreamRenderer,
    chunks,
    convert_each,
    drop_empty_tools,
    engine_choice,
    engine_prompt_tokens,
    engine_reasoning,
    engine_text,
    engine_tool_calls,
    engine_usage,
    expect,
    expect_object,
    function_tool,
    id_suffix,
    join_text_parts,
    json_text,
    model_name,
    one_of,
    optional_bool,
    parse_arguments,
    replay,
    sse_frame,
    status_error_type,
)

NAME = "anthropic_messages"
KEEPALIVE = sse_frame({"type": "ping"}, "ping")

CHARS_PER_TOKEN = 4
"""The ``count_tokens`` estimate's characters per token."""

_TEXT_BLOCKS = frozenset({"text"})
_UNSUPPORTED_BLOCKS = frozenset({"image", "document", "search_result", "container_upload"})
_TOOL_CHOICES = {"auto": "auto", "none": "none", "any": "required"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


# --- request ---------------------------------------------------------------------------------------------------------


def parse_request(body: Any, memo: MessageMemo | None = None) -> ChatRequest:
    """Translate a Messages request into a chat-completions body (see the module docstring); with the session's
    ``memo``, only the messages a resent history adds are converted."""
    body = expect_object(body)
    model = model_name(body)
    stream = optional_bool(body, "stream")
    max_tokens = body.get("max_tokens")
    expect(
        type(max_tokens) is int and max_tokens > 0,
        "'max_tokens' is required and must be a positive integer",
        "max_tokens",
    )
    messages = body.get("messages")
    expect(isinstance(messages, list) and bool(messages), "'messages' must be a non-empty array", "messages")
    stop = body.get("stop_sequences") or []
    expect(
        isinstance(stop, list) and all(isinstance(s, str) for s in stop),
        "'stop_sequences' must be an array of strings",
        "stop_sequences",
    )

    out_messages = []
    system = _system(body.get("system"))
    if system is not None:
        out_messages.append({"role": "system", "content": system})
    out_messages += convert_each(messages, _message_at, memo)
    out: dict[str, Any] = {"model": model, "messages": out_messages, "max_tokens": max_tokens}
    tools = _tools(body.get("tools"))
    if tools:
        out["tools"] = tools
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], out)
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            out[key] = body[key]
    if stop:
        out["stop"] = stop
    drop_empty_tools(out)
    return ChatRequest(dialect=NAME, body=out, model=model, stream=stream, stop=tuple(stop))


def _system(system: Any) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    expect(isinstance(system, list), "'system' must be a string or an array of text blocks", "system")
    return join_text_parts(system, _TEXT_BLOCKS, "system")


def _message_at(message: Any, index: int) -> list[dict[str, Any]]:
    return _message(message, f"messages[{index}]", first=index == 0)


def _message(message: Any, param: str, *, first: bool = False) -> list[dict[str, Any]]:
    expect(isinstance(message, dict), "each message must be an object", param)
    role = message.get("role")
    roles = ("user", "assistant") if first else ("user", "assistant", "system")
    expect(role in roles, f"message role must be one of {', '.join(roles)}, not {role!r}", f"{param}.role")
    content = message.get("content")
    if role == "system":  # a mid-conversation system message (never the first entry)
        where = f"{param}.content"
        expect(isinstance(content, str | list), "message content must be a string or an array of blocks", where)
        text = content if isinstance(content, str) else join_text_parts(content, _TEXT_BLOCKS, where)
        return [{"role": "system", "content": text}]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    expect(isinstance(content, list), "message content must be a string or an array of blocks", f"{param}.content")
    for index, block in enumerate(content):
        expect(isinstance(block, dict), "content blocks must be objects", f"{param}.content[{index}]")
        expect(isinstance(block.get("type"), str), "content blocks need a string 'type'", f"{param}.content[{index}]")
        if block["type"] in _UNSUPPORTED_BLOCKS:
            raise DialectError(
                400,
                f"content block type {block['type']!r} is not supported: the capture proxy serves text only",
                f"{param}.content[{index}]",
            )
    if role == "user":
        return _user(content, param)
    return [_assistant(content, param)]


def _user(blocks: list[dict[str, Any]], param: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for index, block in enumerate(blocks):
        where = f"{param}.content[{index}]"
        kind = block.get("type")
        if kind == "text":
            texts.append(_block_text(block, where))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            expect(isinstance(call_id, str) and bool(call_id), "tool_result needs a 'tool_use_id'", where)
            out.append({"role": "tool", "tool_call_id": call_id, "content": _tool_result_text(block, where)})
        else:
            raise DialectError(400, f"content block type {kind!r} is not supported in a user message", where)
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(blocks: list[dict[str, Any]], param: str) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        where = f"{param}.content[{index}]"
        kind = block.get("type")
        if kind == "text":
            texts.append(_block_text(block, where))
        elif kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
            expect(isinstance(call_id, str) and bool(call_id), "tool_use needs an 'id'", where)
            expect(isinstance(name, str) and bool(name), "tool_use needs a 'name'", where)
            expect(isinstance(arguments, dict), "tool_use 'input' must be an object", where)
            function = {"name": name, "arguments": json_text(arguments, f"{where}.input")}
            calls.append({"id": call_id, "type": "function", "function": function})
        elif kind == "thinking":
            text = block.get("thinking")
            expect(isinstance(text, str), "thinking block needs a string 'thinking'", where)
            thinking.append(text)
        elif kind != "redacted_thinking":
            raise DialectError(400, f"content block type {kind!r} is not supported in an assistant message", where)
    out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        out["tool_calls"] = calls
    if thinking:
        out["reasoning_content"] = "\n".join(thinking)
    return out


def _block_text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    expect(isinstance(text, str), "text block needs a string 'text'", where)
    return text


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    expect(isinstance(content, list), "tool_result content must be a string or an array of blocks", where)
    return join_text_parts(content, _TEXT_BLOCKS, where)


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    expect(isinstance(tools, list), "'tools' must be an array", "tools")
    out: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        expect(isinstance(tool, dict), "each tool must be an object", param)
        if tool.get("type") not in (None, "custom"):
            continue
        out.append(function_tool(tool.get("name"), tool.get("description"), tool.get("input_schema"), param))
    return out


def _tool_choice(choice: Any, out: dict[str, Any]) -> None:
    expect(isinstance(choice, dict), "'tool_choice' must be an object", "tool_choice")
    kind = choice.get("type")
    if kind == "tool":
        name = choice.get("name")
        expect(isinstance(name, str) and bool(name), "'tool_choice' of type 'tool' needs a 'name'", "tool_choice")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        expect(one_of(kind, _TOOL_CHOICES), f"unknown 'tool_choice' type {kind!r}", "tool_choice")
        out["tool_choice"] = _TOOL_CHOICES[kind]
    if choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False


def estimate_tokens(body: Any) -> dict[str, int]:
    """``/v1/messages/count_tokens``: ``{"input_tokens": n}`` at ``CHARS_PER_TOKEN`` characters per token.

    Counts every string in ``system``, ``messages`` and ``tools``; never calls the engine.
    """
    body = expect_object(body)
    expect(isinstance(body.get("messages"), list), "'messages' must be an array", "messages")
    chars = 0
    stack: list[Any] = [body.get("system"), body["messages"], body.get("tools")]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return {"input_tokens": max(1, -(-chars // CHARS_PER_TOKEN))}


# --- response --------------------------------------------------------------------------------------------------------


def _content(engine: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    reasoning = engine_reasoning(engine)
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = engine_text(engine)
    if text:
        blocks.append({"type": "text", "text": text})
    for call in engine_tool_calls(engine):
        arguments = parse_arguments(call["arguments"])
        arguments = arguments if isinstance(arguments, dict) else {}
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["name"], "input": arguments})
    return blocks


def _stop_reason(engine: dict[str, Any], request: ChatRequest, blocks: list[dict[str, Any]]) -> tuple[str, str | None]:
    choice = engine_choice(engine)
    if choice.get("finish_reason") == "length":
        return "max_tokens", None
    if any(block["type"] == "tool_use" for block in blocks):
        return "tool_use", None
    matched = choice.get("stop_reason")
    if isinstance(matched, str) and matched in request.stop:
        return "stop_sequence", matched
    return "end_turn", None


def _usage(engine: dict[str, Any]) -> dict[str, int]:
    prompt, completion, _ = engine_usage(engine)
    return {
        "input_tokens": prompt,
        "output_tokens": completion,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def render_response(engine: dict[str, Any], request: ChatRequest) -> dict[str, Any]:
    """The Messages ``message`` object for one engine completion."""
    blocks = _content(engine)
    stop_reason, stop_sequence = _stop_reason(engine, request, blocks)
    return {
        "id": f"msg_{id_suffix(engine)}",
        "type": "message",
        "role": "assistant",
        "model": request.model or engine.get("model", ""),
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(engine),
    }


def stream_renderer(request: ChatRequest) -> StreamRenderer:
    """Messages SSE events as the engine samples, ``message_start`` to ``message_stop``."""
    return _EventStream(request)


def render_stream(engine: dict[str, Any], request: ChatRequest) -> list[bytes]:
    """The message as Messages SSE events, ``message_start`` to ``message_stop``."""
    return replay(_EventStream(request), engine)


class _EventStream:
    """The events of one message. Thinking and text stream into their blocks as they arrive (thinking first);
    ``finish`` closes the open block and sends every ``tool_use`` block whole."""

    def __init__(self, request: ChatRequest) -> None:
        self.request = request
        self.opened = 0  # content blocks opened by deltas
        self.open: str | None = None  # the type of the block still open

    def start(self, head: dict[str, Any]) -> list[bytes]:
        usage = {
            "input_tokens": engine_prompt_tokens(head),
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        message = {
            "id": f"msg_{id_suffix(head)}",
            "type": "message",
            "role": "assistant",
            "model": self.request.model or head.get("model", ""),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        return [_event("message_start", message=message)]

    def delta(self, fields: dict[str, str]) -> list[bytes]:
        frames = []
        for key, text in fields.items():
            kind = "text" if key == "content" else "thinking"
            if self.open != kind:
                if self.open is not None:
                    frames.append(_event("content_block_stop", index=self.opened - 1))
                opened = {"type": "text", "text": ""} if kind == "text" else _THINKING_OPENED
                frames.append(_event("content_block_start", index=self.opened, content_block=opened))
                self.open = kind
                self.opened += 1
            deltas = (
                {"type": "text_delta", "text": p} if kind == "text" else {"type": "thinking_delta", "thinking": p}
                for p in chunks(text)
            )
            frames.extend(_event("content_block_delta", index=self.opened - 1, delta=delta) for delta in deltas)
        return frames

    def finish(self, engine: dict[str, Any]) -> list[bytes]:
        final = render_response(engine, self.request)
        frames = [] if self.open is None else [_event("content_block_stop", index=self.opened - 1)]
        for index in range(self.opened, len(final["content"])):
            block = final["content"][index]
            opened = {**block, "input": {}}
            text = orjson.dumps(block["input"]).decode()
            frames.append(_event("content_block_start", index=index, content_block=opened))
            frames.extend(
                _event("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": p})
                for p in chunks(text)
            )
            frames.append(_event("content_block_stop", index=index))
        delta = {"stop_reason": final["stop_reason"], "stop_sequence": final["stop_sequence"]}
        frames.append(_event("message_delta", delta=delta, usage=final["usage"]))
        frames.append(_event("message_stop"))
        return frames


_THINKING_OPENED = {"type": "thinking", "thinking": "", "signature": ""}


def _event(kind: str, **fields: Any) -> bytes:
    return sse_frame({"type": kind, **fields}, kind)


# --- errors ----------------------------------------------------------------------------------------------------------


def render_error(
    status: int, message: str, type: str | None = None, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``; ``type`` defaults from the status; no code or param."""
    kind = type or status_error_type(status, _ERROR_TYPES, "invalid_request_error", "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def render_stream_error(
    status: int,
    message: str,
    type: str | None = None,
    *,
    code: str | None = None,
    param: str | None = None,
    request: ChatRequest | None = None,
) -> bytes:
    """An ``event: error`` frame, which Anthropic clients raise as an API error."""
    return sse_frame(render_error(status, message, type), "error")
