"""The agent's reply and the trace agree, whatever goes wrong: errors after a stream opened stay in the stream,
deep nesting is refused at the door, a turn is recorded iff its reply is sent, malformed input is a 4xx."""

from __future__ import annotations

import asyncio
import errno
import gzip
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest

import proxy.server
from proxy.capture_graph import CaptureGraph
from proxy.dialects import openai_responses
from proxy.engine_client import Capture, MalformedUpstream, extract_capture
from proxy.journal import SessionJournal
from proxy.json_depth import MAX_REQUEST_DEPTH, NestingError, dumps_bounded
from proxy.sessions import SessionConfig, SessionRegistry
from tests.proxy.proxy_stack import Stack, run_stack
from tests.proxy.wire import (
    ANTHROPIC,
    CHAT,
    RESPONSES,
    ROUTES,
    Reply,
    agent_headers,
    assert_error_shape,
    post,
    stream_outcome,
    valid_body,
)
from tests.support.counting import python_steps
from tests.support.wait import until


def _deep(depth: int) -> bytes:
    """JSON nested ``depth`` levels: ``[[...[]...]]``."""
    return b"[" * depth + b"]" * depth


def _with_raw(body: dict[str, Any], raw: bytes) -> bytes:
    """``body`` serialised with the string ``"@RAW@"`` replaced by the raw JSON ``raw`` (too deep to write)."""
    return orjson.dumps(body).replace(b'"@RAW@"', raw)


async def _call(stack: Stack, route: str, api_key: str, body: dict[str, Any] | bytes, **headers: str) -> Reply:
    return await post(stack.http, stack.url + route, body, {**agent_headers(route, api_key), **headers})


async def _turns(stack: Stack, session_id: str) -> int:
    return len((await stack.trace(session_id))["turns"])


def _journal_calls(stack: Stack) -> int:
    """Call records on disk, over every journal of the proxy."""
    return sum(path.read_bytes().count(b'"kind":"call"') for path in stack.proxy.sessions.journal_dir.iterdir())


def _bad_tool_calls(completion: dict[str, Any]) -> dict[str, Any]:
    """An engine 200 whose tool call has no function object (the exact ids are fine)."""
    completion["choices"][0]["message"]["tool_calls"] = [{"id": "call_1", "type": "function", "function": "bash"}]
    return completion


# --- 1. an error after a stream's headers went out stays in the stream -------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
def test_a_malformed_engine_reply_ends_an_open_stream_with_the_dialects_error_event(tmp_path: Path, route: str) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        stack.engine.faults = [("patch", _bad_tool_calls)]
        frames, error = stream_outcome(
            route, await _call(stack, route, session.api_key, valid_body(route, stream=True))
        )
        assert error is not None and "malformed engine response" in error["message"], frames
        assert await _turns(stack, session.session_id) == 0 and _journal_calls(stack) == 0
        frames, error = stream_outcome(
            route, await _call(stack, route, session.api_key, valid_body(route, stream=True))
        )
        assert error is None and await _turns(stack, session.session_id) == 1

    run_stack(body, tmp_path)


