"""The dialect interface and the helpers every dialect shares.

A dialect module translates one agent wire format to the engine's OpenAI
chat-completions contract and back. Each module exposes, at module level:

``NAME: str``
    The dialect's name (``openai_chat``, ``openai_responses``, ``anthropic_messages``).
``KEEPALIVE: bytes``
    One SSE frame the proxy may write while the engine call is in flight; every
    client of the dialect ignores it.
``parse_request(body: Any, memo: MessageMemo | None = None) -> ChatRequest``
    Validate and translate the decoded JSON body. Raises ``DialectError`` (status
    400) for a body the dialect rejects; never returns a partial translation.
    ``memo`` is the session's: Anthropic's messages and Responses' input items are
    each read on their own, so only those a resent history adds to the last
    request's are; chat passes messages through, checked in one pass.
``render_response(engine: dict, request: ChatRequest) -> dict``
    The agent's JSON reply built from one complete engine chat completion.
``stream_renderer(request: ChatRequest) -> StreamRenderer``
    The reply as SSE frames while the engine samples it: ``start(head)`` once the
    engine's first chunk is in (``head``: ``id``, ``created``, ``model``, optional
    ``prompt_token_ids``), ``delta(fields)`` per text delta (``{field: text}``, field one
    of ``TEXT_FIELDS``, reasoning before text), ``finish(engine)`` with the complete,
    checked completion: every frame not sent yet (tool calls whole, stop reason,
    usage, the terminal frames). The frames accumulate to ``render_response``'s reply
    exactly, however the text was cut into deltas.
``render_stream(engine: dict, request: ChatRequest) -> list[bytes]``
    The same reply as SSE frames from a complete completion (``replay``: one delta
    per text field).
``render_error(status, message, type=None, *, code=None, param=None) -> dict``
    The dialect's error body for an HTTP error reply.
``render_stream_error(status, message, type=None, *, code=None, param=None, request=None) -> bytes``
    One SSE frame reporting an error after the stream's headers went out.

``engine`` is a vLLM chat completion that the proxy has already checked: it has
``choices[0].message`` (``content``, optional ``tool_calls`` with string
``arguments``, optional ``reasoning_content``/``reasoning``),
``choices[0].finish_reason`` and, normally, ``usage``. Renderers never mutate it.
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy.json_depth import MAX_REQUEST_DEPTH, NestingError, check_depth, dumps_bounded

DELTA_CHARS = 64
"""Characters per streamed text or argument delta."""

_ID_UNSAFE = re.compile(r"[^A-Za-z0-9]")


class DialectError(Exception):
    """A request the dialect rejects; the proxy answers ``status`` with the dialect's error body."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


@dataclass(slots=True, kw_only=True)
class ChatRequest:
    """An agent request translated to the engine's chat-completions shape.

    ``body`` holds ``model``, ``messages`` (OpenAI chat shape: system/user/assistant/tool,
    string content, assistant ``tool_calls`` with string ``arguments``, optional
    ``reasoning_content``), ``tools`` in OpenAI function shape, ``tool_choice``,
    ``parallel_tool_calls`` and every sampling field the agent sent, under its chat
    name (``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop``,
    ``response_format``, ...), so the proxy can enforce its sampling policy on one
    shape. It never holds ``stream``, ``stream_options``, ``n``, ``logprobs``,
    ``top_logprobs`` or ``return_token_ids``: the proxy adds its capture fields.
    Without tools, ``tools``, ``tool_choice`` and ``parallel_tool_calls`` are
    left out altogether.

    The other fields are what the renderers need to answer in the agent's dialect.
    """

    dialect: str
    body: dict[str, Any]
    model: str
    stream: bool = False
    include_usage: bool = False
    """OpenAI chat: ``stream_options.include_usage`` asked for a usage chunk."""
    return_logprobs: bool = False
    """OpenAI chat: the agent asked for ``logprobs``; they are echoed, otherwise stripped."""
    return_token_ids: bool = False
    """OpenAI chat: the agent asked for ``return_token_ids``; ids are echoed, otherwise stripped."""
    tool_kinds: dict[str, str] = field(default_factory=dict)
    """Responses: tool name -> ``local_shell`` or ``custom`` for tools that are not plain functions."""
    stop: tuple[str, ...] = ()
    """Anthropic: the stop sequences, to report ``stop_sequence`` stops."""
    echo: dict[str, Any] = field(default_factory=dict)
    """Responses: request fields the response object repeats."""


