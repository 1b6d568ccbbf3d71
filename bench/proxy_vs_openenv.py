"""Our capture proxy vs OpenEnv 0.10's capture server, side by side (a benchmark, not a test).

    .venv/bin/python bench/proxy_vs_openenv.py            # full run (~5-8 min on 2 cores)
    .venv/bin/python bench/proxy_vs_openenv.py --quick    # smoke run (~1 min)
    .venv/bin/python bench/proxy_vs_openenv.py --cases 64x8 --streaming off --proxies ours
    .venv/bin/python bench/proxy_vs_openenv.py --before REV --ttft 4x4 \
        --cases 1x8,64x8,256x8,16x64,4x128        # the proxy-hardening figures, REV's proxy beside this one

Setup (REFERENCE §7): one fake vLLM-like engine (``bench/fake_vllm.py``, with
tokenize memoised per message string, see ``BenchEngine``) and this process as
the load generator share one core; the proxy under test is alone on the other.
Every (case, proxy, streaming, phase) gets a fresh proxy process, so RSS is per
case. Sessions are simulated agents: each makes a proxy session, then runs N
turns of a chat-completions loop with a ``bash`` tool (the engine answers a tool
call every other turn; the agent appends the assistant message and a tool
result, or a user "Continue."), with a ~6.4k-character system prompt (~1.6k
prompt tokens). Each session's first user message carries a unique marker, so
no two sessions ever send the same prompt.

A case ``SxN`` is S concurrent agent slots, each running sessions of N turns
back to back until the phase has made at least ``--target-calls`` calls (so a
1-session case still measures hundreds of calls), at most ``--max-calls`` calls
or ``--max-seconds`` seconds. All sessions are created before the clock starts.

Two phases per case, each on a fresh proxy and against a DIRECT baseline (the
same load straight to the engine, non-streaming, one direct run for both
streaming modes; a streamed call through a proxy streams from the engine too,
its events sent one after another after the planned sleep, each its own HTTP
chunk as vLLM's server writes them, or with ``--whole-streams`` as one body):

- throughput (closed loop, engine latency 0): ``calls/s`` = completed model
  calls / wall time from the first call sent to the last reply read. The proxy
  is saturated here, so its latencies are queueing, shown as "loaded" only.
- paced (engine latency > 0): the engine sleeps a deterministic per-call time
  with mean L = S / ``--paced-rate`` (jitter +-50%), slot starts are staggered
  by 1/rate, so the offered load is ~``--paced-rate`` calls/s whatever S: a
  loaded-but-not-saturated proxy, as in front of a real engine. Net latency of
  one call = (time from sending the request to having read the whole reply
  body) - (the engine's planned sleep for that call, which the client computes
  from the same request). **Added latency pX = pX(net latency through the
  proxy) - pX(net latency direct), same case, same phase** (a difference of
  percentiles, not a percentile of per-call differences).

Per (proxy, case, streaming): proxy RSS = VmRSS of the proxy process right
after the throughput phase's load (before any trace export) and peak = its
VmHWM then; proxy CPU per call from /proc/PID/stat. After each phase every
session's trace is fetched (ours: ``GET /sessions/{id}/trace``; OpenEnv:
``GET /sessions/{id}/trace_entries``) and checked against what the agent saw:
the expected prompt ids of each successful call are re-rendered here from the
messages that call sent, the expected completion ids from the reply the agent
parsed. **lost** = a successful call with no trace turn carrying exactly its
(prompt ids, completion ids) (a turn with right prompt but wrong completion
counts as lost); **mixed** = a trace turn of a session whose prompt ids are
none of the prompts that session sent (another session's, or corrupted).
Replies that echo ids (ours with ``return_token_ids``; OpenEnv non-streaming
passes the engine's ids through) are also checked against the expected ids.

The proxies run as their CLIs do: ``python -m proxy --engine-url ...`` and
``python -m openenv.core.harness.capture.server --llm-url http://ENGINE/v1
--capture-level tokens --model fake/vllm`` (uvicorn with whatever loop and HTTP
parser the venv has, access log on, as its ``main`` sets). The detail table's
"others CPU %" is the CPU every other process on the machine used during the
load (from /proc/stat): above a few % the figures are noisy. ``--profile DIR``
attaches py-spy to each proxy's throughput phase (collapsed stacks in DIR).

``--before REV`` adds a third proxy, REV's ``proxy`` package (``git archive``)
run the same way, so a change is measured against its base in one run. On a
host whose neighbours come and go, one phase's CPU per call can vary by a third
from run to run: ``--rounds R`` runs every phase R times (the proxies in reverse
order every other round), reports each phase's median round and lists every
round's CPU per call, so a change of a few percent is told from the noise.
``--proxies passthrough`` adds the floor of our HTTP stack: aiohttp on uvloop
for the agent and the proxy's own engine client upstream, each body parsed and
written again as the proxy does, and nothing else (no session, capture, journal
or bridge; its sessions and traces are not checked). Our proxy's cost above it
is what capture costs; its added latency is what this stack adds on this machine.
``--proxies forward`` adds the floor of any proxy: each connection relayed byte
for byte to the engine on uvloop, no HTTP parsed; its added latency is what one
more process and loopback hop cost here. Passthrough's latency above it is the
HTTP stack's and the engine's work for the ids and logprobs a capture asks for.
``--bridge off`` opens our sessions without the token-in bridge (this agent
echoes its calls verbatim, so the bridge saves nothing here and costs one
``/tokenize`` per call; ``bench/bridge_cost.py`` measures it where it pays).
``--ttft SxN`` adds a streamed phase per target (and direct) in which the engine
samples one token per ``--token-latency-ms``: **first text** = time from sending
the request to the first SSE chunk carrying reply text (replies without text are
not counted). The closing "proxy-hardening figures" table puts side by side, per
target: proxy CPU per call by case, added p50 latency (paced), RSS per session in
``Sx64`` cases ((RSS after the load - RSS before it) / sessions), the p50 time of
one session's ``GET .../trace`` in ``Sx128`` cases, and first text / whole reply.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import functools
import http.client
import math
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

try:
    from bench import fake_vllm as fv
except ImportError:  # run as a script: bench/ is sys.path[0]
    import fake_vllm as fv  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
MODEL = fv.MODEL
CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1
TARGETS = ("ours", "before", "passthrough", "forward", "openenv")
UNCAPTURED = ("passthrough", "forward")  # floors: no sessions, no traces
PROXY_TARGETS = ("ours", "before")  # our proxy: this tree's, and ``--before REV``'s (run from a git archive)
TEXT_DELTA = re.compile(rb'"content": ?"[^"]')  # an SSE chunk that carries reply text
DEFAULT_CASES = "1x8,16x8,64x8,256x8,4x64"
BASH_TOOL = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run one shell command in the task's sandbox and return its stdout and stderr.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command line to run"}},
                "required": ["command"],
            },
        },
    }
]


def system_prompt(chars: int) -> str:
    """A deterministic coding-agent system prompt of exactly ``chars`` characters (~chars/4 tokens)."""
    text = (
        "You are a careful software engineer working in a sandboxed repository. Read the task, inspect "
        "files with the bash tool, make minimal patches, run the tests, and stop when they pass."
    )
    words = text.split(" ")
    out: list[str] = []
    n = 0
    i = 0
    while n < chars:
        w = words[i % len(words)] + (f"{i % 97}" if i % 11 == 0 else "")
        out.append(w)
        n += len(w) + 1
        i += 1
    return " ".join(out)[:chars]


def tool_output(command: str) -> str:
    """A deterministic ~200-character tool result for ``command``."""
    seed = zlib.crc32(command.encode())
    lines = [f"{fv.WORDS[(seed >> k) % len(fv.WORDS)]}_{k}.py: ok ({(seed >> (2 * k)) % 1000} ms)" for k in range(6)]
    return f"$ {command}\n" + "\n".join(lines) + "\nexit 0"


def planned_sleep(latency_s: float, jitter: float, messages: list[dict[str, Any]]) -> float:
    """The engine's sleep for one call, computable by both the engine and the client from the request."""
    if latency_s <= 0:
        return 0.0
    key = next((m.get("content") for m in messages if m.get("role") == "user"), "")
    u = zlib.crc32(f"{key}|{len(messages)}".encode()) / 2**32
    return latency_s * (1.0 - jitter + 2.0 * jitter * u)


