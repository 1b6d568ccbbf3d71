"""A fake vLLM-like chat engine for proxy benchmarks and fault injection.

It stands in for vLLM where a real model would only add noise (throughput of
the proxy itself) or can't fail on demand (upstream faults). It keeps vLLM's
wire contract: top-level ``prompt_token_ids``, ``choices[0].token_ids``,
``logprobs.content[*]`` with ``token_id:N`` tokens, parsed ``tool_calls``.
Its "chat template" is append-only like Qwen's: an assistant turn re-renders
to exactly the ids it was sampled as, followed by a newline id, so a
multi-turn session forms one capture path. Every other turn is a tool call,
its arguments serialised as vLLM's parser does (``json.dumps``: ``", "`` and
``": "``), so an agent that re-serialises them compactly re-renders its
history differently. With ``reasoning=True`` each reply carries
``reasoning_content``, sampled as ``<think>...</think>`` before its text and,
as Qwen3's template does, rendered only for assistant turns after the last
user message. ``count_messages=True`` makes a template that changes earlier
turns when a message is added (its header counts the messages).
``sample_seed`` fixes the sampling seed (normally a hash of the prompt's last
ids), so differently built prompts sample the same reply.

Token in, as the embedded engine and prime-rl's vLLM serve it: ``POST
/tokenize`` renders ``messages`` (``tools``, ``add_generation_prompt``) with the
fake template, and ``POST /v1/chat/completions/tokens`` answers a chat request
sampled from its ``tokens`` (a body without them is a 400: the discovery
probe). ``tokenize_calls`` and ``token_calls`` count them. ``token_route=False``
leaves the token route out, as plain vLLM does.

A request with ``"stream": true`` is answered as vLLM streams with
``return_token_ids``: a first chunk with ``prompt_token_ids``, then one
``chat.completion.chunk`` per sampled id (its ``token_ids``, logprob and text
piece; a tool call as ``tool_calls`` deltas: id and name first, then argument
fragments), ``token_latency_s`` apart, the last with ``finish_reason``, a usage
chunk, ``data: [DONE]``. A whole reply waits ``token_latency_s`` per token too.

Faults are scheduled per call: ``FakeVLLM.faults`` is a list consumed in
order, each entry one of ``("status", code, retry_after)``, ``("delay", s)``,
``("hold", event)`` (answer once the ``asyncio.Event`` is set: a test decides
when the engine is done, instead of racing a delay), ``("truncate",)`` (a 200
with cut JSON; a stream cut halfway), ``("no_ids",)``, ``("patch", fn)`` (a 200
with what ``fn(completion)`` returns, a dict or raw bytes: a malformed reply of
any shape; streamed, it is one chunk carrying it whole), ``None`` (normal); and
for streams ``("no_tool_ids",)`` (tool call deltas without ids, as vLLM's
sometimes are), and, at stream frame ``n`` (0 is the role chunk),
``("cut", n)`` (the stream ends there without ``[DONE]``), ``("bad_chunk", n)``
(a chunk of broken JSON), ``("error_event", n)`` (vLLM's error event, then
``[DONE]``), ``("pause", n, event)`` (the stream waits for the event). ``calls``
counts the chat requests that arrived, ``cancelled`` those whose caller went
away while they waited (a delay, ``latency_s``, a hold) or streamed.
``FakeVLLM.tokenize_faults`` is consumed likewise by ``/tokenize``: each entry maps the
rendering's ids to the ``tokens`` the answer carries (a malformed answer of any shape).
A body the fake template can't render is answered 400, as vLLM answers a
request its validation refuses.

``python bench/fake_vllm.py --port N [--latency-s S] [--token-latency-s S]``
runs it standalone.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import zlib
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

VOCAB = 32000
IM_START, IM_END, NEWLINE = 1, 2, 3
ROLE_IDS = {"system": 4, "user": 5, "assistant": 6, "tool": 7}
MODEL = "fake/vllm"
WORDS = ("alpha", "beta", "gamma", "delta", "tool", "file", "run", "test", "patch", "done")


@functools.lru_cache(maxsize=65536)
def tokenize(text: str) -> tuple[int, ...]:
    """Deterministic ids: one per 4-character chunk (memoised: histories resend every message)."""
    return tuple(16 + zlib.crc32(text[i : i + 4].encode()) % (VOCAB - 16) for i in range(0, len(text), 4))


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _assistant_text(message: dict[str, Any], *, with_reasoning: bool = True) -> str:
    text = _content_text(message.get("content"))
    if with_reasoning and message.get("reasoning_content"):
        text = f"<think>{message['reasoning_content']}</think>{text}"
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        text += f'<tool_call>{{"name": "{fn.get("name")}", "arguments": {fn.get("arguments")}}}</tool_call>'
    return text


def render_prompt(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool = True,
    count_messages: bool = False,
) -> list[int]:
    """The fake template: ``<s> role text </s> \\n`` per message (an assistant's reasoning only after the last
    user message), then the generation prompt; ``count_messages`` heads it with the number of messages."""
    ids: list[int] = []
    if count_messages:
        ids += [IM_START, ROLE_IDS["system"], *tokenize(f"{len(messages)} messages"), IM_END, NEWLINE]
    if tools:
        ids += [IM_START, ROLE_IDS["system"], *tokenize(orjson.dumps(tools).decode()), IM_END, NEWLINE]
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    for index, message in enumerate(messages):
        role = message.get("role", "user")
        if role == "assistant":
            text = _assistant_text(message, with_reasoning=index > last_user)
        else:
            text = _content_text(message.get("content"))
        ids += [IM_START, ROLE_IDS.get(role, 5), *tokenize(text), IM_END, NEWLINE]
    return [*ids, IM_START, ROLE_IDS["assistant"]] if add_generation_prompt else ids


class FakeVLLM:
    """The fake engine; ``start()``/``stop()`` on the current loop, or ``run_forever`` standalone."""

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        completion_chars: int = 120,
        token_latency_s: float = 0.0,
        reasoning: bool = False,
        count_messages: bool = False,
        sample_seed: int | None = None,
        token_route: bool = True,
    ) -> None:
        self.latency_s = latency_s
        self.completion_chars = completion_chars
        self.token_latency_s = token_latency_s
        self.reasoning = reasoning
        self.count_messages = count_messages
        self.sample_seed = sample_seed
        self.faults: list[tuple | None] = []
        self.tokenize_faults: list[Callable[[list[int]], Any]] = []
        self.calls = 0
        self.token_calls = 0
        self.tokenize_calls = 0
        self.cancelled = 0
        self.app = web.Application(client_max_size=256 * 1024 * 1024)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        if token_route:
            self.app.router.add_post("/v1/chat/completions/tokens", self._chat_tokens)
        self.app.router.add_post("/tokenize", self._tokenize)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_get("/health", self._health)
        self._runner: web.AppRunner | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        data = {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 131072}]}
        return web.json_response(data)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _tokenize(self, request: web.Request) -> web.Response:
        self.tokenize_calls += 1
        body = orjson.loads(await request.read())
        try:
            ids = render_prompt(
                body["messages"],
                body.get("tools"),
                add_generation_prompt=body.get("add_generation_prompt", True),
                count_messages=self.count_messages,
            )
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
            return _bad_request(f"invalid request: {type(exc).__name__}: {exc}")
        tokens = self.tokenize_faults.pop(0)(ids) if self.tokenize_faults else ids
        reply = {"count": len(ids), "max_model_len": 131072, "tokens": tokens, "token_strs": None}
        try:
            data = orjson.dumps(reply)  # compact, as vLLM writes
        except TypeError:  # an injected id past 64 bits, which only json writes
            data = json.dumps(reply, separators=(",", ":")).encode()
        return web.Response(body=data, content_type="application/json")

    async def _chat_tokens(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not tokens or not all(type(t) is int and 0 <= t < VOCAB for t in tokens):
            return _bad_request("'tokens' must be a non-empty list of token ids")
        self.token_calls += 1
        return await self._chat(request, body, tokens)

    async def _chat(
        self, request: web.Request, body: dict[str, Any] | None = None, prompt_ids: list[int] | None = None
    ) -> web.StreamResponse:
        self.calls += 1
        fault = self.faults.pop(0) if self.faults else None
        if body is None:
            body = orjson.loads(await request.read())
        try:
            if fault and fault[0] == "delay":
                await asyncio.sleep(fault[1])
            elif fault and fault[0] == "hold":
                await fault[1].wait()
            elif self.latency_s:
                await asyncio.sleep(self.latency_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if fault and fault[0] == "status":
            headers = {"Retry-After": str(fault[2])} if len(fault) > 2 and fault[2] is not None else None
            err = {"error": {"message": f"injected {fault[1]}", "type": "server_error", "code": fault[1]}}
            return web.Response(
                body=orjson.dumps(err), status=fault[1], headers=headers, content_type="application/json"
            )
        try:
            completion = self.complete(body, with_ids=not (fault and fault[0] == "no_ids"), prompt_ids=prompt_ids)
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
            return _bad_request(f"invalid request: {type(exc).__name__}: {exc}")
        if body.get("stream"):
            return await self._stream(request, body, completion, fault)
        if self.token_latency_s:  # a whole reply takes as long as sampling its tokens one by one
            try:
                await asyncio.sleep(self.token_latency_s * completion["usage"]["completion_tokens"])
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if fault and fault[0] == "patch":
            completion = fault[1](completion)
        payload = completion if isinstance(completion, bytes) else orjson.dumps(completion)
        if fault and fault[0] == "truncate":
            payload = payload[: len(payload) // 2]
        return web.Response(body=payload, content_type="application/json")

    async def _stream(
        self, request: web.Request, body: dict[str, Any], completion: dict[str, Any], fault: tuple | None
    ) -> web.StreamResponse:
        """vLLM's chat-completions stream of ``completion``, one chunk per sampled token, ``token_latency_s``
        apart (see ``stream_frames``), with the stream faults of the module docstring."""
        if fault and fault[0] == "patch":
            frames = _one_chunk_frames(fault[1](completion))
        else:
            frames = stream_frames(completion, body, tool_ids=not (fault and fault[0] == "no_tool_ids"))
        at = fault[1] if fault and fault[0] in _AT_FAULTS else None
        if fault and fault[0] == "truncate":
            at = len(frames) // 2
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for index, frame in enumerate(frames):
                if index == at:
                    if fault[0] == "pause":
                        await fault[2].wait()
                    elif fault[0] == "bad_chunk":
                        frame = b'data: {"choices": [\n\n'
                    elif fault[0] == "error_event":
                        error = {"error": {"message": "injected stream error", "type": "InternalServerError"}}
                        await response.write(b"data: " + orjson.dumps(error) + b"\n\ndata: [DONE]\n\n")
                        break
                    else:  # cut, truncate: the stream ends here, without [DONE]
                        break
                if index > 0 and self.token_latency_s and frame != _DONE:
                    await asyncio.sleep(self.token_latency_s)
                await response.write(frame)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        await response.write_eof()
        return response

    def reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, seed: int) -> dict[str, Any]:
        """The assistant message for a history: a tool call on odd assistant turns when tools are offered."""
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if tools and turn % 2 == 0:
            name = tools[0]["function"]["name"]
            arguments = json.dumps({"command": f"echo {WORDS[seed % len(WORDS)]} {turn}"})
            call = {
                "id": f"call_{seed:x}_{turn}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            words = [WORDS[(seed >> (i % 24)) % len(WORDS)] for i in range(self.completion_chars // 6)]
            message = {"role": "assistant", "content": " ".join(words)[: self.completion_chars]}
        if self.reasoning:
            message["reasoning_content"] = f"plan {turn}"
        return message

    def complete(
        self, body: dict[str, Any], *, with_ids: bool = True, prompt_ids: list[int] | None = None
    ) -> dict[str, Any]:
        """The chat completion for ``body`` with vLLM's id and logprob fields (``reply`` decides the message),
        sampled from ``prompt_ids`` (None: the rendering of its messages)."""
        messages = body["messages"]
        tools = body.get("tools")
        if prompt_ids is None:
            prompt_ids = render_prompt(messages, tools, count_messages=self.count_messages)
        seed = self.sample_seed if self.sample_seed is not None else zlib.crc32(orjson.dumps(prompt_ids[-64:]))
        message = self.reply(messages, tools, seed)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        completion_ids = [*tokenize(_assistant_text(message)), IM_END]
        temperature = body.get("temperature", 1.0) or 1.0
        logprobs = [-((i * 7919 + seed) % 1000) / (1000.0 * temperature) - 1e-3 for i in range(len(completion_ids))]
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        response: dict[str, Any] = {
            "id": f"chatcmpl-{seed:x}{len(messages)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", MODEL),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(completion_ids),
                "total_tokens": len(prompt_ids) + len(completion_ids),
            },
        }
        if with_ids:
            response["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = completion_ids
        if body.get("logprobs"):
            content = [
                {"token": f"token_id:{t}", "logprob": lp, "bytes": [], "top_logprobs": []}
                for t, lp in zip(completion_ids, logprobs, strict=True)
            ]
            top_n = body.get("top_logprobs") or 0
            if top_n:
                for entry in content:
                    # Processed logprobs: the gap between candidates scales with 1/temperature.
                    entry["top_logprobs"] = [
                        {"token": f"token_id:{10 + k}", "logprob": -(k + 1) / temperature} for k in range(top_n)
                    ]
            choice["logprobs"] = {"content": content}
        return response


_DONE = b"data: [DONE]\n\n"


def _bad_request(message: str) -> web.Response:
    """vLLM's answer to a request its validation refuses."""
    err = {"error": {"message": message, "type": "BadRequestError"}}
    return web.Response(body=orjson.dumps(err), status=400, content_type="application/json")


