"""A bounded, seeded fuzz of the proxy as a hostile client would try it (loopback only).

Valid bodies of the three dialects and of the control plane are mutated (wrong types, deleted and
unknown keys, deep nesting, huge and non-finite numbers, odd strings and bytes, truncated JSON, bad
``Content-Encoding`` and headers, other top-level values) and sent by a few concurrent workers, each
owning its sessions. Every reply must be a 2xx or the route's JSON error shape with a status below
500 (the fake engine never fails here, so a 5xx is the proxy's); every streamed reply must parse as
SSE and end in the dialect's terminal event; after every request the session's graph holds exactly
the turns whose replies the agent got ("recorded iff replied"), and at the end so do the exported
traces and the journals; a normal session is still exact afterwards.

Three phases: ``PROXY_FUZZ_REQUESTS`` (default 10000) mutated requests of every route, 15% of them
asking to stream; ``PROXY_FUZZ_STREAMS`` (default 400) streamed model calls with at most one
mutation; and a few dozen model calls, streamed or not, while the engine fails (malformed 200s,
4xx, 5xx, cut JSON; streams cut, broken or failed midway), whose errors must be in the dialect's shape
and record nothing.
``PROXY_FUZZ_SEED`` (default 8) seeds a run.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import random
import shutil
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy.sessions import SessionRegistry
from tests.proxy.proxy_stack import Stack, agent_turns, run_stack
from tests.proxy.test_proxy_server import _assert_trace_matches
from tests.proxy.wire import (
    ANTHROPIC,
    CHAT,
    RESPONSES,
    TOOL_SCHEMA,
    Reply,
    agent_headers,
    assert_error_shape,
    post,
    stream_outcome,
)

REQUESTS = int(os.environ.get("PROXY_FUZZ_REQUESTS", "10000"))
STREAMS = int(os.environ.get("PROXY_FUZZ_STREAMS", "400"))
FAULTS = 60
SEED = int(os.environ.get("PROXY_FUZZ_SEED", "8"))
WORKERS = 8
SESSION_TURNS = 60  # a worker moves to fresh sessions after this many recorded turns, so traces stay small
COUNT_TOKENS = "/v1/messages/count_tokens"
SESSIONS = "/sessions"

_BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": TOOL_SCHEMA}}
_BASE_BODIES: dict[str, list[dict[str, Any]]] = {
    CHAT: [
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "You are an agent."}]},
                {"role": "user", "content": "list files"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
            ],
            "tools": [_BASH],
            "tool_choice": "auto",
            "temperature": 0.7,
            "max_completion_tokens": 64,
            "stop": ["</s>"],
            "stream_options": {"include_usage": True},
            "logprobs": True,
            "return_token_ids": True,
        },
    ],
    RESPONSES: [
        {"model": "m", "input": "hi"},
        {
            "model": "m",
            "instructions": "You are an agent.",
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "I should list."}]},
                {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": '{"command":"ls"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
                {"type": "local_shell_call", "call_id": "c2", "action": {"type": "exec", "command": ["ls"]}},
                {"type": "local_shell_call_output", "call_id": "c2", "output": "a.py"},
            ],
            "tools": [
                {"type": "function", "name": "bash", "parameters": TOOL_SCHEMA},
                {"type": "local_shell"},
                {"type": "custom", "name": "apply_patch"},
                {"type": "web_search"},
            ],
            "tool_choice": "auto",
            "max_output_tokens": 64,
            "reasoning": {"effort": "low"},
            "text": {"format": {"type": "text"}},
            "metadata": {"run": "1"},
            "store": False,
        },
    ],
    ANTHROPIC: [
        {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]},
        {
            "model": "m",
            "max_tokens": 64,
            "system": [{"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "list files"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "I should list.", "signature": ""},
                        {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls"}},
                    ],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]},
            ],
            "tools": [{"name": "bash", "description": "Run a command.", "input_schema": TOOL_SCHEMA}],
            "tool_choice": {"type": "auto"},
            "stop_sequences": ["</s>"],
            "temperature": 0.5,
            "metadata": {"user_id": "u"},
        },
    ],
    COUNT_TOKENS: [{"model": "m", "messages": [{"role": "user", "content": "hi"}], "system": "s", "tools": []}],
    SESSIONS: [
        {"purpose": "train", "sampling": {"temperature": 0.8}, "metadata": {"episode": 1}},
        {"purpose": "eval", "max_output_tokens": 32, "model": "fake/vllm"},
    ],
}

_RAW_NUMBERS = [
    b"1e400", b"-1e400", b"1e-400", b"18446744073709551616", b"18446744073709551615", b"9223372036854775808",
    b"-9223372036854775809", b"123456789012345678901234567890", b"NaN", b"Infinity", b"-0", b"1E308", b"0.0e0",
]  # fmt: skip
_ODD_STRINGS = [
    b'""', b'"\\u0000"', b'"\\ud800"', b'"\\udfff x"', b'"\xff\xfe"', b'"\xc3"', b'"\xf0\x9f\x98\x80"',
    b'"\\u202e"', b'"a\\nb"', b'"' + b"x" * 100_000 + b'"',
]  # fmt: skip
_WRONG_VALUES: list[Any] = [None, True, False, 0, -1, 1.5, 2**63, "", "x", [], [1], {}, {"a": 1}, [[[]]], ["x", 2]]
_ENCODINGS = ["gzip", "deflate", "br", "zstd", "x-gzip", "identity", "gzip, deflate", "compress", "*", "GZIP", "a;b"]


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys and indexes) to a node inside ``value``, the root excluded."""
    out = []
    if isinstance(value, dict):
        for key, child in value.items():
            out.append((*prefix, key))
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out.append((*prefix, index))
            out += _paths(child, (*prefix, index))
    return out


