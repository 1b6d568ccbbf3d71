"""The token-in bridge: a history the session sampled, re-sent re-serialised, is prompted with the sampled ids.

The fake engine serialises tool call arguments as vLLM's parser does (``{"command": "..."}``); the agents here
send them back compactly, so without the bridge every turn after the first is a new root.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from openenv.core.harness.training import TrainingTrace as OpenEnvTrainingTrace

from bench.fake_vllm import IM_END, NEWLINE, render_prompt
from proxy.capture_graph import sequences_from_trace
from proxy.trace import TrainingTrace
from tests.proxy.proxy_stack import TOOLS, Stack, agent_turns, run_stack
from tests.proxy.wire import CHAT, RESPONSES, ROUTES, agent_headers, post, valid_body

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
            headers = agent_headers(route, key)
            first = valid_body(route)
            reply = await post(stack.http, stack.url + route, first, headers)
            assert reply.status == 200, reply.body
            second = _next_body(route, first, reply.json)
            if stream:
                second["stream"] = True
            reply = await post(stack.http, stack.url + route, second, headers)
            assert reply.status == 200, reply.body
            replies[bridge], traces[bridge] = reply.body, await stack.trace(key)
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
        message = reply["choices"][0]["message"]
        calls = [
            {**call, "function": {**call["function"], "arguments": _compact(call["function"]["arguments"])}}
            for call in message.get("tool_calls") or []
        ]
        messages.append(
            {"role": "assistant", "content": message["content"], **({"tool_calls": calls} if calls else {})}
        )
        messages += [{"role": "tool", "tool_call_id": call["id"], "content": "ran"} for call in calls]
        if not calls:
            messages.append({"role": "user", "content": "continue" if user_turns else "ok"})
    return messages


def test_a_bridged_session_is_one_trajectory_that_validates_and_trains_as_one_row(tmp_path: Path) -> None:
    async def scenario(stack: Stack) -> None:
        rows, saved, sampled, bridged_turns = {}, {}, {}, []
        for bridge in (True, False):
            key = await stack.create_session(sampling=SAMPLING, bridge=bridge)
            await _agent_loop(stack, key, 6)
            raw = await stack.trace(key)
            OpenEnvTrainingTrace.model_validate_json(orjson.dumps(raw))
            sequences = sequences_from_trace(TrainingTrace.model_validate(raw))
            rows[bridge] = sequences
            sampled[bridge] = sum(len(t["completion_token_ids"]) for t in raw["turns"])
            bridged_turns += [t for t in raw["turns"] if t["metadata"]["bridged"]]
            saved[bridge] = (await stack.describe(key))["stats"]["bridge"]
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
        assert saved[False] == {"bridged": 0, "saved_tokens": 0, "fallbacks": {}}
        assert stack.engine.tokenize_calls == 10 and stack.engine.token_calls == 5

        echoing = await stack.create_session(sampling=SAMPLING)  # sends the calls back as it got them
        await agent_turns(stack, echoing, 4)
        turns = (await stack.trace(echoing))["turns"]
        assert [(t["metadata"]["bridged"], t["metadata"].get("bridge_saved_tokens")) for t in turns[1:]] == [
            (True, 0)
        ] * 3  # bridged, but the rendering extended the parent anyway: nothing saved
        assert (await stack.describe(echoing))["stats"]["bridge"]["saved_tokens"] == 0

    run_stack(scenario, tmp_path)
