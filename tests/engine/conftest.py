"""Fixtures: the tiny model, a real engine served over HTTP on 127.0.0.1, a reference model.

``served`` is shared by the whole session and must keep its base weights;
tests that update weights or pause use ``fresh_served``. ``start_engine_process``
runs ``python -m harness_grpo.engine`` as a subprocess on a free port (``tests.support.processes``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from harness_grpo.engine import EmbeddedEngine, ServerThread
from harness_grpo.tiny_model import SERVED_MODEL_NAME, tiny_model_path
from tests.support.processes import EngineProcess, start_engine


class Http:
    """Blocking and concurrent HTTP calls to one base URL through aiohttp; answers ``(status, json)``."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    async def arequest(
        self, session: aiohttp.ClientSession, method: str, path: str, body: Any = None, **kwargs: Any
    ) -> tuple[int, Any]:
        if body is not None:
            kwargs["data"] = orjson.dumps(body)
            kwargs["headers"] = {"Content-Type": "application/json"}
        async with session.request(method, self.base_url + path, **kwargs) as resp:
            data = await resp.read()
            return resp.status, orjson.loads(data)

    def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        async def run() -> tuple[int, Any]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                return await self.arequest(session, method, path, body, **kwargs)

        return asyncio.run(run())

    def get(self, path: str) -> tuple[int, Any]:
        return self.request("GET", path)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        return self.request("POST", path, body, **kwargs)

    def chat(self, **body: Any) -> dict[str, Any]:
        """A successful chat completion (asserts 200)."""
        status, data = self.post("/v1/chat/completions", body)
        assert status == 200, data
        return data

    def post_many(self, path: str, bodies: list[dict[str, Any]]) -> list[tuple[int, Any]]:
        """POST all ``bodies`` concurrently."""

        async def run() -> list[tuple[int, Any]]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                return await asyncio.gather(*(self.arequest(session, "POST", path, b) for b in bodies))

        return asyncio.run(run())


def tool_call_request(http: Http, body: dict[str, Any], tries: int = 16) -> tuple[dict[str, Any], dict[str, Any]]:
    """``body`` with the first ``seed`` below ``tries`` whose chat answer is a tool call, and that answer.

    For tests of how a tool call is answered (streamed, token-in), not of whether the tiny model makes one at a
    given seed: which seeds do depends on the warm model's last bits, which a rebuild elsewhere may change.
    """
    for seed in range(tries):
        answer = http.chat(**{**body, "seed": seed})
        if answer["choices"][0]["finish_reason"] == "tool_calls":
            return {**body, "seed": seed}, answer
    pytest.fail(f"the warm model made no tool call in {tries} samples of {body['messages'][-1]['content']!r}")


def _teacher_forced_logprobs(
    model: torch.nn.Module, prompt_ids: list[int], token_ids: list[int], temperature: float
) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / scale, dim=-1).gather(1, torch.tensor(token_ids)[:, None]).squeeze(1)


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    return tiny_model_path()


@pytest.fixture(scope="session")
def tokenizer(tiny_path: Path):
    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def reference_model(tiny_path: Path) -> torch.nn.Module:
    """The tiny model, freshly loaded from the same path as the engine's."""
    return AutoModelForCausalLM.from_pretrained(tiny_path).eval()


@pytest.fixture(scope="session")
def teacher_forced() -> Callable[..., torch.Tensor]:
    """``teacher_forced(model, prompt_ids, token_ids, T)``: ``log_softmax(logits / T)`` of ``token_ids``
    from one forward pass over prompt + completion (T 0 means 1, as greedy logprobs)."""
    return _teacher_forced_logprobs


def _serve(tiny_path: Path) -> Iterator[tuple[EmbeddedEngine, Http]]:
    engine = EmbeddedEngine(tiny_path, served_model_name=SERVED_MODEL_NAME).start()
    server = ServerThread(engine)
    try:
        yield engine, Http(server.start())
    finally:
        server.stop()
        engine.stop()


@pytest.fixture(scope="session")
def served(tiny_path: Path) -> Iterator[tuple[EmbeddedEngine, Http]]:
    """A session-wide engine at base weights and its HTTP client; never pause it or change its weights."""
    yield from _serve(tiny_path)


@pytest.fixture
def engine(served: tuple[EmbeddedEngine, Http]) -> EmbeddedEngine:
    return served[0]


@pytest.fixture
def http(served: tuple[EmbeddedEngine, Http]) -> Http:
    return served[1]


@pytest.fixture
def fresh_served(tiny_path: Path) -> Iterator[tuple[EmbeddedEngine, Http]]:
    """An engine of its own, for tests that pause it or change its weights."""
    yield from _serve(tiny_path)


@pytest.fixture
def start_engine_process() -> Iterator:
    """Factory: ``start_engine_process(*cli_args) -> EngineProcess`` (``tests.support.processes``); all are
    stopped at teardown."""
    started: list[EngineProcess] = []

    def start(*args: str) -> EngineProcess:
        process = start_engine(*args)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture(scope="session")
def warm_served() -> Iterator[tuple[EmbeddedEngine, Http]]:
    """The warm-started tiny model, which answers tool prompts with a tool call, served over HTTP."""
    from harness_grpo.tiny_model.warm_start import warm_tiny_model_path

    yield from _serve(warm_tiny_model_path())
