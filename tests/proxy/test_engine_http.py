"""The proxy's HTTP/1.1 client for the engine (``proxy.engine_http``) against a scripted loopback server.

Each test's server answers raw bytes, so every framing the client must read (``Content-Length``, chunked, to
the connection's end) and every way an engine can fail (a pooled connection it closed, a reset, an answer that
is not HTTP) is exercised on real sockets.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

import pytest

from proxy.engine_http import DeadlinePassed, EngineConnectionError, EngineHttp

Answer = Callable[[int, asyncio.StreamWriter], Awaitable[bool]]
"""Answers the ``n``-th request (from 0) of a connection; returns whether to keep serving that connection."""


async def _serve(answer: Answer) -> tuple[asyncio.Server, list[bytes], list[int]]:
    """A loopback server calling ``answer`` per request; also the requests seen and the connections opened."""
    requests: list[bytes] = []
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            for n in itertools.count():
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                requests.append(head + await reader.readexactly(length))
                if not await answer(n, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, requests, connections


def _url(server: asyncio.Server) -> str:
    return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/prefix"


async def _json(_: int, writer: asyncio.StreamWriter) -> bool:
    writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}')
    return True


def test_requests_reuse_one_kept_alive_connection_and_send_the_prefix_and_headers() -> None:
    async def run() -> None:
        server, requests, connections = await _serve(_json)
        pool = EngineHttp(_url(server), headers={"Authorization": "Bearer k"})
        for _ in range(3):
            async with await pool.request("POST", "/v1/x", b'{"a":1}') as response:
                assert response.status == 200 and await response.read() == b'{"ok":true}'
        pool.close()
        server.close()
        assert len(connections) == 1
        assert requests[0].startswith(b"POST /prefix/v1/x HTTP/1.1\r\n")
        assert b"Authorization: Bearer k\r\n" in requests[0] and requests[0].endswith(b'\r\n\r\n{"a":1}')

    asyncio.run(run())


def test_a_chunked_body_is_read_piece_by_piece_as_it_arrives_then_the_connection_is_reused() -> None:
    """A read returns what arrived: the chunks that came in together are one piece, not one read each (the proxy
    pays per read)."""
    sent_second = asyncio.Event()

    async def chunked(_: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n")
        await sent_second.wait()
        writer.write(b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: x\r\n\r\n")
        sent_second.clear()
        return True

    async def run() -> None:
        server, _, connections = await _serve(chunked)
        pool = EngineHttp(_url(server), headers={})
        for _ in range(2):
            async with await pool.request("POST", "/s", b"{}") as response:
                assert await response.readany() == b"data: "  # before the rest was sent
                sent_second.set()
                assert await response.readany() == b"abcde"
                assert await response.readany() == b""
        pool.close()
        server.close()
        assert len(connections) == 1

    asyncio.run(run())


def test_a_read_waiting_past_the_deadline_raises_and_drops_the_connection() -> None:
    """``expire_at``: one timer bounds every read of the body; the read waiting when it passes raises
    ``DeadlinePassed`` (a ``TimeoutError``) and the connection is not reused."""

    async def stalls(_: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n")
        await asyncio.sleep(30)
        return False

    async def run() -> None:
        server, _, connections = await _serve(stalls)
        pool = EngineHttp(_url(server), headers={})
        loop = asyncio.get_running_loop()
        async with await pool.request("POST", "/s", b"{}") as response:
            response.expire_at(loop.time() + 0.3)
            assert await response.readany() == b"data: "
            started = loop.time()
            with pytest.raises(DeadlinePassed):
                await response.readany()
            assert 0.2 < loop.time() - started < 2
            with pytest.raises(EngineConnectionError, match="closed before its body was read"):
                await response.readany()
        async with await pool.request("POST", "/s", b"{}") as response:
            pass
        pool.close()
        server.close()
        assert len(connections) == 2

    asyncio.run(run())


def test_a_body_framed_by_the_connections_end_is_read_whole_and_the_connection_not_reused() -> None:
    async def close_delimited(_: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 503 Busy\r\nRetry-After: 0\r\n\r\nbusy")
        return False

    async def run() -> None:
        server, _, connections = await _serve(close_delimited)
        pool = EngineHttp(_url(server), headers={})
        for _ in range(2):
            async with await pool.request("GET", "/health") as response:
                assert (response.status, response.headers["retry-after"]) == (503, "0")
                assert await response.read() == b"busy"
        pool.close()
        server.close()
        assert len(connections) == 2

    asyncio.run(run())


def test_a_pooled_connection_the_engine_closed_is_sent_again_on_a_new_one() -> None:
    async def answer_only_the_first(n: int, writer: asyncio.StreamWriter) -> bool:
        return n == 0 and await _json(n, writer)  # the next request on that connection: closed unanswered

    async def run() -> None:
        server, requests, connections = await _serve(answer_only_the_first)
        pool = EngineHttp(_url(server), headers={})
        for _ in range(3):
            async with await pool.request("POST", "/v1/x", b"{}") as response:
                assert await response.read() == b'{"ok":true}'
        pool.close()
        server.close()
        assert len(connections) == 3 and len(requests) == 5  # requests 2 and 3 each sent twice

    asyncio.run(run())


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nabc",
    ],
    ids=["not-http", "bad-header", "cut-body", "bad-chunk-size", "chunk-longer-than-its-size", "cut-chunk"],
)
def test_answers_that_are_not_whole_http_are_connection_errors(answer: bytes) -> None:
    async def broken(_: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer)
        return False

    async def run() -> None:
        server, _, _ = await _serve(broken)
        pool = EngineHttp(_url(server), headers={})
        with pytest.raises(EngineConnectionError):
            async with await pool.request("POST", "/v1/x", b"{}") as response:
                await response.read()
        pool.close()
        server.close()

    asyncio.run(run())


def test_an_engine_that_is_not_listening_is_a_connection_error_naming_it() -> None:
    async def run() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        url = _url(server)
        server.close()
        await server.wait_closed()
        with pytest.raises(EngineConnectionError, match=r"cannot connect to 127\.0\.0\.1"):
            await EngineHttp(url, headers={}).request("GET", "/health")

    asyncio.run(run())


def test_requests_past_max_connections_wait_for_one_and_cancelled_ones_free_their_slot() -> None:
    release = asyncio.Event()

    async def slow(n: int, writer: asyncio.StreamWriter) -> bool:
        await release.wait()
        return await _json(n, writer)

    async def run() -> None:
        server, _, connections = await _serve(slow)
        pool = EngineHttp(_url(server), headers={}, max_connections=2)

        async def call() -> bytes:
            async with await pool.request("POST", "/v1/x", b"{}") as response:
                return await response.read()

        cancelled = asyncio.create_task(call())
        calls = [asyncio.create_task(call()) for _ in range(4)]
        await asyncio.sleep(0.2)
        assert len(connections) == 2  # two in flight, three waiting
        cancelled.cancel()  # its connection is dropped and its slot goes to a waiting call
        await asyncio.sleep(0.2)
        assert len(connections) == 3
        release.set()
        assert await asyncio.gather(*calls) == [b'{"ok":true}'] * 4
        assert len(connections) <= 3
        pool.close()
        server.close()

    asyncio.run(run())


def test_a_url_without_http_is_refused() -> None:
    with pytest.raises(ValueError, match="http"):
        EngineHttp("unix:///tmp/engine.sock", headers={})
