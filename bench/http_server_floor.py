"""What aiohttp's server costs per request, against the least an asyncio HTTP/1.1 server does, side by side.

The proxy serves agents through aiohttp's web server (``proxy/server.py``). This bench answers one question for
whoever would replace it: how much of a call's CPU is the server's own. Two servers answer the same requests, one
after the other, each in its own process on uvloop pinned to core 0 (the load runs on core 1):

- ``aiohttp``: a ``web.Application`` with one middleware, as the proxy has, and its runner's settings;
- ``bare``: an ``asyncio.Protocol`` that splits the request line and headers itself and writes the answer to the
  transport, with none of the checks, limits and timeouts a real server needs: the floor, not an alternative.

``POST /call`` reads a JSON body (about 3 kB), parses it and answers a fixed JSON reply (about 1.2 kB); with
``?stream=1`` it answers the reply as an SSE stream of three chunked writes, as the proxy streams a reply (start,
text, end). The load is keep-alive connections on raw asyncio streams at concurrency 1 and 64. Printed: the
server process's CPU per request (``/proc``, as ``bench/proxy_vs_openenv.py`` reads it) and aiohttp's over bare's.
Usage: ``.venv/bin/python -m bench.http_server_floor [--requests 8000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from typing import cast

import orjson
import uvloop
from aiohttp import web
from aiohttp.typedefs import Handler

from bench.proxy_vs_openenv import free_port, proc_cpu_s

REPLY = orjson.dumps({"id": "r", "choices": [{"message": {"role": "assistant", "content": "hello " * 200}}]})
FRAMES = (b"data: " + REPLY[:200] + b"\n\n", b"data: " + REPLY[200:600] + b"\n\n", b"data: " + REPLY[600:] + b"\n\n")
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi " * 1000}]})
SERVERS = ("aiohttp", "bare")
CONCURRENCY = (1, 64)


async def serve_aiohttp(port: int) -> None:
    @web.middleware
    async def passing(request: web.Request, handler: Handler) -> web.StreamResponse:  # as the proxy's, less its catch
        return await handler(request)

    async def call(request: web.Request) -> web.StreamResponse:
        orjson.loads(await request.read())
        if not request.query.get("stream"):
            return web.Response(body=REPLY, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(FRAMES[0])
        await response.write(FRAMES[1])
        await response.write_eof(FRAMES[2])
        return response

    app = web.Application(middlewares=[passing])
    app.router.add_post("/call", call)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, auto_decompress=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()


class _Bare(asyncio.Protocol):
    """Requests with a ``Content-Length`` body, one at a time per connection; nothing checked."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            lines = self.buffer[:end].split(b"\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
            asyncio.get_running_loop().create_task(self.answer(lines[0].split(b" ")[1], body))

    async def answer(self, target: bytes, body: bytes) -> None:
        orjson.loads(body)
        if b"stream=1" not in target:
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(REPLY)
            self.transport.write(head + REPLY)
            return
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        self.transport.write(head + b"%x\r\n%s\r\n" % (len(FRAMES[0]), FRAMES[0]))
        await asyncio.sleep(0)  # a write per step of the reply, as a relay makes them
        self.transport.write(b"%x\r\n%s\r\n" % (len(FRAMES[1]), FRAMES[1]))
        await asyncio.sleep(0)
        self.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(FRAMES[2]), FRAMES[2]))


async def serve_bare(port: int) -> None:
    await asyncio.get_running_loop().create_server(_Bare, "127.0.0.1", port)


async def _answer(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    if b"chunked" not in head:
        length = next(int(line[15:]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
        return await reader.readexactly(length)
    pieces = []
    while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
        pieces.append((await reader.readexactly(size + 2))[:-2])
    await reader.readexactly(2)
    return b"".join(pieces)


async def _client(port: int, calls: int, stream: bool) -> None:
    target = b"/call?stream=1" if stream else b"/call"
    request = b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        target,
        len(BODY),
        BODY,
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(calls):
        writer.write(request)
        await _answer(reader)
    writer.close()


async def measure(port: int, pid: int, concurrency: int, stream: bool, requests: int) -> float:
    """Process ``pid``'s CPU ms per request over ``requests`` requests at ``concurrency``, after a warm-up."""
    await asyncio.gather(*(_client(port, 20, stream) for _ in range(concurrency)))
    before = proc_cpu_s(pid)
    await asyncio.gather(*(_client(port, requests // concurrency, stream) for _ in range(concurrency)))
    return (proc_cpu_s(pid) - before) * 1e3 / (requests // concurrency * concurrency)


def _wait_listening(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"the server on port {port} did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=8000, help="requests per measurement")
    parser.add_argument("--serve", nargs=2, metavar=("SERVER", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        server, port = args.serve[0], int(args.serve[1])

        async def run() -> None:
            await (serve_aiohttp if server == "aiohttp" else serve_bare)(port)
            await asyncio.Event().wait()

        uvloop.run(run())
        return
    pin = len(os.sched_getaffinity(0)) > 1
    if pin:
        os.sched_setaffinity(0, {1})
    results: dict[tuple[str, bool, int], float] = {}
    for server in SERVERS:
        port = free_port()
        command = [sys.executable, "-m", "bench.http_server_floor", "--serve", server, str(port)]
        process = subprocess.Popen(command, preexec_fn=(lambda: os.sched_setaffinity(0, {0})) if pin else None)
        try:
            _wait_listening(port, process)
            for stream in (False, True):
                for concurrency in CONCURRENCY:
                    results[server, stream, concurrency] = uvloop.run(
                        measure(port, process.pid, concurrency, stream, args.requests)
                    )
        finally:
            process.terminate()
            process.wait(10)
    print(
        "| reply | concurrency | aiohttp CPU ms/request | bare CPU ms/request | aiohttp ÷ bare | aiohttp − bare, ms |"
    )
    print("|---|---|---|---|---|---|")
    for stream in (False, True):
        for concurrency in CONCURRENCY:
            ours, bare = results["aiohttp", stream, concurrency], results["bare", stream, concurrency]
            kind = "SSE, 3 writes" if stream else "JSON"
            print(f"| {kind} | {concurrency} | {ours:.3f} | {bare:.3f} | {ours / bare:.2f} | {ours - bare:.3f} |")


if __name__ == "__main__":
    main()
