"""Response bodies in vLLM's OpenAI shapes, assembled from a ``Completion``.

Contract (vLLM 0.22+ with ``--return-tokens-as-token-ids`` and
``--enable-auto-tool-choice``): every logprob entry's ``token`` is
``"token_id:N"`` and ``bytes`` are the token's exact UTF-8 bytes
(``tokens.TokenBytes``); logprobs below -9999 (filtered tokens) read -9999.0. Chat puts
``logprobs.content`` only when ``top_logprobs`` was given (even 0), the
prompt ids at top level ``prompt_token_ids`` and the sampled ids in
``choices[0].token_ids`` when ``return_token_ids`` was set. When the request
had tools (and ``tool_choice`` wasn't ``"none"``), tool calls are parsed with
``parse_tool_calls`` into ``message.tool_calls`` and ``finish_reason`` becomes
``"tool_calls"``. Completions put ``prompt_token_ids`` on the choice, as vLLM.
A streamed chat completion's chunks (``streaming``) reuse these pieces and
assemble to the same body.
"""

from __future__ import annotations

import codecs
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from harness_grpo.engine.generator import Completion
from harness_grpo.engine.tool_parser import parse_tool_calls

MIN_LOGPROB = -9999.0

TokenBytes = Callable[[int], bytes]  # the exact bytes of one token id


def _token(token_id: int) -> str:
    return f"token_id:{token_id}"


def _logprob(value: float) -> float:
    return max(value, MIN_LOGPROB)


def _entry(token_id: int, logprob: float, token_bytes: TokenBytes) -> dict[str, Any]:
    return {"token": _token(token_id), "logprob": _logprob(logprob), "bytes": list(token_bytes(token_id))}


def chat_logprob_entries(
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    top_logprobs: Sequence[Sequence[tuple[int, float]]],
    token_bytes: TokenBytes,
) -> list[dict[str, Any]]:
    """Chat ``logprobs.content``: one entry per token id, each with its ``top_logprobs`` entries."""
    return [
        {**_entry(token_id, logprob, token_bytes), "top_logprobs": [_entry(i, lp, token_bytes) for i, lp in top]}
        for token_id, logprob, top in zip(token_ids, logprobs, top_logprobs, strict=True)
    ]


def usage(completion: Completion) -> dict[str, Any]:
    """The ``usage`` object of a response (or of a stream's usage chunk)."""
    prompt, generated = len(completion.prompt_ids), len(completion.token_ids)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + generated,
        "completion_tokens": generated,
        "prompt_tokens_details": None,
    }


def chat_response(
    completion: Completion,
    *,
    model: str,
    top_logprobs: int | None,
    return_token_ids: bool,
    parse_tools: bool,
    token_bytes: TokenBytes,
) -> dict[str, Any]:
    """A ``chat.completion`` body."""
    content: str | None = completion.text
    tool_calls: list[dict[str, Any]] = []
    if parse_tools:
        content, tool_calls = parse_tool_calls(completion.text)
    logprobs = None
    if top_logprobs is not None:
        logprobs = {
            "content": chat_logprob_entries(
                completion.token_ids, completion.logprobs, completion.top_logprobs, token_bytes
            )
        }
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content, "tool_calls": tool_calls},
        "logprobs": logprobs,
        "finish_reason": "tool_calls" if tool_calls else completion.finish_reason,
        "stop_reason": completion.stop_reason,
        "token_ids": completion.token_ids if return_token_ids else None,
    }
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(completion),
        "prompt_logprobs": None,
        "prompt_token_ids": completion.prompt_ids if return_token_ids else None,
    }


def completion_response(
    completion: Completion,
    *,
    model: str,
    logprobs: int | None,
    return_token_ids: bool,
    token_bytes: TokenBytes,
) -> dict[str, Any]:
    """A ``text_completion`` body (legacy completions logprobs shape)."""
    choice_logprobs = None
    if logprobs is not None:
        offsets, offset = [], 0
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for token_id in completion.token_ids:  # character offset where each token's bytes begin
            offsets.append(offset)
            offset += len(utf8.decode(token_bytes(token_id)))
        choice_logprobs = {
            "text_offset": offsets,
            "token_logprobs": [_logprob(lp) for lp in completion.logprobs],
            "tokens": [_token(t) for t in completion.token_ids],
            "top_logprobs": [
                {_token(t): _logprob(lp), **{_token(i): _logprob(v) for i, v in top}}
                for t, lp, top in zip(completion.token_ids, completion.logprobs, completion.top_logprobs, strict=True)
            ],
        }
    choice = {
        "index": 0,
        "text": completion.text,
        "logprobs": choice_logprobs,
        "finish_reason": completion.finish_reason,
        "stop_reason": completion.stop_reason,
        "prompt_logprobs": None,
        "token_ids": completion.token_ids if return_token_ids else None,
        "prompt_token_ids": completion.prompt_ids if return_token_ids else None,
    }
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(completion),
    }
