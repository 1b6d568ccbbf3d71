"""The upstream engine: HTTP client, retries, capture extraction, tier probe.

Contract: ``EngineClient.chat(body)`` POSTs one non-streaming chat completion
and returns the parsed JSON, retrying 408/409/429/5xx and connection errors
with exponential backoff that honours ``Retry-After``; anything else raises
``UpstreamError`` carrying the status to report to the agent; ``body`` may be
the request already serialised (the proxy serialises it with its nesting bound,
``proxy.json_depth``). One call has one time budget, ``timeout_s``, for all its
attempts and waits together: an attempt may only use what is left of it,
running out is a 504 that is never retried, and a retry whose wait would not
leave time to try is not made. ``EngineClient.chat_stream(body)`` is the same
call streamed (vLLM's ``chat.completion.chunk``s, yielded as they arrive;
retried only before the first chunk; one budget for the whole stream), and a
``StreamAssembler`` checks the chunks and adds them up to the completion
``chat`` would have returned. ``extract_capture(response)`` takes the exact
ids and logprobs out of a vLLM chat response, after checking that its message
has the shape the dialects render and nests no deeper than the proxy stores,
or raises ``MalformedUpstream``; it never re-tokenizes.
``probe_tier`` grades an engine: ``tokens`` (ids + processed logprobs: can
train), ``logprobs`` (eval only), ``text``. ``tokenize`` renders a chat through
the engine's ``/tokenize``, ``has_tokens_route`` tells whether the engine serves
``TOKENS_ROUTE`` (an empty body: 400 where it does, 404 where not), and
``chat``/``chat_stream`` take ``route=TOKENS_ROUTE`` to sample from given ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import operator
import time
import uuid
from array import array
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import orjson

from proxy.dialects.base import TEXT_FIELDS
from proxy.engine_http import EngineConnectionError, EngineHttp, EngineResponse
from proxy.json_depth import MAX_REQUEST_DEPTH, NestingError, check_depth, dumps_bounded
from proxy.known_prompt import KnownPrompt, loads_reply, open_json

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
CHAT_ROUTE = "/v1/chat/completions"
TOKENS_ROUTE = "/v1/chat/completions/tokens"  # a chat request sampled from its ``tokens`` (prime-rl's vLLM route)


class UpstreamError(Exception):
    """The engine failed the call; ``status`` is what the agent is told."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class MalformedUpstream(UpstreamError):
    """The engine answered 200 but broke the exact-capture contract."""

    def __init__(self, message: str) -> None:
        super().__init__(502, f"malformed engine response: {message}")


@dataclass(slots=True)
class Capture:
    """What one engine call sampled, exactly as the engine reported it."""

    prompt_ids: list[int]
    sampled_ids: list[int]
    logprobs: list[float] | None  # None: no usable logprobs, the turn is context only
    logprob_note: str | None = None  # why logprobs were dropped


def extract_capture(response: dict[str, Any]) -> Capture:
    """Exact ids and logprobs from a vLLM chat-completions response.

    Prompt ids are top-level ``prompt_token_ids`` (SGLang's per-choice copy is
    accepted); completion ids are ``choices[0].token_ids``. The ids' values are
    checked where they are stored (``CaptureGraph.add_call``, new ids only). One null logprob,
    a count mismatch, or a ``token_id:N`` that disagrees with the ids voids
    the turn's logprobs (it stays as context), per REFERENCE §1.3.
    """
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedUpstream("no choices")
    choice = choices[0]
    prompt_ids = response.get("prompt_token_ids")
    if prompt_ids is None:
        prompt_ids = choice.get("prompt_token_ids")
    if not isinstance(prompt_ids, list) or not prompt_ids:
        raise MalformedUpstream("missing or invalid prompt_token_ids (is return_token_ids supported?)")
    sampled_ids = choice.get("token_ids")
    if not isinstance(sampled_ids, list):
        raise MalformedUpstream("missing or invalid choices[0].token_ids")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedUpstream("missing choices[0].message")
    _check_reply(response, choice, message)
    content = _logprob_entries(choice, "choices[0].")
    if content is None:
        return Capture(prompt_ids, sampled_ids, None, "no logprobs returned")
    if len(content) != len(sampled_ids):
        return Capture(prompt_ids, sampled_ids, None, f"{len(content)} logprobs for {len(sampled_ids)} ids")
    if set(map(type, content)) <= {dict}:  # vLLM's shape, checked in bulk (C loops); anything else is located below
        values = list(map(dict.get, content, repeat("logprob")))
        if (
            set(map(type, values)) <= {float}
            and math.isfinite(sum(values))
            and max(values, default=0.0) <= 0
            and list(map(dict.get, content, repeat("token"))) == list(map("token_id:{}".format, sampled_ids))
        ):
            return Capture(prompt_ids, sampled_ids, values)
    values = []
    for position, (entry, token_id) in enumerate(zip(content, sampled_ids, strict=True)):
        value = entry.get("logprob") if isinstance(entry, dict) else None
        if type(value) not in (float, int) or not math.isfinite(value) or value > 0:
            return Capture(prompt_ids, sampled_ids, None, f"unusable logprob at {position}")
        token = entry.get("token")
        if isinstance(token, str) and token.startswith("token_id:") and token != f"token_id:{token_id}":
            return Capture(prompt_ids, sampled_ids, None, f"logprob ids shifted at {position}")
        values.append(float(value))
    return Capture(prompt_ids, sampled_ids, values)


