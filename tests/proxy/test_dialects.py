"""Unit tests for the proxy's agent dialects: request translation, JSON replies, SSE replay, errors.

Requests are modelled on what the agent CLIs send (codex over Responses, claude-code
over Anthropic Messages, opencode over chat completions); engine replies on vLLM's
chat completions with ``return_token_ids``/``logprobs``. Every stream is parsed as
SSE and its deltas are accumulated back; the result must equal the JSON reply. Where
the OpenAI SDK is installed its wire types validate each event and its streaming
client consumes the replay.
"""

from __future__ import annotations

import inspect
import random
import typing
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from proxy.dialects import COUNT_TOKENS_ROUTE, DIALECTS, ROUTES, ChatRequest, Dialect, DialectError
from proxy.dialects import anthropic_messages as anthropic
from proxy.dialects import openai_chat as chat
from proxy.dialects import openai_responses as responses
from proxy.dialects.base import DELTA_CHARS, MessageMemo
from tests.support.counting import count_calls

LONG_TEXT = (
    'I found the bug: `add` subtracts. Here is the "fix" 🎉 — it changes one line.\n\n'
    + "Details: the test `test_add` expects 2 + 2 == 4, but `a - b` gives 0. " * 4
    + "Ünïcödé and a backslash \\ too."
)
assert len(LONG_TEXT) > 3 * DELTA_CHARS


def engine_response(
    content: str | None = LONG_TEXT,
    tool_calls: Sequence[tuple[str, str]] = (),
    finish_reason: str | None = None,
    reasoning: str | None = None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    """A vLLM chat completion as the proxy receives it (ids, logprobs, usage)."""
    calls = [
        {"id": f"chatcmpl-tool-{i:032x}", "type": "function", "function": {"name": name, "arguments": arguments}}
        for i, (name, arguments) in enumerate(tool_calls)
    ]
    token_ids = [151657, 515, 198, 151658, 151645]
    return {
        "id": "chatcmpl-9d2f4c0e8b7a4b1f9c3e2d1a0b9c8d7e",
        "object": "chat.completion",
        "created": 1732000000,
        "model": "Qwen/Qwen3-8B",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "refusal": None,
                    "tool_calls": calls,
                    "reasoning_content": reasoning,
                },
                "logprobs": {
                    "content": [
                        {"token": f"token_id:{t}", "logprob": -0.25, "bytes": None, "top_logprobs": []}
                        for t in token_ids
                    ]
                },
                "finish_reason": finish_reason or ("tool_calls" if calls else "stop"),
                "stop_reason": stop_reason,
                "token_ids": token_ids,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {"prompt_tokens": 1234, "total_tokens": 1239, "completion_tokens": 5, "prompt_tokens_details": None},
        "prompt_logprobs": None,
        "prompt_token_ids": list(range(1234)),
        "kv_transfer_params": None,
    }


SHELL_ARGS = '{"command": ["bash", "-lc", "pytest -q tests/test_math.py"], "workdir": "/app", "timeout_ms": 120000}'
PATCH = "*** Begin Patch\n*** Update File: math.py\n@@\n-    return a - b\n+    return a + b\n*** End Patch\n"

ENGINE_REPLIES = {
    "text": engine_response(),
    "tool_calls": engine_response(
        content="Let me run the tests first.",
        tool_calls=[("shell", SHELL_ARGS), ("apply_patch", orjson.dumps({"input": PATCH}).decode())],
    ),
    "tool_only": engine_response(
        content=None, tool_calls=[("update_plan", '{"plan": [{"step": "fix", "status": "x"}]}')]
    ),
    "length": engine_response(content=LONG_TEXT[:100], finish_reason="length"),
    "reasoning": engine_response(
        reasoning="The test fails because add subtracts.\n" * 5, tool_calls=[("Bash", '{"command": "ls"}')]
    ),
    "empty": engine_response(content=""),
}


# --- SSE -------------------------------------------------------------------------------------------------------------


def parse_sse(frames: list[bytes]) -> list[tuple[str | None, Any]]:
    """Decode SSE frames (one event each) into ``(event, data)``; ``data`` is JSON or the string ``[DONE]``."""
    events = []
    for frame in frames:
        text = frame.decode()
        assert text.endswith("\n\n") and text.count("\n\n") == 1, frame
        event, data = None, []
        for line in text[:-2].split("\n"):
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            else:
                assert field == "data", line
                data.append(value)
        if data:
            joined = "\n".join(data)
            events.append((event, joined if joined == "[DONE]" else orjson.loads(joined)))
    return events


def openai_types() -> Any:
    return pytest.importorskip("openai.types")


# --- the interface ---------------------------------------------------------------------------------------------------


def test_every_dialect_implements_the_interface() -> None:
    assert set(ROUTES.values()) == set(DIALECTS.values())
    assert COUNT_TOKENS_ROUTE == "/v1/messages/count_tokens"
    for name, module in DIALECTS.items():
        assert name == module.NAME
        assert isinstance(module.KEEPALIVE, bytes)
        for attr in (
            "parse_request",
            "render_response",
            "stream_renderer",
            "render_stream",
            "render_error",
            "render_stream_error",
        ):
            expected = inspect.signature(getattr(Dialect, attr))
            expected = expected.replace(parameters=list(expected.parameters.values())[1:])
            assert inspect.signature(getattr(module, attr)) == expected, (name, attr)


@pytest.mark.parametrize("module", list(DIALECTS.values()), ids=list(DIALECTS))
def test_keepalive_is_ignored_by_sse_clients(module: Dialect) -> None:
    events = parse_sse([module.KEEPALIVE])
    assert events in ([], [("ping", {"type": "ping"})])


# --- OpenAI chat completions (opencode) ------------------------------------------------------------------------------

OPENCODE_REQUEST: dict[str, Any] = {
    "model": "qwen3-8b",
    "max_tokens": 32000,
    "temperature": 0.6,
    "messages": [
        {
            "role": "system",
            "content": "You are opencode, an interactive CLI tool that helps users with software tasks.",
        },
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing test."}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "chatcmpl-tool-aa",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command":"pytest -q","description":"Run tests"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "chatcmpl-tool-aa", "content": "1 failed, 3 passed"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Executes a bash command",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
                    "required": ["command"],
                    "additionalProperties": False,
                },
            },
        }
    ],
    "tool_choice": "auto",
    "stream": True,
    "stream_options": {"include_usage": True},
}


