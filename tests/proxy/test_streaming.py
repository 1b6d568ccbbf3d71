"""Streamed replies are streamed: the agent reads text while the engine samples it, the turn is recorded only once
the stream completed, the capture is exactly what the engine streamed, and a stream that fails on the way records
nothing and ends in the dialect's error event."""

from __future__ import annotations

import asyncio
import gc
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from orjson import JSONDecodeError

from proxy import engine_client, server
from proxy.__main__ import parse_args
from proxy.dialects import DIALECTS
from proxy.dialects.base import DELTA_CHARS, StreamRenderer
from proxy.engine_client import MalformedUpstream, StreamAssembler, UpstreamError
from tests.proxy.proxy_stack import Stack, run_stack
from tests.proxy.test_dialects import (
    CLAUDE_CODE_REQUEST,
    CODEX_REQUEST,
    ENGINE_REPLIES,
    OPENCODE_REQUEST,
    accumulate_anthropic,
    accumulate_chat,
    accumulate_responses,
)
from tests.proxy.wire import (
    ANTHROPIC,
    CHAT,
    RESPONSES,
    ROUTES,
    Reply,
    agent_headers,
    parse_sse,
    post,
    stream_outcome,
    valid_body,
)
from tests.support.wait import until

TOKENS = 40
TOKEN_LATENCY_S = 0.05


def _text_body(route: str, *, stream: bool, marker: str = "task") -> dict[str, Any]:
    """A valid body without tools: the fake engine answers it in text."""
    body = valid_body(route, stream=stream, marker=marker)
    del body["tools"]
    return body


def _is_text_delta(route: str, event: str | None, data: Any) -> bool:
    if route == CHAT:
        return isinstance(data, dict) and any(c["delta"].get("content") for c in data.get("choices") or [])
    if route == RESPONSES:
        return event == "response.output_text.delta"
    return event == "content_block_delta" and data["delta"]["type"] == "text_delta"


async def _timed_stream(stack: Stack, route: str, key: str, body: dict[str, Any]) -> tuple[float, float, bytes]:
    """Seconds to the first text delta and to the end of the stream, and the stream's bytes."""
    started = time.monotonic()
    first = None
    raw = b""
    async with stack.http.post(stack.url + route, json=body, headers=agent_headers(route, key)) as resp:
        assert resp.status == 200
        while line := await resp.content.readline():
            raw += line
            if first is None and line == b"\n" and any(_is_text_delta(route, *f) for f in _frames(raw)[-1:]):
                first = time.monotonic() - started
    assert first is not None, raw[-500:]
    return first, time.monotonic() - started, raw


def _reply(route: str, frames: list[tuple[str | None, Any]]) -> Any:
    """What the agent's client makes of a stream: the text and tool calls, as ``_json_reply`` gives them."""
    if route == CHAT:
        message = accumulate_chat(frames)["message"]
        return message["content"], [(c["id"], c["name"], c["arguments"]) for c in message["tool_calls"]]
    if route == RESPONSES:
        return accumulate_responses(frames)
    return accumulate_anthropic(frames)["content"]


