"""Connections the proxy holds are bounded in time and number: idle and slow (slowloris) connections are closed
by the read timeouts, connections past the cap are refused at once without a log line each, and an agent's
session keeps calling, with an exact trace, through a 2,000-connection flood under a 1024 open-file limit."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import re
import resource
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.queues import Queue as QueueType
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import aiohttp
import pytest

from tests.proxy import proxy_processes as procs
from tests.proxy.proxy_stack import Stack

FLOOD = 2000
SLOW_EACH = 20  # connections per slow kind
TIMEOUT_S = 1.0  # --idle-timeout-s and --body-timeout-s
CLOSE_WITHIN_S = 6.0  # timeout, plus the drain of an unread body (at most the body timeout), plus scheduling noise
OPEN_AT_MOST_S = 10.0  # a connection open this long is reported as never closed
STILL_OPEN = b"(still open)"
HI = [{"role": "user", "content": "hi"}]


def _ensure_descriptors(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} open files in the test process; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


async def _closed_after(reader: asyncio.StreamReader, started: float) -> tuple[float, bytes]:
    """Seconds from ``started`` until the proxy closed the connection, and what it sent before; ``inf`` and
    ``STILL_OPEN`` when it is open ``OPEN_AT_MOST_S`` later."""
    received = bytearray()  # what arrived before a reset counts: a close with unread input is a reset

    async def read_all() -> None:
        while piece := await reader.read(65536):
            received.extend(piece)

    try:
        await asyncio.wait_for(read_all(), OPEN_AT_MOST_S)
    except ConnectionError:
        pass
    except TimeoutError:
        return float("inf"), STILL_OPEN
    return time.monotonic() - started, bytes(received)


async def _flood(host: str, port: int, count: int) -> list[tuple[float, bytes]]:
    """``count`` connections that never send a byte; when each was closed. They are opened 100 at a time (a
    burst past the listen backlog would leave connections the kernel never hands to the proxy)."""

    async def one(opened: asyncio.Event) -> tuple[float, bytes]:
        started = time.monotonic()
        reader, writer = await asyncio.open_connection(host, port)
        opened.set()
        try:
            return await _closed_after(reader, started)
        finally:
            writer.close()

    tasks = []
    for _ in range(0, count, 100):
        events = [asyncio.Event() for _ in range(100)]
        tasks += [asyncio.ensure_future(one(e)) for e in events]
        await asyncio.gather(*(e.wait() for e in events))
        await asyncio.sleep(0.02)
    return await asyncio.gather(*tasks)


def _agent(url: str, api_key: str, calling: EventType, stop: EventType, results: QueueType) -> None:
    """Model calls back to back on one keep-alive connection until ``stop``, ``calling`` set after the first
    reply; puts the statuses and the successful replies on ``results``. It runs in a process of its own: in
    the test's interpreter the flood's load could hold the GIL past the 1 s keep-alive timeout between two
    calls, and the proxy would rightly close the agent's connection as idle."""

    async def run() -> tuple[list[int], list[dict]]:
        statuses: list[int] = []
        replies: list[dict] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
            stack = Stack(None, url, http, procs.ADMIN_KEY)
            while not stop.is_set():
                status, reply = await stack.chat(api_key, HI, return_token_ids=True)
                statuses.append(status)
                if status == 200:
                    replies.append(reply)
                calling.set()
            async with http.get(f"{url}/metrics") as resp:  # on the same connection
                replies.append({"metrics": await resp.text()})
        return statuses, replies

    try:
        results.put(asyncio.run(run()))
    except Exception:  # the test reports it
        results.put(traceback.format_exc())


