"""Weight sync: in-process and HTTP to the real embedded engine; vLLM's NCCL choreography against a stand-in.

The embedded tests use the real engine (in-process, and its real HTTP server on 127.0.0.1). vLLM and
NCCL need a GPU, so the vLLM tests run the real ``VLLMNCCLWeightSync`` against
``StandInVLLMControlPlane`` — a STAND-IN for vLLM's GPU-only control routes — and a ``FakeTransport``
in place of NCCL; ``bench/vllm_weight_sync_gpu.py`` is the check against the real thing.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.abc
import json
import os
import re
import socket
import sys
import threading
import time
import types
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from aiohttp import web
from torch import nn
from transformers import AutoModelForCausalLM

from harness_grpo.engine import EmbeddedEngine, EngineError, SamplingParams, ServerThread
from harness_grpo.tiny_model import SERVED_MODEL_NAME, tiny_model_path
from harness_grpo.weight_transports import (
    EmbeddedWeightSync,
    HTTPEmbeddedWeightSync,
    NCCLTransport,
    VLLMNCCLWeightSync,
    WeightMetadata,
    WeightSync,
    WeightSyncError,
    params_for_sync,
    sync_name,
    weight_sync_for,
)

PROMPT = [{"role": "user", "content": "def update():"}]


# ----- fixtures: the tiny model, a perturbed trainer copy, a real engine ------------------------------


def perturb(model: nn.Module, seed: int, scale: float = 0.5) -> nn.Module:
    """Seeded noise on every parameter (tied weights stay tied)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(scale * param.std() * torch.randn(param.shape, generator=generator))
    return model


@pytest.fixture(scope="module")
def tiny_path():
    return tiny_model_path()


@pytest.fixture
def trainer_model(tiny_path) -> nn.Module:
    """The tiny model as a trainer would hold it, moved away from the engine's weights."""
    return perturb(AutoModelForCausalLM.from_pretrained(tiny_path), seed=0)


@pytest.fixture
def engine(tiny_path) -> Iterator[EmbeddedEngine]:
    engine = EmbeddedEngine(tiny_path, served_model_name=SERVED_MODEL_NAME).start()
    yield engine
    engine.stop()


@pytest.fixture
def engine_url(engine) -> Iterator[str]:
    server = ServerThread(engine)
    yield server.start()
    server.stop()


def greedy_ids(engine: EmbeddedEngine) -> list[int]:
    return engine.generate(engine.render_chat(PROMPT), SamplingParams(max_tokens=16, temperature=0)).token_ids