@pytest.mark.parametrize("route", ROUTES)
def test_a_proxy_bug_after_the_stream_opened_is_an_error_event_never_a_second_response(
    tmp_path: Path, route: str
) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()

        def bug(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("a bug in the proxy")

        stack.proxy._record = bug  # type: ignore[method-assign]
        frames, error = stream_outcome(
            route, await _call(stack, route, session.api_key, valid_body(route, stream=True))
        )
        assert error is not None and "a bug in the proxy" in error["message"], frames
        del stack.proxy._record
        assert (
            stream_outcome(route, await _call(stack, route, session.api_key, valid_body(route, stream=True)))[1] is None
        )
        assert await _turns(stack, session.session_id) == 1

    run_stack(body, tmp_path)


# --- 2. deep nesting is refused at the door ----------------------------------------------------------------------


def _nested_body(route: str, raw: bytes, *, stream: bool = False) -> bytes:
    """A valid body of ``route`` carrying ``raw`` where the agent controls the shape and the proxy forwards it."""
    body = valid_body(route, stream=stream)
    if route == CHAT:
        body["messages"][1]["extra"] = "@RAW@"
    elif route == RESPONSES:
        body["tools"][0]["parameters"]["properties"]["deep"] = "@RAW@"
    else:
        body["tools"][0]["input_schema"]["properties"]["deep"] = "@RAW@"
    return _with_raw(body, raw)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("depth", [250, 600])
def test_deep_nesting_is_a_400_and_is_never_stored(tmp_path: Path, route: str, depth: int) -> None:
    """250 levels used to be accepted and then break the session's trace export for good; 600 (past orjson's
    writer) used to be a 500 from the engine client."""

    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        for stream in (False, True):
            reply = await _call(stack, route, session.api_key, _nested_body(route, _deep(depth), stream=stream))
            assert reply.status == 400, reply
            assert "nests deeper" in assert_error_shape(route, reply)["message"]
        assert await _turns(stack, session.session_id) == 0 and _journal_calls(stack) == 0
        assert (await _call(stack, route, session.api_key, valid_body(route))).status == 200
        assert await _turns(stack, session.session_id) == 1

    run_stack(body, tmp_path)


def test_the_nesting_bound_is_exact_and_what_it_lets_in_exports(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        # body (1) > messages (2) > message (3) > "extra": the rest of the depth
        at_bound = _nested_body(CHAT, _deep(MAX_REQUEST_DEPTH - 3))
        reply = await _call(stack, CHAT, session.api_key, at_bound)
        assert reply.status == 200, reply
        assert (
            await _call(stack, CHAT, session.api_key, _nested_body(CHAT, _deep(MAX_REQUEST_DEPTH - 2)))
        ).status == 400
        assert await _turns(stack, session.session_id) == 1  # the trace of the deepest accepted request exports

    run_stack(body, tmp_path)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        (RESPONSES, {**valid_body(RESPONSES), "metadata": {"a": "@RAW@"}}),  # only echoed, never forwarded
        (RESPONSES, {**valid_body(RESPONSES), "reasoning": {"effort": "@RAW@"}}),
        (
            ANTHROPIC,
            {
                **valid_body(ANTHROPIC),
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "bash", "input": {"a": "@RAW@"}}],
                    },
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]},
                ],
            },
        ),
        (
            RESPONSES,
            {
                **valid_body(RESPONSES),
                "input": [
                    {"type": "function_call", "call_id": "c", "name": "bash", "arguments": {"a": "@RAW@"}},
                    {"type": "function_call_output", "call_id": "c", "output": "ok"},
                ],
            },
        ),
    ],
)
def test_deep_nesting_the_engine_never_sees_is_refused_too(tmp_path: Path, route: str, body: dict[str, Any]) -> None:
    async def run(stack: Stack) -> None:
        session = await stack.create_session()
        for depth in (252, 300):
            for stream in (False, True):
                reply = await _call(stack, route, session.api_key, _with_raw({**body, "stream": stream}, _deep(depth)))
                assert reply.status == 400 and "nests deeper" in assert_error_shape(route, reply)["message"]
        assert await _turns(stack, session.session_id) == 0

    run_stack(run, tmp_path)


def test_dumps_bounded_is_orjson_with_an_exact_depth_bound() -> None:
    value: Any = {"a": [1, "x", None, {"b": 2.5}]}
    assert dumps_bounded(value) == orjson.dumps(value)
    assert dumps_bounded(7, 1) == b"7" and dumps_bounded([], 1) == b"[]"
    with pytest.raises(NestingError):
        dumps_bounded([[]], 1)
    nested: Any = []
    for _ in range(MAX_REQUEST_DEPTH - 1):
        nested = [nested]
    assert dumps_bounded(nested) == orjson.dumps(nested)
    with pytest.raises(NestingError):
        dumps_bounded([nested])


