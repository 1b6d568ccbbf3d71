"""Resources the proxy holds are bounded by its settings, not by how many sessions or engines it saw:
journal descriptors (5,000 sessions under a 1024 open-file limit, created and recovered), what a failed
session creation leaves behind, and engine clients per ``llm_url``."""

from __future__ import annotations

import asyncio
import resource
import socket
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.client import ProxyClientError
from tests.proxy import proxy_processes as procs
from tests.proxy.proxy_stack import Stack, agent_turns, run_stack
from tests.support.wait import until

SESSIONS = 5000
WITH_CALLS = 200  # sessions that also record a call (keeps the test's time bounded)


async def _gather_bounded(coros: list[Awaitable[Any]], limit: int = 32) -> list[Any]:
    """``asyncio.gather`` with at most ``limit`` awaiting at once (bounded load on the proxy)."""
    gate = asyncio.Semaphore(limit)

    async def one(coro: Awaitable[Any]) -> Any:
        async with gate:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))


async def _create(http: aiohttp.ClientSession, url: str, **config: object) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {procs.ADMIN_KEY}"}
    async with http.post(f"{url}/sessions", json=config, headers=headers) as resp:
        return resp.status, await resp.json()


def test_sessions_are_not_bounded_by_the_open_file_limit(tmp_path: Path) -> None:
    """5,000 sessions under RLIMIT_NOFILE 1024: all created, 200 with a recorded call, all recovered after a
    SIGKILL, the recovered ones still capture, and the proxy holds few journal descriptors throughout."""
    limits = {resource.RLIMIT_NOFILE: 1024}
    with procs.fake_engine() as engine:

        async def fill(url: str, pid: int) -> tuple[dict[str, str], dict[str, dict]]:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as http:
                created = await _gather_bounded([_create(http, url, purpose="eval") for _ in range(SESSIONS)])
                failed = [answer for status, answer in created if status != 201]
                assert not failed, f"{len(failed)} of {SESSIONS} creations failed, e.g. {failed[0]}"
                keys = {answer["session_id"]: answer["api_key"] for _, answer in created}  # id -> API key
                called = list(keys)[:WITH_CALLS]
                stack = Stack(None, url, http, procs.ADMIN_KEY)
                await _gather_bounded([agent_turns(stack, keys[sid], 1, marker=sid) for sid in called])
                assert len(procs.open_files_under(pid, tmp_path)) <= 128  # --max-open-journals default
                traces = await _gather_bounded([stack.trace(sid) for sid in called], 8)
                return keys, dict(zip(called, traces, strict=True))

        async def check(url: str, keys: dict[str, str], before: dict[str, dict]) -> None:
            async with aiohttp.ClientSession() as http:
                stack = Stack(None, url, http, procs.ADMIN_KEY)
                async with http.get(f"{url}/sessions", headers=stack.admin_headers) as resp:
                    assert sorted(s["id"] for s in (await resp.json())["sessions"]) == sorted(keys)
                after = await _gather_bounded([stack.trace(sid) for sid in before], 8)
                assert dict(zip(before, after, strict=True)) == before
                await agent_turns(stack, keys[list(keys)[-1]], 1)  # a recovered session without calls records one
                status, answer = await _create(http, url, purpose="eval")
                assert status == 201, answer

        with procs.proxy(procs.url(engine), tmp_path, limits=limits) as proxy:
            assert procs.soft_limit(proxy.pid, "Max open files") == 1024
            keys, before = asyncio.run(fill(procs.url(proxy), proxy.pid))
            proxy.kill()
        with procs.proxy(procs.url(engine), tmp_path, limits=limits) as proxy:
            assert proxy.match["counts"].split()[0] == f"sessions={SESSIONS}"
            asyncio.run(check(procs.url(proxy), keys, before))
            assert len(procs.open_files_under(proxy.pid, tmp_path)) <= 128