def _set(value: Any, path: tuple, new: Any) -> None:
    for key in path[:-1]:
        value = value[key]
    value[path[-1]] = new


def _deep_raw(rng: random.Random) -> bytes:
    depth = rng.choice([64, 120, 126, 127, 128, 129, 200, 246, 250, 254, 255, 300, 1023, 1024, 1025, 3000])
    if rng.random() < 0.5:
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


@dataclass
class Mutated:
    route: str
    data: bytes
    headers: dict[str, str]
    kinds: list[str]


def mutate(rng: random.Random, route: str, key: str, *, stream: bool = False) -> Mutated:
    """One request: a valid body of ``route`` with one to three mutations (sometimes none); ``stream``: a
    streamed model call with at most one mutation."""
    body = orjson.loads(orjson.dumps(rng.choice(_BASE_BODIES[route])))
    if route in (CHAT, RESPONSES, ANTHROPIC) and (stream or rng.random() < 0.15):
        body["stream"] = True
    headers = agent_headers(ANTHROPIC if route == COUNT_TOKENS else route, key)
    raw: dict[str, bytes] = {}  # placeholder -> raw JSON text orjson can't or won't write
    kinds: list[str] = []
    post_ops: list[str] = []
    mutations = rng.choice([0, 1]) if stream else 0 if rng.random() < 0.08 else rng.choice([1, 1, 1, 2, 3])
    for _ in range(mutations):
        kind = rng.choice(
            ["type", "type", "type", "delete", "insert", "deep", "deep", "number", "string", "truncate",
             "encoding", "header", "toplevel"]
        )  # fmt: skip
        kinds.append(kind)
        paths = _paths(body) if isinstance(body, dict | list) else []
        if kind in ("type", "deep", "number", "string") and paths:
            path = rng.choice(paths)
            if kind == "type":
                _set(body, path, orjson.loads(orjson.dumps(rng.choice(_WRONG_VALUES))))
            else:
                mark = f"@RAW{len(raw)}@"
                raw[mark] = (
                    _deep_raw(rng) if kind == "deep" else rng.choice(_RAW_NUMBERS if kind == "number" else _ODD_STRINGS)
                )
                _set(body, path, mark)
        elif kind == "delete" and paths:
            path = rng.choice(paths)
            parent = body
            for part in path[:-1]:
                parent = parent[part]
            del parent[path[-1]]
        elif kind == "insert" and isinstance(body, dict):
            targets = [body] + [n for n in _nodes(body) if isinstance(n, dict)]
            rng.choice(targets)[rng.choice(["extra", "type", "role", "content", "stream", "n", "id"])] = rng.choice(
                _WRONG_VALUES
            )
        elif kind == "toplevel":
            body = rng.choice([[], [body], "body", 1, None, True])
        elif kind in ("truncate", "encoding"):
            post_ops.append(kind)
        elif kind == "header":
            _mutate_headers(rng, headers, key)
    data = orjson.dumps(body)
    for mark, text in raw.items():
        data = data.replace(orjson.dumps(mark), text)
    for op in post_ops:
        data = data[: rng.randrange(len(data) + 1)] if op == "truncate" else _encode(rng, data, headers)
    if not stream and rng.random() < 0.02:
        data = rng.choice([b"", b"\xef\xbb\xbf" + data, data + b"garbage", data + data, b"\x00" * 16])
        kinds.append("bytes")
    return Mutated(route, data, headers, kinds)