def _json_reply(route: str, answer: dict[str, Any]) -> Any:
    if route == CHAT:
        message = answer["choices"][0]["message"]
        calls = [
            (c.get("id"), c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []
        ]
        return message["content"] or "", calls
    if route == RESPONSES:
        return answer["output"]
    return answer["content"]


def _turn(trace: dict[str, Any]) -> tuple[Any, ...]:
    [turn] = trace["turns"]
    return turn["prompt_token_ids"], turn["completion_token_ids"], turn["per_token_logps"]


@pytest.mark.parametrize("route", ROUTES)
def test_text_reaches_the_agent_while_the_engine_samples(tmp_path: Path, route: str) -> None:
    """40+ tokens at 50 ms each: the first text delta arrives after about one token, not after all of them; the
    recorded turn and the reply equal those of the same completion asked for without streaming."""

    async def body(stack: Stack) -> None:
        stack.engine.completion_chars = 6 * TOKENS  # about 5.4 characters a word, one id per 4 characters
        streamed, whole = await stack.create_session(), await stack.create_session()
        stack.engine.token_latency_s = TOKEN_LATENCY_S
        first, total, raw = await _timed_stream(stack, route, streamed.api_key, _text_body(route, stream=True))
        assert total > TOKENS * TOKEN_LATENCY_S and first < 0.5, (first, total)  # 50 ms a token, 40 tokens: 2 s
        frames, error = stream_outcome(route, _raw_reply(raw))
        assert error is None
        stack.engine.token_latency_s = 0
        reply = await post(
            stack.http, stack.url + route, _text_body(route, stream=False), agent_headers(route, whole.api_key)
        )
        assert reply.status == 200
        assert _reply(route, frames) == _json_reply(route, reply.json)
        trace = _turn(await stack.trace(streamed.session_id))
        assert trace == _turn(await stack.trace(whole.session_id)) and len(trace[1]) > TOKENS and trace[2] is not None

    run_stack(body, tmp_path)


def test_text_sampled_token_by_token_is_written_at_most_once_per_flush_interval(tmp_path: Path) -> None:
    """60 tokens at 5 ms each, a 50 ms flush interval: the first text is written as it arrives (one token's
    text, not an interval's), then at most one text write per interval, not one per token; the reply and the
    recorded turn are those of the same completion asked for without streaming."""
    flush_s, tokens = 0.05, 60

    async def body(stack: Stack) -> None:
        stack.engine.completion_chars = 6 * tokens
        streamed, whole = await stack.create_session(), await stack.create_session()
        stack.engine.token_latency_s = 0.005
        _, total, raw = await _timed_stream(stack, CHAT, streamed.api_key, _text_body(CHAT, stream=True))
        texts = [c["delta"]["content"] for _, d in _frames(raw) if _is_text_delta(CHAT, None, d) for c in d["choices"]]
        assert len(texts[0]) <= 3 * 4, texts  # about one token's text (4 characters a token)
        assert len(texts) <= 2 + total / flush_s, (len(texts), total)
        assert len("".join(texts)) > 3 * tokens
        stack.engine.token_latency_s = 0
        reply = await post(
            stack.http, stack.url + CHAT, _text_body(CHAT, stream=False), agent_headers(CHAT, whole.api_key)
        )
        assert _reply(CHAT, stream_outcome(CHAT, _raw_reply(raw))[0]) == _json_reply(CHAT, reply.json)
        assert _turn(await stack.trace(streamed.session_id)) == _turn(await stack.trace(whole.session_id))

    run_stack(body, tmp_path, stream_flush_s=flush_s)


def test_text_waiting_for_its_flush_is_written_while_the_engine_is_silent(tmp_path: Path) -> None:
    """The text of the tokens after the first write is written when the flush interval ends, not held until
    the engine sends again: here the engine pauses after 3 tokens, and the agent has their text meanwhile."""

    async def body(stack: Stack) -> None:
        session, whole = await stack.create_session(), await stack.create_session()
        headers = agent_headers(CHAT, whole.api_key)
        reply = await post(stack.http, stack.url + CHAT, _text_body(CHAT, stream=False), headers)
        expected = reply.json["choices"][0]["message"]["content"][: 3 * 4]
        resume = asyncio.Event()
        stack.engine.token_latency_s = 0.005
        stack.engine.faults = [("pause", 4, resume)]
        async with stack.http.post(
            stack.url + CHAT, json=_text_body(CHAT, stream=True), headers=agent_headers(CHAT, session.api_key)
        ) as resp:
            seen = b""
            while "".join(c["delta"].get("content") or "" for _, d in _frames(seen) for c in d["choices"]) != expected:
                line = await asyncio.wait_for(resp.content.readline(), 10)
                assert line, seen
                seen += line
            resume.set()
            raw = seen + await resp.read()
        assert stream_outcome(CHAT, _raw_reply(raw))[1] is None

    run_stack(body, tmp_path, stream_flush_s=0.05)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("tool_ids", [True, False])
def test_a_streamed_tool_call_is_the_reply_a_whole_one_is(tmp_path: Path, route: str, tool_ids: bool) -> None:
    """Tool calls come as deltas and reach the agent whole; a call the engine streamed without an id (vLLM
    #27482) gets the id the proxy mints for a reply without one."""

    async def body(stack: Stack) -> None:
        streamed, whole = await stack.create_session(), await stack.create_session()
        stack.engine.faults = [None if tool_ids else ("no_tool_ids",), None if tool_ids else ("patch", _no_tool_ids)]
        reply = await post(
            stack.http, stack.url + route, valid_body(route, stream=True), agent_headers(route, streamed.api_key)
        )
        frames, error = stream_outcome(route, reply)
        assert error is None
        reply = await post(stack.http, stack.url + route, valid_body(route), agent_headers(route, whole.api_key))
        assert reply.status == 200
        got, expected = _reply(route, frames), _json_reply(route, reply.json)
        assert all(_tool_ids(route, got)) and all(_tool_ids(route, expected))
        assert got == expected
        assert _turn(await stack.trace(streamed.session_id)) == _turn(await stack.trace(whole.session_id))

    run_stack(body, tmp_path)


def _tool_ids(route: str, reply: Any) -> list[str]:
    if route == CHAT:
        return [call[0] for call in reply[1]]
    if route == RESPONSES:
        return [item["call_id"] for item in reply if "call_id" in item]
    return [block["id"] for block in reply if block["type"] == "tool_use"]


def _no_tool_ids(completion: dict[str, Any]) -> dict[str, Any]:
    for call in completion["choices"][0]["message"]["tool_calls"]:
        del call["id"]
    return completion


def _raw_reply(raw: bytes) -> Reply:
    return Reply(200, "text/event-stream", raw)


def _journal_calls(stack: Stack) -> int:
    return sum(path.read_bytes().count(b'"kind":"call"') for path in stack.proxy.sessions.journal_dir.iterdir())


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (("cut", 6), "ended before data: [DONE]"),
        (("bad_chunk", 6), "invalid JSON in a stream chunk"),
        (("error_event", 6), "injected stream error"),
    ],
)
def test_a_stream_that_fails_midway_records_nothing(
    tmp_path: Path, route: str, fault: tuple[str, int], message: str
) -> None:
    """The agent already read some text; the stream ends in the dialect's error event, nothing is recorded, and
    the engine is not asked again (a retry after the first chunk would send the agent a second reply)."""

    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        key = session.api_key
        calls = stack.engine.calls
        stack.engine.faults = [fault]
        reply = await post(stack.http, stack.url + route, _text_body(route, stream=True), agent_headers(route, key))
        frames, error = stream_outcome(route, reply)
        assert error is not None and message in error["message"], frames[-1]
        assert any(_is_text_delta(route, event, data) for event, data in frames)
        assert stack.engine.calls == calls + 1
        assert len((await stack.trace(session.session_id))["turns"]) == 0 and _journal_calls(stack) == 0
        reply = await post(stack.http, stack.url + route, _text_body(route, stream=True), agent_headers(route, key))
        assert stream_outcome(route, reply)[1] is None and len((await stack.trace(session.session_id))["turns"]) == 1

    run_stack(body, tmp_path)