def http_greedy_ids(url: str) -> list[int]:
    body = {
        "model": SERVED_MODEL_NAME,
        "messages": PROMPT,
        "max_tokens": 16,
        "temperature": 0,
        "return_token_ids": True,
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["choices"][0]["token_ids"]


def http_get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def assert_engine_holds(engine: EmbeddedEngine, model: nn.Module) -> None:
    served, trained = engine.model.state_dict(), model.state_dict()
    assert served.keys() == trained.keys()
    for name, tensor in trained.items():
        assert torch.equal(served[name], tensor), name


# ----- in-process to the embedded engine ------------------------------------------------------------


def test_embedded_sync_changes_greedy_output_and_copies_the_weights(engine, trainer_model):
    before = greedy_ids(engine)
    sync = EmbeddedWeightSync(engine, timeout_s=60)
    assert isinstance(sync, WeightSync) and sync.version == 0

    assert sync.sync(trainer_model) == 1
    assert sync.version == engine.weight_version == 1 and not engine.paused
    assert_engine_holds(engine, trainer_model)
    assert greedy_ids(engine) != before

    # The engine got copies: training on after the sync does not leak into the served weights.
    with torch.no_grad():
        trainer_model.model.norm.weight.add_(1.0)
    assert not torch.equal(engine.model.model.norm.weight, trainer_model.model.norm.weight)

    perturb(trainer_model, seed=1)
    assert sync.sync(trainer_model) == 2 and engine.weight_version == 2
    assert_engine_holds(engine, trainer_model)
    sync.close()
    with pytest.raises(WeightSyncError, match="closed"):
        sync.sync(trainer_model)


def test_embedded_sync_resumes_after_a_failed_update_and_keeps_the_version(engine, trainer_model, monkeypatch):
    sync = EmbeddedWeightSync(engine, timeout_s=30)

    def broken_update(*args, **kwargs):
        assert engine.paused
        raise EngineError(500, "disk on fire")

    monkeypatch.setattr(engine, "update_weights", broken_update)
    with pytest.raises(WeightSyncError, match="disk on fire"):
        sync.sync(trainer_model)
    assert not engine.paused and sync.version == 0 and engine.weight_version == 0

    # Any other error is a WeightSyncError too (other ranks learn of it; they would wait in a collective).
    def stuck_update(*args, **kwargs):
        raise TimeoutError("compute thread did not answer within 30 s")

    monkeypatch.setattr(engine, "update_weights", stuck_update)
    with pytest.raises(WeightSyncError, match="the weight update failed: TimeoutError: compute thread") as raised:
        sync.sync(trainer_model)
    assert isinstance(raised.value.__cause__, TimeoutError)
    assert not engine.paused and sync.version == 0
    monkeypatch.undo()

    # Names the engine's model does not have are refused before the engine is paused.
    pauses = []
    monkeypatch.setattr(engine, "pause", lambda *a, **k: pauses.append(a))
    with pytest.raises(WeightSyncError, match="does not have"):
        sync.sync(nn.Linear(2, 2))
    assert pauses == [] and sync.version == 0


def test_wrapper_prefixes_are_stripped():
    assert sync_name("module.model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert sync_name("_orig_mod.module.lm_head.weight") == "lm_head.weight"
    assert sync_name("model.layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.mlp.w") == "model.layers.0.mlp.w"
    assert sync_name("model.submodule.weight") == "model.submodule.weight"


# ----- HTTP to the embedded engine's real server --------------------------------------------------


def test_http_sync_against_the_real_engine_server(engine, engine_url, trainer_model):
    before = http_greedy_ids(engine_url)
    with HTTPEmbeddedWeightSync(engine_url, timeout_s=30) as sync:
        assert sync.sync(trainer_model) == 1
        assert http_get(engine_url + "/health") == {"status": "ok", "weight_version": 1, "paused": False}
        assert_engine_holds(engine, trainer_model)
        assert http_greedy_ids(engine_url) != before

        perturb(trainer_model, seed=2)
        assert sync.sync(trainer_model) == 2 and sync.version == 2
        assert http_get(engine_url + "/health")["weight_version"] == 2
        assert_engine_holds(engine, trainer_model)


def test_a_second_http_transport_restarts_the_numbering_of_an_engine_server(engine, engine_url, trainer_model):
    """A new run's transport pushes version 1 to an engine server an earlier run left at version 2."""
    with HTTPEmbeddedWeightSync(engine_url, timeout_s=30) as first:
        first.sync(trainer_model)
        first.sync(trainer_model)
    assert http_get(engine_url + "/health")["weight_version"] == 2
    perturb(trainer_model, seed=3)
    with HTTPEmbeddedWeightSync(engine_url, timeout_s=30) as second:
        assert second.sync(trainer_model) == 1
        assert second.sync(trainer_model) == 2
    assert http_get(engine_url + "/health")["weight_version"] == 2
    assert_engine_holds(engine, trainer_model)


def test_http_error_response_raises_and_resumes_the_engine(engine, engine_url, trainer_model, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine, "update_weights", crash)  # the real server turns this into a 500
    sync = HTTPEmbeddedWeightSync(engine_url, timeout_s=30)
    with pytest.raises(WeightSyncError, match="answered HTTP 500") as raised:
        sync.sync(trainer_model)
    assert raised.value.status == 500 and "cleanup: resumed" in str(raised.value)
    assert not engine.paused and sync.version == 0 and engine.weight_version == 0

    # Past a transport's first push (which restarts the numbering), a version the engine already holds is
    # refused by the engine (400), not silently overwritten.
    monkeypatch.undo()
    assert sync.sync(trainer_model) == 1
    with HTTPEmbeddedWeightSync(engine_url, timeout_s=30) as second:
        assert second.sync(trainer_model) == 1
        assert second.sync(trainer_model) == 2
    with pytest.raises(WeightSyncError, match="HTTP 400"):
        sync.sync(trainer_model)
    assert not engine.paused and engine.weight_version == 2
    sync.close()


class SilentServer:
    """A TCP server on 127.0.0.1 that accepts connections, reads requests, and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received = bytearray()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self.received += data

    def request_lines(self) -> list[str]:
        with self._lock:
            text = self.received.decode("latin-1")
        return [line for line in text.split("\r\n") if line.startswith(("GET ", "POST "))]

    def close(self) -> None:
        self.sock.close()
        for conn in self._conns:
            conn.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def test_http_sync_times_out_against_an_engine_that_never_answers(silent_server, trainer_model):
    sync = HTTPEmbeddedWeightSync(silent_server.url, timeout_s=1.0, cleanup_timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"POST /pause: no answer within 1.0s") as raised:
        sync.sync(trainer_model)
    elapsed = time.monotonic() - start
    assert 1.0 <= elapsed < 1.0 + 0.5 + 4.0, elapsed  # the pause's limit plus one bounded resume attempt (+ slack)
    assert "resume failed" in str(raised.value) and raised.value.status is None
    assert silent_server.request_lines() == ["POST /pause?mode=keep HTTP/1.1", "POST /resume HTTP/1.1"]
    assert sync.version == 0
    sync.close()


def test_vllm_sync_times_out_against_a_server_that_never_answers(silent_server):
    sync = VLLMNCCLWeightSync(silent_server.url, transport=FakeTransport(), timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"GET /get_world_size: no answer within 0\.5s"):
        sync.sync(nn.Linear(2, 2))
    assert time.monotonic() - start < 0.5 + 4.0  # bounded: the limit plus slack for a loaded machine
    sync.close()


# ----- vLLM's NCCL choreography against a stand-in control plane ----------------------------------


class FakeTransport:
    """Stands in for NCCL (``NCCLTransport``): records init, collects what is sent.

    It plays its half of the rendezvous with ``StandInVLLMControlPlane`` the way NCCL would: ``init``
    returns only once the engine side was asked to init, ``send`` only streams once the engine side
    is receiving (``/update_weights`` in flight). ``stall_send`` makes ``send`` block until closed.
    """

    def __init__(self, stall_send: bool = False) -> None:
        self.plane: StandInVLLMControlPlane | None = None
        self.stall_send = stall_send
        self.init_args: list[tuple[str, int, int]] = []
        self.init_called = threading.Event()
        self.sent: list[list[tuple[str, torch.Tensor]]] = []
        self.sent_event = threading.Event()
        self.closed = threading.Event()

    def init(self, master_address: str, master_port: int, world_size: int) -> None:
        self.init_args.append((master_address, master_port, world_size))
        self.init_called.set()
        assert self.plane is not None
        if not self.plane.init_received.wait(10):
            raise RuntimeError("the engine side never joined")

    def send(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        assert self.plane is not None
        if self.stall_send:
            self.closed.wait()
            return
        if not self.plane.update_received.wait(10):
            raise RuntimeError("no receiver: /update_weights was not in flight")
        self.plane.update_received.clear()
        self.sent.append([(name, tensor.clone()) for name, tensor in named_tensors])
        self.sent_event.set()

    def close(self) -> None:
        self.closed.set()


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    body: Any


class StandInVLLMControlPlane:
    """STAND-IN for vLLM's weight-sync control plane, which runs only on a GPU (vLLM 0.22-0.25 with
    ``VLLM_SERVER_DEV_MODE=1``; routes in vllm ``vllm/entrypoints/serve/dev/rlhf/api_router.py``).

    Same paths, methods and response bodies; records every call in order. It plays the engine side of
    the NCCL rendezvous with a ``FakeTransport``: ``/init_weight_transfer_engine`` answers once the
    transport's init was called, ``/update_weights`` once the transport has sent, and it checks what
    was sent against the ``update_info`` (as vLLM's packed consumer would fail on a mismatch).
    ``stall`` holds paths that never answer, ``fail`` maps paths to an error status, ``answers`` to
    another 200 body.
    """

    def __init__(self, transport: FakeTransport, world_size: int = 2) -> None:
        self.transport = transport
        transport.plane = self
        self.world_size = world_size
        self.calls: list[Call] = []
        self.stall: set[str] = set()
        self.fail: dict[str, int] = {}
        self.answers: dict[str, Any] = {}
        self.init_received = threading.Event()
        self.update_received = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self.url = ""

    def start(self) -> StandInVLLMControlPlane:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def paths(self) -> list[str]:
        return [call.path for call in self.calls]

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_get("/get_world_size", self._handle)
        app.router.add_get("/v1/models", self._handle)
        for path in ("/init_weight_transfer_engine", "/pause", "/resume", "/start_weight_update"):
            app.router.add_post(path, self._handle)
        app.router.add_post("/update_weights", self._handle)
        app.router.add_post("/finish_weight_update", self._handle)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    @staticmethod
    async def _wait(event: threading.Event, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while not event.is_set():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        path = request.path
        self.calls.append(Call(request.method, path, dict(request.query), body))
        if path in self.stall:
            await asyncio.sleep(3600)
        if path in self.fail:
            return web.json_response({"error": f"stand-in failure on {path}"}, status=self.fail[path])
        if path in self.answers:
            return web.json_response(self.answers[path])
        if path == "/get_world_size":
            return web.json_response({"world_size": self.world_size})
        if path == "/v1/models":  # vLLM's shape (vllm/entrypoints/openai/protocol.py ModelCard)
            card = {"id": "Qwen/Qwen3-0.6B", "object": "model", "created": 0, "owned_by": "vllm"}
            card |= {"root": "Qwen/Qwen3-0.6B", "parent": None, "max_model_len": 40960, "permission": []}
            return web.json_response({"object": "list", "data": [card]})
        if path == "/init_weight_transfer_engine":
            self.init_received.set()
            if not await self._wait(self.transport.init_called):
                return web.json_response({"error": "trainer never joined"}, status=500)
            return web.json_response({"message": "Weight transfer initialized"})
        if path == "/update_weights":
            self.update_received.set()
            if not await self._wait(self.transport.sent_event):
                return web.json_response({"error": "no broadcast arrived"}, status=500)
            self.transport.sent_event.clear()
            info = body["update_info"]
            got = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in self.transport.sent[-1]]
            if got != list(zip(info["names"], info["dtype_names"], info["shapes"], strict=True)):
                return web.json_response({"error": "broadcast does not match update_info"}, status=500)
            return web.json_response({"message": "Weights updated"})
        messages = {
            "/pause": {"status": "paused"},
            "/resume": {"status": "resumed"},
            "/start_weight_update": {"message": "Weight update started"},
            "/finish_weight_update": {"message": "Weight update finished"},
        }
        return web.json_response(messages[path])


class Wrapped(nn.Module):
    """A toy trainer model behind a DDP-style ``module.`` wrapper."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 3, bias=False))


@pytest.fixture
def transport() -> Iterator[FakeTransport]:
    transport = FakeTransport()
    yield transport
    transport.close()


@pytest.fixture
def plane(transport) -> Iterator[StandInVLLMControlPlane]:
    plane = StandInVLLMControlPlane(transport).start()
    yield plane
    plane.stop()


SYNC_ROUTES = ["/pause", "/start_weight_update", "/update_weights", "/finish_weight_update", "/resume"]


def test_vllm_choreography_routes_bodies_and_streamed_tensors(plane, transport):
    model = Wrapped()
    sync = VLLMNCCLWeightSync(plane.url, transport=transport, timeout_s=5, init_timeout_s=5, transfer_timeout_s=5)
    assert sync.sync(model) == 1
    with torch.no_grad():
        model.module[0].weight.add_(1.0)
    assert sync.sync(model) == 2 and sync.version == 2

    assert plane.paths() == ["/get_world_size", "/init_weight_transfer_engine", *SYNC_ROUTES, *SYNC_ROUTES]
    ((address, port, world),) = transport.init_args  # init once
    assert (address, world) == ("127.0.0.1", 3)
    names = ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight"]
    shapes = [[6, 4], [6], [6], [6], [3, 6]]
    update_info = {"names": names, "dtype_names": ["float32"] * 5, "shapes": shapes, "packed": True}
    expected = [
        Call("GET", "/get_world_size", {}, None),
        Call(
            "POST",
            "/init_weight_transfer_engine",
            {},
            {"init_info": {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 3}},
        ),
    ]
    for _ in range(2):
        expected += [
            Call("POST", "/pause", {"mode": "keep"}, None),
            Call("POST", "/start_weight_update", {}, {"is_checkpoint_format": True}),
            Call("POST", "/update_weights", {}, {"update_info": update_info}),
            Call("POST", "/finish_weight_update", {}, {}),
            Call("POST", "/resume", {}, None),
        ]
    assert plane.calls == expected

    # What was streamed is the model's current weights, under the unwrapped names.
    assert [[name for name, _ in sent] for sent in transport.sent] == [names, names]
    for name, tensor in transport.sent[1]:
        assert torch.equal(tensor, model.state_dict()["module." + name])
    assert not torch.equal(transport.sent[0][0][1], transport.sent[1][0][1])
    sync.close()
    assert transport.closed.is_set()


def test_vllm_send_dtype_casts_the_stream_and_the_metadata(plane, transport):
    sync = VLLMNCCLWeightSync(plane.url, transport=transport, timeout_s=5, send_dtype=torch.bfloat16)
    assert sync.sync(Wrapped()) == 1
    update = next(call for call in plane.calls if call.path == "/update_weights")
    assert update.body["update_info"]["dtype_names"] == ["bfloat16"] * 5
    assert {tensor.dtype for _, tensor in transport.sent[0]} == {torch.bfloat16}
    sync.close()


def test_vllm_stalled_update_weights_fails_in_time_and_cleans_up(plane, transport):
    model = Wrapped()
    sync = VLLMNCCLWeightSync(plane.url, transport=transport, timeout_s=5, transfer_timeout_s=1.0)
    assert sync.sync(model) == 1
    plane.update_received.clear()
    plane.calls.clear()

    # /update_weights never answers although every tensor was sent.
    plane.stall.add("/update_weights")
    original_handle_send = transport.send

    def send_without_receiver(named_tensors):
        transport.sent.append(list(named_tensors))

    transport.send = send_without_receiver
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"POST /update_weights did not finish within 1.0s") as raised:
        sync.sync(model)
    assert time.monotonic() - start < 1.0 + 5.0
    assert "finish ok" in str(raised.value) and "resume ok" in str(raised.value)
    assert plane.paths() == SYNC_ROUTES  # the cleanup: finish and resume after the stalled update
    assert sync.version == 1 and sync.broken

    # A broken sync refuses at once, without touching the engine.
    transport.send = original_handle_send
    with pytest.raises(WeightSyncError, match="broken"):
        sync.sync(model)
    assert plane.paths() == SYNC_ROUTES
    sync.close()


def test_vllm_stalled_transport_send_fails_in_time_and_cleans_up():
    transport = FakeTransport(stall_send=True)
    plane = StandInVLLMControlPlane(transport).start()
    try:
        sync = VLLMNCCLWeightSync(plane.url, transport=transport, timeout_s=5, transfer_timeout_s=1.0)
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"POST /update_weights, transport send did not finish within 1\.0s"):
            sync.sync(Wrapped())
        assert time.monotonic() - start < 1.0 + 5.0
        assert plane.paths()[2:] == SYNC_ROUTES
        assert sync.version == 0 and sync.broken
        sync.close()
    finally:
        transport.close()
        plane.stop()