class Dialect(Protocol):
    """The module-level interface each dialect module implements (see the module docstring)."""

    NAME: str
    KEEPALIVE: bytes

    def parse_request(self, body: Any, memo: MessageMemo | None = None) -> ChatRequest: ...

    def render_response(self, engine: dict[str, Any], request: ChatRequest) -> dict[str, Any]: ...

    def stream_renderer(self, request: ChatRequest) -> StreamRenderer: ...

    def render_stream(self, engine: dict[str, Any], request: ChatRequest) -> list[bytes]: ...

    def render_error(
        self, status: int, message: str, type: str | None = None, *, code: str | None = None, param: str | None = None
    ) -> dict[str, Any]: ...

    def render_stream_error(
        self,
        status: int,
        message: str,
        type: str | None = None,
        *,
        code: str | None = None,
        param: str | None = None,
        request: ChatRequest | None = None,
    ) -> bytes: ...


class MessageMemo:
    """One session's last request, for a dialect that reads each message on its own: the messages as sent (their
    JSON) and what each became. An agent resends its whole history on every call; ``convert`` converts only what it
    added. The resent messages must be the same JSON, byte for byte as orjson writes them (``1``, ``1.0`` and
    ``true`` differ), so a reused conversion is the one these messages get. Safe across threads: the last request
    is read and replaced as one value."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[bytes, list[list[Any]], Callable[..., Any] | None] = (b"[]", [], None)

    def convert[T](self, messages: list[Any], one: Callable[[Any, int], list[T]]) -> list[T]:
        """``one(message, index)`` of each of ``messages``, concatenated; ``one`` runs only for the messages after
        the last request's when these start with them (and the last request was converted by ``one`` too). The
        memo changes only once every message is converted: a ``DialectError`` leaves it as it was."""
        try:
            sent = orjson.dumps(messages)
        except orjson.JSONEncodeError:  # an id past 64 bits, say: nothing to compare, convert it all
            sent = None
        last_sent, last_converted, last_one = self._last
        prefix = last_sent[:-1]  # the last request's array without its "]": a resend goes on with "," or "]"
        start = 0
        if (
            sent is not None
            and one is last_one
            and sent.startswith(prefix)
            and sent[len(prefix) : len(prefix) + 1] in (b",", b"]")
        ):
            start = len(last_converted)
        converted = last_converted[:start] + [one(m, index) for index, m in enumerate(messages[start:], start)]
        if sent is not None:
            self._last = (sent, converted, one)
        return list(itertools.chain.from_iterable(converted))


def convert_each[T](messages: list[Any], one: Callable[[Any, int], list[T]], memo: MessageMemo | None) -> list[T]:
    """``one(message, index)`` of each of ``messages``, concatenated; through ``memo`` where the session has one."""
    if memo is not None:
        return memo.convert(messages, one)
    return [out for index, message in enumerate(messages) for out in one(message, index)]


class StreamRenderer(Protocol):
    """One reply's SSE frames, rendered as the engine samples it (see the module docstring)."""

    def start(self, head: dict[str, Any]) -> list[bytes]: ...

    def delta(self, fields: dict[str, str]) -> list[bytes]: ...

    def finish(self, engine: dict[str, Any]) -> list[bytes]: ...


TEXT_FIELDS = ("reasoning_content", "reasoning", "content")
"""The message fields a stream delta carries text in, in the order a reply has them."""


