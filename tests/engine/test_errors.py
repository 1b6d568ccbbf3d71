"""Each bad request gets its status and a vLLM-shaped error; the server keeps serving."""

from __future__ import annotations

import pytest

from harness_grpo.tiny_model import SERVED_MODEL_NAME

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TOKENS = "/v1/chat/completions/tokens"
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
MESSAGES = [{"role": "user", "content": "hi"}]


def _chat(**fields) -> dict:
    return {"model": SERVED_MODEL_NAME, "messages": MESSAGES, "max_tokens": 2, **fields}


CASES = [
    # (path, body, status, param)
    (CHAT, _chat(model="no/such-model"), 404, "model"),
    (COMPLETIONS, {"model": "no/such-model", "prompt": [1, 2]}, 404, "model"),
    (CHAT, _chat(n=2), 400, "n"),
    (CHAT, _chat(max_tokens=40000), 400, "max_tokens"),
    (CHAT, _chat(max_completion_tokens=32768), 400, "max_tokens"),
    (CHAT, _chat(max_tokens=0), 400, "max_tokens"),
    (CHAT, {"model": SERVED_MODEL_NAME, "max_tokens": 2}, 400, "messages"),
    (CHAT, _chat(messages=[]), 400, "messages"),
    (CHAT, _chat(messages="hi"), 400, "messages"),
    (CHAT, _chat(messages=[{"content": "no role"}]), 400, "messages"),
    (CHAT, _chat(temperature="hot"), 400, "temperature"),
    (CHAT, _chat(temperature=-1), 400, "temperature"),
    (CHAT, _chat(top_p=0), 400, "top_p"),
    (CHAT, _chat(top_k=-5), 400, "top_k"),
    (CHAT, _chat(max_tokens="2"), 400, "max_tokens"),
    (CHAT, _chat(seed=1.5), 400, "seed"),
    (CHAT, _chat(stop=[1]), 400, "stop"),
    (CHAT, _chat(logprobs="yes"), 400, "logprobs"),
    (CHAT, _chat(top_logprobs=2), 400, "top_logprobs"),
    (CHAT, _chat(logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    (CHAT, _chat(stream="yes"), 400, "stream"),
    (CHAT, _chat(stream=False, stream_options={"include_usage": True}), 400, "stream_options"),
    (CHAT, _chat(stream=True, stream_options=["include_usage"]), 400, "stream_options"),
    (CHAT, _chat(stream=True, stream_options={"include_usage": "yes"}), 400, "stream_options"),
    (CHAT, _chat(stream=True, stream_options={"continuous_usage_stats": True}), 400, "stream_options"),
    (CHAT, _chat(stream=True, n=2), 400, "n"),
    (COMPLETIONS, {"prompt": [1, 2], "stream": True}, 400, "stream"),
    (CHAT, _chat(logit_bias={"5": 10}), 400, "logit_bias"),
    (CHAT, _chat(presence_penalty=0.5), 400, "presence_penalty"),
    (CHAT, _chat(tools="bash"), 400, "tools"),
    (CHAT, _chat(tool_choice="required"), 400, "tool_choice"),
    (CHAT, _chat(chat_template_kwargs=["x"]), 400, "chat_template_kwargs"),
    (CHAT, _chat(chat_template_kwargs={"tokenize": True}), 400, "messages"),
    (CHAT, _chat(response_format={"type": "json_object"}), 400, "response_format"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [1, "a"]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [10**9]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [[1], [2]]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [1, 2], "logprobs": True}, 400, "logprobs"),
    (COMPLETIONS, {"prompt": [1, 2], "echo": True}, 400, "echo"),
    (COMPLETIONS, {"prompt": [1] * 32768, "max_tokens": 1}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [1] * 32000, "max_tokens": 1000}, 400, "max_tokens"),
    (TOKENS, _chat(), 400, "tokens"),
    (TOKENS, _chat(tokens=[]), 400, "tokens"),
    (TOKENS, _chat(tokens="1 2"), 400, "tokens"),
    (TOKENS, _chat(tokens=[1, "a"]), 400, "tokens"),
    (TOKENS, _chat(tokens=[True]), 400, "tokens"),
    (TOKENS, _chat(tokens=[-1]), 400, "tokens"),
    (TOKENS, _chat(tokens=[10**9]), 400, "tokens"),
    (TOKENS, _chat(tokens=[1] * 32768, max_tokens=1), 400, "tokens"),
    (TOKENS, _chat(tokens=[1] * 32000, max_tokens=1000), 400, "max_tokens"),
    (TOKENS, _chat(tokens=[1], messages=[]), 400, "messages"),
    (TOKENS, _chat(tokens=[1], n=2), 400, "n"),
    (TOKENS, _chat(tokens=[1], stream=True, stream_options=["include_usage"]), 400, "stream_options"),
    (TOKENS, _chat(tokens=[1], model="no/such-model"), 404, "model"),
    (TOKENIZE, {}, 400, "prompt"),
    (TOKENIZE, {"prompt": [1, 2]}, 400, "prompt"),
    (TOKENIZE, {"model": "no/such-model", "prompt": "x"}, 404, "model"),
    (TOKENIZE, {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens"),
    (TOKENIZE, {"messages": []}, 400, "messages"),
    (TOKENIZE, {"messages": MESSAGES, "tools": "bash"}, 400, "tools"),
    (TOKENIZE, {"messages": MESSAGES, "continue_final_message": True}, 400, "continue_final_message"),
    (TOKENIZE, {"messages": MESSAGES, "add_generation_prompt": "yes"}, 400, "add_generation_prompt"),
    (TOKENIZE, {"messages": MESSAGES, "chat_template": "{{ messages }}"}, 400, "chat_template"),
    (TOKENIZE, {"messages": MESSAGES, "chat_template_kwargs": {"tokenize": True}}, 400, "messages"),
    (DETOKENIZE, {}, 400, "tokens"),
    (DETOKENIZE, {"tokens": "abc"}, 400, "tokens"),
    (DETOKENIZE, {"tokens": [10**9]}, 400, "tokens"),
    (DETOKENIZE, {"model": "no/such-model", "tokens": [1]}, 404, "model"),
]


def _assert_error(status: int, body: dict, expected_status: int, param: str | None) -> None:
    assert status == expected_status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == expected_status and error["param"] == param and error["message"]
    assert error["type"] == {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowedError"}[status]


@pytest.mark.parametrize(("path", "body", "status", "param"), CASES, ids=[f"{c[0]}:{c[3]}" for c in CASES])
def test_bad_request_status_and_error_shape(http, path, body, status, param):
    _assert_error(*http.post(path, body), status, param)


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"text"'])
def test_malformed_json_is_400(http, raw):
    _assert_error(*http.post(CHAT, data=raw, headers={"Content-Type": "application/json"}), 400, None)


def test_unknown_route_and_method(http):
    _assert_error(*http.get("/v1/nothing"), 404, None)
    _assert_error(*http.get(CHAT), 405, None)


def test_server_still_serves_after_errors(http):
    for path, body, *_ in CASES[:5]:
        http.post(path, body)
    assert http.chat(**_chat(ignore_eos=True))["choices"][0]["finish_reason"] == "length"