@pytest.mark.parametrize("route", ROUTES)
def test_a_session_deleted_midstream_records_nothing(tmp_path: Path, route: str) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        key = session.api_key
        calls = stack.engine.calls
        resume = asyncio.Event()
        stack.engine.faults = [("pause", 6, resume)]
        call = asyncio.create_task(
            post(stack.http, stack.url + route, _text_body(route, stream=True), agent_headers(route, key))
        )
        await until(lambda: stack.engine.calls == calls + 1, "the stream did not reach the engine")
        await asyncio.to_thread(stack.admin.delete, session.session_id)
        resume.set()
        frames, error = stream_outcome(route, await call)
        assert error is not None and "deleted" in error["message"]
        assert any(_is_text_delta(route, event, data) for event, data in frames)
        assert list(stack.proxy.sessions.journal_dir.iterdir()) == []

    run_stack(body, tmp_path)


@pytest.mark.parametrize("route", ROUTES)
def test_an_agent_that_leaves_midstream_cancels_the_engine_call_and_records_nothing(tmp_path: Path, route: str) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        key = session.api_key
        resume = asyncio.Event()
        stack.engine.faults = [("pause", 6, resume)]
        async with stack.http.post(
            stack.url + route, json=_text_body(route, stream=True), headers=agent_headers(route, key)
        ) as resp:
            seen = b""
            while not any(_is_text_delta(route, e, d) for e, d in _frames(seen)):
                line = await resp.content.readline()
                assert line, f"the stream ended before any text: {seen[-300:]!r}"
                seen += line
            resp.close()  # the agent goes away while the engine still samples
        await until(lambda: stack.engine.cancelled == 1, "the engine's stream was not dropped")
        resume.set()
        assert len((await stack.trace(session.session_id))["turns"]) == 0 and _journal_calls(stack) == 0
        reply = await post(stack.http, stack.url + route, _text_body(route, stream=True), agent_headers(route, key))
        assert stream_outcome(route, reply)[1] is None and len((await stack.trace(session.session_id))["turns"]) == 1

    run_stack(body, tmp_path)


