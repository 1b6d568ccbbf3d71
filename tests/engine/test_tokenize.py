"""/tokenize and /detokenize as vLLM serves them: a chat renders exactly as the chat route renders it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tokenizers.processors import TemplateProcessing

from harness_grpo.engine import EmbeddedEngine, ServerThread
from harness_grpo.tiny_model import SERVED_MODEL_NAME
from tests.engine.conftest import Http

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
READ = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}
SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "Run the tests."}


def _call(name: str, arguments: Any, call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


TOOL_LOOP = [
    SYSTEM,
    USER,
    {"role": "assistant", "content": None, "tool_calls": [_call("bash", '{"command": "pytest"}')]},
    {"role": "tool", "tool_call_id": "call_1", "content": "3 passed"},
]
CHATS = {
    "one user turn": {"messages": [{"role": "user", "content": "hi"}]},
    "system and user": {"messages": [SYSTEM, USER]},
    "tools": {"messages": [SYSTEM, USER], "tools": [BASH, READ]},
    "tool call and result": {"messages": TOOL_LOOP, "tools": [BASH]},
    "two calls, object arguments, two results, next user turn": {
        "messages": [
            USER,
            {
                "role": "assistant",
                "content": "Looking first.",
                "tool_calls": [_call("read_file", {"path": "a.py"}), _call("bash", {"command": "ls"}, "call_2")],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "x = 1"},
            {"role": "tool", "tool_call_id": "call_2", "content": "a.py"},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "Thanks; and now?"},
        ],
        "tools": [BASH, READ],
    },
    "content parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"}]}]},
    "template kwargs": {"messages": TOOL_LOOP, "tools": [BASH], "chat_template_kwargs": {"enable_thinking": False}},
}


def _tokenize(http: Http, **body: Any) -> dict[str, Any]:
    status, data = http.post("/tokenize", {"model": SERVED_MODEL_NAME, **body})
    assert status == 200, data
    return data


def _text(http: Http, tokens: list[int]) -> str:
    status, data = http.post("/detokenize", {"model": SERVED_MODEL_NAME, "tokens": tokens})
    assert status == 200, data
    return data["prompt"]


@pytest.mark.parametrize("fields", CHATS.values(), ids=CHATS.keys())
def test_tokenize_of_a_chat_is_its_chat_prompt(http, engine, fields):
    chat = http.chat(model=SERVED_MODEL_NAME, max_tokens=1, return_token_ids=True, **fields)
    prompt_ids = chat["prompt_token_ids"]
    assert _tokenize(http, **fields) == {
        "count": len(prompt_ids),
        "max_model_len": engine.max_model_len,
        "tokens": prompt_ids,
        "token_strs": None,
    }


def test_token_strs_are_the_tokenizer_pieces(http, tokenizer):
    data = _tokenize(http, messages=[{"role": "user", "content": "é 日本 def f(x):"}], return_token_strs=True)
    assert data["token_strs"] == tokenizer.convert_ids_to_tokens(data["tokens"])
    assert tokenizer.convert_tokens_to_string(data["token_strs"]) == _text(http, data["tokens"])


def test_generation_prompt_and_continue_final_message(http):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "partial"}]
    closed = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\npartial<|im_end|>\n"
    assert _text(http, _tokenize(http, messages=messages)["tokens"]) == closed + "<|im_start|>assistant\n"
    assert _text(http, _tokenize(http, messages=messages, add_generation_prompt=False)["tokens"]) == closed
    open_ended = _tokenize(http, messages=messages, add_generation_prompt=False, continue_final_message=True)
    assert _text(http, open_ended["tokens"]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\npartial"


def test_a_text_prompt_is_encoded_as_is(http, tokenizer):
    text = "<|im_start|>user\ndef f(x):\n    return x<|im_end|>"
    data = _tokenize(http, prompt=text)
    assert data["tokens"] == tokenizer.encode(text) and data["count"] == len(data["tokens"])
    assert _text(http, data["tokens"]) == text


def test_detokenize_keeps_special_tokens(http, tokenizer):
    rendered = tokenizer.apply_chat_template(TOOL_LOOP, tools=[BASH], add_generation_prompt=True, tokenize=False)
    assert _text(http, _tokenize(http, messages=TOOL_LOOP, tools=[BASH])["tokens"]) == rendered
    assert _text(http, []) == ""


@pytest.fixture(scope="module")
def bos_http(tiny_path: Path) -> Iterator[Http]:
    """An engine whose tokenizer adds a BOS token (as Llama's does), serving /tokenize; no compute thread."""
    engine = EmbeddedEngine(tiny_path, served_model_name=SERVED_MODEL_NAME)
    bos = engine.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    engine.tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|endoftext|> $A", pair="<|endoftext|> $A $B", special_tokens=[("<|endoftext|>", bos)]
    )
    with ServerThread(engine) as server:
        yield Http(server.url)


def test_add_special_tokens_defaults_as_vllm(bos_http, tokenizer):
    """Text prompts get the tokenizer's special tokens unless told not to; chats only when asked."""
    bos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    messages = [{"role": "user", "content": "hi"}]
    rendered = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    assert _tokenize(bos_http, prompt="hi")["tokens"] == [bos, *tokenizer.encode("hi")]
    assert _tokenize(bos_http, prompt="hi", add_special_tokens=False)["tokens"] == tokenizer.encode("hi")
    assert _tokenize(bos_http, messages=messages)["tokens"] == rendered
    assert _tokenize(bos_http, messages=messages, add_special_tokens=True)["tokens"] == [bos, *rendered]


def test_past_reasoning_is_dropped_before_the_last_user_turn(http):
    """What the proxy must know: the tiny (Qwen3-style) template keeps an assistant turn's reasoning only after
    the last user message. In a tool loop the sampled ``<think>`` block re-renders; once a new user turn
    arrives, every earlier turn's reasoning disappears from the rendering (so the rendered history stops
    being a prefix of what was sampled). Reasoning in ``reasoning_content`` and inline in ``content`` alike."""
    call = _call("bash", '{"command": "pytest"}')
    for turn in (
        {"role": "assistant", "reasoning_content": "Tests first.", "content": "", "tool_calls": [call]},
        {"role": "assistant", "content": "<think>\nTests first.\n</think>\n\n", "tool_calls": [call]},
    ):
        loop = [USER, turn, {"role": "tool", "tool_call_id": "call_1", "content": "3 passed"}]
        sampled_turn = (
            '<|im_start|>assistant\n<think>\nTests first.\n</think>\n\n<tool_call>\n{"name": "bash", '
            '"arguments": {"command": "pytest"}}\n</tool_call><|im_end|>\n'
        )
        assert sampled_turn in _text(http, _tokenize(http, messages=loop, tools=[BASH])["tokens"])
        next_query = _text(http, _tokenize(http, messages=[*loop, {"role": "user", "content": "Now lint."}])["tokens"])
        assert "<think>" not in next_query
        assert sampled_turn.replace("<think>\nTests first.\n</think>\n\n", "") in next_query