def test_chat_parse_opencode_request() -> None:
    request = chat.parse_request(OPENCODE_REQUEST)
    assert request.dialect == "openai_chat" and request.model == "qwen3-8b"
    assert request.stream and request.include_usage
    assert not request.return_logprobs and not request.return_token_ids
    body = request.body
    assert not {"stream", "stream_options", "n", "logprobs", "top_logprobs", "return_token_ids"} & body.keys()
    assert body["messages"][1] == {"role": "user", "content": "Fix the failing test."}
    assert body["messages"][2] is OPENCODE_REQUEST["messages"][2]
    assert body["tools"] == OPENCODE_REQUEST["tools"] and body["tool_choice"] == "auto"
    assert body["max_tokens"] == 32000 and body["temperature"] == 0.6
    assert OPENCODE_REQUEST["messages"][1]["content"][0]["type"] == "text", "the agent's body is not mutated"


def test_chat_parse_normalises() -> None:
    request = chat.parse_request(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "user", "content": "hi"},
            ],
            "max_completion_tokens": 64,
            "logprobs": True,
            "top_logprobs": 0,
            "return_token_ids": True,
            "n": 1,
            "tools": [],
            "tool_choice": "none",
            "top_k": 20,
        }
    )
    assert request.body == {
        "model": "m",
        "messages": [{"role": "system", "content": "a\nb"}, {"role": "user", "content": "hi"}],
        "max_tokens": 64,
        "top_k": 20,
    }
    assert request.return_logprobs and request.return_token_ids and not request.stream