@pytest.mark.parametrize(
    ("failing", "expected_paths", "cleanup"),
    [
        ("/pause", ["/pause", "/resume"], "resume ok"),
        # The server refused the start, so nothing was started: no finish, just resume.
        ("/start_weight_update", ["/pause", "/start_weight_update", "/resume"], "resume ok"),
        ("/update_weights", SYNC_ROUTES, "finish ok; resume ok"),
        # The finish was sent (and failed): it is not repeated.
        ("/finish_weight_update", SYNC_ROUTES, "resume ok"),
    ],
)
def test_vllm_error_responses_raise_and_clean_up(plane, transport, failing, expected_paths, cleanup):
    sync = VLLMNCCLWeightSync(plane.url, transport=transport, timeout_s=5, transfer_timeout_s=30)
    sync.init(Wrapped())
    plane.calls.clear()
    plane.fail[failing] = 500
    if failing == "/update_weights":
        transport.stall_send = True  # the sender stays blocked: the HTTP error alone must end the wait
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=f"POST {failing} answered HTTP 500") as raised:
        sync.sync(Wrapped())
    assert time.monotonic() - start < 5.0
    assert raised.value.status == 500 and sync.version == 0
    assert plane.paths() == expected_paths
    assert str(raised.value).endswith(f"(cleanup: {cleanup})")
    sync.close()


