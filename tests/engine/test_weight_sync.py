"""Weight updates and pause/resume through the HTTP control routes and in-process."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import torch
from safetensors.torch import save
from transformers import AutoModelForCausalLM

from harness_grpo.engine import EngineError
from harness_grpo.tiny_model import SERVED_MODEL_NAME
from tests.support.wait import until

OCTET = {"Content-Type": "application/octet-stream"}


def _body(**extra) -> dict:
    return {
        "model": SERVED_MODEL_NAME,
        "messages": [{"role": "user", "content": "def update():"}],
        "max_tokens": 12,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        **extra,
    }


@pytest.fixture
def perturbed_model(tiny_path) -> torch.nn.Module:
    """The tiny model with seeded noise on every parameter (tied weights stay tied)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.5 * param.std() * torch.randn(param.shape, generator=generator))
    return model


async def _compute_thread_round_trips(http, session: aiohttp.ClientSession) -> None:
    """Two ``POST /pause`` (already paused: no change). Each returns once the compute thread has run a
    no-op command between two iterations, so by the time the second returns, whatever the iteration
    that ran the first admitted, prefilled or decoded has been counted: a paused engine that still
    worked would show it in ``num_waiting`` and ``stats``."""
    for _ in range(2):
        status, health = await http.arequest(session, "POST", "/pause")
        assert status == 200 and health["paused"] is True, health


def _safetensors(model: torch.nn.Module) -> bytes:
    return save({name: tensor.clone() for name, tensor in model.state_dict().items()})


def test_http_weight_update_changes_output_and_logprobs_follow(fresh_served, perturbed_model, teacher_forced):
    _, http = fresh_served
    before = http.chat(**_body(temperature=0))["choices"][0]["token_ids"]

    status, answer = http.post("/update_weights", data=_safetensors(perturbed_model), headers=OCTET)
    assert status == 200 and answer == {"weight_version": 1}
    assert http.get("/health")[1]["weight_version"] == 1
    assert http.get("/v1/models")[1]["data"][0]["weight_version"] == 1

    after = http.chat(**_body(temperature=0))["choices"][0]["token_ids"]
    assert after != before
    sampled = http.chat(**_body(temperature=0.8, seed=7))
    prompt_ids, token_ids = sampled["prompt_token_ids"], sampled["choices"][0]["token_ids"]
    logprobs = torch.tensor([e["logprob"] for e in sampled["choices"][0]["logprobs"]["content"]])
    expected = teacher_forced(perturbed_model, prompt_ids, token_ids, 0.8)
    assert float((expected - logprobs).abs().max()) < 1e-4


def test_versions_are_monotonic_and_bad_updates_are_refused(fresh_served, perturbed_model):
    engine, http = fresh_served
    state = {name: t.clone() for name, t in perturbed_model.state_dict().items()}
    assert http.post("/update_weights?version=5", data=save(state), headers=OCTET) == (200, {"weight_version": 5})
    status, error = http.post("/update_weights?version=3", data=save(state), headers=OCTET)
    assert status == 400 and error["error"]["param"] == "version"
    status, error = http.post("/update_weights?version=3&rebase=yes", data=save(state), headers=OCTET)
    assert status == 400 and error["error"]["param"] == "rebase"
    # A new trainer's first push restarts the numbering.
    assert http.post("/update_weights?version=1&rebase=true", data=save(state), headers=OCTET) == (
        200,
        {"weight_version": 1},
    )
    assert http.post("/update_weights?version=5", data=save(state), headers=OCTET) == (200, {"weight_version": 5})
    bad_bodies = [
        b"not safetensors",
        save({"no.such.weight": torch.zeros(2)}),
        save({"model.norm.weight": torch.zeros(3)}),
    ]
    for data in bad_bodies:
        status, error = http.post("/update_weights", data=data, headers=OCTET)
        assert status == 400 and error["error"]["type"] == "BadRequestError", error
    assert http.post("/update_weights", {"update_info": {}})[0] == 400
    # A partial update is allowed and bumps the version; the in-process call shares the counter.
    assert engine.update_weights({"model.norm.weight": state["model.norm.weight"]}) == 6
    with pytest.raises(EngineError):
        engine.update_weights({"model.norm.weight": torch.zeros(3)})
    assert http.get("/health")[1]["weight_version"] == 6


def test_request_sent_while_paused_completes_after_resume(fresh_served):
    engine, http = fresh_served

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            assert (await http.arequest(session, "POST", "/pause"))[1]["paused"] is True
            assert (await http.arequest(session, "GET", "/is_paused"))[1] == {"is_paused": True}
            task = asyncio.create_task(http.arequest(session, "POST", "/v1/chat/completions", _body(ignore_eos=True)))
            await until(lambda: engine.num_waiting == 1, "the request did not reach the engine")  # held at the door
            await _compute_thread_round_trips(http, session)
            assert engine.num_waiting == 1 and engine.stats.prefill_tokens == 0
            assert not task.done()
            assert (await http.arequest(session, "POST", "/resume"))[1]["paused"] is False
            status, response = await asyncio.wait_for(task, 30)
            assert status == 200 and len(response["choices"][0]["token_ids"]) == 12

    asyncio.run(run())


def test_pause_keep_freezes_in_flight_request_across_an_update(fresh_served, perturbed_model):
    engine, http = fresh_served

    async def run() -> tuple[int, dict]:
        async with aiohttp.ClientSession() as session:
            task = asyncio.create_task(
                http.arequest(session, "POST", "/v1/chat/completions", _body(max_tokens=400, ignore_eos=True))
            )
            await until(lambda: engine.stats.generated_tokens > 0, "no token decoded")
            status, health = await http.arequest(session, "POST", "/pause?mode=keep")
            assert status == 200 and health["paused"] is True, health
            frozen = engine.stats.generated_tokens
            status, answer = await http.arequest(
                session, "POST", "/update_weights", data=_safetensors(perturbed_model), headers=OCTET
            )
            assert (status, answer) == (200, {"weight_version": 1})
            await _compute_thread_round_trips(http, session)
            assert engine.stats.generated_tokens == frozen and not task.done()
            await http.arequest(session, "POST", "/resume")
            return await asyncio.wait_for(task, 60)

    status, response = asyncio.run(run())
    assert status == 200 and len(response["choices"][0]["token_ids"]) == 400


def test_pause_wait_drains_in_flight_requests(fresh_served):
    engine, http = fresh_served

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            body = _body(max_tokens=200, ignore_eos=True)
            task = asyncio.create_task(http.arequest(session, "POST", "/v1/chat/completions", body))
            await until(lambda: engine.stats.generated_tokens > 0, "no token decoded")
            status, health = await http.arequest(session, "POST", "/pause?mode=wait")
            assert status == 200 and health["paused"] is True
            assert engine.stats.generated_tokens == 200  # the pause answered after the request was drained
            status, response = await asyncio.wait_for(task, 5)
            assert status == 200 and len(response["choices"][0]["token_ids"]) == 200
            status, error = await http.arequest(session, "POST", "/pause?mode=abort")
            assert status == 400 and error["error"]["param"] == "mode"
            await http.arequest(session, "POST", "/resume")

    asyncio.run(run())