def replay(renderer: StreamRenderer, engine: dict[str, Any]) -> list[bytes]:
    """A complete completion through ``renderer``: the start, one delta per text field, the finish."""
    message = engine_message(engine)
    frames = renderer.start(engine)
    reasoning = "reasoning_content" if message.get("reasoning_content") else "reasoning"
    for key in (reasoning, "content"):
        if message.get(key):
            frames += renderer.delta({key: message[key]})
    return frames + renderer.finish(engine)


# --- SSE -------------------------------------------------------------------------------------------------------------

SSE_COMMENT_KEEPALIVE = b": keepalive\n\n"
SSE_DONE = b"data: [DONE]\n\n"


def sse_frame(data: dict[str, Any], event: str | None = None) -> bytes:
    """One SSE frame: optional ``event:`` line, one ``data:`` line of compact JSON, blank line."""
    payload = orjson.dumps(data)
    if event is None:
        return b"data: " + payload + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + payload + b"\n\n"


def chunks(text: str, size: int = DELTA_CHARS) -> list[str]:
    """``text`` cut into consecutive pieces of at most ``size`` characters; ``[]`` for ``""``."""
    return [text[i : i + size] for i in range(0, len(text), size)]


# --- engine response access ------------------------------------------------------------------------------------------


def engine_choice(engine: dict[str, Any]) -> dict[str, Any]:
    """The engine's first (only) choice."""
    return engine["choices"][0]


def engine_message(engine: dict[str, Any]) -> dict[str, Any]:
    """The engine's assistant message."""
    return engine_choice(engine).get("message") or {}


def engine_text(engine: dict[str, Any]) -> str:
    """The assistant text, ``""`` when the engine sent none."""
    return engine_message(engine).get("content") or ""


def engine_reasoning(engine: dict[str, Any]) -> str:
    """The reasoning text the engine's reasoning parser split off, ``""`` when none."""
    message = engine_message(engine)
    return message.get("reasoning_content") or message.get("reasoning") or ""


