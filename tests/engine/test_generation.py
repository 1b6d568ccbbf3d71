"""Generation through the real HTTP server: ids, text, processed logprobs, batching, reproducibility."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import torch

from harness_grpo.engine import EngineError
from harness_grpo.tiny_model import SERVED_MODEL_NAME
from tests.support.wait import until

TOL = 1e-4


def _chat_body(content: str, **extra) -> dict:
    return {
        "model": SERVED_MODEL_NAME,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 12,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        **extra,
    }


def _ids_and_logprobs(response: dict) -> tuple[list[int], list[int], list[float]]:
    choice = response["choices"][0]
    entries = choice["logprobs"]["content"]
    assert [e["token"] for e in entries] == [f"token_id:{t}" for t in choice["token_ids"]]
    return response["prompt_token_ids"], choice["token_ids"], [e["logprob"] for e in entries]


@pytest.fixture
def max_error(reference_model, teacher_forced):
    """Largest gap between returned logprobs and a teacher-forced pass of the reference model."""

    def gap(prompt_ids, token_ids, logprobs, temperature) -> float:
        expected = teacher_forced(reference_model, prompt_ids, token_ids, temperature)
        return float((expected - torch.tensor(logprobs)).abs().max())

    return gap


def test_returned_ids_decode_to_returned_text(http, tokenizer):
    response = http.chat(**_chat_body("Write a function.", temperature=1.0, seed=3))
    choice = response["choices"][0]
    assert choice["message"]["content"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert choice["message"]["tool_calls"] == []
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 12
    assert response["usage"] == {
        "prompt_tokens": len(response["prompt_token_ids"]),
        "completion_tokens": 12,
        "total_tokens": len(response["prompt_token_ids"]) + 12,
        "prompt_tokens_details": None,
    }
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a function."}], add_generation_prompt=True, tokenize=False
    )
    assert response["prompt_token_ids"] == tokenizer.encode(rendered, add_special_tokens=False)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_logprobs_match_teacher_forced_pass(http, max_error, temperature):
    response = http.chat(**_chat_body("def parse(", temperature=temperature, seed=1, max_tokens=16))
    prompt_ids, token_ids, logprobs = _ids_and_logprobs(response)
    assert max_error(prompt_ids, token_ids, logprobs, temperature) < TOL


def test_greedy_logprobs_are_plain_log_softmax(http, max_error):
    response = http.chat(**_chat_body("import os", temperature=0))
    prompt_ids, token_ids, logprobs = _ids_and_logprobs(response)
    assert max_error(prompt_ids, token_ids, logprobs, 1.0) < TOL


def test_concurrent_requests_of_different_lengths_batch_and_match(fresh_served, max_error):
    """Requests paused at the door enter one batch together; one more joins while it decodes."""
    contents = ["x", "def f():\n    return 1\n" * 3, "import sys\n" * 20, "class A:\n    pass\n" * 9]
    bodies = [
        _chat_body(c, temperature=0.7 if i % 2 else 1.0, seed=i, max_tokens=8 + 6 * i) for i, c in enumerate(contents)
    ]
    late = _chat_body("for i in range(3):", temperature=1.0, seed=9, max_tokens=10)
    engine, http = fresh_served  # its own engine: this test pauses it and reads its peak batch size
    steps_before = engine.stats.decode_steps

    async def run() -> list[tuple[int, dict]]:
        async with aiohttp.ClientSession() as session:
            engine.pause()
            try:
                tasks = [asyncio.create_task(http.arequest(session, "POST", "/v1/chat/completions", b)) for b in bodies]
                # all four queued behind the pause
                await until(lambda: engine.num_waiting == len(bodies), "requests did not reach the engine")
            finally:
                engine.resume()
            await until(lambda: engine.stats.decode_steps >= steps_before + 3, "no decode steps")
            tasks.append(asyncio.create_task(http.arequest(session, "POST", "/v1/chat/completions", late)))
            return await asyncio.gather(*tasks)

    results = asyncio.run(run())
    assert engine.stats.peak_batch_size >= len(bodies)
    for body, (status, response) in zip([*bodies, late], results, strict=True):
        assert status == 200, response
        prompt_ids, token_ids, logprobs = _ids_and_logprobs(response)
        assert len(token_ids) == body["max_tokens"]
        assert max_error(prompt_ids, token_ids, logprobs, body["temperature"]) < TOL


def test_top_k_top_p_logprobs_are_of_the_filtered_distribution(http, reference_model):
    temperature, top_k, top_p = 0.8, 40, 0.5
    response = http.chat(
        **_chat_body("while True:", temperature=temperature, top_k=top_k, top_p=top_p, seed=5, max_tokens=10)
    )
    prompt_ids, token_ids, logprobs = _ids_and_logprobs(response)
    with torch.inference_mode():
        logits = reference_model(input_ids=torch.tensor([prompt_ids + token_ids])).logits[0, len(prompt_ids) - 1 : -1]
    for position, (token, logprob) in enumerate(zip(token_ids, logprobs, strict=True)):
        probs = torch.softmax(logits[position] / temperature, dim=-1)
        top = torch.topk(probs, top_k)
        kept = top.values / top.values.sum()
        # nucleus: smallest prefix of the sorted top-k whose mass reaches top_p
        n_keep = int((torch.cumsum(kept, 0) < top_p).sum()) + 1
        nucleus = dict(zip(top.indices[:n_keep].tolist(), (kept[:n_keep] / kept[:n_keep].sum()).tolist(), strict=True))
        assert token in nucleus
        assert abs(logprob - float(torch.log(torch.tensor(nucleus[token])))) < TOL


def test_greedy_is_reproducible(http):
    first = http.chat(**_chat_body("print(", temperature=0, max_tokens=16))
    second = http.chat(**_chat_body("print(", temperature=0, max_tokens=16))
    assert first["choices"][0]["token_ids"] == second["choices"][0]["token_ids"]


def test_seeded_sampling_is_reproducible_alone_and_batched(http):
    body = _chat_body("async def main():", temperature=1.0, seed=1234, max_tokens=16)
    alone = http.chat(**body)["choices"][0]["token_ids"]
    others = [_chat_body("x" * (i + 1), temperature=1.0, seed=i, max_tokens=20) for i in range(3)]
    batched = http.post_many("/v1/chat/completions", [others[0], body, *others[1:]])
    assert all(status == 200 for status, _ in batched)
    assert batched[1][1]["choices"][0]["token_ids"] == alone
    other_seed = http.chat(**{**body, "seed": 4321})["choices"][0]["token_ids"]
    assert other_seed != alone


def test_stop_string_is_cut_from_text(http, tokenizer):
    body = _chat_body("import re", temperature=0, max_tokens=16)
    full = http.chat(**body)["choices"][0]
    text = full["message"]["content"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    stopped = http.chat(**{**body, "stop": [stop]})["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop
    assert stopped["message"]["content"] == text[: text.index(stop)]
    ids = stopped["token_ids"]
    assert ids == full["token_ids"][: len(ids)]
    assert stop in tokenizer.decode(ids) and stop not in tokenizer.decode(ids[:-1])


def test_logprobs_only_with_top_logprobs(http):
    without = http.chat(**{**_chat_body("a", max_tokens=2), "top_logprobs": None})
    assert without["choices"][0]["logprobs"] is None
    with_top = http.chat(**_chat_body("a", max_tokens=2, top_logprobs=3, temperature=1.0))
    for entry in with_top["choices"][0]["logprobs"]["content"]:
        top = entry["top_logprobs"]
        assert len(top) == 3 and top[0]["logprob"] >= top[1]["logprob"] >= top[2]["logprob"]
        assert all(t["token"].startswith("token_id:") for t in top)
    plain = http.chat(model=SERVED_MODEL_NAME, messages=[{"role": "user", "content": "a"}], max_tokens=2)
    assert plain["choices"][0]["logprobs"] is None and plain["choices"][0]["token_ids"] is None
    assert plain["prompt_token_ids"] is None


def test_tools_are_rendered_into_the_prompt(http, tokenizer):
    tool = {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
    response = http.chat(**_chat_body("list files", tools=[tool], tool_choice="auto", max_tokens=2))
    prompt = tokenizer.decode(response["prompt_token_ids"])
    assert json.dumps(tool) in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_chat_template_kwargs_reach_the_template(http, tokenizer):
    response = http.chat(**_chat_body("hi", chat_template_kwargs={"enable_thinking": False}, max_tokens=2))
    assert tokenizer.decode(response["prompt_token_ids"]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_token_in_completions(http, tokenizer, max_error):
    prompt = tokenizer.encode("def main():\n    ")
    status, response = http.post(
        "/v1/completions",
        {
            "model": SERVED_MODEL_NAME,
            "prompt": prompt,
            "max_tokens": 8,
            "temperature": 0.9,
            "seed": 2,
            "logprobs": 0,
            "return_token_ids": True,
        },
    )
    assert status == 200, response
    choice = response["choices"][0]
    assert choice["prompt_token_ids"] == prompt
    assert choice["text"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    logprobs = choice["logprobs"]["token_logprobs"]
    assert max_error(prompt, choice["token_ids"], logprobs, 0.9) < TOL


def test_models_and_health(http, engine):
    status, models = http.get("/v1/models")
    assert status == 200
    (card,) = models["data"]
    assert card["id"] == SERVED_MODEL_NAME and card["max_model_len"] == engine.max_model_len == 32768
    status, health = http.get("/health")
    assert status == 200 and health["status"] == "ok" and health["weight_version"] == card["weight_version"]


def test_client_disconnect_cancels_generation(fresh_served, monkeypatch):
    engine, http = fresh_served  # its own engine: the test drains it with pause(mode="wait")
    futures = []
    submit = engine.submit

    def recording_submit(prompt_ids, params):
        futures.append(submit(prompt_ids, params))
        return futures[-1]

    monkeypatch.setattr(engine, "submit", recording_submit)
    # Far more tokens than the engine decodes within the deadlines below: only the disconnect ends it.
    body = _chat_body("x", max_tokens=32000, ignore_eos=True)

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            request = asyncio.create_task(http.arequest(session, "POST", "/v1/chat/completions", body))
            await until(lambda: futures, "the request did not reach the engine")
            await until(lambda: engine.stats.generated_tokens > 0, "no token decoded")
            request.cancel()  # the client gives up
            with pytest.raises(asyncio.CancelledError):
                await request
        await until(lambda: futures[0].cancelled(), "the engine request was not cancelled when the client left")

    asyncio.run(run())
    try:  # returns once no request is prefilling or decoding
        engine.pause(mode="wait", timeout_s=30)
    except EngineError as exc:
        pytest.fail(f"generation went on after the client left: {exc}")