def _frames(raw: bytes) -> list[tuple[str | None, Any]]:
    """The complete frames of a partly read stream."""
    out = []
    for block in raw.split(b"\n\n")[:-1]:
        event = None
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                event = line[7:].decode()
            elif line.startswith(b"data: {"):
                out.append((event, orjson.loads(line[6:])))
    return out


def test_keepalives_fill_a_silence_in_the_middle_of_a_stream(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        key = session.api_key
        resume = asyncio.Event()
        stack.engine.faults = [("pause", 6, resume)]
        async with stack.http.post(
            stack.url + CHAT, json=_text_body(CHAT, stream=True), headers=agent_headers(CHAT, key)
        ) as resp:
            lines: list[bytes] = []
            while not re.search(rb'"content":"[^"].*: keepalive\n.*: keepalive\n', b"".join(lines), re.DOTALL):
                line = await asyncio.wait_for(resp.content.readline(), 30)
                assert line, lines
                lines.append(line)
            resume.set()
            raw = b"".join(lines) + await resp.content.read()
        assert stream_outcome(CHAT, _raw_reply(raw))[1] is None
        assert len((await stack.trace(session.session_id))["turns"]) == 1

    run_stack(body, tmp_path, keepalive_s=0.1)


def test_a_stream_that_ends_before_a_keepalive_is_due_starts_no_keepalive_task(tmp_path: Path) -> None:
    """A keepalive is a timer until one is due (a task per stream is a fixed cost of every streamed call)."""

    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        loop = asyncio.get_running_loop()
        started: list[str] = []

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            started.append(getattr(coro, "__qualname__", ""))
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)
        try:
            reply = await post(
                stack.http, stack.url + CHAT, _text_body(CHAT, stream=True), agent_headers(CHAT, session.api_key)
            )
        finally:
            loop.set_task_factory(None)
        assert stream_outcome(CHAT, reply)[1] is None
        assert started and not [name for name in started if "keepalive" in name.lower()], started

    run_stack(body, tmp_path)


def test_a_prompt_of_megabytes_streams(tmp_path: Path) -> None:
    """The first chunk carries the prompt's ids on one line (here about 2 MB): no line-length limit applies."""

    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        key = session.api_key
        request = _text_body(CHAT, stream=True, marker="x" * 1_000_000)
        request["return_token_ids"] = True
        reply = await post(stack.http, stack.url + CHAT, request, agent_headers(CHAT, key))
        frames, error = stream_outcome(CHAT, reply)
        assert error is None and len(frames[0][1]["prompt_token_ids"]) > 250_000
        assert len((await stack.trace(session.session_id))["turns"]) == 1

    run_stack(body, tmp_path, max_body_bytes=4_000_000)


# --- the assembler ---------------------------------------------------------------------------------------------


