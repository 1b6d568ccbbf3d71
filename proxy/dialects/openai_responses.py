"""OpenAI Responses (``POST /v1/responses``): codex (``wire_api = "responses"``).

Request translation:

- ``instructions`` and the leading run of ``system``/``developer`` message items
  become one system message (parts joined with a blank line); later ones stay
  in place as ``system`` messages.
- ``message`` items (``input_text``/``output_text`` parts, or a string) become
  user/assistant messages. Image and file parts are a 400.
- ``function_call``, ``local_shell_call`` and ``custom_tool_call`` items become
  assistant ``tool_calls``. Consecutive calls, and calls directly after an
  assistant message, form one assistant turn, as the model produced them.
  ``local_shell_call`` is a call of the function ``shell`` with arguments
  ``{"command": [...], "workdir"?, "timeout_ms"?}``; ``custom_tool_call`` is a
  call with arguments ``{"input": <text>}``.
- ``function_call_output``, ``local_shell_call_output`` and
  ``custom_tool_call_output`` items become ``tool`` messages.
- ``reasoning`` items are kept: their ``reasoning_text`` content (else their
  summary) becomes ``reasoning_content`` of the next assistant turn, so the
  engine's template sees what the model sampled. Reasoning with no following
  assistant turn, or with only ``encrypted_content``, is dropped.
- ``web_search_call`` items are skipped; any other item type is a 400.
- Tools: ``function`` tools map one to one; ``local_shell`` becomes the function
  ``shell`` (``command``: array of strings); a ``custom`` (freeform) tool becomes a
  function with one string parameter ``input``. Hosted tools (``web_search``,
  ``file_search``, ``mcp``, ``code_interpreter``, ...) are skipped: nobody here
  can run them.
- ``max_output_tokens`` -> ``max_tokens``; ``text.format`` -> ``response_format``
  (for the proxy's policy to judge). ``reasoning``, ``include``, ``store``,
  ``metadata``, ``prompt_cache_key``, ``truncation`` and ``text.verbosity`` are
  accepted and only echoed; reasoning is returned as plain text, never encrypted.
  ``previous_response_id``, ``conversation``, ``prompt`` and ``background`` need
  server-side state and are a 400.

Output: an optional ``reasoning`` item, a ``message`` item (when there is text,
or nothing else), then one item per tool call, typed by how its tool came in
(``function_call``, ``local_shell_call`` or ``custom_tool_call``), with
``call_id`` = the engine's tool call id. A reply cut at ``max_tokens`` has status
``incomplete`` (``incomplete_details.reason = "max_output_tokens"``) and its
stream ends in ``response.incomplete``, as OpenAI's does.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from proxy.dialects import openai_chat
from proxy.dialects.base import (
    SSE_COMMENT_KEEPALIVE,
    ChatRequest,
    DialectError,
    MessageMemo,
    StreamRenderer,
    chunks,
    convert_each,
    drop_empty_tools,
    engine_choice,
    engine_created,
    engine_reasoning,
    engine_text,
    engine_tool_calls,
    engine_usage,
    expect,
    expect_bounded,
    expect_object,
    function_tool,
    id_suffix,
    join_text_parts,
    json_text,
    model_name,
    optional_bool,
    parse_arguments,
    replay,
    sse_frame,
)

NAME = "openai_responses"
KEEPALIVE = SSE_COMMENT_KEEPALIVE
LOCAL_SHELL_TOOL = "shell"
"""The function name a ``local_shell`` tool and its calls take on the engine side."""

_LOCAL_SHELL_DESCRIPTION = "Runs a shell command and returns its output."
_LOCAL_SHELL_PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "description": "The command and its arguments."},
        "workdir": {"type": "string", "description": "The working directory to run the command in."},
        "timeout_ms": {"type": "integer", "description": "The timeout for the command in milliseconds."},
    },
    "required": ["command"],
    "additionalProperties": False,
}
_CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The raw input for the tool."}},
    "required": ["input"],
    "additionalProperties": False,
}
_SERVER_STATE = {
    "previous_response_id": "responses are not stored; send the full input",
    "conversation": "conversations are not stored; send the full input",
    "prompt": "stored prompt templates are not available",
    "background": "background responses are not available",
}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_CALL_ITEMS = frozenset({"function_call", "local_shell_call", "custom_tool_call"})
_OUTPUT_ITEMS = frozenset({"function_call_output", "local_shell_call_output", "custom_tool_call_output"})
_SKIPPED_ITEMS = frozenset({"web_search_call"})
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty")


# --- request ---------------------------------------------------------------------------------------------------------


def parse_request(body: Any, memo: MessageMemo | None = None) -> ChatRequest:
    """Translate a Responses request into a chat-completions body (see the module docstring); with the session's
    ``memo``, only the input items a resent input adds are read."""
    body = expect_object(body)
    model = model_name(body)
    stream = optional_bool(body, "stream")
    for key, reason in _SERVER_STATE.items():
        if body.get(key):
            raise DialectError(400, f"'{key}' is not supported: {reason}", key)
    instructions = body.get("instructions")
    expect(instructions is None or isinstance(instructions, str), "'instructions' must be a string", "instructions")
    tools, tool_kinds = _tools(body.get("tools"))

    out: dict[str, Any] = {"model": model, "messages": _messages(instructions, body.get("input"), memo)}
    if tools:
        out["tools"] = tools
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = optional_bool(body, "parallel_tool_calls")
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    for key in _SAMPLING:
        if body.get(key) is not None:
            out[key] = body[key]
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        out["response_format"] = response_format
    drop_empty_tools(out)
    echo = _echo(body)
    expect_bounded(echo)  # every reply repeats these fields, so they must always render
    return ChatRequest(dialect=NAME, body=out, model=model, stream=stream, tool_kinds=tool_kinds, echo=echo)


def _echo(body: dict[str, Any]) -> dict[str, Any]:
    """The request fields a response object repeats, with the API's defaults for those not sent."""
    defaults: dict[str, Any] = {
        "instructions": None,
        "max_output_tokens": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "reasoning": None,
        "store": True,
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "truncation": "disabled",
        "user": None,
    }
    return {key: default if body.get(key) is None else body[key] for key, default in defaults.items()}


