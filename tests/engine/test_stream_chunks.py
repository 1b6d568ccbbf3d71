"""Stream chunks from known token streams (no model): they assemble to the non-streaming response."""

from __future__ import annotations

import random
from typing import Any

import pytest

from harness_grpo.engine.generator import Completion
from harness_grpo.engine.responses import chat_response
from harness_grpo.engine.streaming import ChatStream
from harness_grpo.engine.tokens import TokenBytes
from tests.engine.streams import assemble, expected, without_call_ids

CALL = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n</tool_call>'
PROMPT = [1, 2, 3]


@pytest.fixture
def run_stream(tokenizer):
    """``run_stream(text, ...)``: stream ``text``'s tokens (then EOS) in random groups, as the generator
    would sample them (stopping at a stop string), some of the last ones only with the completion if
    ``lag``; returns (chunks, the chunks of ``tokens`` calls, the non-streaming response)."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    token_bytes = TokenBytes(tokenizer)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    def run(
        text: str | list[str],
        *,
        parse_tools: bool = True,
        stop: tuple[str, ...] = (),
        top_logprobs: int | None = 0,
        return_token_ids: bool = True,
        seed: int = 0,
        lag: bool = True,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        pieces = [text] if isinstance(text, str) else text  # each piece encoded alone, as a model may sample it
        ids = [*(t for piece in pieces for t in tokenizer.encode(piece)), eos]
        final_text, reason, stop_reason = decode(ids), "stop", None
        for n in range(1, len(ids) + 1):  # the generator's stop-string check after each token
            hits = [(i, s) for s in stop if (i := decode(ids[:n]).find(s)) >= 0]
            if hits:
                index, stop_reason = min(hits)
                ids, final_text = ids[:n], decode(ids[:n])[:index]
                break
        logprobs = [-0.1 * (i + 1) for i in range(len(ids))]
        tops = [[(t, lp)] if top_logprobs else [] for t, lp in zip(ids, logprobs, strict=True)]
        completion = Completion(PROMPT, ids, logprobs, tops, final_text, reason, stop_reason)
        options = {"top_logprobs": top_logprobs, "return_token_ids": return_token_ids, "parse_tools": parse_tools}
        stream = ChatStream(
            PROMPT, model="m", include_usage=True, stop=stop, decode=decode, token_bytes=token_bytes, **options
        )
        chunks, token_chunks = [stream.first()], []
        rng = random.Random(seed)
        # with lag, the last tokens arrive with the completion, as when the consumer falls behind
        sent = rng.randrange(len(ids)) if lag else len(ids)
        i = 0
        while i < sent:
            n = min(rng.randint(1, 3), sent - i)
            chunk = stream.tokens(list(zip(ids[i : i + n], logprobs[i : i + n], tops[i : i + n], strict=True)))
            if chunk is not None:
                chunks.append(chunk)
                token_chunks.append(chunk)
            i += n
        chunks.extend(stream.finish(completion))
        return chunks, token_chunks, chat_response(completion, model="m", token_bytes=token_bytes, **options)

    return run


TEXTS = [
    "plain text, no call",
    "é ünïcode: 日本語 and an emoji 🙂 split across byte tokens",
    CALL,
    f"Let me look.\n\n{CALL}\n{CALL.replace('bash', 'read')}",
    f"Broken:\n{CALL.replace('"name"', 'name')}",
    "a <tool is not <tool_cal a <tool_call",
    "ends with newlines\n\n",
    ["Let me look.\n<", CALL.removeprefix("<")],  # the tag sampled as '<', 'tool', '_', 'call', '>'
    ["a <tool_cal", "l in words"],
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("seed", range(4))
def test_assembled_stream_equals_the_response(run_stream, text, seed):
    chunks, _, response = run_stream(text, seed=seed)
    assert without_call_ids(assemble(chunks)) == without_call_ids(expected(response))


@pytest.mark.parametrize("text", [CALL, "a <tool_call> in plain chat\n"])
def test_without_tools_the_markup_is_content(run_stream, text):
    chunks, _, response = run_stream(text, parse_tools=False)
    assert assemble(chunks) == expected(response)
    assert assemble(chunks)["content"] == text


@pytest.mark.parametrize("stop", [("STOP",), ("xyz", "and ST"), ("\n\n",)])
def test_a_stop_string_is_never_streamed(run_stream, stop):
    text = "before ST and STOP\n\nafter"
    for seed in range(4):
        chunks, _, response = run_stream(text, stop=stop, seed=seed, lag=False)
        assert assemble(chunks) == expected(response)
        assert response["choices"][0]["stop_reason"] is not None


def test_content_before_a_call_streams_and_the_call_comes_whole_at_the_end(run_stream):
    text = f"Let me look.\n{CALL}"
    chunks, token_chunks, response = run_stream(text, seed=1, lag=False)
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in token_chunks)
    assert streamed == "Let me look."
    assert all("tool_calls" not in c["choices"][0]["delta"] for c in token_chunks)
    (call,) = chunks[-2]["choices"][0]["delta"]["tool_calls"]
    assert call["function"] == {"name": "bash", "arguments": '{"cmd": "ls -la"}'}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == response["usage"]


def test_held_back_tokens_still_carry_their_ids_and_logprobs(run_stream):
    _, token_chunks, _ = run_stream(CALL, seed=2, lag=False)
    assert token_chunks and all(c["choices"][0]["delta"] == {} for c in token_chunks)
    for chunk in token_chunks:
        choice = chunk["choices"][0]
        assert choice["token_ids"] and len(choice["logprobs"]["content"]) == len(choice["token_ids"])


def test_nothing_requested_means_no_empty_chunks(run_stream):
    chunks, token_chunks, response = run_stream(CALL, top_logprobs=None, return_token_ids=False, seed=3)
    assert token_chunks == []
    assert without_call_ids(assemble(chunks)) == without_call_ids(expected(response))
