"""One time budget per engine call (``upstream_timeout_s``), streamed or not: retries of 5xx and connection errors
happen only inside it, and a timeout is never retried; session creation's probe calls are bounded the same way."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from proxy.client import ProxyClientError
from tests.proxy.proxy_stack import Stack, run_stack
from tests.support.wait import until

BUDGET_S = 1.0
SLACK_S = 3.0  # scheduling noise on a loaded machine; overruns are caught by the engine call counts too


async def _timed_chat(stack: Stack, api_key: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    # The bound is far above the budget: it only keeps a proxy that overruns it from hanging the test.
    status, answer = await asyncio.wait_for(stack.chat(api_key, [{"role": "user", "content": "hi"}]), 60)
    return status, answer, time.monotonic() - started


def test_an_engine_call_has_one_time_budget_for_all_its_attempts(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        assert stack.engine is not None
        hung = asyncio.Event()
        stack.engine.faults = [("hold", hung)]  # the engine hangs on the first probe call
        started = time.monotonic()
        with pytest.raises(ProxyClientError) as probe:
            await stack.create_session()
        assert probe.value.status == 502 and "timed out" in str(probe.value)
        assert time.monotonic() - started < BUDGET_S + SLACK_S
        await until(lambda: stack.engine.cancelled == 1, "the proxy did not drop the probe call it gave up on")
        hung.set()
        session = await stack.create_session()

        calls = stack.engine.calls
        stack.engine.faults = [("hold", asyncio.Event())]  # never answers
        status, answer, elapsed = await _timed_chat(stack, session.api_key)
        assert status == 504 and "timed out" in answer["error"]["message"]
        assert stack.engine.calls == calls + 1, "a timed-out call was retried past its budget"
        assert elapsed < BUDGET_S + SLACK_S
        await until(lambda: stack.engine.cancelled == 2, "the proxy did not drop the engine call it gave up on")

        calls = stack.engine.calls
        stack.engine.faults = [("status", 503, 30)]  # asks for a retry after the budget ends: not made
        status, answer, elapsed = await _timed_chat(stack, session.api_key)
        assert status == 502 and "budget" in answer["error"]["message"]
        assert stack.engine.calls == calls + 1 and elapsed < SLACK_S

        calls = stack.engine.calls
        stack.engine.faults = [("status", 503, 0.3)] * 20  # retried while the budget lasts, then reported
        status, answer, elapsed = await _timed_chat(stack, session.api_key)
        assert status == 502 and "injected 503" in answer["error"]["message"]
        assert 2 <= stack.engine.calls - calls <= 4 and elapsed < BUDGET_S + SLACK_S

        stack.engine.faults = [("status", 503, 0), ("status", 500, 0), None]  # transient: retried, answered
        status, _, _ = await _timed_chat(stack, session.api_key)
        assert status == 200
        assert len((await stack.trace(session.session_id))["turns"]) == 1

    run_stack(body, tmp_path, upstream_timeout_s=BUDGET_S, upstream_retries=20)


def test_a_streamed_call_has_one_budget_and_is_retried_only_before_its_first_chunk(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        assert stack.engine is not None
        session = await stack.create_session()
        request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        headers = {"Authorization": f"Bearer {session.api_key}"}

        async def streamed() -> tuple[bytes, float]:
            started = time.monotonic()
            async with stack.http.post(f"{stack.url}/v1/chat/completions", json=request, headers=headers) as resp:
                return await asyncio.wait_for(resp.read(), 60), time.monotonic() - started

        calls = stack.engine.calls
        stack.engine.faults = [("pause", 5, asyncio.Event())]  # stalls mid-stream, never resumes
        raw, elapsed = await streamed()
        assert b"timed out" in raw.rsplit(b"\n\n", 2)[-2] and elapsed < BUDGET_S + SLACK_S
        assert stack.engine.calls == calls + 1
        await until(lambda: stack.engine.cancelled == 1, "the proxy did not drop the stream it gave up on")

        calls = stack.engine.calls
        stack.engine.faults = [("status", 503, 0), None]  # before the first chunk: retried
        raw, _ = await streamed()
        assert raw.endswith(b"data: [DONE]\n\n") and stack.engine.calls == calls + 2
        assert len((await stack.trace(session.session_id))["turns"]) == 1

    run_stack(body, tmp_path, upstream_timeout_s=BUDGET_S, upstream_retries=20)
