"""The token-in bridge: a history the session sampled, re-sent re-serialised, is prompted with the sampled ids.

The fake engine serialises tool call arguments as vLLM's parser does (``{"command": "..."}``); the agents here
send them back compactly, so without the bridge every turn after the first is a new root.
"""

from __future__ import annotations

import itertools
import json
import re
from array import array
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from openenv.core.harness.training import TrainingTrace as OpenEnvTrainingTrace

from bench.fake_vllm import IM_END, IM_START, NEWLINE, render_prompt, tokenize
from proxy import server
from proxy.bridge import History, _closing_stop, _semantic
from proxy.capture_graph import sequences_from_trace
from proxy.known_prompt import loads_reply
from proxy.trace import TrainingTrace
from tests.proxy.proxy_stack import TOOLS, Stack, agent_turns, run_stack
from tests.proxy.test_dialects import accumulate_chat
from tests.proxy.wire import CHAT, RESPONSES, ROUTES, agent_headers, parse_sse, post, valid_body

SAMPLING = {"temperature": 0.7}


def _compact(arguments: str) -> str:
    return json.dumps(json.loads(arguments), separators=(",", ":"))


def _next_body(route: str, body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """``body`` followed by ``reply`` (its tool call re-serialised compactly, as agents do) and the tool's result."""
    body = orjson.loads(orjson.dumps(body))
    if route == CHAT:
        message = reply["choices"][0]["message"]
        calls = [
            {**call, "function": {**call["function"], "arguments": _compact(call["function"]["arguments"])}}
            for call in message["tool_calls"]
        ]
        body["messages"] += [
            {"role": "assistant", "content": message["content"], "tool_calls": calls},
            *({"role": "tool", "tool_call_id": call["id"], "content": "ok"} for call in calls),
        ]
    elif route == RESPONSES:
        for item in reply["output"]:
            assert item["type"] == "function_call", item
            call = {"type": "function_call", "call_id": item["call_id"], "name": item["name"]}
            body["input"] += [
                {**call, "arguments": _compact(item["arguments"])},
                {"type": "function_call_output", "call_id": item["call_id"], "output": "ok"},
            ]
    else:
        uses = [block for block in reply["content"] if block["type"] == "tool_use"]
        body["messages"] += [
            {"role": "assistant", "content": reply["content"]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "ok"} for use in uses],
            },
        ]
    return body


_PROMPT_COUNT = re.compile(rb'("(?:prompt_tokens|input_tokens|total_tokens)":\s*)\d+')


def _without_prompt_counts(body: bytes) -> bytes:
    """The reply with its prompt's token counts blanked: the two prompts differ, by design, in length."""
    return _PROMPT_COUNT.sub(rb"\1_", body)