def _chunk(delta: dict[str, Any] | None = None, ids: list[int] | None = None, **choice: Any) -> dict[str, Any]:
    logprobs = None if ids is None else {"content": [{"token": f"token_id:{i}", "logprob": -0.5} for i in ids]}
    fields = {"index": 0, "delta": delta or {}, "logprobs": logprobs, "token_ids": ids, **choice}
    return {"id": "chatcmpl-1", "created": 7, "model": "m", "choices": [fields]}


_HEAD = _chunk({"role": "assistant", "content": ""})


def _assemble(chunks: list[dict[str, Any]], batched: bool = False) -> dict[str, Any]:
    """The reply of ``chunks`` added one by one, or, ``batched``, behind a head chunk in one ``add_batch`` (so the
    chunks after it can take the batch path)."""
    assembler = StreamAssembler()
    if batched:
        assembler.add_batch([_HEAD, *chunks])
    else:
        for chunk in chunks:
            assembler.add(chunk)
    return assembler.response()


@pytest.mark.parametrize("batched", [False, True])
def test_the_assembler_builds_the_reply_chat_would_return(batched: bool) -> None:
    first = {**_chunk({"role": "assistant", "content": ""}), "prompt_token_ids": [1, 2]}
    call = {"index": 0, "id": "c", "type": "function", "function": {"name": "bash", "arguments": ""}}
    response = _assemble(
        [
            first,
            _chunk({"reasoning_content": "th", "reasoning": "th"}, [10]),  # vLLM may send both names
            _chunk({"reasoning": "ink"}, [11]),
            _chunk({"content": "hi"}, [12]),
            _chunk({"tool_calls": [call]}, [13]),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}, [14]),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, [15]),
            _chunk({"tool_calls": [{"index": 1, "type": "function", "function": {"name": "ls"}}]}, [16]),
            _chunk({}, [17], finish_reason="tool_calls"),
            {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 8}},
        ],
        batched,
    )
    choice = response["choices"][0]
    assert response["prompt_token_ids"] == [1, 2] and response["usage"]["completion_tokens"] == 8
    assert choice["token_ids"] == list(range(10, 18)) and len(choice["logprobs"]["content"]) == 8
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "reasoning_content": "think",
        "content": "hi",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "bash", "arguments": '{"a": 1}'}},
            {"id": None, "type": "function", "function": {"name": "ls", "arguments": ""}},
        ],
    }


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([_chunk({"content": "a"}, [1])], "without a finish_reason"),
        ([_chunk({"content": "a"}, [1]), _chunk({"reasoning": "b"}, [2], finish_reason="stop")], "reasoning after"),
        ([{**_chunk({}, [1, 2]), "choices": [{**_chunk({}, [1, 2])["choices"][0], "token_ids": [1]}]}], "2 logprobs"),
        ([_chunk({}, [1]), {"choices": [{"token_ids": [2], "finish_reason": "stop"}]}], "without their"),
        ([_chunk({}, [1], finish_reason="stop"), {"choices": [], "usage": {"completion_tokens": 2}}], "usage counts"),
        ([_chunk({"tool_calls": [{"index": 1, "function": {"name": "a"}}]})], "skips one"),
        ([_chunk({"tool_calls": [{"function": {"name": "a"}}]})], "no index"),
        ([_chunk({"tool_calls": [{"index": 0, "function": {"arguments": {"a": 1}}}]})], "not a string"),
        ([_chunk({"content": ["a"]})], "content is not a string"),
        ([_chunk({"reasoning": 5})], "reasoning is not a string"),
        ([_chunk({"content": "a", "tool_calls": "x"})], "tool_calls is not an array"),
        ([{"choices": [{"index": 1}]}], "other than 0"),
        ([{"choices": [{"index": None}]}], "other than 0"),
        ([{"choices": "x"}], "not one choice"),
        ([{"choices": [1]}], "not one choice"),
        ([{"choices": [{}, {}]}], "not one choice"),
        ([{"choices": [{"delta": "x"}]}], "delta is not an object"),
        ([{"choices": [{"token_ids": "x", "logprobs": {"content": []}}]}], "token_ids is not an array"),
        ([{"choices": [{"token_ids": [1], "logprobs": []}]}], "logprobs is not an object"),
        ([{"choices": [{"token_ids": [1], "logprobs": {"content": "x"}}]}], "logprobs.content is not an array"),
    ],
)
@pytest.mark.parametrize("batched", [False, True])
def test_the_assembler_refuses_a_stream_that_breaks_the_contract(
    chunks: list[dict[str, Any]], message: str, batched: bool
) -> None:
    with pytest.raises(MalformedUpstream, match=message):
        _assemble(chunks, batched)


