"""The stack the agent CLI tests run against: engine <- recording relay <- capture proxy, on loopback.

    agent CLI (subprocess) --HTTP--> CaptureProxy --HTTP--> RecordingRelay --HTTP--> engine

The relay forwards every engine request verbatim and keeps each successful chat completion the
engine served (request and response), so a test can check that the session's trace holds exactly
the calls the engine answered, with the engine's own ids and logprobs. The relay sits outside the
proxy, so what it records is the ground truth the proxy's capture is judged against.

The engine is pluggable (``HARNESS_AGENT_ENGINE``):

``fake`` (default)
    ``ToolLoopFakeVLLM``: ``bench.fake_vllm.FakeVLLM`` made to drive agent loops. While tools are
    offered it answers ``tool_turns`` tool calls (a shell tool when the agent has one, arguments
    filled from the tool's JSON schema, the command appending a line to ``harness_steps.txt``),
    then a final text answer. Same vLLM wire contract, same append-only fake template.
``embedded``
    The CPU engine, ``python -m harness_grpo.engine --model M --port 0``, with ``M`` from
    ``HARNESS_AGENT_ENGINE_MODEL``, else the warm-started tiny model (``warm_tiny_model_path()``),
    else ``tiny``.
``http://host:port``
    An engine already running there (vLLM on a GPU box, say).

``warm_tiny_stack`` is a second stack, always on the embedded engine with the warm-started tiny
model, for the tests that the issue asks to run on it.

Everything runs in one background event loop (``ServiceLoop``) so the tests stay synchronous while
the agent subprocesses talk to the proxy.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from bench.fake_vllm import MODEL, WORDS, FakeVLLM
from harness_grpo.service_loop import ServiceLoop
from proxy.client import ProxySession
from proxy.engine_client import StreamAssembler
from proxy.server import CaptureProxy, ProxyConfig

REPO = Path(__file__).resolve().parents[2]
STEPS_FILE = "harness_steps.txt"
"""The file the fake engine's tool calls append to, in the agent's working directory."""
SHELL_TOOLS = ("bash", "Bash", "exec_command", "shell", "shell_command", "run_shell_command")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "agents: runs a real coding-agent CLI through the capture proxy")


# --- the fake engine ----------------------------------------------------------------------------------------------


class ToolLoopFakeVLLM(FakeVLLM):
    """``FakeVLLM`` that makes an agent take ``tool_turns`` tool-calling turns, then answer in text.

    The turn number is the count of assistant tool-call messages already in the history, so an
    agent that drops a malformed turn (mini-swe-agent's format errors) is asked again rather than
    skipped ahead. Tool choice: the first of ``SHELL_TOOLS`` the agent offers, else its first tool.
    Arguments: each required property filled by type; a ``command``/``cmd`` string (or argv array)
    is ``echo step-N >> harness_steps.txt``, so the test can see the agent really ran the calls.
    Ids, logprobs and the prompt template are ``FakeVLLM``'s (append-only, one capture path).
    """

    def __init__(self, *, tool_turns: int = 3, **kw: Any) -> None:
        super().__init__(**kw)
        self.tool_turns = tool_turns

    def reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, seed: int) -> dict[str, Any]:
        done = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        if tools and done < self.tool_turns:
            tool = _pick_tool(tools)
            arguments = orjson.dumps(_fill_arguments(tool.get("parameters") or {}, done + 1)).decode()
            call = {
                "id": f"call_{seed:x}_{done}",
                "type": "function",
                "function": {"name": tool["name"], "arguments": arguments},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        words = " ".join(WORDS[(seed >> (i % 24)) % len(WORDS)] for i in range(8))
        return {"role": "assistant", "content": f"Done after {done} steps: {words}."}


def _pick_tool(tools: list[dict[str, Any]]) -> dict[str, Any]:
    functions = [t["function"] for t in tools if t.get("type") == "function" and t.get("function")]
    by_name = {f["name"]: f for f in functions}
    for name in SHELL_TOOLS:
        if name in by_name:
            return by_name[name]
    return functions[0]


def _fill_arguments(schema: dict[str, Any], step: int) -> dict[str, Any]:
    command = f"echo step-{step} >> {STEPS_FILE}"
    properties = schema.get("properties") or {}
    required = list(schema.get("required") or [])
    for name in ("command", "cmd"):
        if name in properties and name not in required:
            required.insert(0, name)
    out: dict[str, Any] = {}
    for name in required:
        spec = properties.get(name) or {}
        kind = spec.get("type")
        if name in ("command", "cmd"):
            out[name] = ["bash", "-lc", command] if kind == "array" else command
        elif kind == "array":
            out[name] = []
        elif kind in ("integer", "number"):
            out[name] = 30000 if "timeout" in name else 1
        elif kind == "boolean":
            out[name] = False
        elif kind == "object":
            out[name] = {}
        elif spec.get("enum"):
            out[name] = spec["enum"][0]
        else:
            out[name] = f"harness step {step}"
    return out


# --- the recording relay ------------------------------------------------------------------------------------------


@dataclass
class ServedCall:
    """One chat completion the engine served: the upstream request body and the engine's response."""

    request: dict[str, Any]
    response: dict[str, Any]

    @property
    def prompt_ids(self) -> list[int]:
        return self.response["prompt_token_ids"]

    @property
    def completion_ids(self) -> list[int]:
        return self.response["choices"][0]["token_ids"]

    @property
    def logprobs(self) -> list[float] | None:
        content = (self.response["choices"][0].get("logprobs") or {}).get("content")
        return None if content is None else [entry["logprob"] for entry in content]

    @property
    def is_probe(self) -> bool:
        """The proxy's tier probe (``max_tokens: 1``, ``top_logprobs: 2``; engine_client.probe_tier)."""
        return self.request.get("max_tokens") == 1 and self.request.get("top_logprobs") == 2


class RecordingRelay:
    """A transparent reverse proxy in front of the engine that records every chat completion it served, from
    messages or from the proxy's bridged ``tokens`` (a streamed one as the reply it adds up to), and when each
    weight update landed among them."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.served: list[ServedCall] = []
        self.failed: list[tuple[int, bytes]] = []
        self.weight_updates: list[int] = []  # len(served) when each POST /update_weights succeeded
        self._http: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=512 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._http is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        async with self._http.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as resp:
            data = await resp.read()
            status, content_type = resp.status, resp.content_type
        if request.method == "POST" and request.path in ("/v1/chat/completions", "/v1/chat/completions/tokens"):
            if status == 200:
                response = _assembled(data) if content_type == "text/event-stream" else orjson.loads(data)
                self.served.append(ServedCall(orjson.loads(body), response))
            else:
                self.failed.append((status, data[:2000]))
        elif request.method == "POST" and request.path == "/update_weights" and status == 200:
            self.weight_updates.append(len(self.served))
        return web.Response(body=data, status=status, content_type=content_type)


def _assembled(stream: bytes) -> dict[str, Any]:
    """A streamed completion as the whole reply its chunks add up to."""
    assembler = StreamAssembler()
    for event in stream.split(b"\n\n"):
        if event.startswith(b"data: {"):
            assembler.add(orjson.loads(event[6:]))
    return assembler.response()


# --- engines ------------------------------------------------------------------------------------------------------


@dataclass
class EngineHandle:
    """A running engine: where it listens, what kind it is, and how to stop it."""

    kind: str  # "fake" | "embedded" | "external"
    url: str
    fake: ToolLoopFakeVLLM | None = None
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    notes: list[str] = field(default_factory=list)


def _embedded_model() -> str:
    explicit = os.environ.get("HARNESS_AGENT_ENGINE_MODEL")
    if explicit:
        return explicit
    try:
        from harness_grpo.tiny_model.warm_start import warm_tiny_model_path
    except ImportError:
        return "tiny"
    return str(warm_tiny_model_path())


def _start_embedded(log_dir: Path, timeout_s: float = 900.0, model: str | None = None) -> EngineHandle:
    """``python -m harness_grpo.engine`` on a free port; waits for its ``engine ready: URL`` line."""
    model = model or _embedded_model()
    log_path = log_dir / "engine.log"
    argv = [sys.executable, "-m", "harness_grpo.engine", "--model", model, "--port", "0", "--log-level", "WARNING"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = re.search(r"engine ready: (http://\S+)", log_path.read_text(errors="replace"))
        if match:
            return EngineHandle("embedded", match.group(1), process=proc, log_path=log_path, notes=[f"model={model}"])
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"embedded engine did not start: {argv}\n{log_path.read_text(errors='replace')[-4000:]}")


# --- the stack ----------------------------------------------------------------------------------------------------


class AgentStack:
    """Engine, relay and proxy on loopback, plus the control-plane calls the tests need."""

    def __init__(self, engine: EngineHandle, relay: RecordingRelay, proxy: CaptureProxy, url: str) -> None:
        self.engine = engine
        self.relay = relay
        self.proxy = proxy
        self.url = url

    @property
    def served_model(self) -> str:
        return next(iter(self.proxy._models.values()), MODEL)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.proxy.admin_key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def create_session(self, **body: Any) -> tuple[ProxySession, int]:
        """Create a session; returns it and the relay mark to read the session's engine calls from.

        The mark is taken after creation, so the proxy's tier probe (run at the first session's
        creation) is never counted as one of the agent's calls.
        """
        status, data = self._call("POST", "/sessions", body)
        assert status == 201, f"session creation failed: {status} {data}"
        return ProxySession(data["session_id"], data["api_key"]), len(self.relay.served)

    def served_since(self, mark: int) -> list[ServedCall]:
        return list(self.relay.served[mark:])

    def session(self, session_id: str) -> dict[str, Any]:
        status, data = self._call("GET", f"/sessions/{session_id}")
        assert status == 200, data
        return data

    def trace(self, session_id: str) -> dict[str, Any]:
        status, data = self._call("GET", f"/sessions/{session_id}/trace")
        assert status == 200, data
        return data


def engine_choice() -> str:
    """``HARNESS_AGENT_ENGINE``: ``fake`` (default), ``embedded`` or an engine URL."""
    return os.environ.get("HARNESS_AGENT_ENGINE", "fake").strip() or "fake"


def _stop_process(handle: EngineHandle) -> None:
    assert handle.process is not None
    handle.process.terminate()
    try:
        handle.process.wait(30)
    except subprocess.TimeoutExpired:
        handle.process.kill()
        handle.process.wait()


@pytest.fixture(scope="session")
def agent_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineHandle]:
    """The engine behind the proxy (see the module docstring); the fake one is started by ``agent_stack``."""
    choice = engine_choice()
    if choice == "fake":
        yield EngineHandle("fake", "")
    elif choice == "embedded":
        handle = _start_embedded(tmp_path_factory.mktemp("engine"))
        try:
            yield handle
        finally:
            _stop_process(handle)
    elif choice.startswith("http"):
        yield EngineHandle("external", choice.rstrip("/"))
    else:
        raise pytest.UsageError(f"HARNESS_AGENT_ENGINE must be fake, embedded or an http URL, not {choice!r}")


@contextmanager
def running_stack(engine: EngineHandle, journal_dir: Path) -> Iterator[AgentStack]:
    """engine <- RecordingRelay <- CaptureProxy in one background loop (the fake engine is started here)."""
    loop = ServiceLoop("agent-stack-loop")

    async def start() -> AgentStack:
        if engine.kind == "fake":
            engine.fake = ToolLoopFakeVLLM()
            engine.url = f"http://127.0.0.1:{await engine.fake.start()}"
        relay = RecordingRelay(engine.url)
        relay_url = await relay.start()
        config = ProxyConfig(
            engine_url=relay_url, journal_dir=journal_dir, port=0, upstream_backoff_s=0.2, keepalive_s=2.0
        )
        proxy = CaptureProxy(config)
        port = await proxy.start()
        return AgentStack(engine, relay, proxy, f"http://127.0.0.1:{port}")

    async def stop(stack: AgentStack) -> None:
        await stack.proxy.stop()
        await stack.relay.stop()
        if engine.fake is not None:
            await engine.fake.stop()

    stack = loop.run(start())
    try:
        yield stack
    finally:
        loop.run(stop(stack))
        loop.close()


@pytest.fixture(scope="session")
def agent_stack(agent_engine: EngineHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentStack]:
    """The stack on ``HARNESS_AGENT_ENGINE``'s engine, for the whole test session."""
    with running_stack(agent_engine, tmp_path_factory.mktemp("proxy-journal")) as stack:
        yield stack


@pytest.fixture(scope="session")
def warm_tiny_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentStack]:
    """The stack on the embedded engine serving the warm-started tiny model, whatever ``HARNESS_AGENT_ENGINE`` says."""
    from harness_grpo.tiny_model.warm_start import warm_tiny_model_path

    handle = _start_embedded(tmp_path_factory.mktemp("warm-engine"), model=str(warm_tiny_model_path()))
    try:
        with running_stack(handle, tmp_path_factory.mktemp("warm-proxy-journal")) as stack:
            yield stack
    finally:
        _stop_process(handle)