def test_chat_a_history_sent_as_is_is_checked_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent resends its whole history on every call: messages the engine takes as they are cost no call each;
    one that needs converting sends the history through the per-message path, which converts it."""
    per_message = count_calls(monkeypatch, chat, "_message")
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    history += [{"role": "assistant", "content": None, "tool_calls": []}, {"role": "tool", "content": "ok"}] * 50
    request = chat.parse_request({"model": "m", "messages": history})
    assert request.body["messages"] == history and request.body["messages"] is not history and per_message.n == 0
    request = chat.parse_request({"model": "m", "messages": [*history, {"role": "developer", "content": "d"}]})
    assert request.body["messages"] == [*history, {"role": "system", "content": "d"}]
    assert per_message.n == len(history) + 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({"model": "m"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "x"}], "model": 3}, "model"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": ["user"], "content": "x"}]}, "messages[1].role"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": {"a": 1}}]}, "messages[1].role"),
        ({"messages": [{"role": "user", "content": "x"}, "hi"]}, "messages[1]"),
        ({"messages": [{"role": "user", "content": {"text": "x"}}]}, "messages[0]"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}]},
            "messages[0].content",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "max_completion_tokens": 6}, None),
    ],
)
def test_chat_rejects_malformed(body: Any, param: str | None) -> None:
    with pytest.raises(DialectError) as raised:
        chat.parse_request(body)
    assert raised.value.status == 400
    if param is not None:
        assert raised.value.param == param


def test_chat_response_strips_capture_fields_unless_asked() -> None:
    engine = ENGINE_REPLIES["tool_calls"]
    plain = chat.render_response(engine, chat.parse_request(OPENCODE_REQUEST))
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    assert plain["choices"][0]["logprobs"] is None and "kv_transfer_params" not in plain
    assert plain["choices"][0]["message"] == engine["choices"][0]["message"]
    assert plain["model"] == "qwen3-8b" and plain["usage"] == engine["usage"]
    assert "token_ids" in engine["choices"][0], "the engine response is not mutated"

    asked = chat.render_response(
        engine, chat.parse_request({**OPENCODE_REQUEST, "logprobs": True, "return_token_ids": True})
    )
    assert asked["prompt_token_ids"] == engine["prompt_token_ids"]
    assert asked["choices"][0]["token_ids"] == engine["choices"][0]["token_ids"]
    assert asked["choices"][0]["logprobs"] == engine["choices"][0]["logprobs"]
    types = openai_types()
    types.chat.ChatCompletion.model_validate(plain)


def accumulate_chat(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    """Fold ``chat.completion.chunk`` deltas the way OpenAI clients do."""
    assert events[-1] == (None, "[DONE]")
    message: dict[str, Any] = {"content": "", "tool_calls": []}
    out: dict[str, Any] = {"message": message, "finish_reason": None, "usage": None}
    for _, chunk in events[:-1]:
        assert chunk["object"] == "chat.completion.chunk"
        if chunk.get("usage"):
            out["usage"] = chunk["usage"]
        for choice in chunk["choices"]:
            delta = choice["delta"]
            message["content"] += delta.get("content") or ""
            if delta.get("reasoning_content"):
                message["reasoning_content"] = message.get("reasoning_content", "") + delta["reasoning_content"]
            for call in delta.get("tool_calls") or []:
                if call["index"] == len(message["tool_calls"]):
                    message["tool_calls"].append({"id": call["id"], "name": call["function"]["name"], "arguments": ""})
                message["tool_calls"][call["index"]]["arguments"] += call["function"].get("arguments") or ""
            if choice["finish_reason"] is not None:
                out["finish_reason"] = choice["finish_reason"]
                out["logprobs"] = choice["logprobs"]
    return out


@pytest.mark.parametrize("reply", list(ENGINE_REPLIES))
def test_chat_stream_reassembles_to_the_response(reply: str) -> None:
    engine = ENGINE_REPLIES[reply]
    request = chat.parse_request(OPENCODE_REQUEST)
    expected = chat.render_response(engine, request)["choices"][0]
    events = parse_sse(chat.render_stream(engine, request))
    got = accumulate_chat(events)
    message = expected["message"]
    assert got["message"]["content"] == (message["content"] or "")
    assert got["message"].get("reasoning_content") == message.get("reasoning_content")
    assert got["message"]["tool_calls"] == [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message["tool_calls"]
    ]
    assert got["finish_reason"] == expected["finish_reason"]
    assert got["usage"] == engine["usage"]
    content_deltas = [c for _, c in events[:-1] if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content_deltas) == -(-len(message["content"] or "") // DELTA_CHARS)
    types = openai_types()
    for _, chunk in events[:-1]:
        types.chat.ChatCompletionChunk.model_validate(chunk)


def test_chat_stream_without_include_usage_and_with_logprobs() -> None:
    engine = ENGINE_REPLIES["text"]
    request = chat.parse_request({**OPENCODE_REQUEST, "stream_options": None, "logprobs": True})
    events = parse_sse(chat.render_stream(engine, request))
    assert all("usage" not in chunk for _, chunk in events[:-1])
    assert accumulate_chat(events)["logprobs"] == engine["choices"][0]["logprobs"]


def mock_openai_client(frames: list[bytes]) -> Any:
    """The real OpenAI client, its HTTP answered with ``frames`` as an SSE body."""
    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx")

    def answer(request: Any) -> Any:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"".join(frames))

    http_client = httpx.Client(transport=httpx.MockTransport(answer))
    return openai.OpenAI(api_key="s" + "0" * 24, base_url="http://proxy.test/v1", http_client=http_client)


def test_chat_stream_through_the_openai_client() -> None:
    engine = ENGINE_REPLIES["tool_calls"]
    request = chat.parse_request(OPENCODE_REQUEST)
    client = mock_openai_client(chat.render_stream(engine, request))
    with client.chat.completions.stream(model="qwen3-8b", messages=[{"role": "user", "content": "x"}]) as stream:
        final = stream.get_final_completion()
    message = engine["choices"][0]["message"]
    assert final.choices[0].message.content == message["content"]
    assert [(c.id, c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
    ]
    assert final.choices[0].finish_reason == "tool_calls" and final.usage.prompt_tokens == 1234


# --- OpenAI Responses (codex) ----------------------------------------------------------------------------------------

CODEX_INSTRUCTIONS = (
    "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI on a user's computer."
)
APPLY_PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool: do not wrap the patch in JSON.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF',
    },
}
UPDATE_PLAN_TOOL = {
    "type": "function",
    "name": "update_plan",
    "description": "Updates the task plan.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "explanation": {"type": "string"},
            "plan": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"step": {"type": "string"}, "status": {"type": "string"}},
                    "required": ["step", "status"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["plan"],
        "additionalProperties": False,
    },
}
CODEX_REQUEST: dict[str, Any] = {
    "model": "gpt-5-codex",
    "instructions": CODEX_INSTRUCTIONS,
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [
                {
                    "type": "input_text",
                    "text": "<permissions instructions>sandbox: workspace-write</permissions instructions>",
                }
            ],
        },
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "<environment_context>\n  <cwd>/app</cwd>\n</environment_context>"}
            ],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the failing test."}]},
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "**Planning**"}],
            "content": [{"type": "reasoning_text", "text": "I should make a plan, then run the tests."}],
            "encrypted_content": None,
        },
        {
            "type": "function_call",
            "name": "update_plan",
            "arguments": '{"plan":[{"step":"Run tests","status":"in_progress"}]}',
            "call_id": "call_plan",
        },
        {"type": "function_call_output", "call_id": "call_plan", "output": "Plan updated"},
        {
            "type": "local_shell_call",
            "call_id": "call_ls",
            "status": "completed",
            "action": {
                "type": "exec",
                "command": ["bash", "-lc", "pytest -q"],
                "timeout_ms": 120000,
                "working_directory": "/app",
                "env": {},
                "user": None,
            },
        },
        {"type": "function_call_output", "call_id": "call_ls", "output": "F...\n1 failed, 3 passed in 0.02s"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "`add` subtracts."}]},
        {
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": "call_patch",
            "name": "apply_patch",
            "input": PATCH,
        },
        {
            "type": "custom_tool_call_output",
            "call_id": "call_patch",
            "output": "Success. Updated the following files:\nM math.py",
        },
        {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAB...opaque"},
        {
            "type": "local_shell_call",
            "call_id": "call_t1",
            "status": "completed",
            "action": {"type": "exec", "command": ["pytest", "-q"], "env": {}},
        },
        {
            "type": "function_call",
            "name": "update_plan",
            "arguments": '{"plan":[{"step":"Run tests","status":"completed"}]}',
            "call_id": "call_plan2",
        },
        {"type": "function_call_output", "call_id": "call_t1", "output": [{"type": "input_text", "text": "4 passed"}]},
        {"type": "function_call_output", "call_id": "call_plan2", "output": "Plan updated"},
    ],
    "tools": [{"type": "local_shell"}, APPLY_PATCH_TOOL, UPDATE_PLAN_TOOL, {"type": "web_search"}],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
}


def fn(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_responses_parse_codex_request() -> None:
    request = responses.parse_request(CODEX_REQUEST)
    assert request.dialect == "openai_responses" and request.stream and request.model == "gpt-5-codex"
    assert request.tool_kinds == {"shell": "local_shell", "apply_patch": "custom"}
    body = request.body
    assert body["messages"] == [
        {
            "role": "system",
            "content": CODEX_INSTRUCTIONS
            + "\n\n<permissions instructions>sandbox: workspace-write</permissions instructions>",
        },
        {"role": "user", "content": "<environment_context>\n  <cwd>/app</cwd>\n</environment_context>"},
        {"role": "user", "content": "Fix the failing test."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should make a plan, then run the tests.",
            "tool_calls": [fn("call_plan", "update_plan", '{"plan":[{"step":"Run tests","status":"in_progress"}]}')],
        },
        {"role": "tool", "tool_call_id": "call_plan", "content": "Plan updated"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                fn("call_ls", "shell", '{"command":["bash","-lc","pytest -q"],"workdir":"/app","timeout_ms":120000}')
            ],
        },
        {"role": "tool", "tool_call_id": "call_ls", "content": "F...\n1 failed, 3 passed in 0.02s"},
        {
            "role": "assistant",
            "content": "`add` subtracts.",
            "tool_calls": [fn("call_patch", "apply_patch", orjson.dumps({"input": PATCH}).decode())],
        },
        {"role": "tool", "tool_call_id": "call_patch", "content": "Success. Updated the following files:\nM math.py"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                fn("call_t1", "shell", '{"command":["pytest","-q"]}'),
                fn("call_plan2", "update_plan", '{"plan":[{"step":"Run tests","status":"completed"}]}'),
            ],
        },
        {"role": "tool", "tool_call_id": "call_t1", "content": "4 passed"},
        {"role": "tool", "tool_call_id": "call_plan2", "content": "Plan updated"},
    ]
    assert [t["function"]["name"] for t in body["tools"]] == ["shell", "apply_patch", "update_plan"]
    assert body["tools"][0]["function"]["parameters"]["properties"]["command"]["type"] == "array"
    assert body["tools"][1]["function"]["parameters"]["required"] == ["input"]
    assert body["tools"][2]["function"]["parameters"] == UPDATE_PLAN_TOOL["parameters"]
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is False
    assert not {"stream", "store", "include", "reasoning", "instructions", "input"} & body.keys()
    assert request.echo["store"] is False and request.echo["tools"] == CODEX_REQUEST["tools"]


def test_responses_parse_options() -> None:
    request = responses.parse_request(
        {
            "model": "m",
            "input": "hello",
            "max_output_tokens": 256,
            "temperature": 1.0,
            "top_p": 0.95,
            "text": {
                "verbosity": "low",
                "format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}},
            },
            "tools": [{"type": "web_search"}],
            "tool_choice": "required",
            "previous_response_id": None,
        }
    )
    assert request.body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 256,
        "temperature": 1.0,
        "top_p": 0.95,
        "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}}},
    }
    tools = [{"type": "custom", "name": "apply_patch"}]
    for choice, expected in [
        ({"type": "custom", "name": "apply_patch"}, {"type": "function", "function": {"name": "apply_patch"}}),
        ({"type": "local_shell"}, {"type": "function", "function": {"name": "shell"}}),
        ("none", "none"),
    ]:
        body = responses.parse_request({"input": "x", "tools": tools, "tool_choice": choice}).body
        assert body["tool_choice"] == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"input": []}, "input"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"type": "message", "role": "tool", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]},
            "input[0].content",
        ),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0]"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0]"),
        ({"input": "x", "tools": [{"type": "local_shell"}, {"type": "function", "name": "shell"}]}, "tools[1]"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0]"),
        ({"input": "x", "tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format"),
        ({"input": "x", "instructions": ["a"]}, "instructions"),
    ],
)
def test_responses_rejects_malformed(body: Any, param: str) -> None:
    with pytest.raises(DialectError) as raised:
        responses.parse_request(body)
    assert raised.value.status == 400 and raised.value.param == param


def test_responses_render_maps_calls_back_by_tool_kind() -> None:
    engine = engine_response(
        content="Running the tests.",
        tool_calls=[
            ("shell", SHELL_ARGS),
            ("apply_patch", orjson.dumps({"input": PATCH}).decode()),
            ("update_plan", '{"plan": []}'),
        ],
    )
    request = responses.parse_request(CODEX_REQUEST)
    out = responses.render_response(engine, request)
    calls = engine["choices"][0]["message"]["tool_calls"]
    assert out["status"] == "completed" and out["incomplete_details"] is None and out["object"] == "response"
    assert [item["type"] for item in out["output"]] == [
        "message",
        "local_shell_call",
        "custom_tool_call",
        "function_call",
    ]
    message, shell, patch, plan = out["output"]
    assert message["content"] == [{"type": "output_text", "text": "Running the tests.", "annotations": []}]
    assert shell["call_id"] == calls[0]["id"] and shell["status"] == "completed"
    assert shell["action"] == {
        "type": "exec",
        "command": ["bash", "-lc", "pytest -q tests/test_math.py"],
        "env": {},
        "timeout_ms": 120000,
        "working_directory": "/app",
        "user": None,
    }
    assert patch == {
        "type": "custom_tool_call",
        "id": patch["id"],
        "call_id": calls[1]["id"],
        "name": "apply_patch",
        "input": PATCH,
    }
    assert plan["call_id"] == calls[2]["id"] and plan["arguments"] == '{"plan": []}' and plan["name"] == "update_plan"
    assert out["usage"]["input_tokens"] == 1234 and out["usage"]["output_tokens"] == 5
    assert out["usage"]["total_tokens"] == 1239 and out["usage"]["input_tokens_details"]["cached_tokens"] == 0
    assert out["usage"]["output_tokens_details"]["reasoning_tokens"] == 0
    assert out["model"] == "gpt-5-codex" and out["store"] is False and out["previous_response_id"] is None
    openai_types().responses.Response.model_validate(out)


def test_responses_render_edge_cases() -> None:
    request = responses.parse_request({"input": "x", "tools": [{"type": "local_shell"}, APPLY_PATCH_TOOL]})
    engine = engine_response(
        content=None, tool_calls=[("shell", '{"command": "ls -la"}'), ("apply_patch", "*** Begin")]
    )
    shell, patch = responses.render_response(engine, request)["output"]
    assert shell["action"]["command"] == ["ls -la"]
    assert patch["input"] == "*** Begin"
    truncated = responses.render_response(ENGINE_REPLIES["length"], request)
    assert truncated["status"] == "incomplete" and truncated["incomplete_details"] == {"reason": "max_output_tokens"}
    assert truncated["output"][0]["status"] == "incomplete"
    empty = responses.render_response(ENGINE_REPLIES["empty"], request)
    assert [i["type"] for i in empty["output"]] == ["message"] and empty["output"][0]["content"][0]["text"] == ""


def test_responses_round_trip_rebuilds_the_engine_turn() -> None:
    """What codex sends back from a reply parses to the assistant turn the engine produced."""
    engine = ENGINE_REPLIES["reasoning"]
    request = responses.parse_request({"input": "x", "tools": [{"type": "function", "name": "Bash"}]})
    output = responses.render_response(engine, request)["output"]
    assert [item["type"] for item in output] == ["reasoning", "message", "function_call"]
    outputs = [{"type": "function_call_output", "call_id": output[2]["call_id"], "output": "ok"}]
    messages = responses.parse_request({"input": [*output, *outputs]}).body["messages"]
    message = engine["choices"][0]["message"]
    assert messages[0] == {
        "role": "assistant",
        "content": message["content"],
        "reasoning_content": message["reasoning_content"],
        "tool_calls": message["tool_calls"],
    }


def accumulate_responses(events: list[tuple[str | None, Any]]) -> list[dict[str, Any]]:
    """Rebuild output items from Responses events; each must equal its ``output_item.done`` item but for status."""
    items: list[dict[str, Any]] = []
    for sequence, (name, event) in enumerate(events):
        assert name == event["type"] and event["sequence_number"] == sequence
        kind = event["type"]
        index = event.get("output_index")
        if kind == "response.output_item.added":
            assert index == len(items)
            items.append(orjson.loads(orjson.dumps(event["item"])))
        elif kind == "response.content_part.added":
            items[index]["content"].append(dict(event["part"]))
        elif kind == "response.output_text.delta":
            items[index]["content"][event["content_index"]]["text"] += event["delta"]
        elif kind == "response.reasoning_text.delta":
            if not items[index]["content"]:
                items[index]["content"].append({"type": "reasoning_text", "text": ""})
            items[index]["content"][event["content_index"]]["text"] += event["delta"]
        elif kind == "response.function_call_arguments.delta":
            items[index]["arguments"] += event["delta"]
        elif kind == "response.function_call_arguments.done":
            assert items[index]["arguments"] == event["arguments"]
        elif kind == "response.custom_tool_call_input.delta":
            items[index]["input"] += event["delta"]
        elif kind == "response.output_item.done":
            items[index].pop("status", None)
            assert items[index] == {key: value for key, value in event["item"].items() if key != "status"}
            items[index] = event["item"]
    assert events[0][0] == "response.created" and events[0][1]["response"]["status"] == "in_progress"
    return items


@pytest.mark.parametrize("reply", list(ENGINE_REPLIES))
def test_responses_stream_reassembles_to_the_response(reply: str) -> None:
    engine = ENGINE_REPLIES[reply]
    request = responses.parse_request(
        {**CODEX_REQUEST, "tools": [*CODEX_REQUEST["tools"], {"type": "function", "name": "Bash"}]}
    )
    expected = responses.render_response(engine, request)
    events = parse_sse(responses.render_stream(engine, request))
    assert accumulate_responses(events) == expected["output"]
    terminal_type = "response.completed" if expected["status"] == "completed" else "response.incomplete"
    assert events[-1][1] == {"type": terminal_type, "sequence_number": len(events) - 1, "response": expected}
    types = openai_types().responses
    models = {
        typing.get_args(model.model_fields["type"].annotation)[0]: model
        for model in typing.get_args(typing.get_args(types.ResponseStreamEvent)[0])
    }
    for _, event in events:
        models[event["type"]].model_validate(event)


def test_responses_stream_through_the_openai_client() -> None:
    engine = ENGINE_REPLIES["tool_calls"]
    request = responses.parse_request(CODEX_REQUEST)
    client = mock_openai_client(responses.render_stream(engine, request))
    with client.responses.stream(model="gpt-5-codex", input="x") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.output_text == "Let me run the tests first."
    assert [item.model_dump(exclude_none=True)["type"] for item in final.output] == [
        "message",
        "local_shell_call",
        "custom_tool_call",
    ]
    assert final.output[2].input == PATCH


# --- Anthropic Messages (claude-code) --------------------------------------------------------------------------------

CLAUDE_SYSTEM = [
    {
        "type": "text",
        "text": "You are Claude Code, Anthropic's official CLI for Claude.",
        "cache_control": {"type": "ephemeral"},
    },
    {
        "type": "text",
        "text": "You are an interactive CLI tool that helps users with software engineering tasks.",
        "cache_control": {"type": "ephemeral"},
    },
]
CLAUDE_TOOLS = [
    {
        "name": "Bash",
        "description": "Executes a given bash command in a persistent shell session.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
            "required": ["command"],
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        },
    },
    {
        "name": "Read",
        "description": "Reads a file from the local filesystem.",
        "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]},
        "cache_control": {"type": "ephemeral"},
    },
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
]
CLAUDE_CODE_REQUEST: dict[str, Any] = {
    "model": "claude-sonnet-4-5-20250929",
    "max_tokens": 32000,
    "temperature": 1,
    "system": CLAUDE_SYSTEM,
    "messages": [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "<system-reminder>\nAs you answer, use the TodoWrite tool.\n</system-reminder>",
                },
                {"type": "text", "text": "Run the tests and fix failures", "cache_control": {"type": "ephemeral"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Run the tests first.", "signature": "EqQBCkYIBxgCKkB..."},
                {"type": "text", "text": "I'll run the tests."},
                {
                    "type": "tool_use",
                    "id": "toolu_01A",
                    "name": "Bash",
                    "input": {"command": "pytest -q", "description": "Run tests"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "1 failed, 3 passed", "is_error": True},
                {"type": "text", "text": "<system-reminder>The todo list is empty.</system-reminder>"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3..."},
                {"type": "tool_use", "id": "toolu_01B", "name": "Read", "input": {"file_path": "/app/math.py"}},
                {
                    "type": "tool_use",
                    "id": "toolu_01C",
                    "name": "Read",
                    "input": {"file_path": "/app/tests/test_math.py"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01B",
                    "content": [{"type": "text", "text": "     1\tdef add(a, b):\n     2\t    return a - b\n"}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01C",
                    "content": "     1\tassert add(2, 2) == 4\n",
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        },
    ],
    "tools": CLAUDE_TOOLS,
    "metadata": {"user_id": "user_2f1e_account__session_8a7b"},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "stop_sequences": ["</answer>"],
    "stream": True,
}


def test_anthropic_parse_claude_code_request() -> None:
    request = anthropic.parse_request(CLAUDE_CODE_REQUEST)
    assert request.dialect == "anthropic_messages" and request.stream and request.stop == ("</answer>",)
    body = request.body
    assert body["messages"] == [
        {"role": "system", "content": CLAUDE_SYSTEM[0]["text"] + "\n" + CLAUDE_SYSTEM[1]["text"]},
        {
            "role": "user",
            "content": "<system-reminder>\nAs you answer, use the TodoWrite tool.\n</system-reminder>\n"
            "Run the tests and fix failures",
        },
        {
            "role": "assistant",
            "content": "I'll run the tests.",
            "reasoning_content": "Run the tests first.",
            "tool_calls": [fn("toolu_01A", "Bash", '{"command":"pytest -q","description":"Run tests"}')],
        },
        {"role": "tool", "tool_call_id": "toolu_01A", "content": "1 failed, 3 passed"},
        {"role": "user", "content": "<system-reminder>The todo list is empty.</system-reminder>"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                fn("toolu_01B", "Read", '{"file_path":"/app/math.py"}'),
                fn("toolu_01C", "Read", '{"file_path":"/app/tests/test_math.py"}'),
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01B", "content": "     1\tdef add(a, b):\n     2\t    return a - b\n"},
        {"role": "tool", "tool_call_id": "toolu_01C", "content": "     1\tassert add(2, 2) == 4\n"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "Bash",
                "parameters": CLAUDE_TOOLS[0]["input_schema"],
                "description": CLAUDE_TOOLS[0]["description"],
            },
        },
        {
            "type": "function",
            "function": {
                "name": "Read",
                "parameters": CLAUDE_TOOLS[1]["input_schema"],
                "description": CLAUDE_TOOLS[1]["description"],
            },
        },
    ]
    assert body["max_tokens"] == 32000 and body["temperature"] == 1 and body["stop"] == ["</answer>"]
    assert not {"system", "metadata", "thinking", "stream", "stop_sequences", "tool_choice"} & body.keys()


def test_anthropic_a_resent_history_converts_only_what_it_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    """claude-code resends its whole history on every call: with the session's memo only the new messages are
    converted, and the translation is the one without it. A resend that is not the same JSON (a number sent as
    ``true``, ``1.0`` for ``1``), a shorter history or another dialect's memo converts everything again."""
    per_message = count_calls(monkeypatch, anthropic, "_message")
    memo = MessageMemo()
    messages = orjson.loads(orjson.dumps(CLAUDE_CODE_REQUEST["messages"]))

    def parse(history: list[Any], with_memo: MessageMemo | None = memo) -> tuple[list[dict[str, Any]], int]:
        before = per_message.n
        body = orjson.loads(orjson.dumps({**CLAUDE_CODE_REQUEST, "messages": history}))  # parsed afresh, as sent
        converted = anthropic.parse_request(body, with_memo).body["messages"]
        assert converted == anthropic.parse_request(orjson.loads(orjson.dumps(body))).body["messages"]
        return converted, per_message.n - before - len(history)  # less the memo-free parse's own conversions

    assert parse(messages)[1] == len(messages)
    call = {"type": "tool_use", "id": "toolu_09", "name": "Bash", "input": {"command": "ls", "timeout": 1}}
    resent = [*messages, {"role": "assistant", "content": [call]}]
    converted, conversions = parse(resent)
    assert (
        conversions == 1 and converted[-1]["tool_calls"][0]["function"]["arguments"] == '{"command":"ls","timeout":1}'
    )
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_09", "content": "a.py"}]}
    assert parse([*resent, result])[1] == 1 and parse([*resent, result])[1] == 0
    for value in (True, 1.0):  # equal in Python, not in JSON: converted again, and as sent
        changed = [
            *messages,
            {"role": "assistant", "content": [{**call, "input": {"command": "ls", "timeout": value}}]},
        ]
        converted, conversions = parse([*changed, result])
        assert (
            conversions == len(changed) + 1
            and orjson.dumps(value).decode() in converted[-2]["tool_calls"][0]["function"]["arguments"]
        )
    assert parse(messages[:2])[1] == 2
    with pytest.raises(DialectError) as raised:  # a malformed addition: refused, the memo as it was
        anthropic.parse_request({**CLAUDE_CODE_REQUEST, "messages": [*messages[:2], {"role": "robot"}]}, memo)
    assert raised.value.param == "messages[2].role" and parse(messages[:3])[1] == 1
    other = MessageMemo()
    other.convert(messages, lambda message, index: [{"role": "user", "content": "another dialect's"}])
    assert parse(messages, other)[1] == len(messages)