def _nodes(value: Any) -> list[Any]:
    out = []
    stack = [value]
    while stack:
        node = stack.pop()
        out.append(node)
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def _mutate_headers(rng: random.Random, headers: dict[str, str], key: str) -> None:
    choice = rng.randrange(6)
    if choice == 0:
        headers["Content-Type"] = rng.choice(["text/plain", "application/x-www-form-urlencoded", "", "a/b; c=d"])
    elif choice == 1:
        for name in ("Authorization", "x-api-key"):
            if name in headers:
                headers[name] = rng.choice(["", "Bearer", "Bearer  " + key + " x", "nope", key.upper(), "Basic " + key])
    elif choice == 2:
        headers.pop("Authorization", None)
        headers.pop("x-api-key", None)
    elif choice == 3:
        headers[rng.choice(["x-session-id", "session_id", "conversation_id"])] = rng.choice(["x" * 4000, "é", "\t"])
    elif choice == 4:
        headers["Content-Encoding"] = rng.choice(_ENCODINGS)
    else:
        headers["anthropic-version"] = rng.choice(["", "1999-01-01", "x" * 100])


def _encode(rng: random.Random, data: bytes, headers: dict[str, str]) -> bytes:
    encoding = rng.choice(_ENCODINGS)
    headers["Content-Encoding"] = encoding
    if encoding in ("gzip", "x-gzip", "GZIP") and rng.random() < 0.7:
        data = gzip.compress(data)
    elif encoding == "deflate" and rng.random() < 0.7:
        data = zlib.compress(data)
    if rng.random() < 0.3 and data:
        cut = rng.randrange(len(data))
        data = data[:cut] + bytes([data[cut] ^ 0x5A]) + data[cut + 1 :]
    return data


@dataclass
class Tally:
    last: Reply | None = None
    requests: int = 0
    streamed: int = 0
    replied: int = 0  # model calls whose reply the agent got (recorded)
    statuses: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)


@dataclass
class AgentSession:
    session_id: str
    key: str = field(repr=False)
    replied: int = 0


async def _open(stack: Stack, **config: Any) -> AgentSession:
    opened = await stack.create_session(**config)
    return AgentSession(opened.session_id, opened.api_key)


