"""Tool-call parsing for the ``<tool_call>{json}</tool_call>`` (Hermes/Qwen) format.

Contract, as vLLM's ``hermes`` parser: the content is the text before the first
``<tool_call>``; each block holds ``{"name": str, "arguments": object}``; an
unterminated final block is accepted when its JSON is complete. If any block
fails to parse, nothing is a tool call and the whole text is content.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL_TAG = "<tool_call>"
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)


def new_tool_call_id() -> str:
    """An OpenAI-style tool-call id, ``chatcmpl-tool-<32 hex>``."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split model output into ``(content, tool_calls)`` in OpenAI chat shape.

    ``content`` is None when the output holds only tool calls.
    """
    if TOOL_CALL_TAG not in text:
        return text, []
    calls = []
    for match in TOOL_CALL_RE.finditer(text):
        body = (match.group(1) if match.group(1) is not None else match.group(2)).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return text, []
        arguments = obj.get("arguments", {})
        arguments_json = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        calls.append(
            {
                "id": new_tool_call_id(),
                "type": "function",
                "function": {"name": obj["name"], "arguments": arguments_json},
            }
        )
    content = text[: text.index(TOOL_CALL_TAG)].rstrip("\n")
    return (content or None), calls