def test_a_batch_of_token_chunks_is_assembled_without_the_per_chunk_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``add_batch`` takes the chunks vLLM sends per token (text or reasoning, an id and its logprob) without
    ``add``: only the head chunk, tool call deltas and the usage chunk go through it. The reply and the text
    deltas (each run of one field joined) are those of ``add``, chunk by chunk."""
    call = {"index": 0, "id": "c", "type": "function", "function": {"name": "bash", "arguments": ""}}
    chunks = [
        {**_chunk({"role": "assistant", "content": ""}), "prompt_token_ids": [1, 2]},
        *(_chunk({"reasoning_content": "th", "reasoning": "th"}, [10 + i]) for i in range(5)),
        *(_chunk({"content": f"w{i} "}, [20 + i]) for i in range(20)),
        _chunk({"tool_calls": [call]}, [40]),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, [41]),
        _chunk({}, [42], finish_reason="tool_calls", stop_reason=None),
        {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 28}},
    ]
    one_by_one = StreamAssembler()
    deltas = [one_by_one.add(chunk) for chunk in chunks]
    calls = []
    add = StreamAssembler.add
    monkeypatch.setattr(StreamAssembler, "add", lambda self, chunk: calls.append(chunk) or add(self, chunk))
    batched = StreamAssembler()
    joined = batched.add_batch(chunks[:3]) + batched.add_batch(chunks[3:])
    assert [chunks.index(chunk) for chunk in calls] == [0, 26, 27, 29]
    assert batched.response() == one_by_one.response()
    assert joined == [
        {"reasoning_content": "thth"},
        {"reasoning_content": "th" * 3},
        {"content": "".join(f"w{i} " for i in range(20))},
    ]
    assert "".join(d.get("content", "") for d in joined) == "".join(d.get("content", "") for d in deltas)


# --- incremental rendering -------------------------------------------------------------------------------------

_REQUESTS = {
    "openai_chat": OPENCODE_REQUEST,
    "openai_responses": {**CODEX_REQUEST, "tools": [*CODEX_REQUEST["tools"], {"type": "function", "name": "Bash"}]},
    "anthropic_messages": CLAUDE_CODE_REQUEST,
}


def _cut(text: str, sizes: tuple[int, ...] = (1, 3, 7, 2, 11)) -> list[str]:
    pieces, at, n = [], 0, 0
    while at < len(text):
        pieces.append(text[at : at + sizes[n % len(sizes)]])
        at += sizes[n % len(sizes)]
        n += 1
    return pieces


@pytest.mark.parametrize("dialect", list(DIALECTS))
@pytest.mark.parametrize("reply", list(ENGINE_REPLIES))
def test_any_cut_into_deltas_renders_the_reply_render_stream_gives(dialect: str, reply: str) -> None:
    """The frames differ (one per delta) but a client makes the same reply of them."""
    module = DIALECTS[dialect]
    engine = ENGINE_REPLIES[reply]
    request = module.parse_request(_REQUESTS[dialect])
    renderer: StreamRenderer = module.stream_renderer(request)
    message = engine["choices"][0]["message"]
    frames = renderer.start({key: engine[key] for key in ("id", "created", "model", "prompt_token_ids")})
    for key in ("reasoning_content", "content"):
        for piece in _cut(message.get(key) or ""):
            frames += renderer.delta({key: piece})
    frames += renderer.finish(engine)
    route = {"openai_chat": CHAT, "openai_responses": RESPONSES, "anthropic_messages": ANTHROPIC}[dialect]
    streamed, replayed = parse_sse(b"".join(frames)), parse_sse(b"".join(module.render_stream(engine, request)))
    assert len(streamed) > len(replayed) or not (message.get("content") or message.get("reasoning_content"))
    if route == RESPONSES:
        assert streamed[-1] == (replayed[-1][0], {**replayed[-1][1], "sequence_number": len(streamed) - 1})
    assert _reply(route, streamed) == _reply(route, replayed)


def test_chunks_that_arrived_together_reach_the_agent_as_one_delta(tmp_path: Path) -> None:
    """The proxy forwards what has arrived, not each engine chunk: a whole stream read at once is one text delta
    per ``DELTA_CHARS`` of text, not one per token (the per-call CPU of streaming scales with reads, not tokens)."""

    async def body(stack: Stack) -> None:
        stack.engine.completion_chars = 6 * TOKENS
        session = await stack.create_session()
        key = session.api_key
        async with stack.http.post(
            stack.url + CHAT, json=_text_body(CHAT, stream=True), headers=agent_headers(CHAT, key)
        ) as resp:
            raw = await resp.read()
        deltas = [data for _, data in _frames(raw) if _is_text_delta(CHAT, None, data)]
        text = "".join(c["delta"]["content"] for d in deltas for c in d["choices"])
        assert len(text) > 4 * TOKENS
        assert len(deltas) <= -(-len(text) // DELTA_CHARS) + 1, len(deltas)

    run_stack(body, tmp_path)


def test_the_events_of_one_read_are_parsed_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The events that arrived in one read are parsed as one JSON array, not one parse per token; a bad event is
    then found event by event: the chunks before it come back with the error a lone bad event gets."""
    parses = []
    monkeypatch.setattr(
        engine_client,
        "orjson",
        SimpleNamespace(loads=lambda data: parses.append(data) or orjson.loads(data), JSONDecodeError=JSONDecodeError),
    )
    chunks = [_HEAD, *(_chunk({"content": "ab"}, [i]) for i in range(30))]
    events = [orjson.dumps(chunk) for chunk in chunks]
    assert engine_client._stream_chunks(events) == (chunks, None) and len(parses) == 1
    for bad, message in [(b'{"id": 1', "invalid JSON in a stream chunk"), (b"[1]", "not a JSON object")]:
        got, error = engine_client._stream_chunks([*events[:5], bad, *events[5:]])
        assert got == chunks[:5] and isinstance(error, MalformedUpstream) and message in str(error)
    got, error = engine_client._stream_chunks([*events[:5], b'{"error": {"message": "boom"}}', *events[5:]])
    assert got == chunks[:5] and isinstance(error, UpstreamError) and "boom" in str(error)