class StreamAssembler:
    """Builds the chat completion ``chat`` would have returned from the ``chat.completion.chunk``s of a vLLM
    stream (``EngineClient.chat_stream``), checking each chunk as it arrives.

    ``add(chunk)`` returns the chunk's text deltas in order, ``{field: text}`` over ``TEXT_FIELDS``, non-empty
    texts only (one reasoning field: vLLM may send its text under both names); ``add_batch`` takes the chunks
    of one read. ``head`` is the reply's ``id`` (minted when the engine sends none), ``created``, ``model`` and
    ``prompt_token_ids`` once the first chunk has them. ``response()`` is the whole completion (the message's
    text, reasoning and tool calls with their arguments joined, ``finish_reason``, ``prompt_token_ids``,
    ``choices[0].token_ids`` and ``logprobs.content`` in stream order, ``usage``), for ``extract_capture`` and
    the renderers. Tool calls are keyed by their delta ``index``; a call that never got an id keeps none (the
    renderers mint one).

    ``MalformedUpstream`` for a chunk of the wrong shape, reasoning after text (no dialect could show it in
    order), a chunk whose logprobs are not one per id (or ids without logprobs where others had them), a
    stream without a ``finish_reason``, or ids that disagree with ``usage.completion_tokens``.
    """

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self._texts: dict[str, list[str]] = {}
        self._calls: list[dict[str, Any]] = []
        self._ids: list[int] | None = None
        self._logprobs: list[Any] | None = None
        self._unlogged = 0  # ids that came in chunks without logprobs
        self._choice: dict[str, Any] = {"finish_reason": None, "stop_reason": None}
        self._usage: Any = None

    def add(self, chunk: dict[str, Any]) -> dict[str, str]:
        """Take the next chunk; returns its text deltas."""
        if not self.head:
            created = chunk.get("created")
            self.head = {
                "id": chunk.get("id") if isinstance(chunk.get("id"), str) else f"chatcmpl-{uuid.uuid4().hex}",
                "created": created if type(created) is int else int(time.time()),
                "model": chunk.get("model") if isinstance(chunk.get("model"), str) else "",
            }
        if "prompt_token_ids" in chunk and "prompt_token_ids" not in self.head:
            self.head["prompt_token_ids"] = chunk["prompt_token_ids"]
        if isinstance(chunk.get("system_fingerprint"), str):
            self.head["system_fingerprint"] = chunk["system_fingerprint"]
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        if choices is None or choices == []:
            return {}
        if not (isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict)):
            raise MalformedUpstream("a stream chunk's choices is not one choice object")
        choice = choices[0]
        if choice.get("index", 0) != 0:
            raise MalformedUpstream("a stream chunk is for a choice other than 0")
        for key in ("finish_reason", "stop_reason"):
            if choice.get(key) is not None:
                self._choice[key] = choice[key]
        self._add_tokens(choice)
        delta = choice.get("delta")
        if delta is None:
            return {}
        if not isinstance(delta, dict):
            raise MalformedUpstream("a stream chunk's delta is not an object")
        if delta.get("tool_calls") is not None:
            self._add_tool_calls(delta["tool_calls"])
        return self._add_texts(delta)

    def add_batch(
        self, chunks: Iterable[dict[str, Any]], out: list[dict[str, str]] | None = None
    ) -> list[dict[str, str]]:
        """``add`` each chunk in turn; returns ``out`` (a new list if None) with their text deltas appended in
        order, each run of one field joined into one delta. A chunk of the common shape (one choice of index 0;
        a delta of ``role`` and ``content`` or of reasoning; ids with one logprob each, or neither) takes a
        shorter path with the same checks."""
        if out is None:
            out = []
        for chunk in chunks:
            texts = self._add_plain(chunk)
            if texts is None:
                texts = self.add(chunk)
            for key, text in texts.items():
                if out and key in out[-1] and len(out[-1]) == 1:
                    out[-1][key] += text
                else:
                    out.append({key: text})
        return out

    def _add_plain(self, chunk: dict[str, Any]) -> dict[str, str] | None:
        """``add(chunk)`` for a chunk of the common shape (``add_batch``); None, having changed nothing, for any
        other chunk (``add`` then takes it, and refuses what it must)."""
        choices = chunk.get("choices")
        if not (
            self.head
            and type(choices) is list
            and len(choices) == 1
            and "usage" not in chunk
            and "prompt_token_ids" not in chunk
            and "system_fingerprint" not in chunk
        ):
            return None
        choice = choices[0]
        if type(choice) is not dict or choice.get("index", 0) != 0:
            return None
        delta, ids, logprobs = choice.get("delta"), choice.get("token_ids"), choice.get("logprobs")
        if type(delta) is not dict or delta.get("tool_calls") is not None:
            return None
        reasoning = "reasoning_content" in delta or "reasoning" in delta
        text = None if reasoning else delta.get("content")
        if not (text is None or type(text) is str):
            return None
        if ids is not None or logprobs is not None:
            content = logprobs.get("content") if type(logprobs) is dict else None
            if type(ids) is not list or type(content) is not list or len(content) != len(ids):
                return None
            if self._ids is None or self._logprobs is None:
                self._ids, self._logprobs = self._ids or [], self._logprobs or []
            self._ids += ids
            self._logprobs += content
        if choice.get("finish_reason") is not None:
            self._choice["finish_reason"] = choice["finish_reason"]
        if choice.get("stop_reason") is not None:
            self._choice["stop_reason"] = choice["stop_reason"]
        if reasoning:
            return self._add_texts(delta)
        if not text:
            return {}
        self._texts.setdefault("content", []).append(text)
        return {"content": text}

    def _add_texts(self, delta: dict[str, Any]) -> dict[str, str]:
        out = {}
        for key in TEXT_FIELDS:
            text = delta.get(key)
            if not isinstance(text, str | None):
                raise MalformedUpstream(f"a stream delta's {key} is not a string")
            if not text or (key == "reasoning" and "reasoning_content" in out):
                continue
            if key != "content":
                if "content" in self._texts:
                    raise MalformedUpstream("the stream sent reasoning after text")
                key = next((k for k in self._texts if k != "content"), key)  # one name for the reasoning
            self._texts.setdefault(key, []).append(text)
            out[key] = text
        return out

    def _add_tokens(self, choice: dict[str, Any]) -> None:
        ids = choice.get("token_ids")
        if ids is not None and not isinstance(ids, list):
            raise MalformedUpstream("a stream chunk's token_ids is not an array")
        content = _logprob_entries(choice, "a stream chunk's ")
        if ids is not None:
            if self._ids is None:
                self._ids = []
            self._ids.extend(ids)
        if content is not None:
            if ids is not None and len(content) != len(ids):
                raise MalformedUpstream(f"a stream chunk has {len(content)} logprobs for {len(ids)} ids")
            if self._logprobs is None:
                self._logprobs = []
            self._logprobs.extend(content)
        elif ids:
            self._unlogged += len(ids)

    def _add_tool_calls(self, deltas: Any) -> None:
        if not isinstance(deltas, list):
            raise MalformedUpstream("a stream delta's tool_calls is not an array")
        for delta in deltas:
            index = delta.get("index") if isinstance(delta, dict) else None
            if type(index) is not int or not 0 <= index <= len(self._calls):
                raise MalformedUpstream("a streamed tool call has no index, or skips one")
            function = delta.get("function") or {}
            if not isinstance(function, dict):
                raise MalformedUpstream("a streamed tool call's function is not an object")
            name, arguments = function.get("name"), function.get("arguments")
            if not (isinstance(delta.get("id"), str | None) and isinstance(name, str | None)):
                raise MalformedUpstream("a streamed tool call's id or name is not a string")
            if not isinstance(arguments, str | None):
                raise MalformedUpstream("a streamed tool call's arguments are not a string")
            if index == len(self._calls):
                self._calls.append({"id": None, "name": None, "arguments": []})
            call = self._calls[index]
            call["id"] = call["id"] or delta.get("id")
            call["name"] = call["name"] or name
            if arguments:
                call["arguments"].append(arguments)

    def response(self) -> dict[str, Any]:
        """The whole completion; ``MalformedUpstream`` if the stream did not finish it."""
        if self._choice["finish_reason"] is None:
            raise MalformedUpstream("the stream ended without a finish_reason")
        if self._logprobs is not None and self._unlogged:
            raise MalformedUpstream(f"{self._unlogged} streamed ids came without their logprobs")
        completion = (self._usage or {}).get("completion_tokens") if isinstance(self._usage, dict) else None
        if self._ids is not None and type(completion) is int and completion != len(self._ids):
            raise MalformedUpstream(f"the stream carried {len(self._ids)} ids where usage counts {completion}")
        message: dict[str, Any] = {"role": "assistant"}
        for key, parts in self._texts.items():
            message[key] = "".join(parts)
        message.setdefault("content", None)
        if self._calls:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": "".join(call["arguments"])},
                }
                for call in self._calls
            ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None if self._logprobs is None else {"content": self._logprobs},
            **self._choice,
        }
        if self._ids is not None:
            choice["token_ids"] = self._ids
        return {**self.head, "object": "chat.completion", "choices": [choice], "usage": self._usage}


