"""What an agent sees on the wire, checked strictly: one valid body per dialect, raw posts with a deadline,
the dialects' error shapes, and SSE streams that must parse and end in the dialect's terminal event."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

CHAT, RESPONSES, ANTHROPIC = "/v1/chat/completions", "/v1/responses", "/v1/messages"
ROUTES = (CHAT, RESPONSES, ANTHROPIC)

TOOL_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def valid_body(route: str, *, stream: bool = False, marker: str = "task") -> dict[str, Any]:
    """A small, valid request of the route's dialect, with a tool (the fake engine answers a tool call first)."""
    if route == CHAT:
        body: dict[str, Any] = {
            "model": "m",
            "messages": [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": marker}],
            "tools": [{"type": "function", "function": {"name": "bash", "parameters": TOOL_SCHEMA}}],
            "temperature": 0.5,
        }
    elif route == RESPONSES:
        body = {
            "model": "m",
            "instructions": "You are an agent.",
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": marker}]}],
            "tools": [{"type": "function", "name": "bash", "parameters": TOOL_SCHEMA}],
            "metadata": {"run": "1"},
        }
    else:
        body = {
            "model": "m",
            "max_tokens": 64,
            "system": [{"type": "text", "text": "You are an agent."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": marker}]}],
            "tools": [{"name": "bash", "input_schema": TOOL_SCHEMA}],
        }
    if stream:
        body["stream"] = True
    return orjson.loads(orjson.dumps(body))  # a fresh copy: callers mutate it


def agent_headers(route: str, key: str) -> dict[str, str]:
    if route == ANTHROPIC:
        return {"x-api-key": key, "anthropic-version": "2023-06-01", "Content-Type": "application/json"}
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


@dataclass
class Reply:
    status: int
    content_type: str
    body: bytes

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


async def post(
    http: aiohttp.ClientSession,
    url: str,
    data: bytes | dict[str, Any],
    headers: dict[str, str],
    timeout_s: float = 20.0,
) -> Reply:
    """POST and read the whole reply; a reply that does not end within ``timeout_s`` fails the test."""
    payload = data if isinstance(data, bytes) else orjson.dumps(data)

    async def go() -> Reply:
        async with http.post(url, data=payload, headers=headers) as resp:
            return Reply(resp.status, resp.headers.get("Content-Type", ""), await resp.read())

    try:
        return await asyncio.wait_for(go(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"no complete reply within {timeout_s}s from {url}") from None


def assert_error_shape(route: str, reply: Reply) -> dict[str, Any]:
    """The reply is the route's JSON error body (the control plane answers OpenAI's); returns its ``error``."""
    assert reply.content_type.startswith("application/json"), (reply.status, reply.content_type, reply.body[:300])
    body = reply.json
    assert isinstance(body, dict), body
    if route.startswith(ANTHROPIC):
        assert body.get("type") == "error" and set(body) == {"type", "error"}, body
        error = body["error"]
        assert isinstance(error, dict) and set(error) == {"type", "message"}, body
    else:
        assert set(body) == {"error"}, body
        error = body["error"]
        assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, body
    assert isinstance(error["type"], str) and error["type"], body
    assert isinstance(error["message"], str), body
    return error


def parse_sse(raw: bytes) -> list[tuple[str | None, Any]]:
    """``(event, data)`` per SSE frame (comments skipped, ``[DONE]`` kept as a string); anything that is not
    well-formed SSE with one JSON ``data`` line per frame fails the test."""
    assert raw.endswith(b"\n\n"), f"the stream does not end with a complete frame: {raw[-300:]!r}"
    frames = []
    for block in raw[:-2].split(b"\n\n"):
        event, data = None, None
        for line in block.split(b"\n"):
            if line.startswith(b":"):
                continue
            name, sep, value = line.partition(b": ")
            assert sep, f"not an SSE line: {line[:200]!r}"
            if name == b"event":
                event = value.decode()
            elif name == b"data":
                assert data is None, f"two data lines in one frame: {block[:300]!r}"
                data = value.decode() if value == b"[DONE]" else orjson.loads(value)
            else:
                raise AssertionError(f"unexpected SSE field: {line[:200]!r}")
        if data is not None:
            frames.append((event, data))
        else:
            assert event is None, f"an event without data: {block[:200]!r}"
    return frames


TERMINAL_EVENTS = {
    RESPONSES: {"response.completed", "response.incomplete", "response.failed"},
    ANTHROPIC: {"message_stop", "error"},
}


def stream_outcome(route: str, reply: Reply) -> tuple[list[tuple[str | None, Any]], dict[str, Any] | None]:
    """A streamed reply's frames and its error (None if it completed); fails the test unless the stream parses
    and ends in the dialect's terminal event: ``[DONE]`` or an error frame (chat), ``response.completed`` /
    ``incomplete`` / ``failed`` (Responses), ``message_stop`` or ``error`` (Anthropic)."""
    assert reply.status == 200 and reply.content_type.startswith("text/event-stream"), (reply.status, reply.body[:300])
    assert b"HTTP/1." not in reply.body, f"a second HTTP response inside the stream: {reply.body[-500:]!r}"
    frames = parse_sse(reply.body)
    assert frames, "an empty stream"
    event, data = frames[-1]
    if route == CHAT:
        if data == "[DONE]":
            return frames, None
        assert isinstance(data, dict) and set(data) == {"error"}, f"the chat stream ended without [DONE]: {data}"
        return frames, data["error"]
    assert event in TERMINAL_EVENTS[route], f"the stream ended in {event!r}"
    assert isinstance(data, dict) and data.get("type") == event, data
    if event == "response.failed":
        return frames, data["response"]["error"]
    if event == "error":
        return frames, data["error"]
    return frames, None
