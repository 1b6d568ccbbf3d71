"""CPU of translating one agent request, by dialect and history length: a resend with the session's memo beside
a parse without it (a benchmark, not a test).

    .venv/bin/python -m bench.dialect_parse_cost                     # 16, 64, 128 and 256 messages
    .venv/bin/python -m bench.dialect_parse_cost --messages 128 --repeats 500

An agent resends its whole history on every call, so translating a request costs what its history costs unless
the dialect converts only what was added. Each dialect gets a tool loop of N messages as its agent sends it
(claude-code's Anthropic blocks, codex's Responses items, opencode's chat messages) with a ~6 kB system prompt;
"resend" is the parse of that history parsed afresh after the same history less its last message was parsed
with the same memo (the session's state before the call), "cold" the parse without a memo. Times are
``process_time`` per parse, JSON decoding of the body not included.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import orjson

from proxy.dialects import anthropic_messages, openai_chat, openai_responses
from proxy.dialects.base import MessageMemo

SYSTEM = "You are a careful coding agent. " * 200


def anthropic_body(n: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    while len(messages) < n:
        i = len(messages)
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": f"pytest -q {i}"}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Step {i}."}, call]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"{i} passed\n" * 8}
        messages.append({"role": "user", "content": [result]})
    tool = {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {}}}
    return {"model": "m", "max_tokens": 1024, "system": SYSTEM, "messages": messages[:n], "tools": [tool]}


def responses_body(n: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Fix the failing test."}]
    while len(items) < n:
        i = len(items)
        arguments = orjson.dumps({"command": ["pytest", "-q", str(i)]}).decode()
        items.append({"type": "function_call", "call_id": f"call_{i}", "name": "shell", "arguments": arguments})
        items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": f"{i} passed\n" * 8})
    tool = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}
    return {"model": "m", "instructions": SYSTEM, "input": items[:n], "tools": [tool]}


def chat_body(n: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix it."}]
    while len(messages) < n:
        i = len(messages)
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"{i} passed\n" * 8})
    tool = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}
    return {"model": "m", "messages": messages[:n], "tools": [tool]}


DIALECTS: dict[str, tuple[Any, Callable[[int], dict[str, Any]], str]] = {
    "anthropic_messages": (anthropic_messages, anthropic_body, "messages"),
    "openai_responses": (openai_responses, responses_body, "input"),
    "openai_chat": (openai_chat, chat_body, "messages"),
}


def per_parse_us(calls: list[tuple[MessageMemo | None, dict[str, Any]]], dialect: Any) -> float:
    """Process time per ``dialect.parse_request(body, memo)`` over ``calls``."""
    started = time.process_time()
    for memo, body in calls:
        dialect.parse_request(body, memo)
    return (time.process_time() - started) / len(calls) * 1e6


def measure(dialect: Any, body: dict[str, Any], field: str, repeats: int) -> tuple[float, float]:
    """``(cold, resend)`` microseconds per parse of ``body``; each call gets the body parsed afresh, and for the
    resend a memo that has seen the same history less its last entry (the session's state before the call)."""
    before = {**body, field: body[field][:-1]}
    fresh = [orjson.loads(orjson.dumps(body)) for _ in range(2 * repeats)]
    memos = [MessageMemo() for _ in range(repeats)]
    for memo in memos:
        dialect.parse_request(orjson.loads(orjson.dumps(before)), memo)
    cold = per_parse_us([(None, b) for b in fresh[:repeats]], dialect)
    return cold, per_parse_us(list(zip(memos, fresh[repeats:], strict=True)), dialect)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, nargs="+", default=[16, 64, 128, 256])
    p.add_argument("--repeats", type=int, default=300)
    a = p.parse_args()
    print("| dialect | messages | cold us | resend with memo us | ratio |")
    print("|---|---|---|---|---|")
    for name, (dialect, make, field) in DIALECTS.items():
        for n in a.messages:
            cold, resend = measure(dialect, make(n), field, a.repeats)
            print(f"| {name} | {n} | {cold:.1f} | {resend:.1f} | {cold / resend:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