_STRING_FIELDS = frozenset({"content", "reasoning_content", "reasoning"})


def _logprob_entries(choice: dict[str, Any], where: str) -> list[Any] | None:
    """``choice["logprobs"]["content"]``, None when absent; ``MalformedUpstream`` (its message prefixed with
    ``where``) when the logprobs are not an object or their content not an array."""
    logprobs = choice.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, dict):
        raise MalformedUpstream(f"{where}logprobs is not an object")
    content = (logprobs or {}).get("content")
    if content is not None and not isinstance(content, list):
        raise MalformedUpstream(f"{where}logprobs.content is not an array")
    return content


def _check_reply(response: dict[str, Any], choice: dict[str, Any], message: dict[str, Any]) -> None:
    """The fields the dialects render have the types vLLM gives them, and the message (which a turn stores)
    nests no deeper than the proxy stores; a reply that breaks this is refused before anything is recorded.

    The nesting is checked only when the message holds a container this check did not walk (tool arguments
    as an object, a field the dialects don't read), so a plain vLLM message costs one pass over its keys.
    """
    if not isinstance(response.get("id"), str | None):
        raise MalformedUpstream("id is not a string")
    unwalked = False
    for key, value in message.items():
        if key in _STRING_FIELDS:
            if not isinstance(value, str | None):
                raise MalformedUpstream(f"choices[0].message.{key} is not a string")
        elif key == "tool_calls":
            if value is not None:
                unwalked |= _check_tool_calls(value)
        elif isinstance(value, dict | list):
            unwalked = True
    for key in ("finish_reason", "stop_reason"):
        if not isinstance(choice.get(key), str | int | None):
            raise MalformedUpstream(f"choices[0].{key} is not a string")
    usage = response.get("usage")
    if usage is not None:
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        if not (
            isinstance(usage, dict)
            and type(usage.get("prompt_tokens") or 0) is int
            and type(usage.get("completion_tokens") or 0) is int
            and (details is None or (isinstance(details, dict) and type(details.get("cached_tokens") or 0) is int))
        ):
            raise MalformedUpstream("usage is not an object of integer token counts")
    if unwalked:
        try:
            check_depth(message, MAX_REQUEST_DEPTH)
        except NestingError as exc:
            raise MalformedUpstream(f"choices[0].message: {exc}") from None