def test_a_failed_session_creation_leaves_no_descriptor_and_no_journal(tmp_path: Path) -> None:
    """Settings that can't be journaled (400) and a journal write the disk refuses (503, simulated with
    RLIMIT_FSIZE) leave no file and no open descriptor; a record the disk refuses part-way is cut back off,
    so the session keeps recording and recovers exactly."""
    journals = tmp_path / "journals"
    nested: dict = {}
    leaf = nested
    for _ in range(300):  # JSON the proxy can read but not write (orjson nests at most 255 deep)
        leaf["x"] = {}
        leaf = leaf["x"]
    with procs.fake_engine() as engine:

        async def drive(url: str, pid: int) -> tuple[str, dict]:
            async with aiohttp.ClientSession() as http:
                stack = Stack(None, url, http, procs.ADMIN_KEY)
                for session_id, config, expected in (
                    ("nested", {"metadata": nested}, 400),
                    ("too-big", {"metadata": {"blob": "x" * 100_000}}, 503),  # past the 64 KiB file-size limit
                ):
                    status, answer = await _create(http, url, session_id=session_id, purpose="eval", **config)
                    assert status == expected, answer
                    assert list(journals.iterdir()) == [], f"{session_id}: a journal was left behind"
                    assert procs.open_files_under(pid, journals) == [], f"{session_id}: a descriptor leaked"
                status, answer = await _create(http, url, session_id="kept", purpose="eval")
                assert status == 201, answer
                status, _ = await stack.chat(answer["api_key"], [{"role": "user", "content": "y" * 70_000}])
                assert status != 200  # its record does not fit under the limit: the call fails
                replies = await agent_turns(stack, answer["api_key"], 2)  # and later records still fit
                return "kept", replies

        with procs.proxy(procs.url(engine), journals, limits={resource.RLIMIT_FSIZE: 64 * 1024}) as proxy:
            session_id, replies = asyncio.run(drive(procs.url(proxy), proxy.pid))
        with procs.proxy(procs.url(engine), journals) as proxy:
            assert proxy.match["counts"].split()[0] == "sessions=1"

            async def trace() -> dict:
                async with aiohttp.ClientSession() as http:
                    return await Stack(None, procs.url(proxy), http, procs.ADMIN_KEY).trace(session_id)

            turns = asyncio.run(trace())["turns"]
            assert [t["completion_token_ids"] for t in turns] == [r["choices"][0]["token_ids"] for r in replies]


def _established_to(port: int) -> int:
    """IPv4 TCP connections of this machine in ESTABLISHED state whose remote end is 127.0.0.1:``port``."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state = fields[2], fields[3]
        if state == "01" and remote == f"0100007F:{port:04X}":
            count += 1
    return count


def test_engine_clients_are_bounded_and_closed_when_unused(tmp_path: Path) -> None:
    """Each distinct ``llm_url`` got a client with a pool that stayed open forever: now at most
    ``max_engine_clients`` pools are open, the pool of an engine no session uses any more is closed, and a
    failed creation keeps none."""

    async def body(stack: Stack) -> None:
        assert stack.proxy is not None
        engine = stack.proxy.config.engine_url
        port = int(engine.rsplit(":", 1)[1])
        urls = [f"http://agent{i}@127.0.0.1:{port}" for i in range(12)]  # distinct URLs, one engine
        sessions = [await stack.create_session(purpose="eval", llm_url=u) for u in urls]
        await asyncio.gather(*(agent_turns(stack, s.api_key, 1, marker=s.session_id) for s in sessions))
        await until(lambda: _established_to(port) <= 4, "more engine pools open than max_engine_clients")
        await agent_turns(stack, sessions[0].api_key, 1, marker="again")  # an evicted engine's session still works
        await until(lambda: _established_to(port) <= 4, "an evicted engine's pool stayed open")
        for session in sessions:
            await asyncio.to_thread(stack.admin.delete, session.session_id)
        await until(lambda: _established_to(port) == 0, "the pool of an engine no session uses stayed open")
        for i in range(6):  # the engine refuses the tier probe: every creation fails after connecting
            stack.engine.faults = [("status", 400)]
            with pytest.raises(ProxyClientError) as refused:
                await stack.create_session(llm_url=f"http://failed{i}@127.0.0.1:{port}")
            assert refused.value.status == 502
        with socket.socket() as closed_port:  # bound, never listening: connections are refused
            closed_port.bind(("127.0.0.1", 0))
            with pytest.raises(ProxyClientError):
                await stack.create_session(llm_url=f"http://127.0.0.1:{closed_port.getsockname()[1]}")
        await until(lambda: _established_to(port) == 0, "a failed creation kept its engine's pool open")
        assert list(stack.proxy._clients) == []
        session = await stack.create_session(purpose="eval")  # the default engine: kept while the proxy runs
        await agent_turns(stack, session.api_key, 1)
        await asyncio.to_thread(stack.admin.delete, session.session_id)
        assert list(stack.proxy._clients) == [engine]

    run_stack(body, tmp_path, max_engine_clients=4)


def test_a_call_of_a_deleted_session_never_writes_into_the_journal_of_its_successor(tmp_path: Path) -> None:
    """Journals reopen their file on demand; a session deleted mid-call must not reopen its path once a new
    session of the same id owns it, or the old call's turn would land in the new session's trace."""

    async def body(stack: Stack) -> None:
        assert stack.engine is not None
        old = await stack.create_session(session_id="reused")
        engine_done = asyncio.Event()
        stack.engine.faults = [("hold", engine_done)]
        calls = stack.engine.calls
        old_call = asyncio.create_task(stack.chat(old.api_key, [{"role": "user", "content": "old"}]))
        await until(lambda: stack.engine.calls == calls + 1, "the old session's call did not reach the engine")
        await asyncio.to_thread(stack.admin.delete, "reused")
        await stack.create_session(session_id="reused")
        engine_done.set()
        await old_call  # its answer is the model-call path's business; where its turn went is this test's
        assert (await stack.trace("reused"))["turns"] == []
        journal = (tmp_path / "reused.jsonl").read_bytes()
        assert journal.count(b"\n") == 1, journal[:500]  # the new session's header only

    run_stack(body, tmp_path)
