"""Streamed chat completions: vLLM's ``chat.completion.chunk`` bodies, built while tokens are sampled.

Contract. ``ChatStream`` is fed one sequence's sampled tokens in order
(``tokens``, any number per call) and then its finished ``Completion``
(``finish``); the chunks it returns assemble to exactly what
``responses.chat_response`` answers for that ``Completion``: the
concatenated ``delta.content`` is ``message.content`` ("" for None), the
``delta.tool_calls`` are ``message.tool_calls``, the concatenated
``choices[0].token_ids`` are ``choices[0].token_ids`` (with
``return_token_ids``), the ``logprobs.content`` entries align one per id (with
``top_logprobs`` set), and the last choice chunk carries the same
``finish_reason`` and ``stop_reason``; with ``include_usage`` a chunk with
``choices: []`` and ``usage`` follows. The first chunk has ``delta`` =
``{"role": "assistant", "content": ""}`` and the top-level
``prompt_token_ids`` (with ``return_token_ids``).

Text is emitted only once it can no longer change the assembled content
(``StreamText``): a partial UTF-8 character, the tail that may still grow into
a stop string and whatever follows a complete one (cut from the content), and, when tools are parsed, a tail that
may be the start of ``<tool_call>`` and trailing newlines (stripped before a
call) are held back; from the first ``<tool_call>`` on, nothing more is
emitted until the end, because one malformed block turns the whole text back
into content (``tool_parser``). Each call is sent whole in the last choice
chunk. The ids and logprobs of held-back text still go out in the chunk of the
step that sampled them (``delta`` is then ``{}``).

On the wire each body is one SSE event, ``data: <json>\\n\\n`` (``sse``), and
the stream ends with ``data: [DONE]\\n\\n``; an error after the headers is
sent as an ``errors.error_body`` event, then ``[DONE]``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from harness_grpo.engine.generator import Completion
from harness_grpo.engine.responses import TokenBytes, chat_logprob_entries, usage
from harness_grpo.engine.tool_parser import TOOL_CALL_TAG, parse_tool_calls

SSE_DONE = b"data: [DONE]\n\n"

Token = tuple[int, float, list[tuple[int, float]]]  # (token id, logprob, top logprobs), as ``on_token`` gets them


def sse(body: Mapping[str, Any]) -> bytes:
    """One server-sent event carrying ``body`` as JSON."""
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _tag_prefix_at_end(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of the tool-call tag."""
    for n in range(min(len(text), len(TOOL_CALL_TAG) - 1), 0, -1):
        if text.endswith(TOOL_CALL_TAG[:n]):
            return n
    return 0


def _strip_newlines(text: str, end: int, start: int) -> int:
    """``end`` moved left past the newlines before it, but not below ``start``."""
    while end > start and text[end - 1] == "\n":
        end -= 1
    return end


class StreamText:
    """The content of a growing token sequence, released only once it is final (see the module docstring)."""

    def __init__(self, decode: Callable[[list[int]], str], *, stop: Sequence[str], parse_tools: bool) -> None:
        self._decode = decode
        self._stop = tuple(stop)
        self._stop_hold = max((len(s) for s in stop), default=1) - 1
        self._parse_tools = parse_tools
        self._ids: list[int] = []
        self._prefix_offset = 0  # decoding window, as vLLM's incremental detokenizer
        self._read_offset = 0
        self._text = ""  # decoded so far, without a trailing partial character
        self._emitted = 0  # characters of _text already released
        self._frozen = False  # a tool-call tag was seen: nothing more until the end

    def add(self, token_ids: Sequence[int]) -> str:
        """Take the next sampled ids; return the content that became final."""
        if self._frozen:
            return ""
        self._ids.extend(token_ids)
        before = self._decode(self._ids[self._prefix_offset : self._read_offset])
        after = self._decode(self._ids[self._prefix_offset :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        old_length = len(self._text)
        self._text += after[len(before) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        end = len(self._text)
        if self._parse_tools:
            tag = self._text.find(TOOL_CALL_TAG, max(0, old_length - len(TOOL_CALL_TAG) + 1))
            self._frozen = tag >= 0
            end = tag if self._frozen else end - _tag_prefix_at_end(self._text)
            end = _strip_newlines(self._text, end, self._emitted)
        if self._stop:  # the generator finishes on the token that completes a stop string; cut before it
            start = max(0, old_length - self._stop_hold)
            hits = [i for s in self._stop if (i := self._text.find(s, start)) >= 0]
            end = min(end, *hits, len(self._text) - self._stop_hold)
        if end <= self._emitted:
            return ""
        released, self._emitted = self._text[self._emitted : end], end
        return released

    def finish(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """The rest of the content and the tool calls, given the finished completion's ``text``."""
        content: str | None = text
        calls: list[dict[str, Any]] = []
        if self._parse_tools:
            content, calls = parse_tool_calls(text)
        return (content or "")[self._emitted :], calls


class ChatStream:
    """The chunks of one streamed chat completion; see the module docstring for the contract."""

    def __init__(
        self,
        prompt_ids: list[int],
        *,
        model: str,
        top_logprobs: int | None,
        return_token_ids: bool,
        parse_tools: bool,
        include_usage: bool,
        stop: Sequence[str],
        decode: Callable[[list[int]], str],
        token_bytes: TokenBytes,
    ) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self._prompt_ids = prompt_ids
        self._top_logprobs = top_logprobs
        self._return_token_ids = return_token_ids
        self._include_usage = include_usage
        self._token_bytes = token_bytes
        self._text = StreamText(decode, stop=stop, parse_tools=parse_tools)
        self._sent = 0  # token ids already in a chunk

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def _choice(
        self,
        delta: dict[str, Any],
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        top_logprobs: Sequence[Sequence[tuple[int, float]]],
        finish_reason: str | None = None,
        stop_reason: str | None = None,
    ) -> dict[str, Any]:
        self._sent += len(token_ids)
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        if self._top_logprobs is not None:
            choice["logprobs"] = {"content": chat_logprob_entries(token_ids, logprobs, top_logprobs, self._token_bytes)}
        if self._return_token_ids:
            choice["token_ids"] = list(token_ids)
        return choice

    def first(self) -> dict[str, Any]:
        """The opening chunk: the assistant role (and the prompt ids)."""
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        if self._return_token_ids:
            return self._chunk([choice], prompt_token_ids=self._prompt_ids)
        return self._chunk([choice])

    def tokens(self, tokens: Sequence[Token]) -> dict[str, Any] | None:
        """The chunk for tokens just sampled; None when it would carry nothing the request asked for."""
        token_ids = [token_id for token_id, _, _ in tokens]
        content = self._text.add(token_ids)
        if not content and not self._return_token_ids and self._top_logprobs is None:
            self._sent += len(token_ids)
            return None
        delta = {"content": content} if content else {}
        return self._chunk([self._choice(delta, token_ids, [lp for _, lp, _ in tokens], [top for _, _, top in tokens])])

    def finish(self, completion: Completion) -> list[dict[str, Any]]:
        """The last choice chunk (tokens not yet sent, the rest of the content, tool calls, finish reason), then
        the usage chunk if asked."""
        content, calls = self._text.finish(completion.text)
        delta: dict[str, Any] = {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        n = self._sent
        choice = self._choice(
            delta,
            completion.token_ids[n:],
            completion.logprobs[n:],
            completion.top_logprobs[n:],
            "tool_calls" if calls else completion.finish_reason,
            completion.stop_reason,
        )
        chunks = [self._chunk([choice])]
        if self._include_usage:
            chunks.append(self._chunk([], usage=usage(completion)))
        return chunks
