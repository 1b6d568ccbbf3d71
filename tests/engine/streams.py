"""Reading streamed chat completions back: events as they arrive, chunks assembled into the non-streaming
response's terms."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from tests.engine.conftest import Http

CHAT = "/v1/chat/completions"


class Stream:
    """One streamed response as it arrives: its events (JSON bodies, then ``"[DONE]"``) and their arrival times."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self.events: list[Any] = []
        self.times: list[float] = []

    async def next(self) -> Any:
        """The next event (None at the end of the body)."""
        while line := await self.resp.content.readline():
            if line.startswith(b"data: "):
                data = line.removeprefix(b"data: ").strip()
                self.events.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
                self.times.append(time.monotonic())
                return self.events[-1]
        return None

    async def rest(self) -> list[Any]:
        while await self.next() is not None:
            pass
        return self.events

    @property
    def received_token_ids(self) -> list[int]:
        choices = [e["choices"][0] for e in self.events if isinstance(e, dict) and e.get("choices")]
        return [t for choice in choices for t in choice.get("token_ids", [])]


async def open_stream(session: aiohttp.ClientSession, http: Http, body: dict[str, Any], path: str = CHAT) -> Stream:
    """POST ``body`` with ``stream: true`` to ``path``; asserts a 200 event stream."""
    resp = await session.post(http.base_url + path, data=orjson.dumps({**body, "stream": True}))
    assert resp.status == 200, await resp.text()
    assert resp.content_type == "text/event-stream"
    return Stream(resp)


def stream_events(http: Http, body: dict[str, Any], path: str = CHAT) -> list[Any]:
    """Every event of one streamed request."""

    async def run() -> list[Any]:
        async with aiohttp.ClientSession() as session:
            return await (await open_stream(session, http, body, path)).rest()

    return asyncio.run(run())


def chunks_of(events: list[Any]) -> list[dict[str, Any]]:
    """The chunks of a stream that ended in exactly one ``[DONE]``."""
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    return events[:-1]


def assemble(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client rebuilds from a stream's chunks, in the non-streaming response's terms."""
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    first, *rest = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    choices = [c["choices"][0] for c in rest if c["choices"]]
    assert all(c["finish_reason"] is None for c in choices[:-1])
    logprobs = [c["logprobs"] for c in choices]
    usage = [c["usage"] for c in rest if not c["choices"]]
    return {
        "content": "".join(c["delta"].get("content", "") for c in choices),
        "tool_calls": [call for c in choices for call in c["delta"].get("tool_calls", [])],
        "token_ids": [t for c in choices for t in c["token_ids"]] if "token_ids" in choices[0] else None,
        "logprobs": None if logprobs[0] is None else [e for lp in logprobs for e in lp["content"]],
        "finish_reason": choices[-1]["finish_reason"],
        "stop_reason": choices[-1]["stop_reason"],
        "prompt_token_ids": first.get("prompt_token_ids"),
        "usage": usage[0] if usage else None,
    }


def expected(response: dict[str, Any]) -> dict[str, Any]:
    """The same view of a non-streaming response."""
    choice = response["choices"][0]
    return {
        "content": choice["message"]["content"] or "",
        "tool_calls": [{"index": i, **call} for i, call in enumerate(choice["message"]["tool_calls"])],
        "token_ids": choice["token_ids"],
        "logprobs": None if choice["logprobs"] is None else choice["logprobs"]["content"],
        "finish_reason": choice["finish_reason"],
        "stop_reason": choice["stop_reason"],
        "prompt_token_ids": response["prompt_token_ids"],
        "usage": response["usage"],
    }


def without_call_ids(view: dict[str, Any]) -> dict[str, Any]:
    calls = [{k: v for k, v in call.items() if k != "id"} for call in view["tool_calls"]]
    return {**view, "tool_calls": calls}