# --- the engine -----------------------------------------------------------------------------------------------------

_raw_tokenize = getattr(fv.tokenize, "__wrapped__", fv.tokenize)  # fake_vllm may memoise it already


@functools.lru_cache(maxsize=1 << 16)
def memo_tokenize(text: str) -> Sequence[int]:
    """``fake_vllm.tokenize`` memoised per string. The cached result is shared: callers only unpack it."""
    return _raw_tokenize(text)


class BenchEngine(fv.FakeVLLM):
    """FakeVLLM with a runtime-settable, per-call deterministic latency (``POST /bench/config``).

    With ``memo`` tokenize is memoised per message string, without it it is
    not (it sets ``fake_vllm.tokenize`` in the engine process only, whether or
    not fake_vllm memoises it itself): unmemoised, every call re-tokenizes the
    whole history: 0.68 vs 0.16 ms of engine CPU per call at 64x8 (direct
    817 vs 2,112 calls/s), enough to make the engine core the bottleneck.
    """

    def __init__(self, *, memo: bool = True, whole_streams: bool = False) -> None:
        super().__init__()
        fv.tokenize = memo_tokenize if memo else _raw_tokenize
        self.whole_streams = whole_streams
        self.jitter = 0.5
        self.app.router.add_post("/bench/config", self._config)

    async def _config(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.latency_s = float(body.get("latency_s", self.latency_s))
        self.jitter = float(body.get("jitter", self.jitter))
        self.token_latency_s = float(body.get("token_latency_s", self.token_latency_s))
        return web.json_response({"latency_s": self.latency_s, "jitter": self.jitter, "calls": self.calls})

    async def _chat(
        self, request: web.Request, body: dict[str, Any] | None = None, prompt_ids: list[int] | None = None
    ) -> web.StreamResponse:
        if self.token_latency_s:  # sampling token by token: fake_vllm's own stream, a chunk per token
            return await super()._chat(request, body, prompt_ids)
        self.calls += 1
        if body is None:
            body = orjson.loads(await request.read())
        if self.latency_s > 0:
            await asyncio.sleep(planned_sleep(self.latency_s, self.jitter, body["messages"]))
        completion = self.complete(body, prompt_ids=prompt_ids)
        if body.get("stream"):  # sampling time is the planned sleep: then every event at once
            if self.whole_streams:
                frames = fv.stream_frames(completion, body)
                return web.Response(body=b"".join(frames), content_type="text/event-stream")
            return await self._stream(request, body, completion, None)  # a write, and an HTTP chunk, per event
        return web.Response(body=orjson.dumps(completion), content_type="application/json")


def serve_engine(port: int, memo: bool, whole_streams: bool) -> None:
    async def run() -> None:
        engine = BenchEngine(memo=memo, whole_streams=whole_streams)
        bound = await engine.start("127.0.0.1", port)
        print(f"fake vLLM on http://127.0.0.1:{bound} memo={memo}", flush=True)
        await asyncio.Event().wait()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        asyncio.run(run())


def serve_passthrough(port: int, engine_port: int) -> None:
    """The ``passthrough`` target (see the module docstring): the engine fields the proxy asks for are asked for
    (ids and logprobs), JSON bodies are parsed and written again, streams relayed as they come."""
    import uvloop

    from proxy.engine_http import EngineHttp

    async def run() -> None:
        engine = EngineHttp(f"http://127.0.0.1:{engine_port}", headers={"Content-Type": "application/json"})

        async def chat(request: web.Request) -> web.StreamResponse:
            body = orjson.loads(await request.read())
            body.update(logprobs=True, top_logprobs=0, return_token_ids=True)
            async with await engine.request("POST", "/v1/chat/completions", orjson.dumps(body)) as resp:
                status, data = resp.status, await resp.read()
            if body.get("stream") or status != 200:
                return web.Response(body=data, status=status, content_type=resp.headers.get("content-type"))
            return web.Response(body=orjson.dumps(orjson.loads(data)), content_type="application/json")

        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print(f"passthrough on http://127.0.0.1:{port} to engine port {engine_port}", flush=True)
        await asyncio.Event().wait()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        asyncio.run(run(), loop_factory=uvloop.new_event_loop)


def serve_forward(port: int, engine_port: int) -> None:
    """The ``forward`` target (see the module docstring): each connection relayed byte for byte to one of its own
    to the engine, on uvloop; no HTTP is parsed."""
    import uvloop

    class Relay(asyncio.Protocol):
        def __init__(self, peer: asyncio.Transport | None = None) -> None:
            self.peer = peer
            self.early: list[bytes] = []  # what the agent sent before the engine's connection was open

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            if self.peer is None:  # the agent's side: open the engine's
                self.connecting = asyncio.ensure_future(self.connect())

        async def connect(self) -> None:
            loop = asyncio.get_running_loop()
            engine, _ = await loop.create_connection(lambda: Relay(self.transport), "127.0.0.1", engine_port)
            engine.writelines(self.early)
            self.peer = engine

        def data_received(self, data: bytes) -> None:
            if self.peer is None:
                self.early.append(data)
            else:
                self.peer.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.peer is not None:
                self.peer.close()

    async def run() -> None:
        await asyncio.get_running_loop().create_server(Relay, "127.0.0.1", port)
        print(f"forward on http://127.0.0.1:{port} to engine port {engine_port}", flush=True)
        await asyncio.Event().wait()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        asyncio.run(run(), loop_factory=uvloop.new_event_loop)


# --- expected ids (the verifier) ------------------------------------------------------------------------------------


def expected_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """``fake_vllm.render_prompt`` with memoised tokenize (checked equal at startup)."""
    ids: list[int] = []
    if tools:
        ids += [fv.IM_START, fv.ROLE_IDS["system"], *memo_tokenize(orjson.dumps(tools).decode()), fv.IM_END, fv.NEWLINE]
    for message in messages:
        role = message.get("role", "user")
        text = fv._assistant_text(message) if role == "assistant" else fv._content_text(message.get("content"))
        ids += [fv.IM_START, fv.ROLE_IDS.get(role, 5), *memo_tokenize(text), fv.IM_END, fv.NEWLINE]
    return [*ids, fv.IM_START, fv.ROLE_IDS["assistant"]]


def expected_completion(message: dict[str, Any]) -> list[int]:
    return [*memo_tokenize(fv._assistant_text(message)), fv.IM_END]


def ids_key(ids: list[int]) -> int:
    return hash(tuple(ids))


# --- processes ------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _preexec(cores: set[int] | None):
    libc = ctypes.CDLL(None, use_errno=True)

    def fn() -> None:
        if cores:
            os.sched_setaffinity(0, cores)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # die with the benchmark, even on SIGKILL

    return fn


class Procs:
    """Every child process of the benchmark; ``stop_all`` on exit, whatever happened."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.live: dict[int, subprocess.Popen] = {}

    def spawn(
        self, name: str, argv: list[str], cores: set[int] | None, cwd: Path = REPO
    ) -> tuple[subprocess.Popen, Path]:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_preexec(cores),
            )
        self.live[proc.pid] = proc
        return proc, log

    def stop(self, proc: subprocess.Popen, timeout: float = 10.0) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.live.pop(proc.pid, None)

    def stop_all(self) -> None:
        for proc in list(self.live.values()):
            with contextlib.suppress(Exception):
                self.stop(proc, timeout=5.0)


def wait_healthy(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited ({proc.returncode}); log tail:\n{_tail(log)}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                conn.close()
                return
            conn.close()
        time.sleep(0.05)
    raise RuntimeError(f"not healthy after {timeout}s; log tail:\n{_tail(log)}")


def _tail(path: Path, n: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-n:]
    return ""


def post_json(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=orjson.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST {path}: {resp.status} {data[:200]!r}")
        return orjson.loads(data)
    finally:
        conn.close()


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_s() -> float:
    """CPU seconds spent busy on all cores of the machine so far (from /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / CLK_TCK


def proc_mem_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB."""
    rss = hwm = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return rss, hwm


def load_avg() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


# --- the simulated agents -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Call:
    n_messages: int  # the prompt was messages[:n_messages]; the reply is messages[n_messages]
    latency_s: float
    sleep_s: float
    echo_prompt: int | None
    echo_completion: int | None
    ttft_s: float | None = None  # streamed: time to the first chunk carrying reply text (None: no text)


@dataclass
class Agent:
    user_text: str
    messages: list[dict[str, Any]]
    key: str = ""  # what the agent sends as its API key
    session_id: str = ""  # what names its session on the control plane
    calls: list[Call] = field(default_factory=list)
    error: str | None = None


@dataclass
class Phase:
    """What one (target, case, streaming, phase) run measured."""

    target: str
    case: str
    stream: bool
    paced: bool
    calls: int = 0
    errors: int = 0
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)  # net of the engine's planned sleep
    proxy_cpu_s: float = 0.0
    engine_cpu_s: float = 0.0
    loadgen_cpu_s: float = 0.0
    others_cpu_s: float = 0.0  # every other process on the machine during the load: noise
    rss_mb: float = 0.0
    hwm_mb: float = 0.0
    hwm_after_export_mb: float = 0.0
    sessions: int = 0
    lost: int = 0
    mixed: int = 0
    echo_checked: int = 0
    echo_bad: int = 0
    export_s: float = 0.0
    export_ms: list[float] = field(default_factory=list)  # per session: GET of its trace, first byte to last
    rss_idle_mb: float = 0.0  # the proxy's RSS before the load
    call_records: list[Call] = field(default_factory=list)
    note: str = ""

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.wall_s if self.wall_s > 0 else 0.0

    def pct(self, q: float) -> float:
        return percentile(self.latencies_ms, q)

    @property
    def ttft_ms(self) -> list[float]:
        return [c.ttft_s * 1e3 for c in self.call_records if c.ttft_s is not None]

    @property
    def mb_per_session(self) -> float:
        return (self.rss_mb - self.rss_idle_mb) / self.sessions if self.sessions else math.nan


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def parse_json_reply(data: bytes) -> tuple[dict[str, Any], list[int] | None, list[int] | None]:
    body = orjson.loads(data)
    choice = body["choices"][0]
    return choice["message"], body.get("prompt_token_ids"), choice.get("token_ids")


def parse_sse_reply(data: bytes) -> tuple[dict[str, Any], list[int] | None, list[int] | None]:
    """Reassemble an OpenAI chat SSE stream: content, tool calls, and ids when the server sends them."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    prompt_ids = token_ids = None
    for line in data.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        chunk = orjson.loads(payload)
        if "error" in chunk:
            raise RuntimeError(f"stream error: {chunk['error']}")
        if chunk.get("prompt_token_ids") is not None:
            prompt_ids = chunk["prompt_token_ids"]
        for choice in chunk.get("choices") or []:
            if choice.get("token_ids") is not None:  # an engine sends each chunk's ids, a proxy all at the end
                token_ids = (token_ids or []) + choice["token_ids"]
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc.get("index", 0), {"id": None, "name": "", "arguments": ""})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["arguments"] += fn["arguments"]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(calls.items())
        ]
    return message, prompt_ids, token_ids


