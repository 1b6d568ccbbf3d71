"""Token-in chat (prime-rl's /v1/chat/completions/tokens): sampled from exactly ``tokens``, answered as the chat
route answers."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from bench.fake_vllm import FakeVLLM
from harness_grpo.tiny_model import SERVED_MODEL_NAME
from tests.engine.conftest import Http, tool_call_request
from tests.engine.streams import assemble, chunks_of, expected, stream_events, without_call_ids

CHAT = "/v1/chat/completions"
TOKENS = "/v1/chat/completions/tokens"
BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}


def _body(content: str = "def tokens():", **extra: Any) -> dict[str, Any]:
    return {
        "model": SERVED_MODEL_NAME,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 16,
        "temperature": 1.0,
        "seed": 5,
        "logprobs": True,
        "top_logprobs": 2,
        "return_token_ids": True,
        **extra,
    }


def _post(http: Http, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, data = http.post(path, body)
    assert status == 200, data
    return data


def _same_bytes(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal as serialised, key order included, once ``id`` and ``created`` (fresh per response) are set aside."""
    keep = lambda r: {k: v for k, v in r.items() if k not in ("id", "created")}  # noqa: E731
    return orjson.dumps(keep(a)) == orjson.dumps(keep(b))


REQUESTS = {
    "sampled": _body(),
    "greedy": _body("import os", temperature=0, max_tokens=24),
    "stop string": _body(temperature=0, stop=["\n"], max_tokens=24),
    "tools offered": _body("list files", tools=[BASH], tool_choice="auto"),
    "no ids or logprobs": _body("x", logprobs=False, top_logprobs=None, return_token_ids=False, seed=9),
}


@pytest.mark.parametrize("body", REQUESTS.values(), ids=REQUESTS.keys())
def test_tokens_from_a_chat_answer_as_that_chat(http, body):
    want = _post(http, CHAT, body)
    tokens = _post(http, "/tokenize", {k: body[k] for k in ("messages", "tools") if k in body})["tokens"]
    got = _post(http, TOKENS, {**body, "tokens": tokens})
    assert _same_bytes(got, want)


def test_a_streamed_token_in_chat_assembles_to_the_chat(http):
    body = {**_body(max_tokens=24), "stream_options": {"include_usage": True}}
    tokens = _post(http, "/tokenize", {"messages": body["messages"]})["tokens"]
    events = stream_events(http, {**body, "tokens": tokens}, TOKENS)
    chunks = chunks_of(events)
    assert assemble(chunks) == assemble(chunks_of(stream_events(http, body)))
    plain = {k: v for k, v in body.items() if k != "stream_options"}
    assert assemble(chunks) == expected(_post(http, TOKENS, {**plain, "tokens": tokens}))


def test_the_prompt_is_the_tokens_never_the_messages(http, tokenizer):
    """Messages are validated, not rendered: other messages give the same answer, and any ids are the prompt."""
    want = _post(http, CHAT, _body())
    tokens = want["prompt_token_ids"]
    assert _same_bytes(_post(http, TOKENS, {**_body("unrelated"), "tokens": tokens}), want)
    reserialised = tokenizer.encode('<|im_start|>user\n{"command":"pytest"}<|im_end|>\n<|im_start|>assistant\n')
    got = _post(http, TOKENS, {**_body(), "tokens": reserialised})
    assert got["prompt_token_ids"] == reserialised and got["usage"]["prompt_tokens"] == len(reserialised)


def test_a_tool_call_parses_as_from_the_chat(warm_served):
    from harness_grpo.tiny_model.synthetic import heldout_prompts

    _, http = warm_served
    (prompt,) = heldout_prompts(1, 3, system_chars=0)
    body, want = tool_call_request(http, {**_body(max_tokens=200, temperature=0.7), **prompt})
    got = _post(http, TOKENS, {**body, "tokens": want["prompt_token_ids"]})
    assert without_call_ids(expected(got)) == without_call_ids(expected(want))
    assert got["choices"][0]["message"]["tool_calls"][0]["id"] != want["choices"][0]["message"]["tool_calls"][0]["id"]
    streamed = assemble(chunks_of(stream_events(http, {**body, "tokens": want["prompt_token_ids"]}, TOKENS)))
    assert without_call_ids(streamed) == without_call_ids({**expected(want), "usage": None})


async def _probe(base_url: str) -> int:
    """The proxy's capability probe: the status of an empty body sent to the token-in route."""
    async with aiohttp.ClientSession() as session, session.post(base_url + TOKENS, json={}) as resp:
        return resp.status


def test_probe_tells_an_engine_with_the_route_from_one_without(http, engine):
    """An empty body is a 400 on ``tokens`` here, with nothing generated; a 404 where the route is missing."""
    before = engine.stats.generated_tokens
    status, data = http.post(TOKENS, {})
    assert status == 400 and data["error"]["param"] == "tokens"
    assert asyncio.run(_probe(http.base_url)) == 400
    assert engine.stats.generated_tokens == before

    async def probe_route_less_engine() -> int:
        fake = FakeVLLM(token_route=False)  # vLLM's chat routes without prime-rl's token-in route
        port = await fake.start()
        try:
            return await _probe(f"http://127.0.0.1:{port}")
        finally:
            await fake.stop()

    assert asyncio.run(probe_route_less_engine()) == 404
