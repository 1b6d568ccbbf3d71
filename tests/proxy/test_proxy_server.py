"""The real capture proxy on loopback in front of a fake vLLM-like engine: capture, auth, faults."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from openenv.core.harness.training import TrainingTrace as OpenEnvTrainingTrace

import proxy.server as server_module
from proxy.capture_graph import CaptureGraph
from proxy.client import ProxyAdminClient, ProxyClientError, ProxySession
from proxy.server import BUDGET_EXHAUSTED_TEXT as BUDGET_TEXT
from tests.proxy.proxy_stack import TOOLS, Stack, agent_turns, run_stack
from tests.support.processes import ReadyProcess
from tests.support.wait import until


def _assert_trace_matches(trace: dict, replies: list[dict]) -> None:
    OpenEnvTrainingTrace.model_validate(trace)
    assert len(trace["turns"]) == len(replies)
    by_ids = {tuple(t["prompt_token_ids"]): t for t in trace["turns"]}
    for reply in replies:
        turn = by_ids[tuple(reply["prompt_token_ids"])]
        assert turn["completion_token_ids"] == reply["choices"][0]["token_ids"]


def test_multi_turn_capture_is_exact_and_one_path(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session(sampling={"temperature": 0.7})
        replies = await agent_turns(stack, session.api_key, 6)
        trace = await stack.trace(session.session_id)
        _assert_trace_matches(trace, replies)
        assert len(await stack.sequences(session.session_id)) == 1
        for turn in trace["turns"]:
            n = len(turn["prompt_token_ids"])
            assert turn["loss_mask"][:n] == [0] * n
            assert turn["loss_mask"][n:] == [1] * len(turn["completion_token_ids"])
            assert turn["metadata"]["sampling_params"]["temperature"] == 0.7
            assert turn["metadata"]["sampling_params"]["top_p"] == 1.0

    run_stack(body, tmp_path)


def test_a_body_that_arrived_whole_is_read_without_a_timer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a body already received can't wait, so no body timeout (a timer per call) is set for it; one
    still arriving gets it (``test_connection_bounds``: slow bodies are answered 408)."""
    timers: list[str] = []
    timeout = asyncio.timeout

    def counted(delay: float | None) -> asyncio.Timeout:
        timers.append(sys._getframe(1).f_code.co_name)
        return timeout(delay)

    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        monkeypatch.setattr(asyncio, "timeout", counted)
        status, _ = await stack.chat(session.api_key, [{"role": "user", "content": "hi"}])
        assert status == 200 and "_read_body" not in timers, timers

    run_stack(body, tmp_path)


