"""CPU per engine request: the proxy's HTTP client (``proxy.engine_http``) against aiohttp's, side by side.

    .venv/bin/python -m bench.engine_request_cost                  # 3 rounds of 2000 requests each
    .venv/bin/python -m bench.engine_request_cost --requests 500 --rounds 1

One aiohttp server on loopback answers every POST with a ~7 kB JSON body (a prompt's ids and a completion,
the size of a chat answer with ``return_token_ids``); this process, pinned to one core on uvloop as
``python -m proxy`` runs, sends ``--requests`` POSTs of a ~6.5 kB chat body one after another through each
client in turn, over one kept-alive connection, and prints the client's CPU per request (``process_time``,
this process only: the server runs in its own, on the other core) and the ratio, per round.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
import uvloop
from aiohttp import web

from proxy.engine_http import EngineHttp

ANSWER = orjson.dumps({"prompt_token_ids": list(range(1600)), "choices": [{"text": "x" * 200, "token_ids": [1] * 60}]})
REQUEST = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "y" * 6400}]})
HEADERS = {"Content-Type": "application/json"}


def serve(port: int) -> None:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def aiohttp_cost(url: str, requests: int) -> float:
    async with aiohttp.ClientSession() as http:

        async def one() -> bytes:
            async with http.post(url + "/v1/chat/completions", data=REQUEST, headers=HEADERS) as response:
                return await response.read()

        return await _cost(one, requests)


async def engine_http_cost(url: str, requests: int) -> float:
    pool = EngineHttp(url, headers=HEADERS)

    async def one() -> bytes:
        async with await pool.request("POST", "/v1/chat/completions", REQUEST) as response:
            return await response.read()

    try:
        return await _cost(one, requests)
    finally:
        pool.close()


async def _cost(one: Callable[[], Awaitable[bytes]], requests: int) -> float:
    for _ in range(50):
        assert await one() == ANSWER
    start = time.process_time()
    for _ in range(requests):
        await one()
    return (time.process_time() - start) / requests * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        os.sched_setaffinity(0, {1 % os.cpu_count()})
        serve(args.serve)
        return
    os.sched_setaffinity(0, {0})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "bench.engine_request_cost", "--serve", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        print(f"CPU per request, {args.requests} sequential POSTs of {len(REQUEST)} B answered with {len(ANSWER)} B")
        for round_ in range(args.rounds):
            ours = uvloop.run(engine_http_cost(url, args.requests))
            theirs = uvloop.run(aiohttp_cost(url, args.requests))
            print(f"  round {round_}: engine_http {ours:.3f} ms  aiohttp {theirs:.3f} ms  ratio {theirs / ours:.1f}x")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