def _check_reply(route: str, reply: Reply, mutated: Mutated, *, engine_fails: bool = False) -> bool:
    """Whether the reply is a successful model call; fails the test if it is out of shape, or a 5xx while the
    engine works (then only the request can be at fault)."""
    where = (route, mutated.kinds, reply.status, reply.body[:400], mutated.data[:300])
    assert reply.status < 500 or engine_fails, where
    if reply.content_type.startswith("text/event-stream"):
        _, error = stream_outcome(route, reply)
        return error is None
    if reply.status >= 400:
        assert_error_shape(route, reply)
        return False
    assert reply.status in (200, 201), where
    answer = reply.json
    assert isinstance(answer, dict), where
    if route in (SESSIONS, COUNT_TOKENS):
        return False
    if route == CHAT:
        return answer.get("object") == "chat.completion"
    if route == RESPONSES:
        return answer.get("object") == "response"
    return answer.get("type") == "message"


async def _worker(
    stack: Stack, rng: random.Random, tally: Tally, count: int, retired: list[AgentSession], *, streams: int
) -> None:
    """``count`` mutated requests of every route, then ``streams`` streamed model calls, on the worker's own
    sessions; checks every reply and, after each, that the session recorded exactly the replied calls."""
    sessions: list[AgentSession] = []

    async def fresh() -> None:
        retired.extend(sessions)
        sessions[:] = [
            await _open(stack),
            await _open(stack, purpose="eval"),
        ]

    await fresh()
    for n in range(count + streams):
        if max(s.replied for s in sessions) >= SESSION_TURNS:
            await fresh()
        session = rng.choice(sessions)
        if n < count:
            route = rng.choices([CHAT, RESPONSES, ANTHROPIC, COUNT_TOKENS, SESSIONS], weights=[30, 30, 30, 4, 6])[0]
            mutated = mutate(rng, route, stack.admin_key if route == SESSIONS else session.key)
        else:
            route = rng.choice([CHAT, RESPONSES, ANTHROPIC])
            mutated = mutate(rng, route, session.key, stream=True)
        reply = await _send(stack, tally, session, mutated)
        if route == SESSIONS and reply.status == 201:  # keep the registry small: the fuzz made it, drops it
            await asyncio.to_thread(stack.admin.delete, reply.json["session_id"])
    retired.extend(sessions)


async def _send(
    stack: Stack, tally: Tally, session: AgentSession, mutated: Mutated, *, engine_fails: bool = False
) -> Reply:
    """Send one request, check its reply, and check that the session recorded exactly the replied calls."""
    route = mutated.route
    reply = await post(stack.http, stack.url + route, mutated.data, mutated.headers)
    tally.requests += 1
    tally.statuses[reply.status] += 1
    tally.kinds.update(mutated.kinds or ["none"])
    tally.streamed += reply.content_type.startswith("text/event-stream")
    if _check_reply(route, reply, mutated, engine_fails=engine_fails) and route in (CHAT, RESPONSES, ANTHROPIC):
        session.replied += 1
        tally.replied += 1
    graph = stack.proxy.sessions.get(session.session_id).graph
    assert len(graph) == session.replied, (route, mutated.kinds, reply.status, reply.body[:300])
    return reply


def _engine_fault(rng: random.Random, *, stream: bool) -> tuple:
    """A fake-engine fault: a 200 whose completion breaks the contract somewhere (streamed: as one chunk), an HTTP
    failure, or, for a stream, a stream that breaks after some chunks (cut, a broken chunk, an error event)."""

    def patch(completion: dict[str, Any]) -> Any:
        choice = completion["choices"][0]
        target = rng.choice(["tool_calls", "content", "usage", "ids", "logprobs", "message", "choices", "deep"])
        if target == "tool_calls":
            choice["message"]["tool_calls"] = rng.choice([[{"function": "x"}], "bash", [{"function": {"name": 1}}]])
        elif target == "content":
            choice["message"]["content"] = rng.choice([["a"], {"text": "a"}, 5])
        elif target == "usage":
            completion["usage"] = rng.choice([[], {"prompt_tokens": "7"}, {"prompt_tokens_details": []}])
        elif target == "ids":
            completion["prompt_token_ids"] = rng.choice([[-1, 2], ["1"], [], [1.5], [True]])
        elif target == "logprobs":
            choice["logprobs"] = rng.choice([[], {"content": "x"}])
        elif target == "message":
            choice["message"] = rng.choice([None, "hi", []])
        elif target == "choices":
            completion["choices"] = rng.choice([[], {}, ["x"]])
        else:
            depth = rng.choice([130, 300])
            choice["message"]["annotations"] = "@DEEP@"
            return orjson.dumps(completion).replace(b'"@DEEP@"', b"[" * depth + b"]" * depth)
        return completion

    faults = [("patch", patch)] * 6 + [("status", 400), ("status", 404), ("status", 500), ("truncate",)]
    if stream:
        faults += [(kind, rng.randrange(1, 12)) for kind in ("cut", "bad_chunk", "error_event") for _ in range(2)]
    return rng.choice(faults)


