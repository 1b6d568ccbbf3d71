"""Reading streamed chat completions back: their chunks assembled into the non-streaming response's terms."""

from __future__ import annotations

from typing import Any


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