def history_message(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as the agent appends it to its history."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": tc["id"],
                "type": "function",
                "function": {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]},
            }
            for tc in message["tool_calls"]
        ]
    return out


class LoadGen:
    """One phase of simulated agents against one target (``direct``, ``ours`` or ``openenv``)."""

    def __init__(
        self,
        *,
        url: str,
        target: str,
        admin_key: str,
        system: str,
        stream: bool,
        latency_s: float,
        jitter: float,
        bridge: bool = True,
    ) -> None:
        self.url = url
        self.target = target
        self.admin_key = admin_key
        self.system = system
        self.stream = stream
        self.latency_s = latency_s
        self.jitter = jitter
        self.bridge = bridge  # our proxy's sessions only: earlier revisions and OpenEnv have no bridge
        self.started = 0

    def new_agent(self, tag: str) -> Agent:
        user = f"[{tag}] Fix the failing test in the repository, then report what you changed."
        return Agent(user, [{"role": "system", "content": self.system}, {"role": "user", "content": user}])

    async def create_session(self, http: aiohttp.ClientSession, agent: Agent) -> None:
        if self.target in ("direct", *UNCAPTURED):
            return
        headers = {"Authorization": f"Bearer {self.admin_key}"} if self.target in PROXY_TARGETS else {}
        config = {"bridge": False} if self.target == "ours" and not self.bridge else {}
        async with http.post(f"{self.url}/sessions", json=config, headers=headers) as resp:
            data = await resp.json()
            if resp.status not in (200, 201):
                raise RuntimeError(f"{self.target} POST /sessions: {resp.status} {data}")
        agent.session_id = data["session_id"]
        agent.key = data.get("api_key") or agent.session_id  # OpenEnv's session id is also its key

    async def call(self, http: aiohttp.ClientSession, agent: Agent) -> bool:
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": agent.messages,
            "tools": BASH_TOOL,
            "max_tokens": 512,
            "temperature": 1.0,
            "return_token_ids": True,
        }
        if self.stream:
            body["stream"] = True
        payload = orjson.dumps(body)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {agent.key or 'none'}"}
        n = len(agent.messages)
        sleep_s = planned_sleep(self.latency_s, self.jitter, agent.messages)
        t0 = time.perf_counter()
        ttft = None
        try:
            async with http.post(f"{self.url}/v1/chat/completions", data=payload, headers=headers) as resp:
                status = resp.status
                if self.stream and status == 200:
                    pieces = []
                    async for piece in resp.content.iter_any():
                        if ttft is None and TEXT_DELTA.search(piece):
                            ttft = time.perf_counter() - t0
                        pieces.append(piece)
                    data = b"".join(pieces)
                else:
                    data = await resp.read()
            latency = time.perf_counter() - t0
            if status != 200:
                agent.error = f"HTTP {status}: {data[:200]!r}"
                return False
            message, prompt_ids, token_ids = parse_sse_reply(data) if self.stream else parse_json_reply(data)
        except (aiohttp.ClientError, TimeoutError, RuntimeError, KeyError, orjson.JSONDecodeError) as exc:
            agent.error = f"{type(exc).__name__}: {exc}"
            return False
        agent.calls.append(
            Call(
                n,
                latency,
                sleep_s,
                ids_key(prompt_ids) if prompt_ids is not None else None,
                ids_key(token_ids) if token_ids is not None else None,
                ttft,
            )
        )
        reply = history_message(message)
        agent.messages.append(reply)
        if reply.get("tool_calls"):
            tc = reply["tool_calls"][0]
            command = orjson.loads(tc["function"]["arguments"]).get("command", "")
            agent.messages.append({"role": "tool", "tool_call_id": tc["id"], "content": tool_output(command)})
        else:
            agent.messages.append({"role": "user", "content": "Continue."})
        return True

    async def run(
        self,
        *,
        slots: list[list[Agent]],
        turns: int,
        rate: float | None,
        max_calls: int,
        max_seconds: float,
        proc_pids: dict[str, int],
    ) -> tuple[float, dict[str, float]]:
        """Run every slot's sessions back to back; returns (wall seconds, CPU seconds per process)."""
        connector = aiohttp.TCPConnector(limit=len(slots) + 8, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            sem = asyncio.Semaphore(16)

            async def create(agent: Agent) -> None:
                async with sem:
                    await self.create_session(http, agent)

            await asyncio.gather(*(create(a) for s in slots for a in s))
            deadline = math.inf

            async def slot_loop(agents: list[Agent], delay: float) -> None:
                if delay:
                    await asyncio.sleep(delay)
                for agent in agents:
                    for _ in range(turns):
                        if self.started >= max_calls or time.perf_counter() >= deadline:
                            return
                        self.started += 1
                        if not await self.call(http, agent):
                            break

            cpu0 = {name: proc_cpu_s(pid) for name, pid in proc_pids.items()}
            busy0 = machine_busy_s()
            lg0 = time.process_time()
            t0 = time.perf_counter()
            deadline = t0 + max_seconds
            await asyncio.gather(*(slot_loop(s, i / rate if rate else 0.0) for i, s in enumerate(slots)))
            wall = time.perf_counter() - t0
            cpu = {name: proc_cpu_s(pid) - cpu0[name] for name, pid in proc_pids.items()}
            cpu["loadgen"] = time.process_time() - lg0
            cpu["others"] = max(0.0, machine_busy_s() - busy0 - sum(cpu.values()))
        return wall, cpu


async def fetch_traces(
    url: str, target: str, admin_key: str, agents: list[Agent], export_ms: list[float]
) -> list[list[tuple[int, int]]]:
    """Per agent, the (prompt ids key, completion ids key) of every turn in its trace; each GET's ms into
    ``export_ms``."""
    out: list[list[tuple[int, int]]] = [[] for _ in agents]
    sem = asyncio.Semaphore(8)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one(i: int, agent: Agent) -> None:
            if target in PROXY_TARGETS:
                path, field_ = f"/sessions/{agent.session_id}/trace", "turns"
                headers = {"Authorization": f"Bearer {admin_key}"}
            else:
                path, field_, headers = f"/sessions/{agent.session_id}/trace_entries", "entries", {}
            async with sem:
                t0 = time.perf_counter()
                async with http.get(url + path, headers=headers) as resp:
                    data = await resp.read()
                export_ms.append((time.perf_counter() - t0) * 1e3)
                if resp.status != 200:
                    raise RuntimeError(f"{target} GET {path}: {resp.status} {data[:300]!r}")
            turns = orjson.loads(data)[field_]
            out[i] = [(ids_key(t["prompt_token_ids"]), ids_key(t["completion_token_ids"])) for t in turns]

        await asyncio.gather(*(one(i, a) for i, a in enumerate(agents)))
    return out


def verify(agents: list[Agent], traces: list[list[tuple[int, int]]] | None, result: Phase) -> None:
    """Count lost and mixed turns (see the module docstring) and echoed-id mismatches."""
    for i, agent in enumerate(agents):
        expected: Counter[tuple[int, int]] = Counter()
        for call in agent.calls:
            prompt = ids_key(expected_prompt(agent.messages[: call.n_messages], BASH_TOOL))
            completion = ids_key(expected_completion(agent.messages[call.n_messages]))
            expected[(prompt, completion)] += 1
            if call.echo_prompt is not None or call.echo_completion is not None:
                result.echo_checked += 1
                result.echo_bad += int(call.echo_prompt != prompt or call.echo_completion != completion)
        if traces is None:
            continue
        seen = Counter(traces[i])
        result.lost += sum((expected - seen).values())
        prompts = {prompt for prompt, _ in expected}
        result.mixed += sum(1 for prompt, _ in traces[i] if prompt not in prompts)


# --- one phase, end to end ------------------------------------------------------------------------------------------


@dataclass
class Env:
    args: argparse.Namespace
    procs: Procs
    workdir: Path
    engine_port: int
    engine_pid: int
    system: str
    run_tag: str
    pin: bool
    before_src: Path | None = None  # ``--before REV``'s proxy package, extracted


def start_target(env: Env, target: str, label: str) -> tuple[subprocess.Popen | None, int, str]:
    """A fresh proxy process pinned to the proxy core; returns (process, port, admin key)."""
    if target == "direct":
        return None, env.engine_port, ""
    port = free_port()
    cores = {env.args.proxy_core} if env.pin else None
    py = sys.executable
    cwd = REPO
    if target in PROXY_TARGETS:
        admin = secrets.token_hex(16)
        if target == "before":
            assert env.before_src is not None, "--before REV is needed for the 'before' proxy"
            cwd = env.before_src
        journal = env.workdir / f"journal-{label}"
        argv = [
            py,
            "-m",
            "proxy",
            "--engine-url",
            f"http://127.0.0.1:{env.engine_port}",
            "--journal-dir",
            str(journal),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            f"--admin-key={admin}",
        ]
    elif target in UNCAPTURED:
        admin = ""
        argv = [py, str(Path(__file__).resolve()), f"--serve-{target}", str(port), str(env.engine_port)]
    else:
        admin = ""
        argv = [
            py,
            "-m",
            "openenv.core.harness.capture.server",
            "--llm-url",
            f"http://127.0.0.1:{env.engine_port}/v1",
            "--capture-level",
            "tokens",
            "--model",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
    proc, log = env.procs.spawn(f"{target}-{label}", argv, cores, cwd)
    wait_healthy(port, proc, log)
    return proc, port, admin


def run_phase(
    env: Env, target: str, case: tuple[int, int], stream: bool, paced: bool, token_latency_s: float = 0.0
) -> Phase:
    """One phase; ``token_latency_s`` > 0 makes the engine sample that slowly (the time-to-first-token phase)."""
    a = env.args
    sessions, turns = case
    label = f"{sessions}x{turns}-{'sse' if stream else 'json'}-{'paced' if paced else 'tput'}"
    if token_latency_s:
        label += "-ttft"
    result = Phase(target, f"{sessions}x{turns}", stream, paced)
    rate = a.paced_rate if paced else None
    latency = sessions / a.paced_rate if paced else 0.0
    config = {"latency_s": latency, "jitter": 0.5, "token_latency_s": token_latency_s}
    post_json(env.engine_port, "/bench/config", config)
    per_round = sessions * turns
    calls_wanted = min(a.target_calls, a.max_calls) if not token_latency_s else per_round
    rounds = max(1, math.ceil(calls_wanted / per_round))
    proc, port, admin = start_target(env, target, label)
    if proc is not None:
        result.rss_idle_mb = proc_mem_mb(proc.pid)[0]
    spy = None
    try:
        if a.profile and proc is not None and not paced:
            out = a.profile / f"{target}-{label}.txt"
            spy, _ = env.procs.spawn(
                f"py-spy-{target}-{label}",
                [
                    a.py_spy,
                    "record",
                    "--pid",
                    str(proc.pid),
                    "--format",
                    "raw",
                    "--rate",
                    "250",
                    "--nonblocking",
                    "--output",
                    str(out),
                ],
                {a.load_core} if env.pin else None,
            )
            time.sleep(0.5)
        gen = LoadGen(
            url=f"http://127.0.0.1:{port}",
            target=target,
            admin_key=admin,
            system=env.system,
            stream=stream,
            latency_s=latency,
            jitter=0.5,
            bridge=a.bridge == "on",
        )
        slots = [
            [gen.new_agent(f"{env.run_tag}:{target}:{label}:s{i:03d}r{r:03d}") for r in range(rounds)]
            for i in range(sessions)
        ]
        pids = {"engine": env.engine_pid}
        if proc is not None:
            pids["proxy"] = proc.pid
        wall, cpu = asyncio.run(
            gen.run(
                slots=slots, turns=turns, rate=rate, max_calls=a.max_calls, max_seconds=a.max_seconds, proc_pids=pids
            )
        )
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(30)
            env.procs.stop(spy)
        agents = [ag for s in slots for ag in s]
        result.wall_s = wall
        result.calls = sum(len(ag.calls) for ag in agents)
        result.errors = sum(1 for ag in agents if ag.error)
        if result.errors:
            result.note = next(ag.error for ag in agents if ag.error) or ""
        result.latencies_ms = [(c.latency_s - c.sleep_s) * 1e3 for ag in agents for c in ag.calls]
        result.call_records = [c for ag in agents for c in ag.calls]
        result.proxy_cpu_s = cpu.get("proxy", 0.0)
        result.engine_cpu_s = cpu["engine"]
        result.loadgen_cpu_s = cpu["loadgen"]
        result.others_cpu_s = cpu["others"]
        result.sessions = sum(1 for ag in agents if ag.calls)
        traces = None
        if proc is not None:
            result.rss_mb, result.hwm_mb = proc_mem_mb(proc.pid)
        if proc is not None and target not in UNCAPTURED:
            used = [ag for ag in agents if ag.key]
            t0 = time.perf_counter()
            traces = asyncio.run(fetch_traces(f"http://127.0.0.1:{port}", target, admin, used, result.export_ms))
            result.export_s = time.perf_counter() - t0
            result.hwm_after_export_mb = proc_mem_mb(proc.pid)[1]
            agents = used
        verify(agents, traces, result)
    finally:
        if proc is not None:
            env.procs.stop(proc)
            shutil.rmtree(env.workdir / f"journal-{label}", ignore_errors=True)
    return result


# --- reporting ------------------------------------------------------------------------------------------------------


def fmt(x: float, nd: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def added(res: dict, target: str, case: str, stream: bool, q: float) -> float:
    p = res.get((target, case, stream, True))
    d = res.get(("direct", case, False, True))
    if p is None or d is None:
        return math.nan
    return p.pct(q) - d.pct(q)


def added_pair(res: dict, target: str, case: str, stream: bool) -> str:
    return f"{fmt(added(res, target, case, stream, 0.5), 2)} / {fmt(added(res, target, case, stream, 0.99), 2)}"


def cpu_ms_per_call(r: Phase) -> float:
    return r.proxy_cpu_s * 1e3 / max(r.calls, 1)


def median_cpu_round(phases: list[Phase]) -> Phase:
    """The round of a phase whose proxy CPU per call is the median (the lower middle of an even count); the direct
    baseline, with no proxy, by its median p50 latency."""
    key = cpu_ms_per_call if any(r.proxy_cpu_s for r in phases) else (lambda r: r.pct(0.5))
    return sorted(phases, key=key)[(len(phases) - 1) // 2]


def rounds_report(rounds: dict[tuple[str, str, bool, bool], list[Phase]]) -> str:
    """Each proxy phase's CPU per call in every round, in the order run, with their median and spread."""
    lines = [
        "",
        "Proxy CPU ms/call in each round (the tables above show the median round):",
        "| target | case | stream | phase | rounds | median | min - max |",
        "|--------|------|--------|-------|--------|--------|-----------|",
    ]
    for (target, case, stream, paced), phases in rounds.items():
        if target == "direct":
            continue
        cpu = [cpu_ms_per_call(r) for r in phases]
        lines.append(
            f"| {target} | {case} | {'yes' if stream else 'no'} | {'paced' if paced else 'tput'} | "
            f"{' '.join(f'{c:.2f}' for c in cpu)} | {statistics.median(cpu):.2f} | {min(cpu):.2f} - {max(cpu):.2f} |"
        )
    return "\n".join(lines)


def report(res: dict, cases: list[str], streams: list[bool], targets: list[str]) -> str:
    out: list[str] = []
    headers = [
        "case",
        "stream",
        "ours calls/s",
        "openenv calls/s",
        "ratio",
        "ours added p50/p99 ms",
        "openenv added p50/p99 ms",
        "ours RSS MB (peak)",
        "openenv RSS MB (peak)",
        "lost/mixed ours; openenv",
    ]
    rows = []
    for case in cases:
        for stream in streams:
            o = res.get(("ours", case, stream, False))
            e = res.get(("openenv", case, stream, False))
            o_tp = o.calls_per_s if o else math.nan
            e_tp = e.calls_per_s if e else math.nan
            ratio = o_tp / e_tp if o and e and e_tp > 0 else math.nan

            def lm(t: str, case: str = case, stream: bool = stream) -> str:
                ph = [res.get((t, case, stream, p)) for p in (False, True)]
                ph = [x for x in ph if x is not None]
                if not ph:
                    return "-"
                return f"{sum(x.lost for x in ph)}/{sum(x.mixed for x in ph)}"

            def mem(x: Phase | None) -> str:
                return f"{x.rss_mb:.0f} ({x.hwm_mb:.0f})" if x else "-"

            rows.append(
                [
                    case,
                    "yes" if stream else "no",
                    fmt(o_tp, 0),
                    fmt(e_tp, 0),
                    fmt(ratio, 2) + ("x" if o and e else ""),
                    added_pair(res, "ours", case, stream),
                    added_pair(res, "openenv", case, stream),
                    mem(o),
                    mem(e),
                    f"{lm('ours')}; {lm('openenv')}",
                ]
            )
    out.append(table(headers, rows))

    out.append("\nDetail (tput = closed loop, engine latency 0; paced = ~--paced-rate calls/s offered):")
    headers = [
        "target",
        "case",
        "stream",
        "phase",
        "calls",
        "err",
        "calls/s",
        "p50/p99 ms",
        "proxy CPU ms/call",
        "proxy core %",
        "engine/loadgen CPU ms/call",
        "engine+loadgen core %",
        "others CPU %",
        "sessions",
        "HWM after export MB",
        "trace fetch s",
        "echo ok",
    ]
    rows = []
    for case in cases:
        for target in ["direct", *targets]:
            for stream in [False] if target == "direct" else streams:
                for paced in (False, True):
                    r = res.get((target, case, stream, paced))
                    if r is None:
                        continue
                    core1 = (r.engine_cpu_s + r.loadgen_cpu_s) / r.wall_s * 100 if r.wall_s else math.nan
                    rows.append(
                        [
                            target,
                            case,
                            "yes" if stream else "no",
                            "paced" if paced else "tput",
                            str(r.calls),
                            str(r.errors),
                            fmt(r.calls_per_s, 0),
                            f"{fmt(r.pct(0.5), 2)} / {fmt(r.pct(0.99), 2)}",
                            fmt(r.proxy_cpu_s * 1e3 / r.calls, 2) if target != "direct" and r.calls else "-",
                            fmt(r.proxy_cpu_s / r.wall_s * 100, 0) if target != "direct" and r.wall_s else "-",
                            f"{fmt(r.engine_cpu_s * 1e3 / max(r.calls, 1), 2)} / "
                            f"{fmt(r.loadgen_cpu_s * 1e3 / max(r.calls, 1), 2)}",
                            fmt(core1, 0),
                            fmt(r.others_cpu_s / r.wall_s * 100 if r.wall_s else math.nan, 0),
                            str(r.sessions),
                            fmt(r.hwm_after_export_mb, 0) if target not in ("direct", *UNCAPTURED) else "-",
                            fmt(r.export_s, 2) if target not in ("direct", *UNCAPTURED) else "-",
                            f"{r.echo_checked - r.echo_bad}/{r.echo_checked}" if r.echo_checked else "n/a",
                        ]
                    )
    out.append(table(headers, rows))
    if res:
        others = sum(r.others_cpu_s for r in res.values()) / max(sum(r.wall_s for r in res.values()), 1e-9) * 100
        out.append(
            f"\nOther processes on the machine used {others:.0f}% CPU on average during the load "
            f"(of {(os.cpu_count() or 1) * 100}%)" + ("; the figures are noisy." if others > 20 else ".")
        )
    notes = [
        f"{k[0]} {k[1]} stream={k[2]} paced={k[3]}: {r.errors} failed session(s), first: {r.note}"
        for k, r in res.items()
        if r.errors
    ]
    if notes:
        out.append("\nErrors:\n" + "\n".join(notes))
    return "\n".join(out)


def targets_verdict(res: dict, streams: list[bool]) -> str:
    lines = ["\nTargets (from the issue):"]
    case = "64x8"
    for stream in streams:
        o = res.get(("ours", case, stream, False))
        e = res.get(("openenv", case, stream, False))
        tag = "streaming" if stream else "non-streaming"
        if o and e and e.calls_per_s > 0:
            ratio = o.calls_per_s / e.calls_per_s
            verdict = "PASS" if ratio >= 2.0 else "FAIL"
            lines.append(
                f"  [{verdict}] throughput at 64 sessions ({tag}): ours {o.calls_per_s:.0f} calls/s = "
                f"{ratio:.2f}x OpenEnv's {e.calls_per_s:.0f} (target >= 2x)"
            )
        else:
            lines.append(f"  [n/a ] throughput at 64 sessions ({tag}): case not run for both proxies")
        p50 = added(res, "ours", case, stream, 0.5)
        if not math.isnan(p50):
            verdict = "PASS" if p50 < 2.0 else "FAIL"
            lines.append(
                f"  [{verdict}] p50 added latency at 64 sessions ({tag}, paced): ours {p50:.2f} ms (target < 2 ms)"
            )
        else:
            lines.append(f"  [n/a ] p50 added latency at 64 sessions ({tag}): paced case not run")
    ours = [r for k, r in res.items() if k[0] == "ours"]
    if ours:
        lost, mixed = sum(r.lost for r in ours), sum(r.mixed for r in ours)
        verdict = "PASS" if lost == 0 and mixed == 0 else "FAIL"
        lines.append(
            f"  [{verdict}] ours lost/mixed turns over every case: {lost}/{mixed} of "
            f"{sum(r.calls for r in ours)} calls (target 0/0)"
        )
    oe = [r for k, r in res.items() if k[0] == "openenv"]
    if oe:
        lines.append(
            f"  (OpenEnv lost/mixed: {sum(r.lost for r in oe)}/{sum(r.mixed for r in oe)} of "
            f"{sum(r.calls for r in oe)} calls)"
        )
    return "\n".join(lines)


def hardening_report(
    res: dict, ttft: dict[str, Phase], targets: list[str], streams: list[bool], token_latency_ms: float
) -> str:
    """The proxy-hardening figures side by side per target: CPU per call and added p50 latency by concurrency,
    RSS per session of 64-turn cases, one session's trace export in 128-turn cases, time to first token."""
    rows: list[list[str]] = []

    def row(name: str, value: Any) -> None:
        cells = [value(t) for t in targets]
        if any(c != "-" for c in cells):
            rows.append([name, *cells])

    def phase(t: str, case: str, stream: bool, paced: bool) -> Phase | None:
        return res.get((t, case, stream, paced))

    cases = sorted({k[1] for k in res}, key=lambda c: tuple(map(int, c.split("x"))))
    for stream in streams:
        tag = "sse" if stream else "json"
        for case in cases:
            row(
                f"proxy CPU ms/call {case} {tag}",
                lambda t, c=case, s=stream: (
                    fmt(p.proxy_cpu_s * 1e3 / p.calls, 2) if (p := phase(t, c, s, False)) and p.calls else "-"
                ),
            )
        for case in cases:
            row(f"added p50 ms {case} {tag} (paced)", lambda t, c=case, s=stream: fmt(added(res, t, c, s, 0.5), 2))
        for case in [c for c in cases if c.endswith("x64")]:
            row(
                f"RSS MB per 64-turn session {case} {tag}",
                lambda t, c=case, s=stream: (
                    fmt(p.mb_per_session, 2) if (p := phase(t, c, s, False)) and t not in UNCAPTURED else "-"
                ),
            )
        for case in [c for c in cases if c.endswith("x128")]:
            row(
                f"trace export ms, one 128-turn session {case} {tag} (p50)",
                lambda t, c=case, s=stream: (
                    fmt(percentile(p.export_ms, 0.5), 1) if (p := phase(t, c, s, False)) else "-"
                ),
            )
    if ttft:
        direct = ttft.get("direct")
        row(
            f"first text ms p50, engine {token_latency_ms:g} ms/token",
            lambda t: fmt(percentile(ttft[t].ttft_ms, 0.5), 1) if t in ttft else "-",
        )
        row("whole reply ms p50, same phase", lambda t: fmt(ttft[t].pct(0.5), 1) if t in ttft else "-")
        row(
            "proxy CPU ms/call, same phase",
            lambda t: fmt(cpu_ms_per_call(ttft[t]), 2) if t in ttft and ttft[t].proxy_cpu_s else "-",
        )
        if direct is not None:
            rows.append(
                [
                    "(direct to the engine: first text / whole reply ms p50)",
                    f"{fmt(percentile(direct.ttft_ms, 0.5), 1)} / {fmt(direct.pct(0.5), 1)}",
                    *[""] * (len(targets) - 1),
                ]
            )
    if not rows:
        return ""
    return "\nProxy-hardening figures (tput phases unless marked):\n" + table(["figure", *targets], rows)


def extract_proxy(rev: str, dest: Path) -> Path:
    """``rev``'s ``proxy`` package under ``dest`` (``python -m proxy`` there runs that revision)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "proxy"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


# --- main -----------------------------------------------------------------------------------------------------------


def parse_cases(spec: str) -> list[tuple[int, int]]:
    cases = []
    for part in spec.split(","):
        s, _, n = part.strip().lower().partition("x")
        cases.append((int(s), int(n)))
    return cases


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    p.add_argument("--cases", default=None, help=f"comma-separated SESSIONSxTURNS (default {DEFAULT_CASES})")
    p.add_argument(
        "--proxies", default="ours,openenv", help="comma-separated subset of: ours,before,passthrough,forward,openenv"
    )
    p.add_argument(
        "--before",
        metavar="REV",
        default=None,
        help="a git revision whose proxy runs as the 'before' target (added to --proxies when given)",
    )
    p.add_argument(
        "--ttft",
        metavar="SxN",
        default=None,
        help="also run a streamed time-to-first-token phase of this case with a slowly sampling engine (e.g. 4x4)",
    )
    p.add_argument("--token-latency-ms", type=float, default=20.0, help="the engine's ms per token in --ttft")
    p.add_argument(
        "--bridge",
        choices=("on", "off"),
        default="on",
        help="our sessions' token-in bridge (off: the proxy's own costs; this agent echoes its calls verbatim)",
    )
    p.add_argument("--streaming", choices=("off", "on", "both"), default="both")
    p.add_argument("--no-paced", action="store_true", help="skip the paced (added-latency) phase")
    p.add_argument("--paced-rate", type=float, default=None, help="offered calls/s in the paced phase (100)")
    p.add_argument("--target-calls", type=int, default=None, help="min calls per phase: rounds of sessions (500)")
    p.add_argument("--max-calls", type=int, default=None, help="max calls per phase (2500)")
    p.add_argument("--max-seconds", type=float, default=None, help="max seconds of load per phase (20)")
    p.add_argument("--system-chars", type=int, default=6400, help="system prompt length (~4 chars per token)")
    p.add_argument("--no-memo", action="store_true", help="run the engine without memoised tokenize")
    p.add_argument(
        "--whole-streams", action="store_true", help="the engine sends a stream as one body, not a chunk per event"
    )
    p.add_argument("--proxy-core", type=int, default=0)
    p.add_argument("--load-core", type=int, default=1, help="core of the engine and this load generator")
    p.add_argument("--no-pin", action="store_true", help="don't pin processes to cores")
    p.add_argument("--quick", action="store_true", help="smoke run: small cases, short phases")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every phase this many times, the proxies in reverse order every other round; the tables show "
        "each phase's round of median proxy CPU per call, and a table its CPU in every round",
    )
    p.add_argument("--json", type=Path, default=None, help="also write every measurement here")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="py-spy each proxy's throughput phase (raw collapsed stacks in DIR; perturbs the figures)",
    )
    p.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy", help="the py-spy binary for --profile")
    p.add_argument("--serve-engine", type=int, default=None, metavar="PORT", help=argparse.SUPPRESS)
    p.add_argument("--serve-passthrough", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    p.add_argument("--serve-forward", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    quick = a.quick
    a.cases = a.cases or ("1x4,16x4,64x4" if quick else DEFAULT_CASES)
    a.paced_rate = a.paced_rate or (200.0 if quick else 100.0)
    a.target_calls = a.target_calls or (64 if quick else 500)
    a.max_calls = a.max_calls or (600 if quick else 2500)
    a.max_seconds = a.max_seconds or (5.0 if quick else 20.0)
    if a.profile:
        a.profile.mkdir(parents=True, exist_ok=True)
    return a


def self_check(system: str) -> None:
    """The verifier's memoised render must equal the engine's own."""
    msgs = [
        {"role": "system", "content": system},
        {"role": "user", "content": "[check] hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": tool_output("ls")},
    ]
    assert expected_prompt(msgs, BASH_TOOL) == fv.render_prompt(msgs, BASH_TOOL), "verifier render drifted"


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.serve_engine is not None:
        serve_engine(a.serve_engine, memo=not a.no_memo, whole_streams=a.whole_streams)
        return 0
    if a.serve_passthrough is not None:
        serve_passthrough(*a.serve_passthrough)
        return 0
    if a.serve_forward is not None:
        serve_forward(*a.serve_forward)
        return 0
    targets = [t.strip() for t in a.proxies.split(",") if t.strip()]
    if a.before and "before" not in targets:
        targets.insert(targets.index("ours") + 1 if "ours" in targets else 0, "before")
    bad = set(targets) - set(TARGETS)
    if bad:
        raise SystemExit(f"unknown proxies: {sorted(bad)}")
    if "before" in targets and not a.before:
        raise SystemExit("the 'before' proxy needs --before REV")
    cases = parse_cases(a.cases)
    streams = {"off": [False], "on": [True], "both": [False, True]}[a.streaming]
    cpus = os.cpu_count() or 1
    pin = not a.no_pin and cpus >= 2 and {a.proxy_core, a.load_core} <= os.sched_getaffinity(0)
    system = system_prompt(a.system_chars)
    self_check(system)

    def on_term(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
    workdir = Path(tempfile.mkdtemp(prefix="bench-proxy-vs-openenv-"))
    procs = Procs(workdir)
    rounds: dict[tuple[str, str, bool, bool], list[Phase]] = {}  # (target, case, stream, paced) -> one per round
    ttft: dict[str, Phase] = {}
    failures: list[str] = []
    pinning = f"proxy->core {a.proxy_core}, engine+loadgen->core {a.load_core}" if pin else "no"
    print(
        f"os.cpu_count()={cpus}  pinned={pinning}"
        f"  python={platform.python_version()}  engine memo={'off' if a.no_memo else 'on'}"
        f"  streams={'whole' if a.whole_streams else 'a chunk per event'}",
        flush=True,
    )
    print(
        f"load average at start: {load_avg()}  cases={a.cases}  streaming={a.streaming}  proxies={a.proxies}  "
        f"paced rate={a.paced_rate}/s  target/max calls={a.target_calls}/{a.max_calls}  "
        f"max seconds={a.max_seconds}  system prompt={a.system_chars} chars",
        flush=True,
    )
    started = time.monotonic()
    try:
        if pin:
            os.sched_setaffinity(0, {a.load_core})
        engine_port = free_port()
        argv_engine = [sys.executable, str(Path(__file__).resolve()), "--serve-engine", str(engine_port)]
        if a.no_memo:
            argv_engine.append("--no-memo")
        if a.whole_streams:
            argv_engine.append("--whole-streams")
        engine, log = procs.spawn("engine", argv_engine, {a.load_core} if pin else None)
        wait_healthy(engine_port, engine, log)
        env = Env(a, procs, workdir, engine_port, engine.pid, system, secrets.token_hex(4), pin)
        if a.before:
            env.before_src = extract_proxy(a.before, workdir / "before-src")

        def measure(target: str, sessions: int, turns: int, stream: bool, paced: bool) -> None:
            case = f"{sessions}x{turns}"
            name = f"{case:>6} {target:<7} {('sse ' if stream else 'json') if target != 'direct' else '    '}    " + (
                "paced" if paced else "tput "
            )
            try:
                r = run_phase(env, target, (sessions, turns), stream, paced)
            except (RuntimeError, OSError, aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
                failures.append(f"{name.strip()}: {type(exc).__name__}: {exc}")
                print(f"  {name}: FAILED {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
                return
            rounds.setdefault((target, case, stream, paced), []).append(r)
            extra = (
                ""
                if target == "direct"
                else (
                    f"  CPU {r.proxy_cpu_s * 1e3 / max(r.calls, 1):.2f} ms/call RSS {r.rss_mb:.0f} MB "
                    + ("(no capture)" if target in UNCAPTURED else f"lost/mixed {r.lost}/{r.mixed}")
                )
            )
            print(
                f"  {name}: {r.calls} calls {r.calls_per_s:7.0f}/s p50 {r.pct(0.5):6.2f} ms{extra} err {r.errors}",
                flush=True,
            )

        for round_ in range(a.rounds):
            if a.rounds > 1:
                print(f"round {round_ + 1} of {a.rounds}", flush=True)
            for sessions, turns in cases:
                for paced in (False,) if a.no_paced else (False, True):
                    measure("direct", sessions, turns, False, paced)
                for stream in streams:
                    for target in targets if round_ % 2 == 0 else targets[::-1]:
                        for paced in (False,) if a.no_paced else (False, True):
                            measure(target, sessions, turns, stream, paced)
        if a.ttft:
            (sessions, turns), token_s = parse_cases(a.ttft)[0], a.token_latency_ms / 1e3
            for target in ["direct", *targets]:
                try:
                    r = run_phase(env, target, (sessions, turns), True, False, token_latency_s=token_s)
                except (RuntimeError, OSError, aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
                    failures.append(f"ttft {target}: {type(exc).__name__}: {exc}")
                    continue
                ttft[target] = r
                print(
                    f"  {a.ttft:>6} {target:<7} sse     ttft : {r.calls} calls, first text p50 "
                    f"{percentile(r.ttft_ms, 0.5):7.1f} ms, whole reply p50 {r.pct(0.5):7.1f} ms err {r.errors}",
                    flush=True,
                )
    except KeyboardInterrupt:
        print("\ninterrupted; stopping child processes", file=sys.stderr)
        return 130
    finally:
        procs.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    case_names = [f"{s}x{n}" for s, n in cases]
    res = {key: median_cpu_round(phases) for key, phases in rounds.items()}
    print()
    print(report(res, case_names, streams, targets))
    if a.rounds > 1:
        print(rounds_report(rounds))
    print(targets_verdict(res, streams))
    print(hardening_report(res, ttft, targets, streams, a.token_latency_ms))
    if failures:
        print("\nFailed runs:\n  " + "\n  ".join(f[:500] for f in failures))
    print(f"\nos.cpu_count()={cpus}; load average at end: {load_avg()}; total {time.monotonic() - started:.0f} s")
    if a.json:
        rows = [
            {
                "target": k[0],
                "case": k[1],
                "stream": k[2],
                "paced": k[3],
                "calls": r.calls,
                "errors": r.errors,
                "wall_s": r.wall_s,
                "calls_per_s": r.calls_per_s,
                "p50_ms": r.pct(0.5),
                "p99_ms": r.pct(0.99),
                "proxy_cpu_s": r.proxy_cpu_s,
                "engine_cpu_s": r.engine_cpu_s,
                "loadgen_cpu_s": r.loadgen_cpu_s,
                "rss_mb": r.rss_mb,
                "hwm_mb": r.hwm_mb,
                "hwm_after_export_mb": r.hwm_after_export_mb,
                "sessions": r.sessions,
                "lost": r.lost,
                "mixed": r.mixed,
                "echo_checked": r.echo_checked,
                "echo_bad": r.echo_bad,
                "export_s": r.export_s,
                "round": i,
            }
            for k, phases in rounds.items()
            for i, r in enumerate(phases)
        ]
        a.json.write_bytes(
            orjson.dumps(
                {"cpu_count": cpus, "args": {k: str(v) for k, v in vars(a).items()}, "results": rows},
                option=orjson.OPT_INDENT_2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