def _suffix(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """The fake template's rendering of what follows the last assistant message."""
    end = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prefix = render_prompt(messages[: end + 1], tools, add_generation_prompt=False)
    full = render_prompt(messages, tools)
    assert full[: len(prefix)] == prefix
    return full[len(prefix) :]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("route", ROUTES)
def test_a_bridged_turn_extends_its_parent_and_the_agent_reads_the_same_reply(
    tmp_path: Path, route: str, stream: bool
) -> None:
    async def scenario(stack: Stack) -> None:
        replies, traces = {}, {}
        for bridge in (True, False):
            key = await stack.create_session(sampling=SAMPLING, bridge=bridge)
            headers = agent_headers(route, key.api_key)
            first = valid_body(route)
            reply = await post(stack.http, stack.url + route, first, headers)
            assert reply.status == 200, reply.body
            second = _next_body(route, first, reply.json)
            if stream:
                second["stream"] = True
            reply = await post(stack.http, stack.url + route, second, headers)
            assert reply.status == 200, reply.body
            replies[bridge], traces[bridge] = reply.body, await stack.trace(key.session_id)
        assert stack.engine.token_calls == 1
        assert _without_prompt_counts(replies[True]) == _without_prompt_counts(replies[False])

        parent, turn = traces[True]["turns"]
        messages, tools = turn["request"]["messages"], turn["request"]["tools"] or None
        assert parent["completion_token_ids"][-1] == IM_END
        bridged = parent["prompt_token_ids"] + parent["completion_token_ids"] + [NEWLINE] + _suffix(messages, tools)
        assert turn["prompt_token_ids"] == bridged
        assert turn["metadata"]["bridged"] is True and turn["metadata"]["parent_id"] == parent["node_id"]
        assert "bridge_fallback" not in turn["metadata"] and parent["metadata"]["bridged"] is False
        assert turn["completion_token_ids"] == traces[False]["turns"][1]["completion_token_ids"]
        assert turn["per_token_logps"] == traces[False]["turns"][1]["per_token_logps"]  # the policy's temperature

        plain = traces[False]["turns"][1]
        assert plain["metadata"]["parent_id"] is None and plain["metadata"]["bridged"] is False
        assert plain["prompt_token_ids"] == render_prompt(messages, tools)  # the re-serialised history

    run_stack(scenario, tmp_path, engine_options={"sample_seed": 7})


async def _agent_loop(stack: Stack, key: str, turns: int, *, user_turns: bool = False) -> list[dict[str, Any]]:
    """A chat agent that sends its tool calls back compactly; ``user_turns``: a user message after each text."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "an agent"}, {"role": "user", "content": "go"}]
    for _ in range(turns):
        status, reply = await stack.chat(key, messages, tools=TOOLS)
        assert status == 200, reply
        _send_back_compactly(messages, reply["choices"][0]["message"], "continue" if user_turns else "ok")
    return messages


def _send_back_compactly(messages: list[dict[str, Any]], message: dict[str, Any], user_text: str) -> None:
    """Append the reply as the agent sends it back (tool call arguments compacted), then a tool result per call,
    or ``user_text`` after a reply without calls."""
    calls = [
        {**call, "function": {**call["function"], "arguments": _compact(call["function"]["arguments"])}}
        for call in message.get("tool_calls") or []
    ]
    messages.append({"role": "assistant", "content": message["content"], **({"tool_calls": calls} if calls else {})})
    messages += [{"role": "tool", "tool_call_id": call["id"], "content": "ran"} for call in calls]
    if not calls:
        messages.append({"role": "user", "content": user_text})


def test_a_bridged_session_is_one_trajectory_that_validates_and_trains_as_one_row(tmp_path: Path) -> None:
    async def scenario(stack: Stack) -> None:
        rows, saved, sampled, bridged_turns = {}, {}, {}, []
        for bridge in (True, False):
            key = await stack.create_session(sampling=SAMPLING, bridge=bridge)
            await _agent_loop(stack, key.api_key, 6)
            raw = await stack.trace(key.session_id)
            OpenEnvTrainingTrace.model_validate_json(orjson.dumps(raw))
            sequences = sequences_from_trace(TrainingTrace.model_validate(raw))
            rows[bridge] = sequences
            sampled[bridge] = sum(len(t["completion_token_ids"]) for t in raw["turns"])
            bridged_turns += [t for t in raw["turns"] if t["metadata"]["bridged"]]
            saved[bridge] = (await stack.describe(key.session_id))["stats"]["bridge"]
            assert [t["metadata"]["bridged"] for t in raw["turns"]] == [False] + [bridge] * 5
        # Without the bridge each turn after a tool call is a new root (text turns re-render as sampled).
        assert len(rows[True]) == 1 and len(rows[False]) == 4
        assert sum(rows[True][0].loss_mask) == sampled[True]  # every turn trains, in the one row
        assert saved[True]["bridged"] == 5 and saved[True]["fallbacks"] == {}
        # Saved: per bridged turn, the parent's ids (all of its prompt but the trailer "\n" and the suffix) that a
        # new root would repeat had the engine rendered the re-serialised history.
        assert saved[True]["saved_tokens"] == sum(
            len(t["prompt_token_ids"]) - 1 - len(_suffix(t["request"]["messages"], TOOLS)) for t in bridged_turns
        )
        assert saved[False] == {"bridged": 0, "saved_tokens": 0, "fallbacks": {}, "speculated": 0, "missed": 0}
        # Two renderings for the first bridged call (which learns how the template closes a turn), one after it.
        assert stack.engine.tokenize_calls == 6 and stack.engine.token_calls == 5

        echoing = await stack.create_session(sampling=SAMPLING)  # sends the calls back as it got them
        await agent_turns(stack, echoing.api_key, 4)
        turns = (await stack.trace(echoing.session_id))["turns"]
        assert [(t["metadata"]["bridged"], t["metadata"].get("bridge_saved_tokens")) for t in turns[1:]] == [
            (True, 0)
        ] * 3  # bridged, but the rendering extended the parent anyway: nothing saved
        assert (await stack.describe(echoing.session_id))["stats"]["bridge"]["saved_tokens"] == 0

    run_stack(scenario, tmp_path)


def _chat_message(streamed: dict[str, Any]) -> dict[str, Any]:
    """A streamed reply, as ``accumulate_chat`` folds it, as the message a whole reply would have carried."""
    calls = [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in streamed["tool_calls"]
    ]
    return {"role": "assistant", "content": streamed["content"] or None, **({"tool_calls": calls} if calls else {})}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_session_whose_template_renders_its_turns_as_sampled_skips_tokenize_and_a_miss_is_made_again_bridged(
    tmp_path: Path, stream: bool
) -> None:
    """An agent that sends its turns back as it got them: once a bridged call shows the engine renders them as
    sampled, calls go to the chat route unrendered and are checked after; the first call that re-serialises a
    tool call (so the rendering differs) is sampled again through the bridge, and the agent reads only that."""

    async def scenario(stack: Stack) -> None:
        key = await stack.create_session(sampling=SAMPLING)
        headers = agent_headers(CHAT, key.api_key)
        messages: list[dict[str, Any]] = [{"role": "system", "content": "an agent"}, {"role": "user", "content": "go"}]
        seen, calls_after_first = [], 0
        for call in range(5):
            body = {"model": "any", "messages": messages, "tools": TOOLS, "stream": stream}
            reply = await post(stack.http, stack.url + CHAT, body, headers)
            assert reply.status == 200, reply.body
            if stream:
                frames = parse_sse(reply.body)
                assert sum(1 for _, data in frames if data != "[DONE]" and "role" in data["choices"][0]["delta"]) == 1
                message = _chat_message(accumulate_chat(frames)["message"])
            else:
                message = reply.json["choices"][0]["message"]
            seen.append(message)
            calls_after_first = calls_after_first if call else stack.engine.calls  # the engine was probed before
            if call < 2:  # as it got them, then (the third reply on) compactly
                messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
                calls = message.get("tool_calls") or []
                messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ran"} for c in calls]
                if not message.get("tool_calls"):
                    messages.append({"role": "user", "content": "continue"})
            else:
                _send_back_compactly(messages, message, "continue")
        turns = (await stack.trace(key.session_id))["turns"]
        assert [(t["metadata"]["bridged"], t["metadata"].get("bridge_speculated", False)) for t in turns] == [
            (False, False),
            (True, False),  # rendered twice: the template renders the first turn as sampled
            (True, True),  # the chat route's rendering, confirmed
            (True, False),  # the re-serialised call missed, and was sampled again through the bridge
            (True, False),  # a session that missed no longer speculates
        ]
        for parent, turn in itertools.pairwise(turns):
            assert turn["metadata"]["parent_id"] == parent["node_id"]
            assert turn["prompt_token_ids"] == [
                *parent["prompt_token_ids"],
                *parent["completion_token_ids"],
                NEWLINE,
                *_suffix(turn["request"]["messages"], TOOLS),
            ]
        assert turns[3]["metadata"]["bridge_saved_tokens"] > 0
        for message, turn in zip(seen, turns, strict=True):  # what the agent read is what was recorded
            recorded = turn["response"]["choices"][0]["message"]
            assert message.get("content") == recorded.get("content")
            assert [c["function"] for c in message.get("tool_calls") or []] == [
                c["function"] for c in recorded.get("tool_calls") or []
            ]
        stats = (await stack.describe(key.session_id))["stats"]["bridge"]
        assert (stats["bridged"], stats["speculated"], stats["missed"]) == (4, 1, 1)
        async with stack.http.get(f"{stack.url}/metrics") as resp:
            metrics = await resp.text()
        assert "proxy_bridge_speculated_turns_total 1\n" in metrics
        assert "proxy_bridge_missed_speculations_total 1\n" in metrics
        calls = stack.engine.calls - calls_after_first
        assert (calls, stack.engine.token_calls, stack.engine.tokenize_calls) == (4 + 1, 3, 4)

    run_stack(scenario, tmp_path)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_turn_is_indexed_for_the_bridge_after_its_reply_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """The bridge's index of a turn is off the reply's path: built once the reply's last bytes were handed to the
    transport, and still in place before the session's next call, which is bridged from it."""
    events: list[str] = []
    index_turn, write_eof = server._index_turn, web.StreamResponse.write_eof

    def indexed(*args: Any) -> None:
        index_turn(*args)
        events.append("indexed")

    agent_keys: list[str] = []

    async def sent(response: web.StreamResponse, data: bytes = b"") -> None:
        request = response._req  # the proxy's answer to the agent, not the in-process engine's to the proxy
        await write_eof(response, data)
        if request is not None and request.headers.get("Authorization") in agent_keys and request.path == CHAT:
            events.append("sent")

    monkeypatch.setattr(server, "_index_turn", indexed)
    monkeypatch.setattr(web.StreamResponse, "write_eof", sent)

    async def scenario(stack: Stack) -> None:
        key = await stack.create_session(sampling=SAMPLING)
        agent_keys.append(f"Bearer {key.api_key}")
        messages: list[dict[str, Any]] = [{"role": "system", "content": "an agent"}, {"role": "user", "content": "go"}]
        for _ in range(4):
            body = {"model": "any", "messages": messages, "tools": TOOLS, "stream": stream}
            reply = await post(stack.http, stack.url + CHAT, body, agent_headers(CHAT, key.api_key))
            assert reply.status == 200, reply.body
            streamed = accumulate_chat(parse_sse(reply.body))["message"] if stream else None
            message = _chat_message(streamed) if streamed else reply.json["choices"][0]["message"]
            _send_back_compactly(messages, message, "continue")
        turns = (await stack.trace(key.session_id))["turns"]
        assert [t["metadata"]["bridged"] for t in turns] == [False, True, True, True]
        assert events == ["sent", "indexed"] * 4

    run_stack(scenario, tmp_path)


def test_a_bridged_call_renders_once_and_fingerprints_only_its_new_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per call, the proxy's cost does not grow with the history: after the first bridged call (rendered twice, to
    learn how the template closes a turn), one ``/tokenize`` per call, and the messages fingerprinted are the
    call's new ones plus its reply; the prompts are the ones two renderings give."""
    hashed = []
    monkeypatch.setattr("proxy.bridge._semantic", lambda message: hashed.append(message) or _semantic(message))

    async def scenario(stack: Stack) -> None:
        session = await stack.create_session(sampling=SAMPLING)
        key = session.api_key
        messages: list[dict[str, Any]] = [{"role": "system", "content": "an agent"}, {"role": "user", "content": "go"}]
        costs, sent = [], 0
        for _ in range(24):
            renders, hashes, new = stack.engine.tokenize_calls, len(hashed), len(messages) - sent
            sent = len(messages)
            status, reply = await stack.chat(key, messages, tools=TOOLS)
            assert status == 200, reply
            costs.append((stack.engine.tokenize_calls - renders, len(hashed) - hashes - new))
            _send_back_compactly(messages, reply["choices"][0]["message"], "continue")
        assert costs == [(0, 1), (2, 1)] + [(1, 1)] * 22  # (renders, fingerprints past the new messages: the reply)
        turns = (await stack.trace(session.session_id))["turns"]
        for parent, turn in itertools.pairwise(turns):
            assert turn["metadata"]["bridged"] and turn["metadata"]["parent_id"] == parent["node_id"]
            history = turn["request"]["messages"]
            assert turn["prompt_token_ids"] == [
                *parent["prompt_token_ids"],
                *parent["completion_token_ids"],
                NEWLINE,
                *_suffix(history, TOOLS),
            ]

    run_stack(scenario, tmp_path)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