def engine_tool_calls(engine: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool calls as ``{"id", "name", "arguments"}``; a missing id is derived from the response id."""
    calls = engine_message(engine).get("tool_calls") or []
    suffix = id_suffix(engine)
    out = []
    for index, call in enumerate(calls):
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = "" if arguments is None else orjson.dumps(arguments).decode()
        call_id = call.get("id") or f"call_{suffix}_{index}"
        out.append({"id": call_id, "name": function.get("name") or "", "arguments": arguments})
    return out


def engine_prompt_tokens(engine: dict[str, Any]) -> int:
    """``usage.prompt_tokens``, else the number of prompt ids (a stream's head has no usage yet)."""
    prompt = (engine.get("usage") or {}).get("prompt_tokens")
    return len(engine.get("prompt_token_ids") or ()) if prompt is None else prompt


def engine_usage(engine: dict[str, Any]) -> tuple[int, int, int]:
    """``(prompt_tokens, completion_tokens, cached_prompt_tokens)``; counts ids when ``usage`` is missing."""
    usage = engine.get("usage") or {}
    prompt = engine_prompt_tokens(engine)
    completion = usage.get("completion_tokens")
    if completion is None:
        completion = len(engine_choice(engine).get("token_ids") or ())
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return prompt, completion, cached


def engine_created(engine: dict[str, Any]) -> int:
    """The engine's ``created`` timestamp, or now."""
    created = engine.get("created")
    return created if isinstance(created, int) else int(time.time())


def id_suffix(engine: dict[str, Any]) -> str:
    """An alphanumeric suffix derived from the engine's response id, so JSON and SSE renderings share ids."""
    raw = engine.get("id")
    suffix = _ID_UNSAFE.sub("", raw.removeprefix("chatcmpl-")) if isinstance(raw, str) else ""
    return suffix or uuid.uuid4().hex


def parse_arguments(arguments: str) -> Any:
    """Decode a tool call's JSON arguments; ``None`` when they are not valid JSON."""
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return None


# --- request translation ---------------------------------------------------------------------------------------------


def expect(condition: bool, message: str, param: str | None = None) -> None:
    """Raise a 400 ``DialectError`` unless ``condition``."""
    if not condition:
        raise DialectError(400, message, param)


def expect_object(body: Any) -> dict[str, Any]:
    """``body`` if it is a JSON object, else a 400."""
    expect(isinstance(body, dict), "request body must be a JSON object")
    return body


def one_of(value: Any, options: frozenset[str] | dict[str, Any]) -> bool:
    """Whether ``value`` is one of the string ``options``; False for any non-string, hashable or not."""
    return isinstance(value, str) and value in options


def json_text(value: Any, param: str | None = None) -> str:
    """Compact JSON text of a request value (tool arguments); a value nested too deeply is a 400."""
    try:
        return dumps_bounded(value).decode()
    except NestingError:
        raise DialectError(400, f"value nests deeper than {MAX_REQUEST_DEPTH} levels", param) from None


def expect_bounded(value: Any, param: str | None = None) -> None:
    """A 400 unless ``value`` nests at most ``MAX_REQUEST_DEPTH`` levels: for what a reply repeats but the
    engine request (whose serialisation checks the rest) does not carry."""
    try:
        check_depth(value)
    except NestingError:
        raise DialectError(400, f"value nests deeper than {MAX_REQUEST_DEPTH} levels", param) from None


def optional_bool(body: dict[str, Any], key: str) -> bool:
    """``body[key]`` as a bool (absent or null is False); a non-boolean is a 400."""
    value = body.get(key)
    expect(value is None or isinstance(value, bool), f"'{key}' must be a boolean", key)
    return bool(value)


def model_name(body: dict[str, Any]) -> str:
    """The requested model name, ``""`` when absent; a non-string is a 400."""
    model = body.get("model")
    expect(model is None or isinstance(model, str), "'model' must be a string", "model")
    return model or ""


def drop_empty_tools(body: dict[str, Any]) -> None:
    """Without tools, remove ``tools``, ``tool_choice`` and ``parallel_tool_calls`` (vLLM rejects them alone)."""
    if not body.get("tools"):
        for key in ("tools", "tool_choice", "parallel_tool_calls"):
            body.pop(key, None)


def join_text_parts(parts: list[Any], text_types: frozenset[str], param: str) -> str:
    """The ``text`` of every content part joined with newlines; a non-text part is a 400.

    Images, audio and files are refused: the proxy trains on token ids alone.
    """
    texts = []
    for part in parts:
        expect(isinstance(part, dict), "content parts must be objects", param)
        kind = part.get("type")
        if not one_of(kind, text_types):
            raise DialectError(
                400, f"content part type {kind!r} is not supported: the capture proxy serves text only", param
            )
        text = part.get("text")
        expect(isinstance(text, str), f"content part {kind!r} needs a string 'text'", param)
        texts.append(text)
    return "\n".join(texts)


def function_tool(name: Any, description: Any, parameters: Any, param: str) -> dict[str, Any]:
    """An OpenAI chat function tool; validates the name, defaults empty parameters to an empty object schema."""
    expect(isinstance(name, str) and bool(name), "tool name must be a non-empty string", param)
    expect(parameters is None or isinstance(parameters, dict), "tool parameters must be a JSON schema object", param)
    function: dict[str, Any] = {"name": name, "parameters": parameters or {"type": "object", "properties": {}}}
    if description:
        expect(isinstance(description, str), "tool description must be a string", param)
        function["description"] = description
    return {"type": "function", "function": function}


def status_error_type(status: int, table: dict[int, str], default_4xx: str, default_5xx: str) -> str:
    """The error ``type`` a dialect reports for an HTTP status."""
    if status in table:
        return table[status]
    return default_5xx if status >= 500 else default_4xx