def _tools(tools: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    if tools is None:
        return [], {}
    expect(isinstance(tools, list), "'tools' must be an array", "tools")
    out: list[dict[str, Any]] = []
    kinds: dict[str, str] = {}
    names: set[str] = set()
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        expect(isinstance(tool, dict), "each tool must be an object", param)
        kind = tool.get("type")
        if kind == "function":
            spec = function_tool(tool.get("name"), tool.get("description"), tool.get("parameters"), param)
        elif kind == "custom":
            spec = function_tool(tool.get("name"), tool.get("description"), _CUSTOM_PARAMETERS, param)
        elif kind == "local_shell":
            spec = function_tool(LOCAL_SHELL_TOOL, _LOCAL_SHELL_DESCRIPTION, _LOCAL_SHELL_PARAMETERS, param)
        else:
            continue
        name = spec["function"]["name"]
        expect(name not in names, f"duplicate tool name {name!r}", param)
        names.add(name)
        if kind != "function":
            kinds[name] = kind
        out.append(spec)
    return out, kinds


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    expect(isinstance(choice, dict), "'tool_choice' must be auto, none, required or a tool object", "tool_choice")
    kind = choice.get("type")
    if kind == "local_shell":
        return {"type": "function", "function": {"name": LOCAL_SHELL_TOOL}}
    if kind in ("function", "custom"):
        name = choice.get("name")
        expect(isinstance(name, str) and bool(name), "'tool_choice' needs a tool name", "tool_choice")
        return {"type": "function", "function": {"name": name}}
    raise DialectError(400, f"'tool_choice' of type {kind!r} is not supported", "tool_choice")


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    expect(isinstance(text, dict), "'text' must be an object", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    expect(isinstance(fmt, dict), "'text.format' must be an object", "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    expect(kind == "json_schema", f"'text.format' type {kind!r} is not supported", "text.format")
    schema = {key: fmt[key] for key in ("name", "schema", "strict", "description") if fmt.get(key) is not None}
    return {"type": "json_schema", "json_schema": schema}


def _messages(instructions: str | None, items: Any, memo: MessageMemo | None) -> list[dict[str, Any]]:
    """The chat messages of ``input``: each item read on its own (``_item``; with ``memo``, only the items a resent
    input adds), then folded in order (``_fold``)."""
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    expect(isinstance(items, list) and bool(items), "'input' must be a non-empty string or array", "input")
    return _fold(instructions, convert_each(items, _item, memo))


def _item(item: Any, index: int) -> list[tuple[str, Any]]:
    """What input item ``index`` adds to the conversation, checked: nothing (a skipped item, empty reasoning) or one
    step, ``("reasoning", text)``, ``("assistant", text)``, ``("call", tool call)``, ``("system", text)`` or
    ``("message", message)`` (a user message or a tool output)."""
    param = f"input[{index}]"
    expect(isinstance(item, dict), "each input item must be an object", param)
    kind = item.get("type", "message" if "role" in item else None)
    expect(kind is None or isinstance(kind, str), "input item 'type' must be a string", f"{param}.type")
    role = item.get("role") if kind == "message" else None
    if kind in _SKIPPED_ITEMS:
        return []
    if kind == "reasoning":
        text = _reasoning_text(item, param)
        return [("reasoning", text)] if text else []
    if role == "assistant":
        return [("assistant", _text(item.get("content"), f"{param}.content"))]
    if kind in _CALL_ITEMS:
        return [("call", _tool_call(item, kind, param))]
    if kind in _OUTPUT_ITEMS:
        call_id = item.get("call_id") or (item.get("id") if kind == "local_shell_call_output" else None)
        expect(isinstance(call_id, str) and bool(call_id), f"{kind} needs a 'call_id'", param)
        return [("message", {"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), param)})]
    if kind != "message":
        raise DialectError(400, f"input item type {kind!r} is not supported", param)
    if role in ("system", "developer"):
        return [("system", _text(item.get("content"), f"{param}.content"))]
    if role == "user":
        return [("message", {"role": "user", "content": _text(item.get("content"), f"{param}.content")})]
    raise DialectError(400, f"unknown message role {role!r}", f"{param}.role")


def _fold(instructions: str | None, steps: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """The messages of ``_item``'s steps in order: reasoning goes to the next assistant message; a tool call joins
    the assistant message before it (a new one if reasoning came between); anything else ends the model's turn
    (reasoning still pending belongs to none); system text before the first message joins ``instructions``.
    Every assistant message is made here, so the steps' own dicts (shared by a memo's later requests) are never
    changed."""
    system = [instructions] if instructions else []
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None

    def assistant(content: str) -> dict[str, Any]:
        nonlocal reasoning
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        reasoning = None
        messages.append(message)
        return message

    for kind, value in steps:
        if kind == "reasoning":
            reasoning = value if reasoning is None else f"{reasoning}\n{value}"
        elif kind == "assistant":
            assistant(value)
        elif kind == "call":
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant" or reasoning is not None:
                last = assistant("")
            last.setdefault("tool_calls", []).append(value)
        else:
            reasoning = None
            if kind == "message":
                messages.append(value)
            elif messages:
                messages.append({"role": "system", "content": value})
            else:
                system.append(value)
    if system:
        messages.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return messages


def _text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    expect(isinstance(content, list), "content must be a string or an array of parts", param)
    return join_text_parts(content, _TEXT_PARTS, param)


def _reasoning_text(item: dict[str, Any], param: str) -> str:
    parts = item.get("content") or item.get("summary") or []
    expect(isinstance(parts, list), "reasoning content must be an array", param)
    texts = []
    for part in parts:
        expect(isinstance(part, dict) and isinstance(part.get("text"), str), "reasoning parts need 'text'", param)
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_call(item: dict[str, Any], kind: str, param: str) -> dict[str, Any]:
    call_id = item.get("call_id") or (item.get("id") if kind == "local_shell_call" else None)
    expect(isinstance(call_id, str) and bool(call_id), f"{kind} needs a 'call_id'", param)
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
        if isinstance(arguments, dict):
            arguments = json_text(arguments, f"{param}.arguments")
        expect(isinstance(arguments, str), "function_call 'arguments' must be a string", param)
    elif kind == "custom_tool_call":
        name, text = item.get("name"), item.get("input")
        expect(isinstance(text, str), "custom_tool_call 'input' must be a string", param)
        arguments = json_text({"input": text}, param)
    else:
        name = LOCAL_SHELL_TOOL
        action = item.get("action")
        expect(isinstance(action, dict), "local_shell_call needs an 'action' object", param)
        shell: dict[str, Any] = {"command": action.get("command") or []}
        if action.get("working_directory") is not None:
            shell["workdir"] = action["working_directory"]
        if action.get("timeout_ms") is not None:
            shell["timeout_ms"] = action["timeout_ms"]
        arguments = json_text(shell, f"{param}.action")
    expect(isinstance(name, str) and bool(name), f"{kind} needs a 'name'", param)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# --- response --------------------------------------------------------------------------------------------------------


def _output_items(engine: dict[str, Any], request: ChatRequest, status: str) -> list[dict[str, Any]]:
    suffix = id_suffix(engine)
    items: list[dict[str, Any]] = []
    reasoning = engine_reasoning(engine)
    if reasoning:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{suffix}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
    text = engine_text(engine)
    calls = engine_tool_calls(engine)
    if text or not calls:
        items.append(
            {
                "type": "message",
                "id": f"msg_{suffix}",
                "status": status,
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for index, call in enumerate(calls):
        kind = request.tool_kinds.get(call["name"])
        if kind == "local_shell":
            items.append(
                {
                    "type": "local_shell_call",
                    "id": f"lsh_{suffix}_{index}",
                    "call_id": call["id"],
                    "status": "completed",
                    "action": _shell_action(call["arguments"]),
                }
            )
        elif kind == "custom":
            items.append(
                {
                    "type": "custom_tool_call",
                    "id": f"ctc_{suffix}_{index}",
                    "call_id": call["id"],
                    "name": call["name"],
                    "input": _custom_input(call["arguments"]),
                }
            )
        else:
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{suffix}_{index}",
                    "call_id": call["id"],
                    "name": call["name"],
                    "arguments": call["arguments"],
                    "status": "completed",
                }
            )
    return items


def _shell_action(arguments: str) -> dict[str, Any]:
    """The ``exec`` action of a ``shell`` call; a string command becomes ``[command]``, anything else ``[]``."""
    parsed = parse_arguments(arguments)
    parsed = parsed if isinstance(parsed, dict) else {}
    command = parsed.get("command")
    if isinstance(command, str):
        command = [command]
    elif not isinstance(command, list):
        command = []
    workdir, timeout = parsed.get("workdir"), parsed.get("timeout_ms")
    return {
        "type": "exec",
        "command": [part if isinstance(part, str) else orjson.dumps(part).decode() for part in command],
        "env": {},
        "timeout_ms": timeout if isinstance(timeout, int) and not isinstance(timeout, bool) else None,
        "working_directory": workdir if isinstance(workdir, str) else None,
        "user": None,
    }


def _custom_input(arguments: str) -> str:
    """A custom tool's text: ``arguments["input"]``, else the raw arguments."""
    parsed = parse_arguments(arguments)
    if isinstance(parsed, dict) and isinstance(parsed.get("input"), str):
        return parsed["input"]
    return arguments


def _response(
    engine: dict[str, Any], request: ChatRequest, status: str, output: list[dict[str, Any]], usage: Any
) -> dict[str, Any]:
    return {
        "id": f"resp_{id_suffix(engine)}",
        "object": "response",
        "created_at": engine_created(engine),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": request.model or engine.get("model", ""),
        "output": output,
        "previous_response_id": None,
        "usage": usage,
        **request.echo,
    }


def _status(engine: dict[str, Any]) -> str:
    return "incomplete" if engine_choice(engine).get("finish_reason") == "length" else "completed"


def render_response(engine: dict[str, Any], request: ChatRequest) -> dict[str, Any]:
    """The Responses ``response`` object for one engine completion."""
    status = _status(engine)
    prompt, completion, cached = engine_usage(engine)
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }
    return _response(engine, request, status, _output_items(engine, request, status), usage)


def stream_renderer(request: ChatRequest) -> StreamRenderer:
    """Responses SSE events as the engine samples, ``response.created`` to ``response.completed``."""
    return _EventStream(request)


def render_stream(engine: dict[str, Any], request: ChatRequest) -> list[bytes]:
    """The response as Responses SSE events, ``response.created`` to ``response.completed``."""
    return replay(_EventStream(request), engine)


_Event = Callable[..., bytes]


class _EventStream:
    """The events of one response. Reasoning and text stream into their items as they arrive (a reasoning item
    first, then the message item); ``finish`` closes the open item and sends every other item whole."""

    def __init__(self, request: ChatRequest) -> None:
        self.request = request
        self.sequence = itertools.count()
        self.suffix = ""
        self.opened = 0  # output items opened by deltas
        self.open: str | None = None  # the type of the item still open
        self.reasoning: list[str] = []

    def event(self, kind: str, **fields: Any) -> bytes:
        return sse_frame({"type": kind, "sequence_number": next(self.sequence), **fields}, kind)

    def start(self, head: dict[str, Any]) -> list[bytes]:
        self.suffix = id_suffix(head)
        started = _response(head, self.request, "in_progress", [], None)
        return [self.event("response.created", response=started), self.event("response.in_progress", response=started)]

    def delta(self, fields: dict[str, str]) -> list[bytes]:
        frames = []
        for key, text in fields.items():
            kind = "message" if key == "content" else "reasoning"
            if self.open != kind:
                frames += self._open(kind)
            where = {"item_id": self._item_id(kind), "output_index": self.opened - 1, "content_index": 0}
            if kind == "message":
                frames += (
                    self.event("response.output_text.delta", **where, delta=p, logprobs=[]) for p in chunks(text)
                )
            else:
                self.reasoning.append(text)
                frames += (self.event("response.reasoning_text.delta", **where, delta=p) for p in chunks(text))
        return frames

    def _item_id(self, kind: str) -> str:
        return f"{'msg' if kind == 'message' else 'rs'}_{self.suffix}"

    def _open(self, kind: str) -> list[bytes]:
        """Open the item of ``kind``, closing the reasoning item if it was open (reasoning never follows text)."""
        frames = []
        if self.open == "reasoning":
            content = [{"type": "reasoning_text", "text": "".join(self.reasoning)}]
            item = {"type": "reasoning", "id": self._item_id("reasoning"), "summary": [], "content": content}
            frames = _reasoning_close(self.event, self.opened - 1, item)
        self.open = kind
        self.opened += 1
        if kind == "message":
            item = {"type": "message", "id": self._item_id(kind), "status": "in_progress", "role": "assistant"}
            part = {"type": "output_text", "text": "", "annotations": []}
            return frames + _message_open(self.event, self.opened - 1, {**item, "content": [part]})
        item = {"type": "reasoning", "id": self._item_id(kind), "summary": [], "content": []}
        return frames + _reasoning_open(self.event, self.opened - 1, item)

    def finish(self, engine: dict[str, Any]) -> list[bytes]:
        final = render_response(engine, self.request)
        items = final["output"]
        frames = []
        if self.open is not None:
            close = _message_close if self.open == "message" else _reasoning_close
            frames += close(self.event, self.opened - 1, items[self.opened - 1])
        for index in range(self.opened, len(items)):
            frames += _ITEM_EVENTS[items[index]["type"]](self.event, index, items[index])
        done = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return [*frames, self.event(done, response=final)]


def _message_open(event: _Event, index: int, item: dict[str, Any]) -> list[bytes]:
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [
        event("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []}),
        event("response.content_part.added", **where, part={**item["content"][0], "text": ""}),
    ]


def _message_close(event: _Event, index: int, item: dict[str, Any]) -> list[bytes]:
    part = item["content"][0]
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [
        event("response.output_text.done", **where, text=part["text"], logprobs=[]),
        event("response.content_part.done", **where, part=part),
        event("response.output_item.done", output_index=index, item=item),
    ]


def _message_events(event: _Event, index: int, item: dict[str, Any]) -> list[bytes]:
    text = item["content"][0]["text"]
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [
        *_message_open(event, index, item),
        *(event("response.output_text.delta", **where, delta=piece, logprobs=[]) for piece in chunks(text)),
        *_message_close(event, index, item),
    ]


def _reasoning_open(event: _Event, index: int, item: dict[str, Any]) -> list[bytes]:
    return [event("response.output_item.added", output_index=index, item={**item, "content": []})]


def _reasoning_close(event: _Event, index: int, item: dict[str, Any]) -> list[bytes]:
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [
        event("response.reasoning_text.done", **where, text=item["content"][0]["text"]),
        event("response.output_item.done", output_index=index, item=item),
    ]


def _reasoning_events(event: _Event, index: int, item: dict[str, Any]) -> list[bytes]:
    text = item["content"][0]["text"]
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [
        *_reasoning_open(event, index, item),
        *(event("response.reasoning_text.delta", **where, delta=piece) for piece in chunks(text)),
        *_reasoning_close(event, index, item),
    ]


def _function_call_events(event: _Event, index: int, item: dict[str, Any]) -> list[bytes]:
    where = {"item_id": item["id"], "output_index": index}
    arguments = item["arguments"]
    added = {**item, "arguments": "", "status": "in_progress"}
    return [
        event("response.output_item.added", output_index=index, item=added),
        *(event("response.function_call_arguments.delta", **where, delta=piece) for piece in chunks(arguments)),
        event("response.function_call_arguments.done", **where, name=item["name"], arguments=arguments),
        event("response.output_item.done", output_index=index, item=item),
    ]


def _custom_tool_call_events(event: _Event, index: int, item: dict[str, Any]) -> list[bytes]:
    where = {"item_id": item["id"], "output_index": index}
    text = item["input"]
    return [
        event("response.output_item.added", output_index=index, item={**item, "input": ""}),
        *(event("response.custom_tool_call_input.delta", **where, delta=piece) for piece in chunks(text)),
        event("response.custom_tool_call_input.done", **where, input=text),
        event("response.output_item.done", output_index=index, item=item),
    ]


def _local_shell_call_events(event: _Event, index: int, item: dict[str, Any]) -> list[bytes]:
    return [
        event("response.output_item.added", output_index=index, item={**item, "status": "in_progress"}),
        event("response.output_item.done", output_index=index, item=item),
    ]


_ITEM_EVENTS: dict[str, Callable[[_Event, int, dict[str, Any]], list[bytes]]] = {
    "message": _message_events,
    "reasoning": _reasoning_events,
    "function_call": _function_call_events,
    "custom_tool_call": _custom_tool_call_events,
    "local_shell_call": _local_shell_call_events,
}


# --- errors ----------------------------------------------------------------------------------------------------------

render_error = openai_chat.render_error
"""The OpenAI error body, ``{"error": {"message", "type", "param", "code"}}``, as for chat completions."""


def render_stream_error(
    status: int,
    message: str,
    type: str | None = None,
    *,
    code: str | None = None,
    param: str | None = None,
    request: ChatRequest | None = None,
) -> bytes:
    """A ``response.failed`` event whose ``response.error`` carries ``code`` and ``message`` (what codex reads).

    ``code`` defaults from the status: ``rate_limit_exceeded`` (429), ``server_error`` (5xx), else ``invalid_prompt``.
    """
    if code is None:
        code = "rate_limit_exceeded" if status == 429 else "server_error" if status >= 500 else "invalid_prompt"
    response = {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "failed",
        "error": {"code": code, "message": message},
        "incomplete_details": None,
        "model": request.model if request else "",
        "output": [],
        "previous_response_id": None,
        "usage": None,
        **(request.echo if request else _echo({})),
    }
    return sse_frame({"type": "response.failed", "sequence_number": 0, "response": response}, "response.failed")