# --- 3. a turn is recorded iff its reply is sent -----------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
def test_a_malformed_engine_reply_records_nothing(tmp_path: Path, route: str) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        stack.engine.faults = [("patch", _bad_tool_calls)]
        reply = await _call(stack, route, session.api_key, valid_body(route))
        assert reply.status == 502 and "malformed engine response" in assert_error_shape(route, reply)["message"]
        assert await _turns(stack, session.session_id) == 0 and _journal_calls(stack) == 0

    run_stack(body, tmp_path)


@pytest.mark.parametrize("broken_at", ["render_response", "start", "finish"])
def test_a_reply_that_cannot_be_rendered_records_nothing(
    tmp_path: Path, broken_at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the JSON reply is rendered; as a stream starts (the engine's first chunk); as it finishes."""
    stream = broken_at != "render_response"

    def broken(*args: Any) -> Any:
        raise KeyError("a renderer bug")

    if stream:
        monkeypatch.setattr(openai_responses._EventStream, broken_at, broken)
    else:
        monkeypatch.setattr(openai_responses, "render_response", broken)

    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        reply = await _call(stack, RESPONSES, session.api_key, valid_body(RESPONSES, stream=stream))
        if stream:
            error = stream_outcome(RESPONSES, reply)[1]
        else:
            assert reply.status == 500
            error = assert_error_shape(RESPONSES, reply)
        assert error is not None and "a renderer bug" in error["message"]
        assert await _turns(stack, session.session_id) == 0 and _journal_calls(stack) == 0

    run_stack(body, tmp_path)


@pytest.mark.parametrize("route", ROUTES)
def test_a_full_disk_answers_an_error_and_records_nothing(
    tmp_path: Path, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = {"full": False}
    append = SessionJournal.append

    def append_unless_full(journal: SessionJournal, record: dict[str, Any]) -> None:
        if disk["full"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        append(journal, record)

    monkeypatch.setattr(SessionJournal, "append", append_unless_full)

    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        live = stack.proxy.sessions.get(session.session_id)
        disk["full"] = True
        reply = await _call(stack, route, session.api_key, valid_body(route))
        assert reply.status == 500 and "No space left" in assert_error_shape(route, reply)["message"]
        _, error = stream_outcome(route, await _call(stack, route, session.api_key, valid_body(route, stream=True)))
        assert error is not None and "No space left" in error["message"]
        assert len(live.graph) == 0 and await _turns(stack, session.session_id) == 0
        assert (await stack.describe(session.session_id))["stats"]["calls"] == 0
        disk["full"] = False  # the disk has room again
        assert (await _call(stack, route, session.api_key, valid_body(route))).status == 200
        assert await _turns(stack, session.session_id) == 1 and _journal_calls(stack) == 1

    run_stack(body, tmp_path)


@pytest.mark.parametrize("stream", [False, True])
def test_a_session_deleted_during_its_call_records_nothing(tmp_path: Path, stream: bool) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        calls = stack.engine.calls
        engine_done = asyncio.Event()
        stack.engine.faults = [("hold", engine_done)]
        call = asyncio.create_task(_call(stack, ANTHROPIC, session.api_key, valid_body(ANTHROPIC, stream=stream)))
        await until(lambda: stack.engine.calls == calls + 1, "the call did not reach the engine")
        await asyncio.to_thread(stack.admin.delete, session.session_id)
        engine_done.set()
        reply = await call
        if stream:
            error = stream_outcome(ANTHROPIC, reply)[1]
        else:
            assert reply.status == 404, reply
            error = assert_error_shape(ANTHROPIC, reply)
        assert error is not None and "deleted" in error["message"]
        assert stack.proxy.sessions.get(session.session_id) is None
        assert list(stack.proxy.sessions.journal_dir.iterdir()) == []  # not resurrected by a late write

    run_stack(body, tmp_path)


def _capture() -> Capture:
    return Capture([1, 2, 3], [4, 5], [-0.5, -0.25])


def test_session_record_writes_the_journal_before_the_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = SessionRegistry(tmp_path)
    session, _ = registry.create(SessionConfig(purpose="eval"), "m")
    request = {"messages": [{"role": "user", "content": "hi"}], "tools": []}

    def disk_full(journal: SessionJournal, record: dict[str, Any]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as full:
        full.setattr(SessionJournal, "append", disk_full)
        with pytest.raises(OSError):
            session.record(_capture(), request, {}, {})
    assert len(session.graph) == 0 and session.stats.calls == 0
    node_id = session.record(_capture(), request, {}, {})
    assert len(session.graph) == 1 and session.stats.calls == 1
    registry.close()
    recovered = SessionRegistry(tmp_path)
    recovered.recover()
    assert [t.node_id for t in recovered.get(session.id).graph.to_training_trace().turns] == [node_id]
    recovered.close()


def test_before_commit_sees_the_prompt_delta_and_can_veto_the_call() -> None:
    graph = CaptureGraph()
    root = graph.add_call([1, 2], [3], [-0.1])
    seen: list[tuple[str, str | None, list[int]]] = []

    def veto(node_id: str, parent_id: str | None, new_ids: list[int]) -> None:
        seen.append((node_id, parent_id, list(new_ids)))
        raise OSError("no")

    with pytest.raises(OSError):
        graph.add_call([1, 2, 3, 7], [8], [-0.2], before_commit=veto)
    assert len(graph) == 1 and seen[0][1:] == (root, [7])
    child = graph.add_call([1, 2, 3, 7], [8], [-0.2], before_commit=lambda *delta: seen.append(delta))
    assert seen[1] == (child, root, [7]) and graph.prompt_delta(child) == (root, [7])


# --- 8. malformed input is a 4xx in the caller's dialect ---------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "changes"),
    [
        (CHAT, {"messages": [{"role": ["user"], "content": "x"}]}),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": {"text": 1}, "text": "x"}]}]}),
        (CHAT, {"messages": [{"role": "assistant", "content": "x", "tool_calls": "bash"}]}),
        (CHAT, {"tools": [{"type": "function", "function": ["bash"]}]}),
        (CHAT, {"tools": [1]}),
        (CHAT, {"temperature": [0.5]}),
        (CHAT, {"stop": {"a": 1}}),
        (CHAT, {"seed": "1"}),
        (CHAT, {"tool_choice": 3}),
        (RESPONSES, {"input": [{"type": ["message"], "role": "user", "content": "x"}]}),
        (RESPONSES, {"input": [{"role": "user", "content": [{"type": ["input_text"], "text": "x"}]}]}),
        (RESPONSES, {"temperature": {"t": 1}}),
        (RESPONSES, {"instructions": ["be brief"]}),
        (ANTHROPIC, {"messages": [{"role": "user", "content": [{"type": ["text"], "text": "x"}]}]}),
        (ANTHROPIC, {"tool_choice": {"type": ["auto"]}}),
        (ANTHROPIC, {"system": [{"type": {}, "text": "x"}]}),
        (ANTHROPIC, {"top_k": "40"}),
    ],
)
def test_wrong_types_are_a_400_in_the_dialect(tmp_path: Path, route: str, changes: dict[str, Any]) -> None:
    """From the dialect or the policy, or (chat messages' pass-through fields) the engine's 400 relayed as the
    request's fault; never a 500."""

    async def body(stack: Stack) -> None:
        session = await stack.create_session(purpose="eval")
        reply = await _call(stack, route, session.api_key, {**valid_body(route), **changes})
        assert reply.status == 400, reply
        assert_error_shape(route, reply)
        assert await _turns(stack, session.session_id) == 0

    run_stack(body, tmp_path)


def test_body_encodings_are_decoded_or_refused_in_the_dialect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        raw = orjson.dumps(valid_body(ANTHROPIC))

        async def send(data: bytes, encoding: str) -> Reply:
            return await _call(stack, ANTHROPIC, session.api_key, data, **{"Content-Encoding": encoding})

        assert (await send(gzip.compress(raw), "gzip")).status == 200
        assert (await send(zlib.compress(raw), "deflate")).status == 200
        assert (await send(gzip.compress(gzip.compress(raw)), "gzip, gzip")).status == 200
        for data, encoding, status in [
            (b"\x1f\x8b not gzip", "gzip", 400),
            (gzip.compress(raw)[:-9], "gzip", 400),  # truncated
            (b"not deflate", "deflate", 400),
            (gzip.compress(b" " * 300_000), "gzip", 413),  # decodes past max_body_bytes
            (raw, "zstd", 415),
            (raw, "compress", 415),
        ]:
            reply = await send(data, encoding)
            assert reply.status == status, (encoding, reply)
            assert_error_shape(ANTHROPIC, reply)
        monkeypatch.setattr(proxy.server, "brotli", None)  # where the brotli package is not installed
        reply = await send(raw, "br")
        assert reply.status == 415 and "br" in assert_error_shape(ANTHROPIC, reply)["message"]
        assert await _turns(stack, session.session_id) == 3  # the three bodies that decoded

    run_stack(body, tmp_path, max_body_bytes=200_000)


def test_br_bodies_are_decoded_when_brotli_is_installed(tmp_path: Path) -> None:
    brotli = pytest.importorskip("brotli")

    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        raw = orjson.dumps(valid_body(CHAT))
        assert (
            await _call(stack, CHAT, session.api_key, brotli.compress(raw), **{"Content-Encoding": "br"})
        ).status == 200
        reply = await _call(stack, CHAT, session.api_key, b"not brotli", **{"Content-Encoding": "br"})
        assert reply.status == 400 and assert_error_shape(CHAT, reply)

    run_stack(body, tmp_path)


@pytest.mark.parametrize(
    "config",
    [
        {"session_id": 5},
        {"session_id": ["a"]},
        {"llm_url": 5},
        {"llm_url": "ftp://engine"},
        {"model": {"name": "m"}},
        {"metadata": [1]},
        {"sampling": [1]},
        {"sampling": {"temperature": "hot"}},
        {"max_model_calls": "3"},
        {"purpose": ["train"]},
        {"unknown": 1},
        {"metadata": {"a": "@RAW@"}},
    ],
)
def test_malformed_session_requests_are_a_400(tmp_path: Path, config: dict[str, Any]) -> None:
    async def body(stack: Stack) -> None:
        reply = await post(stack.http, stack.url + "/sessions", _with_raw(config, _deep(300)), stack.admin_headers)
        assert reply.status == 400, reply
        assert_error_shape("/sessions", reply)
        assert len(stack.proxy.sessions) == 0

    run_stack(body, tmp_path)


@pytest.mark.parametrize(
    ("status", "chat_type", "anthropic_type"),
    [
        (400, "invalid_request_error", "invalid_request_error"),
        (404, "not_found_error", "not_found_error"),
        (422, "invalid_request_error", "invalid_request_error"),
    ],
)
def test_an_upstream_4xx_is_reported_as_the_requests_fault(
    tmp_path: Path, status: int, chat_type: str, anthropic_type: str
) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        for route, expected in ((CHAT, chat_type), (RESPONSES, chat_type), (ANTHROPIC, anthropic_type)):
            stack.engine.faults = [("status", status)]
            reply = await _call(stack, route, session.api_key, valid_body(route))
            assert reply.status == status and assert_error_shape(route, reply)["type"] == expected
            stack.engine.faults = [("status", status)]
            _, error = stream_outcome(route, await _call(stack, route, session.api_key, valid_body(route, stream=True)))
            assert error is not None and f"injected {status}" in error["message"]
        stack.engine.faults = [("status", 500)] * 4
        reply = await _call(stack, ANTHROPIC, session.api_key, valid_body(ANTHROPIC))
        assert reply.status == 502 and assert_error_shape(ANTHROPIC, reply)["type"] == "api_error"

    run_stack(body, tmp_path)


def test_an_engine_model_list_without_a_string_id_is_a_502_not_a_stored_session(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        async def models(path: str) -> dict[str, Any]:
            return {"object": "list", "data": [{"id": ["fake/vllm"]}]}

        stack.proxy._client(None).get_json = models
        reply = await post(stack.http, stack.url + "/sessions", {}, stack.admin_headers)
        assert reply.status == 502 and "string" in assert_error_shape("/sessions", reply)["message"]
        assert len(stack.proxy.sessions) == 0

    run_stack(body, tmp_path)


def _completion(**message: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "prompt_token_ids": [1, 2],
        "choices": [{"message": {"role": "assistant", **message}, "token_ids": [3], "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": None},
    }


@pytest.mark.parametrize(
    "message",
    [
        {"tool_calls": "bash"},
        {"tool_calls": [{"function": "bash"}]},
        {"tool_calls": [{"function": {"name": 1, "arguments": "{}"}}]},
        {"tool_calls": [{"id": 5, "function": {"name": "b", "arguments": "{}"}}]},
        {"tool_calls": [{"function": {"name": "b", "arguments": 5}}]},
        {"content": ["a"]},
        {"reasoning_content": {"text": "a"}},
        {"annotations": orjson.loads(_deep(MAX_REQUEST_DEPTH))},
        {"tool_calls": [{"function": {"name": "b", "arguments": {"a": orjson.loads(_deep(MAX_REQUEST_DEPTH))}}}]},
    ],
)
def test_extract_capture_refuses_a_reply_the_dialects_cannot_render_or_the_trace_cannot_store(
    message: dict[str, Any],
) -> None:
    with pytest.raises(MalformedUpstream):
        extract_capture(_completion(**message))


def test_extract_capture_takes_what_vllm_sends() -> None:
    calls = [{"id": "c", "type": "function", "function": {"name": "b", "arguments": '{"a": 1}'}}]
    capture = extract_capture(_completion(content=None, tool_calls=calls, reasoning_content="r", refusal=None))
    assert capture.prompt_ids == [1, 2] and capture.sampled_ids == [3] and capture.logprobs is None
    extract_capture(_completion(content="x", annotations=[{"type": "url"}]))  # a field no dialect reads


def _sampled(n: int, **entry: Any) -> dict[str, Any]:
    """A vLLM reply with ``n`` sampled ids and their logprob entries (``entry`` overrides entry 1's fields)."""
    content = [{"token": f"token_id:{10 + i}", "logprob": -0.5, "bytes": [], "top_logprobs": []} for i in range(n)]
    content[1].update(entry)
    reply = _completion(content="x")
    reply["choices"][0].update(token_ids=list(range(10, 10 + n)), logprobs={"content": content})
    return reply


@pytest.mark.parametrize(
    ("entry", "logprobs", "note"),
    [
        ({}, [-0.5] * 3, None),
        ({"logprob": -1}, [-0.5, -1.0, -0.5], None),  # an int, coerced
        ({"token": "hello"}, [-0.5] * 3, None),  # a text token: nothing to compare its id with
        ({"logprob": float("nan")}, None, "unusable logprob at 1"),
        ({"logprob": 0.5}, None, "unusable logprob at 1"),
        ({"logprob": None}, None, "unusable logprob at 1"),
        ({"token": "token_id:99"}, None, "logprob ids shifted at 1"),
    ],
)
def test_extract_capture_keeps_or_voids_logprobs_per_position(
    entry: dict[str, Any], logprobs: list[float] | None, note: str | None
) -> None:
    capture = extract_capture(_sampled(3, **entry))
    assert (capture.logprobs, capture.logprob_note) == (logprobs, note)


def test_extract_capture_checks_vllm_logprobs_in_bulk() -> None:
    """Python work per call does not grow with the completion: 2,000 sampled ids cost what 20 do."""
    small, large = _sampled(20), _sampled(2000)
    _, small_steps = python_steps(lambda: extract_capture(small))
    capture, large_steps = python_steps(lambda: extract_capture(large))
    assert capture.logprobs == [-0.5] * 2000
    assert large_steps < small_steps + 20
