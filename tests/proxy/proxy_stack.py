"""The real proxy in front of the fake vLLM-like engine, both on 127.0.0.1, for tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.fake_vllm import FakeVLLM
from proxy.server import CaptureProxy, ProxyConfig


@dataclass
class Stack:
    engine: FakeVLLM
    proxy: CaptureProxy
    url: str
    http: aiohttp.ClientSession

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.proxy.admin_key}"}

    async def create_session(self, **body: Any) -> str:
        async with self.http.post(f"{self.url}/sessions", json=body, headers=self.admin) as resp:
            data = await resp.json()
            assert resp.status == 201, data
            return data["api_key"]

    async def chat(self, key: str, messages: list[dict], **extra: Any) -> tuple[int, dict]:
        body = {"model": "any", "messages": messages, **extra}
        headers = {"Authorization": f"Bearer {key}"}
        async with self.http.post(f"{self.url}/v1/chat/completions", json=body, headers=headers) as resp:
            return resp.status, await resp.json()

    async def trace(self, key: str) -> dict:
        async with self.http.get(f"{self.url}/sessions/{key}/trace", headers=self.admin) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()


def run_stack(
    fn: Callable[[Stack], Awaitable[None]], journal_dir: Path, *, latency_s: float = 0.0, **proxy_kw: Any
) -> None:
    """Start the fake engine and the proxy, run ``fn(stack)``, stop both."""

    async def main() -> None:
        engine = FakeVLLM(latency_s=latency_s)
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
                await fn(Stack(engine, proxy, f"http://127.0.0.1:{port}", http))
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


async def agent_turns(stack: Stack, key: str, turns: int, marker: str = "task") -> list[dict]:
    """Drive a chat-completions agent loop for ``turns`` calls; returns the engine replies as seen."""
    messages: list[dict] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": marker}]
    replies = []
    for _ in range(turns):
        status, reply = await stack.chat(key, messages, tools=TOOLS, return_token_ids=True)
        assert status == 200, reply
        replies.append(reply)
        message = reply["choices"][0]["message"]
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"ran {call['function']['name']}"})
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": "continue"})
    return replies
