"""Agent dialects of the capture proxy: each translates one agent wire format to the engine's chat contract and back.

``ROUTES`` maps the path an agent posts to its dialect module; every module has
the interface documented in ``proxy.dialects.base``.
"""

from proxy.dialects import anthropic_messages, openai_chat, openai_responses
from proxy.dialects.base import ChatRequest, Dialect, DialectError

DIALECTS: dict[str, Dialect] = {module.NAME: module for module in (openai_chat, openai_responses, anthropic_messages)}
ROUTES: dict[str, Dialect] = {
    "/v1/chat/completions": openai_chat,
    "/v1/responses": openai_responses,
    "/v1/messages": anthropic_messages,
}
COUNT_TOKENS_ROUTE = "/v1/messages/count_tokens"
"""Answered by ``anthropic_messages.estimate_tokens``; never forwarded or recorded."""

__all__ = ["COUNT_TOKENS_ROUTE", "DIALECTS", "ROUTES", "ChatRequest", "Dialect", "DialectError"]