def test_responses_a_resent_input_reads_only_what_it_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    """codex resends its whole input on every call: with the session's memo only the new items are read, and the
    messages are the ones without it, also where a new item joins a message the last request ended with (a second
    tool call after the first), which the last request's messages keep as they were."""
    per_item = count_calls(monkeypatch, responses, "_item")
    memo = MessageMemo()

    def parse(items: list[Any]) -> tuple[list[dict[str, Any]], int]:
        before = per_item.n
        body = orjson.loads(orjson.dumps({**CODEX_REQUEST, "input": items}))
        messages = responses.parse_request(body, memo).body["messages"]
        assert messages == responses.parse_request(orjson.loads(orjson.dumps(body))).body["messages"]
        return messages, per_item.n - before - len(items)

    items = orjson.loads(orjson.dumps(CODEX_REQUEST["input"]))
    assert parse(items)[1] == len(items)
    think = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Look around."}]}
    first = {"type": "function_call", "name": "shell", "arguments": '{"command":["ls"]}', "call_id": "call_a"}
    earlier, conversions = parse([*items, think, first])
    assert conversions == 2 and earlier[-1]["tool_calls"][0]["id"] == "call_a"
    assert earlier[-1]["reasoning_content"] == "Look around."
    second = {**first, "arguments": '{"command":["pwd"]}', "call_id": "call_b"}
    later, conversions = parse([*items, think, first, second])
    assert conversions == 1 and [call["id"] for call in later[-1]["tool_calls"]] == ["call_a", "call_b"]
    assert [call["id"] for call in earlier[-1]["tool_calls"]] == ["call_a"]  # the last request's, unchanged
    output = {"type": "function_call_output", "call_id": "call_a", "output": "a.py"}
    assert parse([*items, think, first, second, output])[1] == 1
    with pytest.raises(DialectError) as raised:
        responses.parse_request({**CODEX_REQUEST, "input": [*items, think, first, second, output, {"type": "x"}]}, memo)
    assert raised.value.param == f"input[{len(items) + 4}]"
    assert parse([*items, think, first, second, output, output])[1] == 1


