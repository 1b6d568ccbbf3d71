"""The proxy's token-in bridge on the embedded engine: an agent loop that re-serialises its tool calls chains into
one trajectory with the bridge and forks at every turn without it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from openenv.core.harness.training import TrainingTrace as OpenEnvTrainingTrace

from harness_grpo.engine import EmbeddedEngine
from harness_grpo.tiny_model.synthetic import heldout_prompts
from proxy.capture_graph import sequences_from_trace
from proxy.server import CaptureProxy, ProxyConfig
from proxy.trace import TrainingTrace
from tests.engine.conftest import Http

TURNS = 4


async def _agent(http: aiohttp.ClientSession, url: str, key: str, stream: bool) -> list[bool]:
    """A tool loop that sends each call back compactly; returns, per turn, whether that changed the call's text
    (the model's arguments were not already compact), so that re-rendering the history changes its tokens."""
    (prompt,) = heldout_prompts(1, 7, system_chars=0)
    messages: list[dict[str, Any]] = prompt["messages"][:2]
    reserialised = []
    for turn in range(TURNS):
        body = {
            "model": "m",
            "messages": messages,
            "tools": prompt["tools"],
            "seed": turn,
            "max_tokens": 200,
            "stream": stream,
        }
        headers = {"Authorization": f"Bearer {key}"}
        async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            raw = await resp.read()
        message = _message(raw) if stream else orjson.loads(raw)["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        sent = [
            {
                **c,
                "function": {
                    **c["function"],
                    "arguments": json.dumps(json.loads(c["function"]["arguments"]), separators=(",", ":")),
                },
            }
            for c in calls
        ]
        reserialised.append(sent != calls)
        messages.append(
            {"role": "assistant", "content": message.get("content"), **({"tool_calls": sent} if sent else {})}
        )
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "1 failed, 2 passed"} for c in calls]
        if not calls:
            messages.append({"role": "user", "content": "Go on."})
    return reserialised


def _message(stream: bytes) -> dict[str, Any]:
    """The assistant message an OpenAI chat stream adds up to (content and whole tool calls)."""
    content, calls = "", {}
    for line in stream.splitlines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        for choice in orjson.loads(line[6:]).get("choices") or []:
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(
                    call["index"], {"id": call.get("id"), "type": "function", "function": {"name": "", "arguments": ""}}
                )
                entry["function"]["name"] += call.get("function", {}).get("name") or ""
                entry["function"]["arguments"] += call.get("function", {}).get("arguments") or ""
    return {"role": "assistant", "content": content or None, "tool_calls": [calls[i] for i in sorted(calls)]}


def test_a_re_serialising_agent_chains_with_the_bridge_and_forks_without(
    warm_served: tuple[EmbeddedEngine, Http], tmp_path: Path
) -> None:
    _, engine_http = warm_served

    async def main() -> None:
        proxy = CaptureProxy(ProxyConfig(engine_url=engine_http.base_url, journal_dir=tmp_path, port=0))
        port = await proxy.start()
        url = f"http://127.0.0.1:{port}"
        admin = {"Authorization": f"Bearer {proxy.admin_key}"}
        try:
            async with aiohttp.ClientSession() as http:
                for stream in (False, True):
                    traces, reserialised = {}, {}
                    for bridge in (True, False):
                        async with http.post(
                            f"{url}/sessions", json={"bridge": bridge, "sampling": {"temperature": 0.7}}, headers=admin
                        ) as resp:
                            opened = await resp.json()
                        reserialised[bridge] = await _agent(http, url, opened["api_key"], stream)
                        async with http.get(f"{url}/sessions/{opened['session_id']}/trace", headers=admin) as resp:
                            traces[bridge] = await resp.read()
                    # Each turn that follows a re-serialised call gets a history the engine did not write.
                    forced_forks = sum(reserialised[False][:-1])
                    assert forced_forks >= 1, reserialised  # the warm model called a tool (it does in most turns)
                    rows = {}
                    for bridge, raw in traces.items():
                        OpenEnvTrainingTrace.model_validate_json(raw)
                        trace = TrainingTrace.model_validate_json(raw)
                        assert [t.metadata["bridged"] for t in trace.turns] == [False] + [bridge] * (TURNS - 1)
                        rows[bridge] = sequences_from_trace(trace)
                    assert len(rows[True]) == 1, (stream, rows)
                    assert len(rows[False]) >= 1 + forced_forks, (stream, reserialised, rows)
        finally:
            await proxy.stop()

    asyncio.run(main())