async def _engine_faults(stack: Stack, rng: random.Random, tally: Tally, retired: list[AgentSession]) -> None:
    """Model calls while the engine fails, one at a time: errors in the dialect's shape, nothing recorded."""
    session = await _open(stack)
    retired.append(session)
    for _ in range(FAULTS):
        route = rng.choice([CHAT, RESPONSES, ANTHROPIC])
        stream = rng.random() < 0.5
        fault = _engine_fault(rng, stream=stream)
        stack.engine.faults = [fault] * (4 if fault[:2] == ("status", 500) else 1)  # a 500 past the retries
        reply = await _send(stack, tally, session, mutate(rng, route, session.key, stream=stream), engine_fails=True)
        stream_only = fault[0] in ("cut", "bad_chunk", "error_event")  # a mutation may have unset "stream"
        assert reply.status >= 400 or "text/event-stream" in reply.content_type or stream_only, reply
        stack.engine.faults = []


def _share(total: int, worker: int) -> int:
    return total // WORKERS + (worker < total % WORKERS)


def test_fuzzed_requests_get_answers_in_shape_and_traces_match_replies(tmp_path: Path) -> None:
    tally = Tally()
    journals = tmp_path / "journals"

    async def body(stack: Stack) -> None:
        rng = random.Random(SEED)
        retired: list[AgentSession] = []
        started = time.monotonic()
        workers = [
            _worker(stack, random.Random(rng.random()), tally, _share(REQUESTS, i), retired, streams=_share(STREAMS, i))
            for i in range(WORKERS)
        ]
        await asyncio.gather(*workers)
        await _engine_faults(stack, random.Random(rng.random()), tally, retired)
        elapsed = time.monotonic() - started
        for session in retired:  # the exported traces agree with what the agents got
            assert len((await stack.trace(session.session_id))["turns"]) == session.replied, session
        copy = tmp_path / "recovered"
        shutil.copytree(journals, copy)
        registry = SessionRegistry(copy)
        registry.recover()
        for session in retired:  # and so do the journals, read back as a restarted proxy would
            assert len(registry.get(session.session_id).graph) == session.replied, session
        registry.close()
        session = await stack.create_session()  # a normal session is still exact afterwards
        replies = await agent_turns(stack, session.api_key, 6)
        _assert_trace_matches(await stack.trace(session.session_id), replies)
        print(
            f"\nfuzz: seed {SEED}, {tally.requests} requests ({tally.streamed} streamed, {tally.replied} replied) "
            f"in {elapsed:.1f}s; statuses {dict(sorted(tally.statuses.items()))}; mutations {dict(tally.kinds)}"
        )

    run_stack(body, journals, max_body_bytes=1_000_000)
    assert tally.requests == REQUESTS + STREAMS + FAULTS
    assert tally.streamed >= STREAMS * 3 // 4, tally
    assert tally.replied >= REQUESTS // 10, tally  # the mutations leave enough calls valid to check recording
    assert sum(n for status, n in tally.statuses.items() if 400 <= status < 500) >= REQUESTS // 3, tally