def test_vllm_init_checks_the_world_size_and_the_model_must_not_change(plane, transport):
    plane.world_size = 0
    sync = VLLMNCCLWeightSync(plane.url, transport=transport, timeout_s=5)
    with pytest.raises(WeightSyncError, match="positive world_size"):
        sync.sync(Wrapped())
    plane.world_size = 2
    assert sync.sync(Wrapped()) == 1

    changed = Wrapped()
    changed.module.append(nn.Linear(3, 3))
    with pytest.raises(WeightSyncError, match="changed since the init"):
        sync.sync(changed)
    assert sync.version == 1 and not sync.broken
    sync.close()


def test_concurrent_syncs_are_refused(plane, transport):
    sync = VLLMNCCLWeightSync(plane.url, transport=transport, timeout_s=5, transfer_timeout_s=2.0)
    sync.init(Wrapped())
    transport.stall_send = True
    outcome: list[BaseException] = []

    def first_sync() -> None:
        try:
            sync.sync(Wrapped())
        except WeightSyncError as exc:
            outcome.append(exc)

    first = threading.Thread(target=first_sync, daemon=True)
    first.start()
    deadline = time.monotonic() + 30
    while "/update_weights" not in plane.paths():
        assert time.monotonic() < deadline, "the first sync never reached /update_weights"
        time.sleep(0.01)
    with pytest.raises(WeightSyncError, match="in progress"):
        sync.sync(Wrapped())
    first.join(10)
    assert len(outcome) == 1 and "did not finish" in str(outcome[0])
    sync.close()