@pytest.mark.parametrize(
    ("pieces", "batches"),
    [
        ([b'data: {"a":1}\n\ndata: {"b":2}\n\n'], [[b'{"a":1}', b'{"b":2}']]),
        ([b'data: {"a":', b"1}\n", b"\ndata: x\n\n"], [[b'{"a":1}', b"x"]]),
        ([b"data: a\r\n\r\ndata: b\n\n"], [[b"a", b"b"]]),
        ([b": ping\n\nevent: x\ndata: a\ndata: b\n\n", b"data:c\n\n"], [[b"a\nb"], [b"c"]]),
        ([b"data: a\n\ndata: b\n", b"\n"], [[b"a"], [b"b"]]),
    ],
    ids=["whole-events", "cut-events", "crlf", "other-fields", "cut-blank-line"],
)
def test_the_sse_events_of_each_read_are_its_data(pieces: list[bytes], batches: list[list[bytes]]) -> None:
    """A read of whole one-line ``data: `` events (vLLM's) and any other framing SSE allows give the same
    events: a batch per read that completed some."""

    class Pieces:
        async def readany(self) -> bytes:
            return pieces.pop(0) if pieces else b""

    async def read() -> list[list[bytes]]:
        return [batch async for batch in engine_client._sse_data(Pieces())]  # type: ignore[arg-type]

    assert asyncio.run(read()) == batches