RESPONSES_ITEMS = [
    {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r"}]},
    {"type": "reasoning", "content": []},
    {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"},
    {"type": "local_shell_call", "call_id": "l", "action": {"command": ["ls"]}},
    {"type": "function_call_output", "call_id": "c", "output": "o"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
    {"type": "message", "role": "user", "content": "u"},
    {"type": "message", "role": "developer", "content": "d"},
    {"type": "web_search_call"},
    {"type": "bogus"},
]


def test_responses_with_a_memo_any_resent_input_reads_as_it_does_without() -> None:
    """Random inputs, each after a random earlier request of the session (its start, or another input): the
    messages, or the error, are those of a parse without a memo."""
    rng = random.Random(0)

    def messages(items: list[Any], memo: MessageMemo | None) -> Any:
        try:
            return responses.parse_request({"input": items, "instructions": "I"}, memo).body["messages"]
        except DialectError as exc:
            return exc.status, str(exc), exc.param

    for _ in range(2000):
        items = [rng.choice(RESPONSES_ITEMS) for _ in range(rng.randint(1, 8))]
        memo = MessageMemo()
        earlier = items[: rng.randint(1, len(items))] if rng.random() < 0.8 else [rng.choice(RESPONSES_ITEMS)]
        messages(orjson.loads(orjson.dumps(earlier)), memo)
        assert messages(orjson.loads(orjson.dumps(items)), memo) == messages(items, None), (earlier, items)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        (
            {"type": "tool", "name": "Bash", "disable_parallel_tool_use": True},
            {"tool_choice": {"type": "function", "function": {"name": "Bash"}}, "parallel_tool_calls": False},
        ),
    ],
)
def test_anthropic_tool_choice_mapping(choice: dict[str, Any], expected: dict[str, Any]) -> None:
    body = anthropic.parse_request({**CLAUDE_CODE_REQUEST, "tool_choice": choice}).body
    assert {key: body[key] for key in ("tool_choice", "parallel_tool_calls") if key in body} == expected


def test_anthropic_minimal_request() -> None:
    request = anthropic.parse_request(
        {
            "model": "claude-haiku",
            "max_tokens": 512,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "hi"}],
            "tool_choice": {"type": "auto"},
            "top_k": 40,
        }
    )
    assert request.body == {
        "model": "claude-haiku",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "max_tokens": 512,
        "top_k": 40,
    }
    assert not request.stream and request.stop == ()


