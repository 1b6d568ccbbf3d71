"""What the proxy keeps per session grows with the session's distinct tokens and messages, not with
turns x history: an agent resends its whole history on every call, and the proxy must not keep a copy
of it per turn."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from pathlib import Path

import orjson

import proxy
from bench.proxy_vs_openenv import BASH_TOOL, history_message, system_prompt, tool_output
from tests.proxy.proxy_stack import Stack, run_stack

TURNS = 64
PROXY_DIR = Path(proxy.__file__).parent


async def _bench_agent(stack: Stack, key: str, turns: int, tag: str) -> None:
    """The benchmark's simulated agent: a ~1.6k-token system prompt, a bash tool, ~200-character tool results."""
    messages = [
        {"role": "system", "content": system_prompt(6400)},
        {"role": "user", "content": f"[{tag}] Fix the failing test in the repository."},
    ]
    for _ in range(turns):
        status, reply = await stack.chat(key, messages, tools=BASH_TOOL, max_tokens=512, return_token_ids=True)
        assert status == 200, reply
        message = history_message(reply["choices"][0]["message"])
        messages.append(message)
        if message.get("tool_calls"):
            call = message["tool_calls"][0]
            command = orjson.loads(call["function"]["arguments"]).get("command", "")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": tool_output(command)})
        else:
            messages.append({"role": "user", "content": "Continue."})


def _proxy_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Traced bytes allocated with a frame in the ``proxy`` package (not the agent's or the engine's own)."""
    ours = snapshot.filter_traces([tracemalloc.Filter(True, f"{PROXY_DIR}/*", all_frames=True)])
    return sum(stat.size for stat in ours.statistics("filename"))


async def _close_agent_connections(stack: Stack, timeout_s: float = 10.0) -> None:
    """Close the agent plane's keep-alive connections and wait until the proxy has dropped them: aiohttp keeps
    a connection's last response (here the 64th reply, about 1 MB) until its next request or its close."""
    await stack.http.close()
    assert stack.proxy is not None and stack.proxy._runner is not None
    deadline = asyncio.get_running_loop().time() + timeout_s
    while stack.proxy._runner.server.connections:
        assert asyncio.get_running_loop().time() < deadline, "the proxy kept the closed agent connections"
        await asyncio.sleep(0.01)


def test_a_64_turn_session_retains_at_most_1_mb(tmp_path: Path) -> None:
    """What deleting a 64-turn session of the benchmark's agent frees of the memory the proxy allocated during
    it (tracemalloc) is under 1 MB; a copy of the history per turn was ~2.6 MB. The agent's connections are
    closed first, so a connection's last response is not counted as the session's."""

    async def body(stack: Stack) -> None:
        await _bench_agent(stack, (await stack.create_session()).api_key, 4, "warm-up")  # pools and caches
        session = await stack.create_session()
        key = session.api_key
        gc.collect()
        tracemalloc.start(32)
        try:
            await _bench_agent(stack, key, TURNS, "measured")
            assert (await stack.describe(session.session_id))["stats"]["calls"] == TURNS
            await _close_agent_connections(stack)
            gc.collect()
            with_session = _proxy_bytes(tracemalloc.take_snapshot())
            await asyncio.to_thread(stack.admin.delete, session.session_id)
            gc.collect()
            without = _proxy_bytes(tracemalloc.take_snapshot())
        finally:
            tracemalloc.stop()
        retained = with_session - without
        assert retained < 1_000_000, f"{retained / 1e6:.2f} MB retained by one {TURNS}-turn session"

    run_stack(body, tmp_path)