_AT_FAULTS = frozenset({"cut", "bad_chunk", "error_event", "pause"})


def _data(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def stream_frames(completion: dict[str, Any], body: dict[str, Any], *, tool_ids: bool = True) -> list[bytes]:
    """``completion`` as vLLM streams it: a role chunk with ``prompt_token_ids``, one chunk per completion id
    (its ``token_ids``, its logprob, its piece of the text: any reasoning whole first, then 4 characters, as
    ``tokenize`` cuts; a tool call's name with its first id, then its arguments spread over the others), the
    last one with ``finish_reason``, a usage chunk when ``stream_options.include_usage`` asks, then ``[DONE]``."""
    choice = completion["choices"][0]
    message = choice["message"]
    head = {key: completion[key] for key in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    ids = choice.get("token_ids")
    count = len(ids) if ids is not None else completion["usage"]["completion_tokens"]
    logprobs = (choice.get("logprobs") or {}).get("content")
    deltas: list[dict[str, Any]] = [{} for _ in range(count)]
    text = message.get("content") or ""
    skip = 0  # reasoning, when there is some, goes whole with the first id; the text follows
    if message.get("reasoning_content") and count > 1:
        deltas[0]["reasoning_content"], skip = message["reasoning_content"], 1
    for index in range(count - 1 - skip):
        if text[4 * index : 4 * index + 4]:
            deltas[index + skip]["content"] = text[4 * index : 4 * index + 4]
    events = []  # tool call deltas: per call its header (id, name), then its arguments 4 characters at a time
    for index, call in enumerate(message.get("tool_calls") or []):
        function = {"name": call["function"]["name"], "arguments": ""}
        events.append(
            {"index": index, **({"id": call["id"]} if tool_ids else {}), "type": "function", "function": function}
        )
        arguments = call["function"]["arguments"]
        events += (
            {"index": index, "function": {"arguments": arguments[i : i + 4]}} for i in range(0, len(arguments), 4)
        )
    slots = max(count - 1, 1)  # spread over every id but the last (the end of turn)
    for position, event in enumerate(events):
        deltas[position * slots // len(events)].setdefault("tool_calls", []).append(event)
    first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}]}
    if "prompt_token_ids" in completion:
        first["prompt_token_ids"] = completion["prompt_token_ids"]
    frames = [_data(first)]
    for index, delta in enumerate(deltas):
        last = index == count - 1
        out: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None if logprobs is None else {"content": logprobs[index : index + 1]},
            "finish_reason": choice["finish_reason"] if last else None,
        }
        if ids is not None:
            out["token_ids"] = ids[index : index + 1]
        if last:
            out["stop_reason"] = None
        frames.append(_data({**head, "choices": [out]}))
    if (body.get("stream_options") or {}).get("include_usage"):
        frames.append(_data({**head, "choices": [], "usage": completion["usage"]}))
    return [*frames, _DONE]


def _one_chunk_frames(completion: dict[str, Any] | bytes) -> list[bytes]:
    """A patched completion streamed as one chunk carrying it whole (its message as the delta), then
    ``[DONE]``: whatever the patch broke reaches the client as a stream chunk."""
    if isinstance(completion, bytes):
        return [b"data: " + completion + b"\n\n", _DONE]
    choices = completion.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = dict(choices[0])
        choice["delta"] = choice.pop("message", None)
        choices = [choice]
    return [_data({**completion, "object": "chat.completion.chunk", "choices": choices}), _DONE]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--latency-s", type=float, default=0.0)
    p.add_argument("--token-latency-s", type=float, default=0.0, help="time between streamed tokens")
    a = p.parse_args()

    async def run() -> None:
        engine = FakeVLLM(latency_s=a.latency_s, token_latency_s=a.token_latency_s)
        port = await engine.start(a.host, a.port)
        print(f"fake vLLM on http://{a.host}:{port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