async def _slow(host: str, port: int, head: bytes, trickle: bytes) -> tuple[float, bytes]:
    """Send ``head`` at once, then ``trickle`` a byte every 0.2 s until the proxy closes the connection."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head)

    async def drip() -> None:
        for byte in trickle * 1000:
            await asyncio.sleep(0.2)
            writer.write(bytes([byte]))
            await writer.drain()

    dripping = asyncio.ensure_future(drip())
    try:
        return await _closed_after(reader, started)
    finally:
        dripping.cancel()
        writer.close()


def _peak_descriptors(pid: int, stop: EventType) -> int:
    """The most descriptors ``pid`` held at once, sampled every 5 ms until ``stop``."""
    peak = 0
    while not stop.wait(0.005):
        peak = max(peak, len(os.listdir(f"/proc/{pid}/fd")))
    return peak


def _metric(text: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]


def test_idle_slow_and_excess_connections_are_closed_while_a_session_keeps_working(tmp_path: Path) -> None:
    _ensure_descriptors(FLOOD + 3 * SLOW_EACH + 256)
    args = ("--idle-timeout-s", str(TIMEOUT_S), "--body-timeout-s", str(TIMEOUT_S))
    with (
        procs.fake_engine() as engine,
        procs.proxy(procs.url(engine), tmp_path, *args, limits={resource.RLIMIT_NOFILE: 1024}) as proxy,
    ):
        cap = int(re.search(r"max_connections=(\d+)", proxy.match["counts"])[1])
        assert cap < 1024 - 128, cap  # journal descriptors and the engine pool are kept back
        url = procs.url(proxy)
        host, port = url.removeprefix("http://").split(":")

        async def attack(api_key: str) -> tuple[float, int, list[tuple[float, bytes]], list[tuple[float, bytes]]]:
            """The idle flood, then the slow connections; what each measured."""
            lines_before = len(proxy.output)
            flood_started = time.monotonic()
            flooded = await _flood(host, int(port), FLOOD)
            flood_s = time.monotonic() - flood_started
            flood_log_lines = len(proxy.output) - lines_before
            body_head = (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
            )
            head, body, wrong = (
                (b"POST /v1/chat/completions HTTP/1.1\r\n", b"x-slow: yes\r\n"),
                (body_head.format(api_key).encode(), b'{"a": 1'),
                (body_head.format("wrong").encode(), b'{"a": 1'),
            )
            slow = await asyncio.gather(
                *(_slow(host, int(port), *kind) for kind in (head, body, wrong) for _ in range(SLOW_EACH))
            )
            return flood_s, flood_log_lines, flooded, slow

        async def drive() -> dict[str, object]:
            async with aiohttp.ClientSession() as http:
                stack = Stack(None, url, http, procs.ADMIN_KEY)
                session = await stack.create_session(purpose="eval")
                spawn = multiprocessing.get_context("spawn")
                calling, stop, results = spawn.Event(), spawn.Event(), spawn.Queue()
                agent_args = (url, session.api_key, calling, stop, results)
                agent = spawn.Process(target=_agent, args=agent_args, daemon=True)
                agent.start()
                assert await asyncio.to_thread(calling.wait, 60), "the agent made no call"
                with ThreadPoolExecutor(1) as pool:
                    sampling = pool.submit(_peak_descriptors, proxy.pid, stop)
                    try:
                        flood_s, flood_log_lines, flooded, slow = await attack(session.api_key)
                    finally:
                        stop.set()
                    called = await asyncio.to_thread(results.get, timeout=60)
                    agent.join(10)
                    peak = sampling.result()
                assert not isinstance(called, str), f"the agent failed:\n{called}"
                statuses, replies = called
                metrics = replies.pop()["metrics"]
                trace = await stack.trace(session.session_id)  # a new connection: the flood is gone
                return {
                    "replies": replies,
                    "statuses": statuses,
                    "flooded": flooded,
                    "flood_s": flood_s,
                    "flood_log_lines": flood_log_lines,
                    "slow": slow,
                    "metrics": metrics,
                    "trace": trace,
                    "peak": peak,
                }

        out = asyncio.run(drive())

    flooded, slow, metrics = out["flooded"], out["slow"], out["metrics"]
    refused = [data for _, data in flooded if data.startswith(b"HTTP/1.1 503")]
    idle = [(s, data) for s, data in flooded if not data]
    print(
        f"\nflood: {FLOOD} idle connections, cap {cap}: {len(refused)} refused at once, {len(idle)} closed idle "
        f"within {max((s for s, _ in idle), default=0):.2f}s; all closed in {out['flood_s']:.2f}s; "
        f"peak {out['peak']} descriptors; {len(out['replies'])} agent calls meanwhile; "
        f"{out['flood_log_lines']} log lines; "
        f"slow head/body/unauthorised closed within "
        + "/".join(f"{max(s for s, _ in slow[i * SLOW_EACH : (i + 1) * SLOW_EACH]):.2f}s" for i in range(3))
    )
    assert len(refused) + len(idle) == FLOOD, [d[:80] for _, d in flooded if d and not d.startswith(b"HTTP/1.1 503")]
    # Connections past the cap are accepted before they are refused, so the peak may pass the cap briefly; it
    # stays clear of the limit, with room for journals and the engine pool.
    assert refused and out["peak"] < 1024 - 128
    assert max(s for s, _ in idle) < CLOSE_WITHIN_S
    assert _metric(metrics, "proxy_connections_refused_total") == len(refused)
    assert out["flood_log_lines"] <= 2, proxy.text[-2000:]
    assert all(s < CLOSE_WITHIN_S for s, _ in slow), [round(s, 2) for s, _ in slow]
    heads, bodies, unauthorised = (slow[i * SLOW_EACH : (i + 1) * SLOW_EACH] for i in range(3))
    assert all(data == b"" for _, data in heads)
    assert all(data.startswith(b"HTTP/1.1 408") for _, data in bodies), bodies[0][1][:200]
    assert all(data.startswith(b"HTTP/1.1 401") for _, data in unauthorised), unauthorised[0][1][:200]
    assert _metric(metrics, "proxy_body_timeouts_total") == SLOW_EACH
    assert set(out["statuses"]) == {200} and len(out["replies"]) >= 5, out["statuses"]
    turns = out["trace"]["turns"]
    assert [t["completion_token_ids"] for t in turns] == [r["choices"][0]["token_ids"] for r in out["replies"]]