@pytest.mark.parametrize("as_sampled", [False, True], ids=["rendered", "speculative"])
def test_a_bridged_call_parses_only_the_ids_past_those_it_knew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_sampled: bool, stream: bool
) -> None:
    """The ids a bridged call gets back start with ids the session holds: its prompt with the ids it sent or the
    turn it expects (in a reply, or a stream's first chunk), the ``/tokenize`` of its history with the last
    rendering. Those are matched as bytes and only the ids after them parsed (``proxy.known_prompt``), and the trace
    is what parsing everything gives."""
    answers: list[tuple[str, bool]] = []  # per engine answer read: (its array of ids, whether its start was known)

    def spy(data: bytes, name: str, known: Any) -> tuple[Any, bytes | None]:
        parsed, json_ = loads_reply(data, name, known)
        if b'"%s":' % name.encode() in data:  # not a stream's later chunks
            answers.append((name, json_ is not None))
        return parsed, json_

    monkeypatch.setattr("proxy.engine_client.loads_reply", spy)

    async def scenario(stack: Stack) -> None:
        session = await stack.create_session(sampling=SAMPLING)
        messages: list[dict[str, Any]] = [{"role": "system", "content": "an agent"}, {"role": "user", "content": "go"}]
        per_call = []
        for _ in range(8):
            answers.clear()
            if stream:
                body = {"model": "m", "messages": messages, "tools": TOOLS, "stream": True}
                answer = await post(stack.http, f"{stack.url}{CHAT}", body, agent_headers(CHAT, session.api_key))
                assert answer.status == 200, answer.body
                message = accumulate_chat(parse_sse(answer.body))["message"]
                calls = [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in message.pop("tool_calls")
                ]
                message = {"role": "assistant", **message, **({"tool_calls": calls} if calls else {})}
            else:
                status, reply = await stack.chat(session.api_key, messages, tools=TOOLS)
                assert status == 200, reply
                message = reply["choices"][0]["message"]
            per_call.append(list(answers))
            if as_sampled:  # the engine then renders the history as sampled: calls speculate
                messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
                calls = message.get("tool_calls") or []
                messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ran"} for c in calls]
                if not calls:
                    messages.append({"role": "user", "content": "continue"})
            else:
                _send_back_compactly(messages, message, "continue")
        later = [("prompt_token_ids", True)] if as_sampled else [("tokens", True), ("prompt_token_ids", True)]
        assert per_call[2:] == [later] * 6
        assert per_call[1] == [("tokens", False), ("tokens", False), ("prompt_token_ids", True)]  # the ids it sent
        turns = (await stack.trace(session.session_id))["turns"]
        assert [t["metadata"].get("bridge_speculated", False) for t in turns] == [False, False] + [as_sampled] * 6
        for parent, turn in itertools.pairwise(turns):
            assert turn["metadata"]["parent_id"] == parent["node_id"]
            assert turn["prompt_token_ids"] == [
                *parent["prompt_token_ids"],
                *parent["completion_token_ids"],
                NEWLINE,
                *_suffix(turn["request"]["messages"], TOOLS),
            ]

    run_stack(scenario, tmp_path)