def _check_tool_calls(calls: Any) -> bool:
    """Check ``tool_calls`` has the shape the dialects render; True if it holds containers not walked here."""
    if not isinstance(calls, list):
        raise MalformedUpstream("choices[0].message.tool_calls is not an array")
    unwalked = False
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments"), str | dict | None)
            and isinstance(call.get("id"), str | None)
        ):
            raise MalformedUpstream(
                f"choices[0].message.tool_calls[{index}] is not {{id, function: {{name, arguments}}}} with strings"
            )
        unwalked |= len(call) > 3 or len(function) > 2 or isinstance(function["arguments"], dict)
    return unwalked


def engine_base_url(url: str) -> str:
    """The form engine URLs are compared and cached in: ``http://host:port`` with no ``/v1`` or trailing slash."""
    return url.rstrip("/").removesuffix("/v1")


@dataclass
class EngineCounters:
    """Counters that outlive a client (shared by the clients of one proxy)."""

    retries: int = 0


class EngineClient:
    """A pooled client for one engine base URL (``http://host:port``, no ``/v1``).

    ``retire()`` ends it as a cached client: its pool closes as soon as no call is in flight (at
    once if idle); a call made on it afterwards still works and closes the pool again when done.
    """

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int = 256,
        timeout_s: float = 600.0,
        retries: int = 3,
        backoff_s: float = 2.0,
        max_retry_after_s: float = 60.0,
        api_key: str | None = None,
        counters: EngineCounters | None = None,
    ) -> None:
        self.base_url = engine_base_url(base_url)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.counters = counters or EngineCounters()
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._max_connections = max_connections
        self._pool: EngineHttp | None = None
        self._in_flight = 0
        self._retired = False

    @property
    def retry_count(self) -> int:
        """Retries counted in ``counters`` (this client's, or every client's sharing them)."""
        return self.counters.retries

    def _http(self) -> EngineHttp:
        # No pool-wide timeout: every call bounds itself (``_post``, ``get_json``, ``chat_stream``).
        if self._pool is None:
            self._pool = EngineHttp(self.base_url, headers=self._headers, max_connections=self._max_connections)
        return self._pool

    async def close(self) -> None:
        """Close pooled connections (a later call opens a new pool)."""
        pool, self._pool = self._pool, None  # a call starting while this closes gets a new pool
        if pool is not None:
            pool.close()

    def retire(self) -> asyncio.Task[None] | None:
        """Close the pool once no call is in flight; returns the closing task when that is now."""
        self._retired = True
        if self._in_flight or self._pool is None:
            return None
        return asyncio.get_running_loop().create_task(self.close())

    async def chat(self, body: dict[str, Any] | bytes, *, route: str = CHAT_ROUTE) -> dict[str, Any]:
        """One non-streaming chat completion, retried on transient failures within ``timeout_s``.

        ``body`` is the request, or its JSON already serialised. A dict is serialised with the proxy's nesting
        bound: one that nests deeper raises ``NestingError`` (a ``ValueError``) before anything is sent.
        ``route`` is ``CHAT_ROUTE``, or ``TOKENS_ROUTE`` for a body that carries its prompt as ``tokens``.
        """
        return (await self.chat_known(body, route=route))[0]

    async def chat_known(
        self, body: dict[str, Any] | bytes, *, route: str = CHAT_ROUTE, known: KnownPrompt | None = None
    ) -> tuple[dict[str, Any], bytes | None]:
        """``chat`` of a prompt expected to start with ``known`` (``proxy.known_prompt``), and where it did, the
        open JSON of the engine's prompt ids (else None): those ids were then taken from ``known``, not parsed."""
        payload = body if isinstance(body, bytes) else dumps_bounded(body)
        return await self._post(route, payload, "prompt_token_ids", known)

    async def tokenize(self, body: dict[str, Any]) -> array[int]:
        """``POST /tokenize`` (vLLM's): the ids of a chat rendering, packed (64-bit); a reply without a list of
        ints in that range is malformed. Packing is the check: it refuses anything else in one pass."""
        return (await self.tokenize_known(body))[0]

    async def tokenize_known(self, body: dict[str, Any], known: KnownPrompt | None = None) -> tuple[array[int], bytes]:
        """``tokenize`` of a rendering expected to start with ``known`` (its ids packed, ``proxy.known_prompt``), and
        the open JSON of the ids: the engine's where they started with ``known`` (those ids then not parsed)."""
        answer, tokens_json = await self._post("/tokenize", dumps_bounded(body), "tokens", known)
        tokens = answer.get("tokens")
        if isinstance(tokens, array):
            return tokens, tokens_json
        if isinstance(tokens, list):
            with contextlib.suppress(TypeError, OverflowError):
                return array("q", tokens), open_json(tokens)
        raise MalformedUpstream("/tokenize answered without a list of token ids")

    async def chat_stream(
        self,
        body: dict[str, Any] | bytes,
        *,
        route: str = CHAT_ROUTE,
        known: KnownPrompt | None = None,
        matched: list[bytes] | None = None,
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """One streamed chat completion: yields the SSE ``data`` chunks as JSON objects, in order, in batches
        (every chunk that had arrived by then: a caller that forwards each batch at once pays per read, not per
        token), and ends after ``data: [DONE]``.

        ``body`` and ``route`` are as for ``chat``; ``body`` asks for the stream. ``known``: what the prompt is
        expected to start with, matched against the first chunk's ``prompt_token_ids`` as ``chat_known`` matches
        a reply; where they matched, the open JSON of the prompt's ids is appended to ``matched``. Failures are
        retried as ``chat`` retries them, but only until the first chunk arrived. The whole stream has one budget,
        ``timeout_s`` (504 when it runs out). An error event is an ``UpstreamError`` (502); a chunk that is not a
        JSON object, or a stream that ends without ``[DONE]``, is ``MalformedUpstream``. Close it
        (``contextlib.aclosing``) so an abandoned stream drops its engine connection at once.
        """
        payload = body if isinstance(body, bytes) else dumps_bounded(body)
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        attempt = 0
        self._in_flight += 1
        try:
            while True:
                received = False
                retry: str | None = None
                try:
                    async with asyncio.timeout_at(deadline):
                        response = await self._http().request("POST", route, payload)
                    async with response:
                        if response.status != 200:
                            async with asyncio.timeout_at(deadline):
                                data = await response.read()
                            failure = _retryable_failure(response.status, data)
                            retry = response.headers.get("retry-after")
                        else:
                            # closed here, not left to the garbage collector: an async generator dropped open costs
                            # the loop a thread-safe wakeup and a task to close it
                            response.expire_at(deadline)
                            async with contextlib.aclosing(_sse_data(response)) as reads:
                                async for events in reads:
                                    done = b"[DONE]" in events
                                    if done:
                                        events = events[: events.index(b"[DONE]")]
                                    if events:
                                        first: list[dict[str, Any]] = []
                                        if not received and known is not None:  # the chunk with the prompt's ids
                                            chunk, prompt_json = _known_stream_chunk(events[0], known)
                                            first, events = [chunk], events[1:]
                                            if prompt_json is not None and matched is not None:
                                                matched.append(prompt_json)
                                        received = True
                                        batch, failure = _stream_chunks(events)
                                        batch[:0] = first
                                        if batch:  # the chunks before a bad one still reach the caller first
                                            yield batch
                                        if failure is not None:
                                            raise failure
                                    if done:
                                        return
                            raise MalformedUpstream("the stream ended before data: [DONE]")
                except TimeoutError:  # the budget is spent: never retried
                    raise UpstreamError(504, f"engine timed out (no answer within {self.timeout_s:g} s)") from None
                except EngineConnectionError as exc:
                    if received:
                        raise UpstreamError(502, f"engine stream broke ({exc})") from None
                    failure = UpstreamError(502, f"engine unreachable ({exc})")
                await asyncio.sleep(self._retry_wait(failure, attempt, retry, deadline))
                attempt += 1
        finally:
            self._in_flight -= 1
            if self._retired and not self._in_flight:
                await self.close()

    def _retry_wait(self, failure: UpstreamError, attempt: int, retry_after: str | None, deadline: float) -> float:
        """The wait before retrying a call whose attempt ``attempt`` failed with ``failure``; raises ``failure``
        when no retry is made (not retryable, retries used up, or the wait would outlast the budget)."""
        if attempt >= self.retries:
            raise failure
        delay = self.backoff_s * (2**attempt)
        if retry_after is not None:
            with contextlib.suppress(ValueError):
                delay = min(max(float(retry_after), 0.0), self.max_retry_after_s)
        if asyncio.get_running_loop().time() + delay >= deadline:
            failure.args = (f"{failure} (not retried: the call's {self.timeout_s:g} s budget ends first)",)
            raise failure
        self.counters.retries += 1
        return delay

    async def get_json(self, path: str) -> dict[str, Any]:
        """GET a JSON object route (``/v1/models``, ``/health``) within ``timeout_s``; any failure is an
        ``UpstreamError`` (502)."""
        self._in_flight += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                async with await self._http().request("GET", path) as resp:
                    data = await resp.read()
                if resp.status != 200:
                    raise UpstreamError(502, f"engine {path} answered {resp.status}")
                answer = orjson.loads(data)
        except (EngineConnectionError, TimeoutError) as exc:
            raise UpstreamError(502, f"engine {path} unreachable: {type(exc).__name__}: {exc}") from None
        except orjson.JSONDecodeError:
            raise UpstreamError(502, f"engine {path} answered invalid JSON") from None
        finally:
            self._in_flight -= 1
            if self._retired and not self._in_flight:
                await self.close()
        if not isinstance(answer, dict):
            raise UpstreamError(502, f"engine {path} answered {type(answer).__name__}, not a JSON object")
        return answer

    async def _post(
        self, path: str, payload: bytes, array_name: str = "", known: KnownPrompt | None = None
    ) -> tuple[dict[str, Any], bytes | None]:
        """The engine's JSON object answer to ``payload``, and the open JSON of its array ``array_name`` where
        that started with ``known`` (``loads_reply``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s  # the whole call's budget: attempts and waits
        attempt = 0
        self._in_flight += 1
        try:
            while True:
                retry: str | None = None
                try:
                    async with asyncio.timeout_at(deadline):
                        async with await self._http().request("POST", path, payload) as resp:
                            status = resp.status
                            data = await resp.read()
                            retry_after = resp.headers.get("retry-after")
                except TimeoutError:  # the budget is spent: never retried
                    raise UpstreamError(504, f"engine timed out (no answer within {self.timeout_s:g} s)") from None
                except EngineConnectionError as exc:
                    failure = UpstreamError(502, f"engine unreachable ({exc})")
                else:
                    if status == 200:
                        try:
                            parsed, prompt_json = loads_reply(data, array_name, known)
                        except orjson.JSONDecodeError as exc:
                            raise MalformedUpstream(f"invalid JSON ({exc})") from None
                        if not isinstance(parsed, dict):
                            raise MalformedUpstream("response is not a JSON object")
                        return parsed, prompt_json
                    failure = _retryable_failure(status, data)
                    retry = retry_after
                await asyncio.sleep(self._retry_wait(failure, attempt, retry, deadline))
                attempt += 1
        finally:
            self._in_flight -= 1
            if self._retired and not self._in_flight:
                await self.close()


def _retryable_failure(status: int, data: bytes) -> UpstreamError:
    """The failure of an engine's non-200 answer (its status for a 4xx, the request's fault; else 502), raised
    at once unless the status is retryable."""
    message = _error_message(data) or f"engine answered HTTP {status}"
    failure = UpstreamError(status if 400 <= status < 500 else 502, message)
    if status not in RETRYABLE_STATUS:
        raise failure
    return failure


async def _sse_data(content: EngineResponse) -> AsyncIterator[list[bytes]]:
    """The ``data`` of the SSE events of ``content`` (each event's data lines joined by newlines), a list per
    read: the events completed by what arrived. Other fields and comments are skipped. Lines may be of any
    length (a prompt's ids). A read of whole one-line ``data: `` events (vLLM's) is split in one pass."""
    buffer = bytearray()  # a line cut by the read, grown in place (a prompt's ids may take many reads)
    data: list[bytes] = []
    while True:
        piece = await content.readany()
        if not piece:
            return
        if not buffer and not data and piece.endswith(b"\n\n") and b"\r" not in piece:
            events = piece.split(b"\n\n")
            if all(e.startswith(b"data: ") and b"\n" not in e for e in events[:-1]):
                yield [e[6:] for e in events[:-1]]
                continue
        buffer += piece
        if b"\n" not in piece:
            continue
        *lines, rest = buffer.split(b"\n")
        buffer = rest
        events = []
        for line in lines:
            line = line.removesuffix(b"\r")
            if not line:
                if data:
                    events.append(b"\n".join(data))
                    data = []
            elif line.startswith(b"data:"):
                data.append(bytes(line[5:].removeprefix(b" ")))
        if events:
            yield events


def _stream_chunks(events: list[bytes]) -> tuple[list[dict[str, Any]], UpstreamError | None]:
    """The events of one read as chunks (``_stream_chunk``): all of them and None, or those before the first bad
    one and its error. Several events are parsed in one pass, as one JSON array; one by one only to find a bad one.
    """
    if not events:
        return [], None
    try:  # one event: its own parse is cheaper than an array's
        chunks = [orjson.loads(events[0])] if len(events) == 1 else orjson.loads(b"[" + b",".join(events) + b"]")
    except orjson.JSONDecodeError:
        chunks = None
    if not (
        chunks is None
        or len(chunks) != len(events)
        or set(map(type, chunks)) != {dict}
        or any(map(operator.contains, chunks, repeat("error")))
        or "error" in map(dict.get, chunks, repeat("object"))
    ):
        return chunks, None
    out: list[dict[str, Any]] = []
    try:
        out.extend(map(_stream_chunk, events))
    except UpstreamError as exc:
        return out, exc
    return out, None


def _stream_chunk(data: bytes) -> dict[str, Any]:
    """One stream chunk parsed; an error event is an ``UpstreamError``, anything but a JSON object is malformed."""
    return _known_stream_chunk(data, None)[0]


def _known_stream_chunk(data: bytes, known: KnownPrompt | None) -> tuple[dict[str, Any], bytes | None]:
    """``_stream_chunk`` whose ``prompt_token_ids`` are matched against ``known`` (``loads_reply``), and the open
    JSON of those ids where they matched (else None)."""
    try:
        chunk, prompt_json = loads_reply(data, "prompt_token_ids", known)
    except orjson.JSONDecodeError as exc:
        raise MalformedUpstream(f"invalid JSON in a stream chunk ({exc})") from None
    if not isinstance(chunk, dict):
        raise MalformedUpstream("a stream chunk is not a JSON object")
    if "error" in chunk or chunk.get("object") == "error":
        raise UpstreamError(502, f"engine stream failed: {_error_message(data) or 'error event'}")
    return chunk, prompt_json


def _error_message(data: bytes) -> str | None:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data[:200].decode("utf-8", "replace") or None
    if isinstance(parsed, dict):
        err = parsed.get("error", parsed)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(parsed.get("message"), str):
            return parsed["message"]
    return None


@dataclass(frozen=True, slots=True)
class EngineTier:
    """The capture tier of an engine: ``tokens`` trains; ``logprobs`` and ``text`` are eval only."""

    tier: str
    gap_ratio: float | None
    detail: str

    @property
    def trainable(self) -> bool:
        return self.tier == "tokens"


async def has_tokens_route(client: EngineClient) -> bool:
    """Whether the engine serves ``TOKENS_ROUTE``, without a generation: its validation answers ``{}`` with a 400
    where the route exists, a 404 where not. Any other failure is raised (``UpstreamError``)."""
    try:
        await client.chat(b"{}", route=TOKENS_ROUTE)
    except UpstreamError as exc:
        if exc.status in (400, 404, 405):
            return exc.status == 400
        raise
    return False


async def probe_tier(client: EngineClient, model: str) -> EngineTier:
    """Grade the engine with the processed-vs-raw probe (REFERENCE §1.4).

    The gap between the top-2 logprobs of one prompt halves from T=1 to T=2
    when logprobs are post-temperature (ratio 0.5) and stays (1.0) when raw.
    """
    gaps = []
    for temperature in (1.0, 2.0):
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 1,
            "temperature": temperature,
            "top_p": 1.0,
            "seed": 0,
            "logprobs": True,
            "top_logprobs": 2,
            "return_token_ids": True,
            "stream": False,
        }
        response = await client.chat(body)
        try:
            capture = extract_capture(response)
        except MalformedUpstream as exc:
            try:
                has_logprobs = bool(response["choices"][0]["logprobs"]["content"])
            except (KeyError, IndexError, TypeError):
                has_logprobs = False
            return EngineTier("logprobs" if has_logprobs else "text", None, str(exc))
        if capture.logprobs is None:
            return EngineTier("text", None, capture.logprob_note or "no logprobs")
        top = response["choices"][0]["logprobs"]["content"][0].get("top_logprobs") or []
        try:
            gap = float(top[0]["logprob"] - top[1]["logprob"])
        except (KeyError, IndexError, TypeError):
            return EngineTier("logprobs", None, "engine returned fewer than 2 usable top_logprobs")
        gaps.append(gap)
    if gaps[0] <= 1e-6:
        return EngineTier("logprobs", None, "top-2 logprobs tie; can't tell processed from raw")
    ratio = gaps[1] / gaps[0]
    if abs(ratio - 0.5) < 0.1:
        return EngineTier("tokens", ratio, "ids and processed logprobs")
    return EngineTier("logprobs", ratio, f"logprobs look raw (gap ratio {ratio:.2f}, processed gives 0.5)")
