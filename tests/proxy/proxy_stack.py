"""The real proxy in front of the fake vLLM-like engine, both on 127.0.0.1, for tests.

The control plane is driven through ``proxy.client.ProxyAdminClient``, as trainers drive it; the
agent plane through aiohttp, as agents do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.fake_vllm import FakeVLLM
from proxy.client import ProxyAdminClient, ProxySession
from proxy.server import CaptureProxy, ProxyConfig


@dataclass
class Stack:
    """One running stack: the fake engine (None when it runs as a process), the proxy's URL, an HTTP
    session for the agent plane, and the control plane through ``ProxyAdminClient``."""

    engine: FakeVLLM | None
    url: str
    http: aiohttp.ClientSession
    admin_key: str
    proxy: CaptureProxy | None = None

    @property
    def admin(self) -> ProxyAdminClient:
        """The blocking control-plane client; from the stack's loop, call it through ``asyncio.to_thread``
        (the proxy answers on this same loop)."""
        return ProxyAdminClient(self.url, self.admin_key, timeout_s=60)

    @property
    def admin_headers(self) -> dict[str, str]:
        """For tests of the control plane's raw HTTP behaviour (auth, status codes)."""
        return {"Authorization": f"Bearer {self.admin_key}"}

    async def create_session(self, **config: Any) -> ProxySession:
        return await asyncio.to_thread(self.admin.create_session, **config)

    async def describe(self, session_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.admin.describe, session_id)

    async def trace(self, session_id: str) -> dict[str, Any]:
        """The session's trace (validated by the client) as plain data."""
        return (await asyncio.to_thread(self.admin.trace, session_id)).model_dump()

    async def sequences(self, session_id: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.admin.sequences, session_id)

    async def chat(self, api_key: str, messages: list[dict], **extra: Any) -> tuple[int, dict]:
        body = {"model": "any", "messages": messages, **extra}
        headers = {"Authorization": f"Bearer {api_key}"}
        async with self.http.post(f"{self.url}/v1/chat/completions", json=body, headers=headers) as resp:
            return resp.status, await resp.json()


def run_stack(
    fn: Callable[[Stack], Awaitable[None]],
    journal_dir: Path,
    *,
    latency_s: float = 0.0,
    engine_options: dict[str, Any] | None = None,
    **proxy_kw: Any,
) -> None:
    """Start the fake engine (``FakeVLLM(latency_s=..., **engine_options)``) and the proxy, run ``fn(stack)``,
    stop both."""

    async def main() -> None:
        engine = FakeVLLM(latency_s=latency_s, **(engine_options or {}))
        engine_port = await engine.start()
        config = ProxyConfig(
            engine_url=f"http://127.0.0.1:{engine_port}",
            journal_dir=journal_dir,
            port=0,
            upstream_backoff_s=0.01,
            **proxy_kw,
        )
        proxy = CaptureProxy(config)
        port = await proxy.start()
        try:
            async with aiohttp.ClientSession() as http:
                await fn(Stack(engine, f"http://127.0.0.1:{port}", http, proxy.admin_key, proxy))
        finally:
            await proxy.stop()
            await engine.stop()

    asyncio.run(main())


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]


async def agent_turns(stack: Stack, api_key: str, turns: int, marker: str = "task") -> list[dict]:
    """Drive a chat-completions agent loop for ``turns`` calls; returns the engine replies as seen."""
    messages: list[dict] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": marker}]
    replies = []
    for _ in range(turns):
        status, reply = await stack.chat(api_key, messages, tools=TOOLS, return_token_ids=True)
        assert status == 200, reply
        replies.append(reply)
        message = reply["choices"][0]["message"]
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"ran {call['function']['name']}"})
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": "continue"})
    return replies