class _DumpsSpy:
    """``orjson`` for a module under test, noting the type of each ``prompt_token_ids`` it is asked to write."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def __getattr__(self, name: str) -> Any:
        return getattr(orjson, name)

    def dumps(self, obj: Any, *args: Any) -> bytes:
        if isinstance(obj, dict) and "prompt_token_ids" in obj:
            self.seen.append(type(obj["prompt_token_ids"]).__name__)
        return orjson.dumps(obj, *args)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
def test_the_ids_a_bridged_call_echoes_are_the_engines_bytes_not_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """A ``return_token_ids`` agent gets the prompt ids the trace holds; where the call was bridged, the engine's
    bytes of them (matched, ``proxy.known_prompt``) are what it gets, not thousands of ids serialised again."""
    seen: list[str] = []
    monkeypatch.setattr("proxy.server.orjson", _DumpsSpy(seen))
    monkeypatch.setattr("proxy.dialects.base.orjson", _DumpsSpy(seen))

    async def scenario(stack: Stack) -> None:
        session = await stack.create_session(sampling=SAMPLING)
        messages: list[dict[str, Any]] = [{"role": "system", "content": "an agent"}, {"role": "user", "content": "go"}]
        echoed, kinds = [], []
        for _ in range(3):
            seen.clear()
            body = {"model": "m", "messages": messages, "tools": TOOLS, "stream": stream, "return_token_ids": True}
            answer = await post(stack.http, f"{stack.url}{CHAT}", body, agent_headers(CHAT, session.api_key))
            assert answer.status == 200, answer.body
            if stream:
                frames = parse_sse(answer.body)
                echoed.append(frames[0][1]["prompt_token_ids"])
                message = _chat_message(accumulate_chat(frames)["message"])
            else:
                echoed.append(answer.json["prompt_token_ids"])
                message = answer.json["choices"][0]["message"]
            kinds.append(list(seen))
            _send_back_compactly(messages, message, "continue")
        turns = (await stack.trace(session.session_id))["turns"]
        assert echoed == [turn["prompt_token_ids"] for turn in turns]
        assert [turn["metadata"]["bridged"] for turn in turns] == [False, True, True]
        assert kinds == [["list"], ["Fragment"], ["Fragment"]]

    run_stack(scenario, tmp_path)


async def _fallbacks(stack: Stack, key: str) -> list[tuple[bool, str | None, bool]]:
    """Per turn after the first: (bridged, fallback reason, whether it is a root)."""
    turns = (await stack.trace(key))["turns"][1:]
    return [
        (t["metadata"]["bridged"], t["metadata"].get("bridge_fallback"), t["metadata"]["parent_id"] is None)
        for t in turns
    ]


def test_a_history_the_agent_rewrote_starts_a_new_root_and_says_so(tmp_path: Path) -> None:
    async def scenario(stack: Stack) -> None:
        key = await stack.create_session(sampling=SAMPLING)
        messages = await _agent_loop(stack, key.api_key, 2)
        compacted = [messages[0], {"role": "user", "content": "summary: ran a command"}, *messages[-3:]]
        status, _ = await stack.chat(key.api_key, compacted, tools=TOOLS)
        assert status == 200
        edited = [*messages[:3], {**messages[3], "content": "edited"}, *messages[4:]]  # a tool result changed
        status, _ = await stack.chat(key.api_key, edited, tools=TOOLS)
        assert status == 200
        fewer_tools = await stack.chat(key.api_key, messages, tools=[{**TOOLS[0], "function": {"name": "sh"}}])
        assert fewer_tools[0] == 200
        # The edited history still matches its first sampled turn: bridged there, a branch of it, not a root.
        assert await _fallbacks(stack, key.session_id) == [
            (True, None, False),
            (False, "rewrite", True),
            (True, None, False),
            (False, "rewrite", True),
        ]
        trace = await stack.trace(key.session_id)
        assert trace["turns"][3]["metadata"]["parent_id"] == trace["turns"][0]["node_id"]
        described = (await stack.describe(key.session_id))["stats"]["bridge"]
        assert described["bridged"] == 2 and described["fallbacks"] == {"rewrite": 2}

    run_stack(scenario, tmp_path)


def test_a_template_that_re_renders_earlier_turns_falls_back(tmp_path: Path) -> None:
    async def scenario(stack: Stack) -> None:
        key = await stack.create_session(sampling=SAMPLING)
        await _agent_loop(stack, key.api_key, 3)
        assert await _fallbacks(stack, key.session_id) == [(False, "re-render", True)] * 2
        assert stack.engine.token_calls == 0

    run_stack(scenario, tmp_path, engine_options={"count_messages": True})

    async def from_the_fourth_call(stack: Stack) -> None:  # bridged, rendered once, then the template changes
        key = await stack.create_session(sampling=SAMPLING)
        messages = await _agent_loop(stack, key.api_key, 3)
        stack.engine.count_messages = True
        renders = stack.engine.tokenize_calls
        status, _ = await stack.chat(key.api_key, messages, tools=TOOLS)
        assert status == 200
        assert await _fallbacks(stack, key.session_id) == [(True, None, False)] * 2 + [(False, "re-render", True)]
        assert stack.engine.tokenize_calls - renders == 2  # the rendering that did not extend the last, then the prefix

    run_stack(from_the_fourth_call, tmp_path / "changed")


def test_a_turn_rendered_once_closes_at_the_first_stop_id_followed_by_the_templates_closing() -> None:
    before = array("q", [1, 5, 2, 3, 1, 6])  # the last call's rendering, up to the generation prompt
    closing = array("q", [NEWLINE, IM_START])

    def closing_stop(full: list[int]) -> int | None:
        return _closing_stop(array("q", full), before, closing, IM_END)

    assert closing_stop([*before, 9, IM_END, NEWLINE, IM_START, 7]) == 7
    # a stop id inside the turn's text (a special token written out) is not where it closes
    assert closing_stop([*before, IM_END, 9, IM_END, NEWLINE, IM_START]) is None
    assert closing_stop([1, 5, 2, 3, 1, 7, 9, IM_END, NEWLINE, IM_START]) is None
    assert closing_stop([*before, 9, 9]) is None
    assert closing_stop(list(before[:4])) is None  # shorter than the last rendering


@pytest.mark.parametrize("tokens", [[1, "2"], [1, 2.0], [1, None], [2**70], [-(2**64)], {"0": 1}, "1 2"])
def test_a_tokenize_answer_that_is_not_a_list_of_64_bit_ids_is_an_engine_fallback(tmp_path: Path, tokens: Any) -> None:
    """Whatever shape the engine's ``/tokenize`` answer has, the call is answered from the chat route and the
    turn says why it was not bridged; the session bridges again once the engine answers properly."""

    async def scenario(stack: Stack) -> None:
        key = await stack.create_session(sampling=SAMPLING)
        stack.engine.tokenize_faults = [lambda ids: tokens] * 2
        await _agent_loop(stack, key.api_key, 3)
        assert await _fallbacks(stack, key.session_id) == [(False, "engine", True), (True, None, False)]

    run_stack(scenario, tmp_path)


def test_an_unfinished_turn_an_engine_without_the_route_and_a_session_that_opts_out_are_not_bridged(
    tmp_path: Path,
) -> None:
    def cut(completion: dict[str, Any]) -> dict[str, Any]:
        completion["choices"][0]["finish_reason"] = "length"
        return completion

    async def scenario(stack: Stack) -> None:
        key = await stack.create_session(sampling=SAMPLING)
        stack.engine.faults = [("patch", cut)]
        await _agent_loop(stack, key.api_key, 2)
        assert await _fallbacks(stack, key.session_id) == [(False, "unfinished", True)]

        off = await stack.create_session(sampling=SAMPLING, bridge=False)
        await _agent_loop(stack, off.api_key, 2)
        assert await _fallbacks(stack, off.session_id) == [(False, None, True)]
        assert stack.engine.tokenize_calls == 0 and stack.engine.token_calls == 0

    run_stack(scenario, tmp_path)

    async def plain_vllm(stack: Stack) -> None:
        key = await stack.create_session(sampling=SAMPLING)
        await _agent_loop(stack, key.api_key, 3)
        assert await _fallbacks(stack, key.session_id) == [(False, "unsupported", True), (False, "unsupported", False)]
        assert stack.engine.tokenize_calls == 0

    run_stack(plain_vllm, tmp_path / "plain", engine_options={"token_route": False})


@pytest.mark.parametrize("mode", ["fork", "keep"])
@pytest.mark.parametrize("agent_keeps_reasoning", [True, False], ids=["agent-keeps", "agent-drops"])
def test_reasoning_the_template_drops_forks_or_is_kept_as_sampled(
    tmp_path: Path, mode: str, agent_keeps_reasoning: bool
) -> None:
    """A tool loop re-renders its reasoning and is bridged either way (the sampled reasoning restored for the
    check when the agent dropped it); a new user turn drops it: ``fork`` starts a root, ``keep`` keeps the ids."""

    async def scenario(stack: Stack) -> None:
        key = await stack.create_session(sampling=SAMPLING, bridge_reasoning=mode)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for _ in range(3):  # a tool call, a text reply, then a new user turn's call
            status, reply = await stack.chat(key.api_key, messages, tools=TOOLS)
            assert status == 200, reply
            message = reply["choices"][0]["message"]
            assert message["reasoning_content"]
            sent = {"role": "assistant", "content": message["content"]}
            if agent_keeps_reasoning:
                sent["reasoning_content"] = message["reasoning_content"]
            calls = message.get("tool_calls") or []
            if calls:
                sent["tool_calls"] = [
                    {**c, "function": {**c["function"], "arguments": _compact(c["function"]["arguments"])}}
                    for c in calls
                ]
            messages += [sent, *({"role": "tool", "tool_call_id": c["id"], "content": "ran"} for c in calls)]
            if not calls:
                messages.append({"role": "user", "content": "and now?"})
        user_turn = (True, None, False) if mode == "keep" else (False, "reasoning", True)
        assert await _fallbacks(stack, key.session_id) == [(True, None, False), user_turn]
        if mode == "keep":  # the user turn's prompt holds the text turn's sampled reasoning
            parent = (await stack.trace(key.session_id))["turns"][1]
            assert parent["completion_token_ids"][:4] == list(tokenize("<think>plan 1</t"))

    run_stack(scenario, tmp_path, engine_options={"reasoning": True})


def test_a_recovered_session_keeps_bridging_and_metrics_count_the_bridge(tmp_path: Path) -> None:
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}  # part of the match, so journaled with the turn
    state: dict[str, Any] = {}

    async def before(stack: Stack) -> None:
        state["key"] = key = await stack.create_session(sampling=SAMPLING)
        messages = [{"role": "user", "content": "go"}]
        status, reply = await stack.chat(key.api_key, messages, tools=TOOLS, **kwargs)
        assert status == 200
        call = reply["choices"][0]["message"]["tool_calls"][0]
        compact = {**call, "function": {**call["function"], "arguments": _compact(call["function"]["arguments"])}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [compact]},
            {"role": "tool", "tool_call_id": call["id"], "content": "ran"},
        ]
        state["messages"] = messages
        state["before"] = (await stack.describe(key.session_id))["stats"]["bridge"]

    async def after(stack: Stack) -> None:
        key = state["key"]
        assert (await stack.describe(key.session_id))["stats"]["bridge"] == state["before"]
        status, _ = await stack.chat(key.api_key, state["messages"], tools=TOOLS, **kwargs)
        assert status == 200
        status, _ = await stack.chat(
            key.api_key, [{"role": "assistant", "content": "hi"}, *state["messages"]], tools=TOOLS
        )
        assert status == 200
        assert await _fallbacks(stack, key.session_id) == [(True, None, False), (False, "rewrite", True)]
        stats = (await stack.describe(key.session_id))["stats"]["bridge"]
        async with stack.http.get(f"{stack.url}/metrics") as resp:
            metrics = await resp.text()
        assert (
            "proxy_bridged_turns_total 1\n" in metrics
            and 'proxy_bridge_fallbacks_total{reason="rewrite"} 1\n' in metrics
        )
        assert stats["saved_tokens"] > 0 and f"proxy_bridge_saved_tokens_total {stats['saved_tokens']}\n" in metrics

    run_stack(before, tmp_path)
    run_stack(after, tmp_path)


def test_the_match_is_semantic() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"a": 1, "b": [2, 3]}'}}
    sampled = {"role": "assistant", "content": "<think>\nhm\n</think>\n\nOK ", "tool_calls": [call]}
    user = {"role": "user", "content": [{"type": "text", "text": "go"}]}
    index_key = History([user], None, None).key(sampled)

    def boundary(message: dict[str, Any], first: dict[str, Any] = user, tools: Any = None) -> bytes:
        return History([first, message], tools, None).boundaries[-1][1]

    resent = {
        "role": "assistant",
        "content": [{"type": "text", "text": "OK"}],
        "tool_calls": [{"id": "toolu_9", "function": {"name": "bash", "arguments": '{"b":[2,3],"a":1}'}}],
    }
    assert boundary(resent) == boundary({**resent, "reasoning_content": "hm"}) == index_key
    assert boundary(resent, {"role": "user", "content": "go"}) == index_key
    different = [
        {**resent, "content": "OK!"},
        {**resent, "tool_calls": [{"function": {"name": "bash", "arguments": '{"a": 1, "b": [3, 2]}'}}]},
        {**resent, "tool_calls": [{"function": {"name": "sh", "arguments": '{"a": 1, "b": [2, 3]}'}}]},
        {**resent, "tool_calls": []},
    ]
    assert index_key not in {boundary(message) for message in different}
    assert boundary(resent, {"role": "user", "content": "go on"}) != index_key
    assert boundary(resent, tools=TOOLS) != index_key


def test_a_resent_history_shares_the_earlier_requests_message_objects() -> None:
    """Each call resends the whole history, parsed afresh: once fingerprinted against the previous call's, its
    messages are the session's earlier objects, so the later comparisons of the history cost one pointer each."""
    system = {"role": "system", "content": "an agent " * 800}
    first = [system, {"role": "user", "content": "go"}]
    earlier = History(first, TOOLS, None)
    earlier = History([*first, {"role": "assistant", "content": "ok"}], TOOLS, None, extends=earlier)
    resent = orjson.loads(orjson.dumps([*earlier.messages, {"role": "user", "content": "more"}]))
    later = History(resent, TOOLS, None, extends=earlier)
    assert later.messages is resent and resent[:3] == earlier.messages
    assert all(a is b for a, b in zip(resent[:3], earlier.messages, strict=True)) and resent[3]["content"] == "more"
    changed = orjson.loads(orjson.dumps(resent))
    changed[1]["content"] = "went"  # not a resend: nothing is shared, the fingerprints start over
    History(changed, TOOLS, None, extends=later)
    assert not any(a is b for a, b in zip(changed, later.messages, strict=True))
