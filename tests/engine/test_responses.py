"""Response assembly from known token ids: tool calls, text, logprob entries (no model involved)."""

from __future__ import annotations

import json

import pytest

from harness_grpo.engine.generator import Completion
from harness_grpo.engine.responses import chat_response, completion_response
from harness_grpo.engine.tokens import TokenBytes

CALL = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n</tool_call>'


@pytest.fixture
def make_completion(tokenizer):
    """A Completion as the generator builds it for ``text`` generated and then ``<|im_end|>``."""

    def make(text: str) -> Completion:
        ids = [*tokenizer.encode(text), tokenizer.convert_tokens_to_ids("<|im_end|>")]
        decoded = tokenizer.decode(ids, skip_special_tokens=True)
        return Completion([1, 2, 3], ids, [-0.5] * len(ids), [[] for _ in ids], decoded, "stop", None)

    return make


def _chat(completion: Completion, tokenizer, parse_tools: bool = True) -> dict:
    return chat_response(
        completion,
        model="m",
        top_logprobs=0,
        return_token_ids=True,
        parse_tools=parse_tools,
        token_bytes=TokenBytes(tokenizer),
    )


def test_tool_call_tokens_become_message_tool_calls(make_completion, tokenizer):
    completion = make_completion(CALL)
    assert completion.text == CALL  # the markup tokens survive skip_special_tokens, the EOS does not
    response = _chat(completion, tokenizer)
    choice = response["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"cmd": "ls -la"}
    assert choice["token_ids"] == completion.token_ids  # EOS id included
    assert response["prompt_token_ids"] == [1, 2, 3]


def test_content_before_tool_calls_is_kept(make_completion, tokenizer):
    second = CALL.replace("bash", "read").replace("ls -la", "x.py")
    choice = _chat(make_completion(f"Let me look.\n{CALL}\n{second}"), tokenizer)["choices"][0]
    assert choice["message"]["content"] == "Let me look."
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["bash", "read"]


def test_no_parsing_without_tools_or_for_broken_calls(make_completion, tokenizer):
    plain = _chat(make_completion(CALL), tokenizer, parse_tools=False)["choices"][0]
    assert plain["message"] == {"role": "assistant", "content": CALL, "tool_calls": []}
    assert plain["finish_reason"] == "stop"
    broken = CALL.replace('"name"', "name")
    choice = _chat(make_completion(broken), tokenizer)["choices"][0]
    assert choice["message"]["content"] == broken and choice["finish_reason"] == "stop"


def test_logprob_entries_carry_exact_bytes(tokenizer):
    text = "é x<tool_call>"
    ids = tokenizer.encode(text)
    assert len(ids) == 4  # "é" is two byte tokens
    top = [[(ids[0], -0.1), (7, float("-inf"))]] * len(ids)
    completion = Completion([5], ids, [-1.0] * len(ids), top, text, "length", None)
    token_bytes = TokenBytes(tokenizer)
    response = chat_response(
        completion, model="m", top_logprobs=2, return_token_ids=False, parse_tools=False, token_bytes=token_bytes
    )
    entries = response["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in entries] == [f"token_id:{i}" for i in ids]
    assert b"".join(bytes(e["bytes"]) for e in entries) == text.encode()
    assert entries[0]["top_logprobs"][1] == {"token": "token_id:7", "logprob": -9999.0, "bytes": list(b"%")}
    assert response["choices"][0]["token_ids"] is None and response["prompt_token_ids"] is None

    legacy = completion_response(completion, model="m", logprobs=1, return_token_ids=True, token_bytes=token_bytes)
    legacy = legacy["choices"][0]
    assert legacy["logprobs"]["text_offset"] == [0, 0, 1, 3]
    assert legacy["logprobs"]["token_logprobs"] == [-1.0] * len(ids)
    assert legacy["logprobs"]["top_logprobs"][0] == {f"token_id:{ids[0]}": -0.1, "token_id:7": -9999.0}
    assert legacy["prompt_token_ids"] == [5] and legacy["token_ids"] == ids