def test_metadata_check_catches_a_stream_that_differs_from_the_announcement():
    metadata = WeightMetadata.of(Wrapped())
    good = list(params_for_sync(Wrapped()))
    assert [name for name, _ in metadata.checked(iter(good))] == list(metadata.names)
    with pytest.raises(WeightSyncError, match="only 4 of the 5"):
        list(metadata.checked(iter(good[:4])))
    with pytest.raises(WeightSyncError, match="announced as"):
        list(metadata.checked(iter([good[1], good[0]])))


class _VLLMImportBlocker(importlib.abc.MetaPathFinder):
    """Makes ``import vllm`` fail as if vLLM were not installed, and records each attempt."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "vllm" or name.startswith("vllm."):
            self.attempts.append(name)
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)


def _drop_vllm_modules(monkeypatch) -> None:
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.fixture
def vllm_imports(monkeypatch) -> list[str]:
    """Every attempt to import vLLM during the test, which fails as if vLLM were not installed."""
    _drop_vllm_modules(monkeypatch)
    blocker = _VLLMImportBlocker()
    monkeypatch.setattr(sys, "meta_path", [blocker, *sys.meta_path])
    return blocker.attempts


def test_the_nccl_transport_imports_vllm_only_when_used(vllm_imports):
    transport = NCCLTransport()
    with pytest.raises(WeightSyncError, match="send before init"):
        transport.send(iter([]))
    transport.close()
    assert vllm_imports == []  # building, a refused send and closing never import vLLM

    with pytest.raises(WeightSyncError, match=r"needs vLLM \(the `vllm` extra: vllm>=0\.22,<0\.26\)"):
        NCCLTransport().init("127.0.0.1", 1, 2)
    assert vllm_imports == ["vllm"]  # using it does, and a missing vLLM is named


def test_the_nccl_transport_with_vllm_installed_fails_on_what_is_missing_next(monkeypatch):
    """With vLLM importable (a stub of its ``nccl_engine`` module here), ``init`` gets past the import
    and the error is about the next missing thing, the CUDA device, not vLLM."""
    _drop_vllm_modules(monkeypatch)
    parts = ["vllm", "distributed", "weight_transfer", "nccl_engine"]
    modules = [types.ModuleType(".".join(parts[: depth + 1])) for depth in range(len(parts))]
    for parent, child, name in zip(modules, modules[1:], parts[1:], strict=False):
        setattr(parent, name, child)
    for module in modules:
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(WeightSyncError, match="needs a CUDA device") as raised:
        NCCLTransport().init("127.0.0.1", 1, 2)
    assert "vllm" not in str(raised.value).lower()


# ----- picking the transport for an engine: weight_sync_for ------------------------------------------


def test_weight_sync_for_the_embedded_engine_server_is_the_http_transport(engine, engine_url, trainer_model):
    assert {card["owned_by"] for card in http_get(engine_url + "/v1/models")["data"]} == {"harness-grpo"}
    before = http_greedy_ids(engine_url)
    sync = weight_sync_for(engine_url, timeout_s=30, initial_version=4, is_main=True)
    assert type(sync) is HTTPEmbeddedWeightSync and isinstance(sync, WeightSync) and sync.version == 4
    assert sync.sync(trainer_model) == 5
    assert http_get(engine_url + "/health") == {"status": "ok", "weight_version": 5, "paused": False}
    assert_engine_holds(engine, trainer_model)
    assert http_greedy_ids(engine_url) != before
    sync.close()


def test_weight_sync_for_vllm_is_the_nccl_transport_and_imports_no_vllm(plane, vllm_imports):
    sync = weight_sync_for(plane.url, timeout_s=5, initial_version=7, is_main=True)
    assert type(sync) is VLLMNCCLWeightSync and isinstance(sync, WeightSync) and sync.version == 7
    assert sync.base_url == plane.url and sync.timeout_s == 5
    assert plane.paths() == ["/v1/models"]  # asked what it is; nothing else until the first sync
    assert vllm_imports == []
    sync.close()


def test_weight_sync_for_without_a_url_is_the_in_process_transport(engine, trainer_model):
    sync = weight_sync_for(None, engine=engine, timeout_s=30, initial_version=2, is_main=True)
    assert type(sync) is EmbeddedWeightSync and sync.engine is engine
    assert sync.sync(trainer_model) == 3 and engine.weight_version == 3
    assert_engine_holds(engine, trainer_model)
    other_rank = weight_sync_for(None, timeout_s=30, initial_version=3, is_main=False)
    assert type(other_rank) is EmbeddedWeightSync and other_rank.engine is None and other_rank.version == 3
    with pytest.raises(ValueError, match="needs its engine"):
        weight_sync_for(None, timeout_s=30, initial_version=0, is_main=True)
    with pytest.raises(ValueError, match=r"torch\.distributed"):  # a non-main rank with no main rank to ask
        weight_sync_for("http://127.0.0.1:9", timeout_s=30, initial_version=0, is_main=False)


def test_weight_sync_for_an_engine_that_does_not_answer_is_a_clear_error(silent_server):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(
        WeightSyncError, match=f"cannot tell which engine serves {re.escape(closed)}: GET /v1/models: Client"
    ):
        weight_sync_for(closed, timeout_s=5, initial_version=0, is_main=True)
    start = time.monotonic()
    with pytest.raises(
        WeightSyncError, match=rf"serves {re.escape(silent_server.url)}: GET /v1/models: no answer within 0\.5s"
    ):
        weight_sync_for(silent_server.url, timeout_s=0.5, initial_version=0, is_main=True)
    assert time.monotonic() - start < 0.5 + 4.0  # bounded: the limit plus slack for a loaded machine
    assert silent_server.request_lines() == ["GET /v1/models HTTP/1.1"]


def test_weight_sync_for_an_answer_that_is_no_model_list_is_a_clear_error(plane):
    plane.answers["/v1/models"] = {"object": "list", "data": []}
    with pytest.raises(WeightSyncError, match=r"GET /v1/models answered \{'object': 'list', 'data': \[\]\}"):
        weight_sync_for(plane.url, timeout_s=5, initial_version=0, is_main=True)
    plane.fail["/v1/models"] = 404
    with pytest.raises(
        WeightSyncError, match=f"serves {re.escape(plane.url)}: GET /v1/models answered HTTP 404"
    ) as raised:
        weight_sync_for(plane.url, timeout_s=5, initial_version=0, is_main=True)
    assert raised.value.status == 404


# ----- two ranks (gloo on CPU): lock-step FSDP gathers and one outcome for all ranks -------------


def _two_rank_worker(rank: int, port: int, results) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (2,))
        model = Wrapped()
        full = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        for module in model.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                setattr(module, name, nn.Parameter(distribute_tensor(param.data, mesh, [Shard(0)])))
        assert all(isinstance(p, DTensor) for p in model.parameters())

        yielded = [(name, tensor.clone()) for name, tensor in params_for_sync(model)]
        out: dict[str, Any] = {"rank": rank, "yielded": [name for name, _ in yielded]}
        out["full_ok"] = all(torch.equal(tensor, full["module." + name]) for name, tensor in yielded)

        transport = plane = None
        url = "http://127.0.0.1:9"  # rank 1 never talks to the engine
        if rank == 0:
            transport = FakeTransport()
            plane = StandInVLLMControlPlane(transport).start()
            url = plane.url
        # The engine's kind: rank 0 asks the engine, rank 1 (whose URL answers nothing) learns it from rank 0.
        chosen = weight_sync_for(url, timeout_s=10, initial_version=0, is_main=rank == 0)
        out["chosen"] = type(chosen).__name__
        chosen.close()
        try:
            weight_sync_for("http://127.0.0.1:9", timeout_s=10, initial_version=0, is_main=rank == 0)
        except WeightSyncError as exc:
            out["probe_error"] = str(exc)
        sync = VLLMNCCLWeightSync(url, transport=transport or FakeTransport(), timeout_s=10, transfer_timeout_s=10)
        out["versions"] = [sync.sync(model), sync.sync(model)]
        if rank == 0:
            plane.fail["/start_weight_update"] = 500
        try:
            sync.sync(model)
        except WeightSyncError as exc:
            out["error"] = str(exc)
        out["version_after_error"] = sync.version
        sync.close()
        if rank == 0:
            out["paths"] = plane.paths()
            out["sent_ok"] = (
                all(torch.equal(tensor, full["module." + name]) for sent in transport.sent for name, tensor in sent)
                and len(transport.sent) == 2
            )
            plane.stop()
        results.put(out)
        dist.barrier()  # no collective may still be in flight on either rank when the groups go
    finally:
        dist.destroy_process_group()
    # Gloo's worker threads can abort the interpreter's finalization (pytorch/pytorch#179291); the
    # result is flushed, so leave without it.
    results.close()
    results.join_thread()
    os._exit(0)


def test_two_ranks_gather_in_lock_step_and_agree_on_the_outcome():
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    procs = mp.start_processes(_two_rank_worker, args=(port, results), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 120
    while not procs.join(timeout=1):
        if time.monotonic() > deadline:
            for process in procs.processes:
                process.kill()
            pytest.fail("the two-rank run did not finish in 120s")
    by_rank = {out["rank"]: out for out in (results.get(timeout=10), results.get(timeout=10))}
    zero, one = by_rank[0], by_rank[1]
    assert zero["yielded"] == ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight"] and zero["full_ok"]
    assert one["yielded"] == []  # other ranks gather and discard
    assert zero["chosen"] == one["chosen"] == "VLLMNCCLWeightSync"
    assert zero["probe_error"].startswith("cannot tell which engine serves http://127.0.0.1:9")
    assert one["probe_error"] == zero["probe_error"] + " (from rank 0)"
    assert zero["versions"] == one["versions"] == [1, 2]
    assert zero["sent_ok"]
    assert zero["paths"] == [
        "/v1/models",
        "/get_world_size",
        "/init_weight_transfer_engine",
        *SYNC_ROUTES,
        *SYNC_ROUTES,
        "/pause",
        "/start_weight_update",
        "/resume",
    ]
    assert "answered HTTP 500" in zero["error"] and "another rank" in one["error"]
    assert zero["version_after_error"] == one["version_after_error"] == 2


# ----- the GPU bench's CPU-side code paths ----------------------------------------------------------


def test_gpu_bench_parses_builds_its_command_and_reports_without_a_gpu(tmp_path):
    import subprocess
    import sys

    from bench import vllm_weight_sync_gpu as bench

    script = bench.REPO_ROOT / "bench" / "vllm_weight_sync_gpu.py"
    shown = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "--timeout-s" in shown.stdout and "Duplicate GPU" in shown.stdout

    args = bench.parse_args(["--timeout-s", "30", "--json-out", str(tmp_path / "result.json"), "--vllm-arg=--seed=1"])
    command = bench.vllm_command(args, 8123)
    assert command[:3] == ["vllm", "serve", "Qwen/Qwen3-0.6B"]
    joined = " ".join(command)
    for flag in (
        '--weight-transfer-config {"backend": "nccl"}',
        "--gpu-memory-utilization 0.3",
        "--logprobs-mode processed_logprobs",
        "--return-tokens-as-token-ids",
        "--enable-auto-tool-choice --tool-call-parser hermes",
        "--port 8123",
        "--enforce-eager",
    ):
        assert flag in joined, flag
    assert command[-1] == "--seed=1"
    assert bench.vllm_env(0, {"PATH": "/bin"}) == {
        "PATH": "/bin",
        "VLLM_SERVER_DEV_MODE": "1",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    assert bench.vllm_env(1, {"CUDA_VISIBLE_DEVICES": "4,5"})["CUDA_VISIBLE_DEVICES"] == "5"
    with pytest.raises(ValueError):
        bench.vllm_env(2, {"CUDA_VISIBLE_DEVICES": "4,5"})

    summary = bench.summarize([2.0, 0.3, 0.1, 0.2, 0.4])
    assert (summary["first_s"], summary["median_s"], summary["p90_s"]) == (2.0, 0.25, 0.4)
    assert bench.summarize([0.5])["median_s"] == 0.5
    code, message = bench.init_failure_message(WeightSyncError("transport init failed"), True, "")
    assert code == bench.EXIT_SAME_GPU and "one GPU" in message
    code, _ = bench.init_failure_message(WeightSyncError("x"), False, "ncclInvalidUsage: Duplicate GPU detected")
    assert code == bench.EXIT_SAME_GPU
    assert bench.init_failure_message(WeightSyncError("x"), False, "")[0] == bench.EXIT_FAILED

    if not torch.cuda.is_available():
        assert bench.run_bench(args) == bench.EXIT_UNAVAILABLE
        result = json.loads((tmp_path / "result.json").read_text())
        assert result["ok"] is False and "GPU" in result["error"]