USER_HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ("x", None),
        ({"messages": USER_HI}, "max_tokens"),
        ({"messages": USER_HI, "max_tokens": 0}, "max_tokens"),
        ({"messages": USER_HI, "max_tokens": True}, "max_tokens"),
        ({"max_tokens": 5}, "messages"),
        ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}],
            },
            "messages[0].content[0]",
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
            "messages[0].content[0]",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}
                ],
            },
            "messages[0].content[0]",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}],
                    }
                ],
            },
            "messages[0].content[0]",
        ),
        ({"max_tokens": 5, "messages": USER_HI, "system": [{"type": "image"}]}, "system"),
        ({"max_tokens": 5, "messages": USER_HI, "tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"max_tokens": 5, "messages": USER_HI, "stop_sequences": "</a>"}, "stop_sequences"),
        ({"max_tokens": 5, "messages": USER_HI, "tools": [{"description": "no name"}]}, "tools[0]"),
    ],
)
def test_anthropic_rejects_malformed(body: Any, param: str | None) -> None:
    with pytest.raises(DialectError) as raised:
        anthropic.parse_request(body)
    assert raised.value.status == 400 and raised.value.param == param


def test_anthropic_render_response() -> None:
    request = anthropic.parse_request(CLAUDE_CODE_REQUEST)
    engine = engine_response(content="Reading the file.", tool_calls=[("Read", '{"file_path": "/app/math.py"}')])
    out = anthropic.render_response(engine, request)
    call_id = engine["choices"][0]["message"]["tool_calls"][0]["id"]
    assert out == {
        "id": "msg_9d2f4c0e8b7a4b1f9c3e2d1a0b9c8d7e",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [
            {"type": "text", "text": "Reading the file."},
            {"type": "tool_use", "id": call_id, "name": "Read", "input": {"file_path": "/app/math.py"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 1234,
            "output_tokens": 5,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


@pytest.mark.parametrize(
    ("engine", "stop_reason", "stop_sequence"),
    [
        (engine_response(), "end_turn", None),
        (engine_response(stop_reason=151645), "end_turn", None),
        (engine_response(stop_reason="</answer>"), "stop_sequence", "</answer>"),
        (engine_response(finish_reason="length"), "max_tokens", None),
        (engine_response(tool_calls=[("Bash", "{}")]), "tool_use", None),
    ],
)
def test_anthropic_stop_reasons(engine: dict[str, Any], stop_reason: str, stop_sequence: str | None) -> None:
    out = anthropic.render_response(engine, anthropic.parse_request(CLAUDE_CODE_REQUEST))
    assert (out["stop_reason"], out["stop_sequence"]) == (stop_reason, stop_sequence)


def test_anthropic_render_edge_cases() -> None:
    request = anthropic.parse_request(CLAUDE_CODE_REQUEST)
    broken = engine_response(content=None, tool_calls=[("Bash", '{"command": "ls'), ("Read", "[1]"), ("Noop", "")])
    assert [block["input"] for block in anthropic.render_response(broken, request)["content"]] == [{}, {}, {}]
    assert anthropic.render_response(ENGINE_REPLIES["empty"], request)["content"] == []


def test_anthropic_round_trip_rebuilds_the_engine_turn() -> None:
    engine = ENGINE_REPLIES["reasoning"]
    request = anthropic.parse_request(CLAUDE_CODE_REQUEST)
    content = anthropic.render_response(engine, request)["content"]
    assert [block["type"] for block in content] == ["thinking", "text", "tool_use"]
    messages = anthropic.parse_request(
        {"max_tokens": 5, "messages": [*USER_HI, {"role": "assistant", "content": content}]}
    ).body["messages"]
    message = engine["choices"][0]["message"]
    assert messages[1]["content"] == message["content"]
    assert messages[1]["reasoning_content"] == message["reasoning_content"]
    [call] = messages[1]["tool_calls"]
    [engine_call] = message["tool_calls"]
    assert call["id"] == engine_call["id"] and call["function"]["name"] == engine_call["function"]["name"]
    assert orjson.loads(call["function"]["arguments"]) == orjson.loads(engine_call["function"]["arguments"])


def accumulate_anthropic(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    """Fold Messages events the way the Anthropic SDK's MessageStream does."""
    events = [(name, data) for name, data in events if name != "ping"]
    assert events[0][0] == "message_start" and events[-1][0] == "message_stop"
    message = dict(events[0][1]["message"])
    message["content"] = []
    partial: dict[int, str] = {}
    open_block: int | None = None
    for name, event in events[1:-1]:
        assert name == event["type"]
        if name == "content_block_start":
            assert open_block is None and event["index"] == len(message["content"])
            open_block = event["index"]
            message["content"].append(dict(event["content_block"]))
        elif name == "content_block_delta":
            assert event["index"] == open_block
            block, delta = message["content"][open_block], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                assert delta["type"] == "input_json_delta" and block["type"] == "tool_use"
                partial[open_block] = partial.get(open_block, "") + delta["partial_json"]
        elif name == "content_block_stop":
            assert event["index"] == open_block
            if message["content"][open_block]["type"] == "tool_use":
                message["content"][open_block]["input"] = orjson.loads(partial[open_block])
            open_block = None
        else:
            assert name == "message_delta" and open_block is None
            message.update(event["delta"])
            message["usage"] = {**message["usage"], **event["usage"]}
    return message


@pytest.mark.parametrize("reply", list(ENGINE_REPLIES))
def test_anthropic_stream_reassembles_to_the_response(reply: str) -> None:
    engine = ENGINE_REPLIES[reply]
    request = anthropic.parse_request(CLAUDE_CODE_REQUEST)
    expected = anthropic.render_response(engine, request)
    events = parse_sse([anthropic.KEEPALIVE, *anthropic.render_stream(engine, request)])
    assert events[0] == ("ping", {"type": "ping"})
    start = events[1][1]["message"]
    assert start["stop_reason"] is None and start["usage"]["input_tokens"] == 1234 and start["content"] == []
    assert accumulate_anthropic(events) == expected


# --- count_tokens ----------------------------------------------------------------------------------------------------


def test_anthropic_estimate_tokens() -> None:
    body = {"model": "claude", "system": "x" * 40, "messages": [{"role": "user", "content": "y" * 38}]}
    assert anthropic.estimate_tokens(body) == {"input_tokens": 21}  # 40 + 38 + len("user") = 82 chars
    assert anthropic.estimate_tokens({"messages": []}) == {"input_tokens": 1}
    estimate = anthropic.estimate_tokens(CLAUDE_CODE_REQUEST)["input_tokens"]
    assert (
        sum(len(block["text"]) for block in CLAUDE_SYSTEM) / 4 < estimate < len(orjson.dumps(CLAUDE_CODE_REQUEST)) / 4
    )
    with pytest.raises(DialectError):
        anthropic.estimate_tokens({"system": "x"})


# --- errors ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "openai_type", "anthropic_type"),
    [
        (400, "invalid_request_error", "invalid_request_error"),
        (401, "authentication_error", "authentication_error"),
        (404, "not_found_error", "not_found_error"),
        (429, "rate_limit_error", "rate_limit_error"),
        (500, "server_error", "api_error"),
        (502, "server_error", "api_error"),
        (503, "server_error", "overloaded_error"),
        (529, "server_error", "overloaded_error"),
    ],
)
def test_error_bodies(status: int, openai_type: str, anthropic_type: str) -> None:
    expected = {"error": {"message": "boom", "type": openai_type, "param": None, "code": None}}
    assert chat.render_error(status, "boom") == expected
    assert responses.render_error(status, "boom") == expected
    assert anthropic.render_error(status, "boom") == {
        "type": "error",
        "error": {"type": anthropic_type, "message": "boom"},
    }


def test_error_body_overrides() -> None:
    assert chat.render_error(
        400, "too long", "invalid_request_error", code="context_length_exceeded", param="messages"
    ) == {
        "error": {
            "message": "too long",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    assert anthropic.render_error(502, "x", "overloaded_error")["error"]["type"] == "overloaded_error"
    error = DialectError(400, "'max_tokens' is required", "max_tokens")
    assert str(error) == error.message and error.param == "max_tokens"


def test_stream_error_frames() -> None:
    [(name, data)] = parse_sse([chat.render_stream_error(502, "engine down")])
    assert name is None and data == chat.render_error(502, "engine down")

    [(name, data)] = parse_sse([anthropic.render_stream_error(529, "busy")])
    assert name == "error" and data == {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}

    request = responses.parse_request(CODEX_REQUEST)
    [(name, data)] = parse_sse(
        [responses.render_stream_error(400, "too long", code="context_length_exceeded", request=request)]
    )
    assert name == "response.failed" and data["type"] == "response.failed"
    assert data["response"]["status"] == "failed" and data["response"]["model"] == "gpt-5-codex"
    assert data["response"]["error"] == {"code": "context_length_exceeded", "message": "too long"}
    [(_, data)] = parse_sse([responses.render_stream_error(503, "engine down")])
    assert data["response"]["error"]["code"] == "server_error"
    openai_types().responses.ResponseFailedEvent.model_validate(data)


def test_chat_request_defaults() -> None:
    request = ChatRequest(dialect="openai_chat", body={}, model="m")
    assert not request.stream and request.tool_kinds == {} and request.stop == () and request.echo == {}
