"""Streamed chat completions through the real HTTP server: same result as non-streamed, sent as sampled."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from harness_grpo.engine import ServerThread
from harness_grpo.tiny_model import SERVED_MODEL_NAME
from tests.engine.conftest import Http, tool_call_request
from tests.engine.streams import (
    Stream,
    assemble,
    chunks_of,
    expected,
    open_stream,
    stream_events,
    without_call_ids,
)
from tests.support.wait import until


def _body(content: str = "def stream():", **extra: Any) -> dict[str, Any]:
    return {
        "model": SERVED_MODEL_NAME,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 24,
        "temperature": 1.0,
        "seed": 7,
        "logprobs": True,
        "top_logprobs": 2,
        "return_token_ids": True,
        **extra,
    }


@pytest.mark.parametrize(
    ("content", "extra"),
    [
        ("def stream():", {}),
        ("def stream():", {"stream_options": {"include_usage": True}}),
        ("import os", {"temperature": 0, "max_tokens": 40, "stream_options": {"include_usage": False}}),
        ("x", {"top_logprobs": None, "logprobs": False, "return_token_ids": False, "seed": 3}),
        ("é 日本 🙂", {"seed": 11, "max_tokens": 32}),
    ],
)
def test_streamed_equals_non_streamed(http, content, extra):
    body = _body(content, **extra)
    chunks = chunks_of(stream_events(http, body))
    want = expected(http.chat(**{k: v for k, v in body.items() if k != "stream_options"}))
    if not extra.get("stream_options", {}).get("include_usage"):
        assert all(c["choices"] for c in chunks)
        want["usage"] = None
    assert assemble(chunks) == want
    assert len({c["created"] for c in chunks}) == 1 and {c["model"] for c in chunks} == {SERVED_MODEL_NAME}


def test_a_stop_string_ends_the_stream_as_it_ends_the_response(http):
    body = _body(temperature=0, max_tokens=16)
    text = http.chat(**body)["choices"][0]["message"]["content"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    chunks = chunks_of(stream_events(http, {**body, "stop": [stop]}))
    want = expected(http.chat(**{**body, "stop": [stop]}))
    assert want["stop_reason"] == stop
    assert assemble(chunks) == {**want, "usage": None}


def test_a_streamed_tool_call_equals_the_non_streamed_one(warm_served):
    from harness_grpo.tiny_model.synthetic import heldout_prompts

    _, http = warm_served
    (prompt,) = heldout_prompts(1, 7, system_chars=0)
    body, answer = tool_call_request(http, {**_body(max_tokens=200, temperature=0.7), **prompt})
    want = expected(answer)
    assert want["tool_calls"]
    chunks = chunks_of(stream_events(http, {**body, "stream_options": {"include_usage": True}}))
    assert without_call_ids(assemble(chunks)) == without_call_ids(want)
    token_chunks = [c for c in chunks[1:-2] if c["choices"]]
    assert len(token_chunks) > 1 and all(c["choices"][0]["delta"] == {} for c in token_chunks)


def test_first_token_arrives_long_before_the_last(fresh_served):
    engine, http = fresh_served  # its own engine: the test reads its token count
    n = 256

    async def run() -> tuple[Stream, int, float]:
        async with aiohttp.ClientSession() as session:
            start = time.monotonic()
            stream = await open_stream(session, http, _body(max_tokens=n, ignore_eos=True))
            while not stream.received_token_ids:
                assert await stream.next() is not None
            generated_at_first = engine.stats.generated_tokens
            await stream.rest()
            return stream, generated_at_first, start

    stream, generated_at_first, start = asyncio.run(run())
    assert generated_at_first < n  # the first token was sent while the rest were still being sampled
    assert len(stream.received_token_ids) == n
    first = next(t for t, e in zip(stream.times, stream.events, strict=True) if e["choices"][0].get("token_ids"))
    ttft, total = first - start, stream.times[-1] - start
    print(f"\n{n} tokens streamed: first token after {ttft * 1000:.1f} ms, all after {total * 1000:.1f} ms")
    assert ttft < total / 4


def test_client_disconnect_mid_stream_cancels_the_sequence(fresh_served, monkeypatch):
    engine, http = fresh_served  # its own engine: the test drains it with pause(mode="wait")
    futures = []
    submit = engine.submit

    def recording_submit(prompt_ids, params, on_token=None):
        futures.append(submit(prompt_ids, params, on_token))
        return futures[-1]

    monkeypatch.setattr(engine, "submit", recording_submit)

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            # Far more tokens than the engine decodes within the deadlines below: only the disconnect ends it.
            stream = await open_stream(session, http, _body(max_tokens=32000, ignore_eos=True))
            while len(stream.received_token_ids) < 3:
                assert await stream.next() is not None
            stream.resp.close()  # the client goes away mid-stream
        await until(lambda: futures[0].cancelled(), "the sequence was not cancelled when the client left")

    asyncio.run(run())
    engine.pause(mode="wait", timeout_s=30)  # returns once no request is prefilling or decoding


def test_pause_keep_freezes_a_stream_and_resume_finishes_it_unchanged(fresh_served):
    engine, http = fresh_served  # its own engine: the test pauses it
    body = _body(max_tokens=200, ignore_eos=True)

    async def run() -> list[Any]:
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, http, body)
            while not stream.received_token_ids:
                assert await stream.next() is not None
            await asyncio.to_thread(engine.pause, "keep")
            frozen_at = engine.stats.generated_tokens  # this is the engine's only request
            assert frozen_at < 200
            while len(stream.received_token_ids) < frozen_at:
                assert await stream.next() is not None
            with pytest.raises(TimeoutError):  # nothing more while paused
                await asyncio.wait_for(stream.next(), 0.3)
            assert len(stream.received_token_ids) == frozen_at
            engine.resume()
            return await stream.rest()

    chunks = chunks_of(asyncio.run(run()))
    assert assemble(chunks) == {**expected(http.chat(**body)), "usage": None}


def test_an_engine_failure_mid_stream_is_an_error_event(fresh_served):
    engine, http = fresh_served  # its own engine: the test stops it

    async def run() -> list[Any]:
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, http, _body(max_tokens=32000, ignore_eos=True))
            while not stream.received_token_ids:
                assert await stream.next() is not None
            await asyncio.to_thread(engine.stop)  # in-flight requests fail with a 503
            return await stream.rest()

    events = asyncio.run(run())
    assert events[-1] == "[DONE]"
    assert events[-2] == {
        "error": {"message": "the engine stopped", "type": "ServiceUnavailableError", "param": None, "code": 503}
    }
    assert all("choices" in e for e in events[:-2])


def test_a_stream_past_its_deadline_ends_in_a_timeout_event(fresh_served):
    engine, _ = fresh_served  # its own engine: the test drains it with pause(mode="wait")
    server = ServerThread(engine, request_timeout_s=0.5)
    http = Http(server.start())
    try:
        events = stream_events(http, _body(max_tokens=32000, ignore_eos=True))
    finally:
        server.stop()
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 504
    assert events[-2]["error"]["type"] == "GatewayTimeoutError"
    engine.pause(mode="wait", timeout_s=30)  # the timed-out sequence was cancelled


def test_empty_stream_options_are_ignored_without_stream(http):
    assert http.chat(**_body(max_tokens=2, stream=False, stream_options={}))["object"] == "chat.completion"