def test_text_sampled_token_by_token_costs_no_task_per_token(tmp_path: Path) -> None:
    """Holding text for its flush is a timer, not a task per chunk: a stream sampled token by token starts at
    most one task per flush interval more than the same stream read at once."""
    flush_s, tokens = 0.05, 60

    async def body(stack: Stack) -> None:
        stack.engine.completion_chars = 6 * tokens
        session = await stack.create_session()
        loop = asyncio.get_running_loop()
        started: list[str] = []

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            started.append(getattr(coro, "__qualname__", ""))
            return asyncio.Task(coro, loop=loop, **kwargs)

        counts, seconds = [], 0.0
        loop.set_task_factory(factory)
        try:
            for latency in (0, 0.005):
                stack.engine.token_latency_s = latency
                started.clear()
                _, seconds, raw = await _timed_stream(stack, CHAT, session.api_key, _text_body(CHAT, stream=True))
                assert stream_outcome(CHAT, _raw_reply(raw))[1] is None
                counts.append(len(started))
        finally:
            loop.set_task_factory(None)
        assert counts[1] - counts[0] <= 2 + seconds / flush_s, (counts, seconds)

    run_stack(body, tmp_path, stream_flush_s=flush_s)


def test_a_streamed_call_leaves_no_async_generator_for_the_loop_to_close(tmp_path: Path) -> None:
    """Every stream reader the call opened is closed by the call: one left to the garbage collector costs the loop
    a thread-safe wakeup and a task to close it, on every call."""

    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        hooks = sys.get_asyncgen_hooks()
        dropped: list[str] = []

        def finalizer(generator: Any) -> None:
            dropped.append(generator.__qualname__)
            hooks.finalizer(generator)

        sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=finalizer)
        try:
            for route in ROUTES:
                _, _, raw = await _timed_stream(stack, route, session.api_key, _text_body(route, stream=True))
                assert stream_outcome(route, _raw_reply(raw))[1] is None
            gc.collect()
        finally:
            sys.set_asyncgen_hooks(*hooks)
        assert dropped == []

    run_stack(body, tmp_path)


def test_a_streams_headers_go_out_with_its_first_frames(tmp_path: Path) -> None:
    """A stream's status line and headers are written with its first frames, in one write: until the engine's
    first chunk arrives the agent has read nothing, then one read holds both."""

    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        resume = asyncio.Event()
        stack.engine.faults = [("pause", 0, resume)]  # the engine answers 200, then samples nothing until resumed
        payload = orjson.dumps(_text_body(CHAT, stream=True))
        head = f"POST {CHAT} HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer {session.api_key}\r\n"
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        url = urlsplit(stack.url)
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        writer.write(head.encode() + payload)
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(1), 0.5)
        finally:
            resume.set()
        first = await asyncio.wait_for(reader.read(1 << 16), 10)
        rest = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"text/event-stream" in first.split(b"\r\n\r\n")[0]
        assert b"data: " in first.split(b"\r\n\r\n", 1)[1]
        assert (first + rest).endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
        assert len((await stack.trace(session.session_id))["turns"]) == 1

    run_stack(body, tmp_path)


def test_a_streams_last_frames_and_its_end_are_one_write() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[str, bytes]] = []

        async def write(self, data: bytes) -> None:
            self.calls.append(("write", data))

        async def write_eof(self, data: bytes = b"") -> None:
            self.calls.append(("write_eof", data))

    stream = Recorder()
    asyncio.run(server._send(stream, b"data: [DONE]\n\n"))  # type: ignore[arg-type]
    assert stream.calls == [("write_eof", b"data: [DONE]\n\n")]


def test_the_flush_interval_is_set_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    config = parse_args(["--engine-url", "http://127.0.0.1:1", "--journal-dir", "j", "--stream-flush-s", "0.2"])
    assert config.stream_flush_s == 0.2 and parse_args(["--engine-url", "e", "--journal-dir", "j"]).stream_flush_s > 0
    with pytest.raises(SystemExit) as exit_info:  # the parser's refusal: status 2, one line
        parse_args(["--engine-url", "e", "--journal-dir", "j", "--stream-flush-s", "-1"])
    assert exit_info.value.code == 2 and "stream_flush_s must be at least 0" in capsys.readouterr().err