def test_keys_and_admin(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        async with stack.http.post(f"{stack.url}/sessions", json={}) as resp:
            assert resp.status == 401
        async with stack.http.post(f"{stack.url}/sessions", json={}, headers={"Authorization": "Bearer wrong"}) as resp:
            assert resp.status == 401
        status, err = await stack.chat("s" + "0" * 24, [{"role": "user", "content": "hi"}])
        assert status == 401 and err["error"]["type"] == "authentication_error"
        headers = {"x-api-key": "nope", "anthropic-version": "2023-06-01"}
        body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        async with stack.http.post(f"{stack.url}/v1/messages", json=body, headers=headers) as resp:
            err = await resp.json()
            assert resp.status == 401 and err["type"] == "error" and err["error"]["type"] == "authentication_error"
        session = await stack.create_session(session_id="my-run.0", purpose="eval")
        assert session.session_id == "my-run.0" and session.api_key != session.session_id
        async with stack.http.get(f"{stack.url}/sessions", headers=stack.admin_headers) as resp:  # no client method
            assert [s["id"] for s in (await resp.json())["sessions"]] == ["my-run.0"]

    run_stack(body, tmp_path)


def test_policy_refusals_and_budget(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session(max_model_calls=2)
        msgs = [{"role": "user", "content": "hi"}]
        status, err = await stack.chat(session.api_key, msgs, logit_bias={"5": 10})
        assert status == 400 and "logit_bias" in err["error"]["message"]
        status, err = await stack.chat(session.api_key, msgs, n=2)
        assert status == 400
        status, err = await stack.chat(session.api_key, msgs, tools=TOOLS, tool_choice="required")
        assert status == 400 and err["error"]["param"] == "tool_choice"
        for _ in range(2):
            status, _reply = await stack.chat(session.api_key, msgs, temperature=0.1)
            assert status == 200
        status, reply = await stack.chat(session.api_key, msgs)
        assert status == 200 and reply["choices"][0]["message"]["content"] == BUDGET_TEXT
        trace = await stack.trace(session.session_id)
        assert len(trace["turns"]) == 2
        assert trace["turns"][0]["metadata"]["requested_sampling_params"] == {"temperature": 0.1}
        assert trace["turns"][0]["metadata"]["sampling_params"]["temperature"] == 1.0

    run_stack(body, tmp_path)


def test_upstream_faults_become_dialect_errors_and_record_nothing(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        msgs = [{"role": "user", "content": "hi"}]
        stack.engine.faults = [("status", 503, 0), ("status", 429, 0), None]
        status, _ = await stack.chat(session.api_key, msgs)
        assert status == 200  # retried twice, honouring Retry-After: 0
        stack.engine.faults = [("status", 500)] * 4
        status, err = await stack.chat(session.api_key, msgs)
        assert status == 502 and "injected 500" in err["error"]["message"]
        stack.engine.faults = [("status", 400)]
        status, err = await stack.chat(session.api_key, msgs)
        assert status == 400 and "injected 400" in err["error"]["message"]
        stack.engine.faults = [("truncate",)]
        status, err = await stack.chat(session.api_key, msgs)
        assert status == 502 and "invalid JSON" in err["error"]["message"]
        stack.engine.faults = [("no_ids",)]
        status, err = await stack.chat(session.api_key, msgs)
        assert status == 502 and "prompt_token_ids" in err["error"]["message"]
        trace = await stack.trace(session.session_id)
        assert len(trace["turns"]) == 1

    run_stack(body, tmp_path)


def test_upstream_timeout(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        probes = stack.engine.calls  # the proxy probes the engine when the first session is created
        stack.engine.faults = [("hold", asyncio.Event())]  # never answers: only the proxy's timeout ends the call
        # The bound is far above upstream_timeout_s: it only keeps a proxy that never times out from hanging.
        try:
            status, err = await asyncio.wait_for(stack.chat(session.api_key, [{"role": "user", "content": "hi"}]), 60)
        except TimeoutError:
            pytest.fail("the proxy waited on the engine past its 0.5 s upstream timeout")
        assert status == 504 and "timed out" in err["error"]["message"]
        await until(lambda: stack.engine.cancelled == 1, "the proxy did not drop the engine call it gave up on")
        assert stack.engine.calls == probes + 1  # upstream_retries=0: not retried
        assert len((await stack.trace(session.session_id))["turns"]) == 0

    run_stack(body, tmp_path, upstream_timeout_s=0.5, upstream_retries=0)


def test_client_disconnect_cancels_upstream_and_records_nothing(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        probes = stack.engine.calls  # the proxy probes the engine when the first session is created
        for n, stream in enumerate((False, True), start=1):
            stack.engine.faults = [("hold", asyncio.Event())]  # never answers: only a cancellation ends the call
            call = asyncio.create_task(stack.chat(session.api_key, [{"role": "user", "content": "hi"}], stream=stream))
            await until(lambda n=n: stack.engine.calls == probes + n, "the call did not reach the engine")
            call.cancel()  # the agent goes away
            with pytest.raises(asyncio.CancelledError):
                await call
            await until(lambda n=n: stack.engine.cancelled == n, "the engine call was not cancelled")
        assert len((await stack.trace(session.session_id))["turns"]) == 0

    run_stack(body, tmp_path, keepalive_s=0.1)


def test_an_agent_that_hangs_up_as_its_stream_is_written_records_nothing_and_logs_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's connection closes just before the proxy writes its stream's second frame (aiohttp then refuses
    the write: ``ClientConnectionResetError``, a ``ConnectionResetError``): a client gone, not a proxy error, so no
    "Error handling request" traceback, nothing recorded, and the session's next call is served."""
    write = aiohttp.web.StreamResponse.write
    proxy_port: list[int] = []
    writes: list[aiohttp.web.StreamResponse] = []  # the proxy's stream, once per write

    async def hang_up_before_second_frame(self: aiohttp.web.StreamResponse, data: bytes) -> None:
        transport = self._req.transport if self._req is not None else None
        if transport is not None and transport.get_extra_info("sockname")[1] in proxy_port:
            writes.append(self)
            if len(writes) == 2:
                transport.close()
        await write(self, data)

    async def body(stack: Stack) -> None:
        proxy_port.append(int(stack.url.rsplit(":", 1)[1]))
        session = await stack.create_session()
        monkeypatch.setattr(aiohttp.web.StreamResponse, "write", hang_up_before_second_frame)
        payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        headers = {"Authorization": f"Bearer {session.api_key}"}
        with pytest.raises(aiohttp.ClientPayloadError):
            async with stack.http.post(f"{stack.url}/v1/chat/completions", json=payload, headers=headers) as resp:
                assert resp.status == 200
                await resp.read()
        assert len(writes) >= 2, "the proxy's stream was never written past its first frame"
        monkeypatch.undo()
        assert len((await stack.trace(session.session_id))["turns"]) == 0
        status, reply = await stack.chat(session.api_key, [{"role": "user", "content": "hi"}])
        assert status == 200, reply
        assert len((await stack.trace(session.session_id))["turns"]) == 1

    caplog.set_level(logging.DEBUG)
    run_stack(body, tmp_path, engine_options={"token_latency_s": 0.01})
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert not errors, [record.getMessage() for record in errors]


def test_streaming_keepalive_and_replay(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        engine_done = asyncio.Event()
        stack.engine.faults = [("hold", engine_done)]
        payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "tools": TOOLS}
        headers = {"Authorization": f"Bearer {session.api_key}"}
        lines: list[bytes] = []

        async def read_until_two_keepalives() -> None:
            while lines.count(b": keepalive\n") < 2:
                line = await resp.content.readline()
                assert line, f"the stream ended before two keepalives: {lines}"
                lines.append(line)

        async with stack.http.post(f"{stack.url}/v1/chat/completions", json=payload, headers=headers) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            try:  # while the engine still holds the call
                await asyncio.wait_for(read_until_two_keepalives(), 30)
            except TimeoutError:
                pytest.fail(f"fewer than two keepalives in 30 s while the engine worked: {lines}")
            assert (
                len((await stack.trace(session.session_id))["turns"]) == 0
            )  # nothing recorded before the engine answered
            engine_done.set()
            raw = b"".join(lines) + await resp.content.read()
        assert raw.decode().rstrip().endswith("data: [DONE]")
        assert len((await stack.trace(session.session_id))["turns"]) == 1

    run_stack(body, tmp_path, keepalive_s=0.1)


def test_concurrent_sessions_never_mix(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        sessions = [await stack.create_session() for _ in range(24)]
        results = await asyncio.gather(
            *(agent_turns(stack, s.api_key, 4, marker=f"task number {i}") for i, s in enumerate(sessions))
        )
        for i, (session, replies) in enumerate(zip(sessions, results, strict=True)):
            trace = await stack.trace(session.session_id)
            _assert_trace_matches(trace, replies)
            for turn in trace["turns"]:
                assert turn["request"]["messages"][1]["content"] == f"task number {i}"

    run_stack(body, tmp_path)


def test_bad_bodies_get_clear_4xx(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        headers = {"Authorization": f"Bearer {session.api_key}", "Content-Type": "application/json"}
        url = f"{stack.url}/v1/chat/completions"
        async with stack.http.post(url, data=b"{not json", headers=headers) as resp:
            err = await resp.json()
            assert resp.status == 400 and "malformed JSON" in err["error"]["message"]
        async with stack.http.post(url, data=b"x" * 300_000, headers=headers) as resp:
            err = await resp.json()
            assert resp.status == 413 and "exceeds" in err["error"]["message"]
        async with stack.http.post(url, json={"model": "m"}, headers=headers) as resp:
            assert resp.status == 400
        async with stack.http.get(f"{stack.url}/metrics") as resp:
            text = await resp.text()
            assert "proxy_client_errors_total 2" in text

    run_stack(body, tmp_path, max_body_bytes=200_000)


FAKE_VLLM_READY = re.compile(r"fake vLLM on (http://\S+)")
PROXY_READY = re.compile(r"proxy listening on (http://\S+)")


def test_sigkill_and_restart_serves_same_traces(tmp_path: Path) -> None:
    with ReadyProcess([sys.executable, "bench/fake_vllm.py"], FAKE_VLLM_READY, timeout_s=30) as engine:
        proxy_cmd = [sys.executable, "-m", "proxy", "--engine-url", engine.match.group(1)]
        proxy_cmd += ["--journal-dir", str(tmp_path), "--port", "0", "--admin-key", "adm"]

        async def drive(url: str) -> tuple[list[ProxySession], dict[str, dict]]:
            async with aiohttp.ClientSession() as http:
                stack = Stack(None, url, http, "adm")
                sessions = [await stack.create_session() for _ in range(3)]
                await asyncio.gather(*(agent_turns(stack, s.api_key, 3) for s in sessions))
                return sessions, {s.session_id: await stack.trace(s.session_id) for s in sessions}

        async def fetch(url: str, sessions: list[ProxySession]) -> dict[str, dict]:
            async with aiohttp.ClientSession() as http:
                stack = Stack(None, url, http, "adm")
                traces = {s.session_id: await stack.trace(s.session_id) for s in sessions}
                await agent_turns(stack, sessions[0].api_key, 1)  # a recovered session keeps capturing
                return traces

        with ReadyProcess(proxy_cmd, PROXY_READY, timeout_s=30) as proxy:
            assert "event_loop=uvloop" in proxy.match.string  # the proxy's own loop: half the CPU per call
            sessions, before = asyncio.run(drive(proxy.match.group(1)))
            assert proxy.kill() == -signal.SIGKILL
        with ReadyProcess(proxy_cmd, PROXY_READY, timeout_s=30) as proxy:
            assert asyncio.run(fetch(proxy.match.group(1), sessions)) == before


def test_concurrent_calls_of_one_session_cannot_overrun_its_budget(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session(max_model_calls=2)
        probes = stack.engine.calls  # the proxy probes the engine when the first session is created
        engine_done = asyncio.Event()
        stack.engine.faults = [("hold", engine_done)] * 2
        msgs = [{"role": "user", "content": "hi"}]
        calls = [asyncio.create_task(stack.chat(session.api_key, msgs)) for _ in range(5)]
        # While the engine holds two calls, the other three are answered by the budget, not the engine.
        # (The budget may answer before the second held call has reached the engine, so wait for both.)
        await until(
            lambda: sum(c.done() for c in calls) == 3 and stack.engine.calls == probes + 2,
            "three calls were not answered while two ran",
        )
        early = [c.result() for c in calls if c.done()]
        assert all(status == 200 and r["choices"][0]["message"]["content"] == BUDGET_TEXT for status, r in early)
        engine_done.set()
        replies = await asyncio.gather(*calls)
        assert all(status == 200 for status, _ in replies)
        budget = [r for _, r in replies if r["choices"][0]["message"]["content"] == BUDGET_TEXT]
        assert len(budget) == 3
        assert stack.engine.calls == probes + 2
        assert len((await stack.trace(session.session_id))["turns"]) == 2

    run_stack(body, tmp_path)


def test_control_plane_and_odd_bodies_get_answers_in_the_callers_dialect(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        assert (await stack.create_session(session_id="s-dup")).session_id == "s-dup"
        with pytest.raises(ProxyClientError) as duplicate:
            await stack.create_session(session_id="s-dup")
        assert duplicate.value.status == 409 and "s-dup" in str(duplicate.value)
        with socket.socket() as closed_port:  # bound, never listening: connections are refused
            closed_port.bind(("127.0.0.1", 0))
            with pytest.raises(ProxyClientError) as unreachable:
                await stack.create_session(llm_url=f"http://127.0.0.1:{closed_port.getsockname()[1]}")
        assert unreachable.value.status == 502 and "engine probe failed" in str(unreachable.value)
        session = await stack.create_session()
        msgs = [{"role": "user", "content": "hi"}]
        status, error = await stack.chat(session.api_key, msgs, max_tokens="5")
        assert status == 400 and error["error"]["param"] == "max_tokens"
        status, error = await stack.chat(session.api_key, msgs, response_format="json")
        assert status == 400 and error["error"]["param"] == "response_format"
        headers = {"x-api-key": session.api_key, "anthropic-version": "2023-06-01"}
        async with stack.http.post(f"{stack.url}/v1/messages/count_tokens", json=[1], headers=headers) as resp:
            error = await resp.json()
            assert resp.status == 400 and error["type"] == "error", error

    run_stack(body, tmp_path)


def test_the_proxy_model_setting_names_the_served_model(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        assert (await stack.describe(session.session_id))["model"] == "served-as-this"

    run_stack(body, tmp_path, model="served-as-this")


def test_the_blocking_admin_client_covers_the_control_plane(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        client = ProxyAdminClient(stack.url, stack.admin_key, timeout_s=10)
        session = await asyncio.to_thread(client.create_session, max_model_calls=3, metadata={"episode": 1})
        assert session.api_key not in repr(session)
        await agent_turns(stack, session.api_key, 2)
        described = await asyncio.to_thread(client.describe, session.session_id)
        assert described["config"]["metadata"] == {"episode": 1} and described["stats"]["calls"] == 2
        trace = await asyncio.to_thread(client.trace, session.session_id)
        sequences = await asyncio.to_thread(client.sequences, session.session_id)
        assert len(trace.turns) == 2 and len(sequences) == 1
        await asyncio.to_thread(client.delete, session.session_id)
        with pytest.raises(ProxyClientError) as missing:
            await asyncio.to_thread(client.describe, session.session_id)
        assert missing.value.status == 404
        with pytest.raises(ProxyClientError) as refused:
            await asyncio.to_thread(ProxyAdminClient(stack.url, "wrong-key", timeout_s=10).create_session)
        assert refused.value.status == 401

    run_stack(body, tmp_path)


def test_exports_build_and_serialise_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace or sequence export (hundreds of MB for a long session) never runs on the loop that serves
    every other session: building and serialising both happen on a worker thread."""
    threads: dict[str, threading.Thread] = {}
    trace_json, dumps = CaptureGraph.trace_json, server_module.orjson.dumps

    def recording_trace_json(graph: CaptureGraph) -> bytes:
        threads["trace"] = threading.current_thread()
        return trace_json(graph)

    def recording_dumps(value: Any, *args: Any, **kwargs: Any) -> bytes:
        if isinstance(value, dict) and "sequences" in value:
            threads["sequences"] = threading.current_thread()
        return dumps(value, *args, **kwargs)

    monkeypatch.setattr(CaptureGraph, "trace_json", recording_trace_json)
    monkeypatch.setattr(server_module.orjson, "dumps", recording_dumps)

    async def body(stack: Stack) -> None:
        session = await stack.create_session(purpose="train", sampling={"temperature": 1.0})
        await agent_turns(stack, session.api_key, 3)
        loop_thread = threading.current_thread()
        assert len((await stack.trace(session.session_id))["turns"]) == 3
        assert len(await stack.sequences(session.session_id)) == 1
        assert set(threads) == {"trace", "sequences"}
        assert all(thread is not loop_thread for thread in threads.values())

    run_stack(body, tmp_path)


def test_a_large_request_is_parsed_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An 8 MB request (20,000 Anthropic messages of 8 text blocks) is parsed and translated on a worker
    thread, a small one inline; while the large one is parsed (then answered by the spent call budget, so
    the engine is not involved), requests to the same proxy keep being answered: the longest wait for one
    is well under the large request's time (inline it was nearly all of it; what is left is orjson's
    parse, which holds the GIL)."""
    threads: list[threading.Thread] = []
    translate = server_module._translate

    def recording_translate(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return translate(*args)

    monkeypatch.setattr(server_module, "_translate", recording_translate)
    blocks = [{"type": "text", "text": "x" * 20}] * 8
    messages = [{"role": "user", "content": blocks}, {"role": "assistant", "content": blocks}] * 10_000
    messages.append({"role": "user", "content": "?"})
    payload = orjson.dumps({"model": "any", "max_tokens": 16, "messages": messages})
    assert len(payload) > server_module.INLINE_PARSE_BYTES

    async def body(stack: Stack) -> None:
        session = await stack.create_session(purpose="train", sampling={"temperature": 1.0}, max_model_calls=1)
        key = session.api_key
        await agent_turns(stack, key, 1)
        loop_thread = threading.current_thread()
        assert threads == [loop_thread]
        headers = {"x-api-key": key, "Content-Type": "application/json"}

        async def large() -> float:
            started = time.perf_counter()
            async with stack.http.post(f"{stack.url}/v1/messages", data=payload, headers=headers) as resp:
                assert resp.status == 200 and BUDGET_TEXT in (await resp.text())
            return time.perf_counter() - started

        task = asyncio.ensure_future(large())
        waits = []
        while not task.done():
            started = time.perf_counter()
            async with stack.http.get(f"{stack.url}/health") as resp:
                assert resp.status == 200
            waits.append(time.perf_counter() - started)
        elapsed = await task
        assert len(threads) == 2 and threads[1] is not loop_thread
        assert max(waits) < elapsed * 0.6, f"a small request waited {max(waits):.3f} s of the large one's {elapsed:.3f}"

    run_stack(body, tmp_path)
