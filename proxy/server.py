"""The capture proxy's HTTP service.

Agent plane (the session's API key, looked up by its hash): ``POST
/v1/chat/completions`` (OpenAI chat), ``POST /v1/responses`` (OpenAI
Responses), ``POST /v1/messages`` and ``/v1/messages/count_tokens``
(Anthropic), ``GET /v1/models``.
Control plane (admin key; sessions named by id): ``POST/GET /sessions``,
``GET/DELETE /sessions/{id}``, ``GET /sessions/{id}/trace`` (``TrainingTrace``
JSON), ``GET /sessions/{id}/sequences``. Open: ``GET /health``, ``GET
/metrics`` (Prometheus text).

``POST /sessions`` answers ``{"session_id", "api_key", ...}``: the id is a name
(the caller may choose it), the key a secret the proxy mints, returns this once
and keeps only as a hash (``proxy.sessions``). A body naming ``api_key`` is a
400: a caller can't choose a key.

One model call: authenticate, decode the body (``Content-Encoding`` identity,
gzip, deflate, or br when ``brotli`` is installed), translate (dialect), apply
the session's sampling policy, serialise the engine request with the nesting
bound (``proxy.json_depth``: a body that nests deeper is a 400 and is never
stored), plan its prompt (``proxy.bridge``: a history this session sampled is
sent as the ids it sampled, on the engine's token route; else the engine
renders the messages), call the engine once (retrying transient failures before it answered),
extract and check the exact capture, render the reply in the agent's dialect,
record the turn (journal, then graph), and only then send the reply. A JSON
reply comes from one non-streaming engine call. A streamed one comes from the
engine's stream: its text goes to the agent as the engine samples it (the first
at once, then at most one write per ``stream_flush_s``; keepalives fill
silences), and the last frames (tool calls, stop reason, the end of the
stream) are sent once the completed stream's turn is recorded.

Invariant: a turn is in the trace if and only if the agent was sent its reply
(for a stream, the whole of it; text it read of a failed stream is no reply).
A reply that can't be rendered, a turn the journal can't write (a full disk)
and a session deleted during the call record nothing and answer an error. A
client that disconnects cancels the engine call, records nothing and logs no
error (its handler is cancelled, or its next write fails); an engine failure
or malformed engine reply becomes an error in the agent's dialect and nothing
is recorded. Once a stream's headers are out, every error,
the proxy's own included, is the dialect's stream error event followed by the
end of the stream, never a second HTTP response.

Connections (``ProxyConfig``; ``python -m proxy --help``): a connection that
sends no complete request head within ``idle_timeout_s`` of opening or of its
last reply is closed (this is also the keep-alive timeout). A request body must
arrive whole within ``body_timeout_s`` of the handler reading it, else the
caller gets a 408 and the rest of the body is drained for at most
``min(body_timeout_s, 10)`` s before the connection closes. At most
``max_connections`` connections are open at once (default: the open-file soft
limit less ``max_open_journals``, ``max_upstream_connections`` and
``FD_RESERVE``, at least 16); one accepted past the cap is answered 503 and
closed at once, so a flood can't take the descriptors journals and engine calls
need, and connections already open (an agent's keep-alive one included) keep
working. Refused connections are counted in ``/metrics``
(``proxy_connections_refused_total``, with ``proxy_connections_open`` and
``proxy_body_timeouts_total``), and logged at most once a minute.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
import secrets
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import aclosing, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, cast
from urllib.parse import urlsplit

import orjson
from aiohttp import web

from proxy.bridge import BridgePlan, History, plan_prompt
from proxy.dialects import COUNT_TOKENS_ROUTE, ROUTES, anthropic_messages, openai_chat
from proxy.dialects.base import ChatRequest, DialectError, StreamRenderer
from proxy.engine_client import (
    CHAT_ROUTE,
    TOKENS_ROUTE,
    Capture,
    EngineClient,
    EngineCounters,
    EngineTier,
    MalformedUpstream,
    StreamAssembler,
    UpstreamError,
    engine_base_url,
    extract_capture,
    has_tokens_route,
    probe_tier,
)
from proxy.json_depth import MAX_REQUEST_DEPTH, NestingError, check_depth, dumps_bounded
from proxy.known_prompt import KnownPrompt
from proxy.metrics import ProxyMetrics
from proxy.sampling_policy import PolicyError, engine_request
from proxy.sessions import Session, SessionConfig, SessionRegistry, keys_equal
from proxy.trace import CaptureContractError

try:
    import brotli
except ImportError:  # optional: without it, a br body is answered 415
    brotli = None

log = logging.getLogger("proxy")

BUDGET_EXHAUSTED_TEXT = "Step budget exhausted; stopping."
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
INLINE_PARSE_BYTES = 256 * 1024  # bodies up to this are parsed on the loop (a thread hop costs more than they do)
FD_RESERVE = 64  # descriptors kept back from connections: listening sockets, the event loop, threads, logs, ...
REFUSAL_LOG_INTERVAL_S = 60.0


@dataclass
class ProxyConfig:
    """Settings of one proxy process."""

    engine_url: str
    journal_dir: Path
    host: str = "127.0.0.1"
    port: int = 8100
    admin_key: str | None = None  # None on loopback: minted; required off loopback
    model: str | None = None  # served name upstream; None: the engine's first model
    engine_api_key: str | None = None  # sent upstream as "Authorization: Bearer" (an engine behind a key)
    keepalive_s: float = 10.0
    max_body_bytes: int = 32 * 1024 * 1024
    upstream_timeout_s: float = 600.0  # one engine call's whole budget, its retries included
    upstream_retries: int = 3
    upstream_backoff_s: float = 2.0
    max_upstream_connections: int = 256
    max_engine_clients: int = 16  # engine URLs with an open pool; least recently used closed first
    max_open_journals: int = 128  # journal descriptors held open; sessions are not bounded by it
    fsync: bool = False
    probe_engines: bool = True
    idle_timeout_s: float = 60.0  # no complete request head this long after opening or a reply: closed
    body_timeout_s: float = 60.0  # a request body must arrive whole within this
    max_connections: int | None = None  # None: from the open-file limit (``connection_cap``)
    stream_flush_s: float = 0.05  # after a stream's first text, text is written to the agent at most this often

    def __post_init__(self) -> None:
        if self.host not in LOOPBACK_HOSTS and not self.admin_key:
            raise ValueError(
                f"binding {self.host} (not loopback) requires an admin key (--admin-key or $HARNESS_PROXY_ADMIN_KEY): "
                "without one, anyone who reaches the port could open sessions"
            )
        if self.max_engine_clients < 1:
            raise ValueError("max_engine_clients must be at least 1")
        if not (self.idle_timeout_s > 0 and self.body_timeout_s > 0):
            raise ValueError("idle_timeout_s and body_timeout_s must be positive")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if not self.stream_flush_s >= 0:
            raise ValueError("stream_flush_s must be at least 0")


def connection_cap(config: ProxyConfig) -> int:
    """``config.max_connections``, or else the open-file soft limit less the journal descriptors, one engine
    pool and ``FD_RESERVE`` (at least 16)."""
    if config.max_connections is not None:
        return config.max_connections
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(soft - config.max_open_journals - config.max_upstream_connections - FD_RESERVE, 16)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _agent_key(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("x-goog-api-key")


class CaptureProxy:
    """The proxy application; ``start()``/``stop()`` run it in the current event loop."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.admin_key = config.admin_key or secrets.token_urlsafe(24)
        self.sessions = SessionRegistry(
            config.journal_dir, fsync=config.fsync, max_open_journals=config.max_open_journals
        )
        self.metrics = ProxyMetrics()
        self._clients: OrderedDict[str, EngineClient] = OrderedDict()  # base URL -> client, least recent first
        self._engine_counters = EngineCounters()
        self._closing: set[asyncio.Task[None]] = set()  # retired clients' pools being closed
        self._tiers: dict[tuple[str, str], EngineTier] = {}
        self._tokens_routes: dict[str, bool] = {}  # base URL -> whether the engine serves TOKENS_ROUTE
        self._models: dict[str, str] = {}
        self._runner: web.AppRunner | None = None
        self.app = self._build_app()

    # --- lifecycle -------------------------------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[self._error_middleware])
        for path, dialect in ROUTES.items():
            app.router.add_post(path, self._model_call_handler(dialect))
        app.router.add_post(COUNT_TOKENS_ROUTE, self._count_tokens)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/sessions", self._create_session)
        app.router.add_get("/sessions", self._list_sessions)
        app.router.add_get("/sessions/{sid}", self._get_session)
        app.router.add_delete("/sessions/{sid}", self._delete_session)
        app.router.add_get("/sessions/{sid}/trace", self._get_trace)
        app.router.add_get("/sessions/{sid}/sequences", self._get_sequences)
        return app

    async def start(self) -> int:
        """Recover journals, bind, serve; returns the bound port."""
        recovered = self.sessions.recover()
        if recovered:
            log.info("recovered %d session(s) from %s", recovered, self.config.journal_dir)
        if self.sessions.quarantined:
            log.warning(
                "%d journal(s) could not be recovered and were moved to %s",
                len(self.sessions.quarantined),
                self.sessions.quarantine_dir,
            )
        # auto_decompress off: the proxy decodes bodies itself (_read_body), so an encoding it can't decode is
        # answered in the caller's dialect instead of by the HTTP parser in plain text, and output is bounded.
        self._runner = web.AppRunner(
            self.app,
            handler_cancellation=True,
            access_log=None,
            auto_decompress=False,
            keepalive_timeout=self.config.idle_timeout_s,
            lingering_time=min(self.config.body_timeout_s, 10.0),
        )
        await self._runner.setup()
        site = _CappedSite(self._runner, self.config.host, self.config.port, connection_cap(self.config), self.metrics)
        return await site.start_serving()

    async def stop(self) -> None:
        """Stop serving and close upstream pools and journals."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        while self._clients:
            await self._clients.popitem()[1].close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        self.sessions.close()

    def _client(self, url: str | None) -> EngineClient:
        """The pooled client of an engine; at most ``max_engine_clients`` are kept, least recently used retired."""
        url = engine_base_url(url or self.config.engine_url)
        client = self._clients.get(url)
        if client is None:
            client = EngineClient(
                url,
                max_connections=self.config.max_upstream_connections,
                timeout_s=self.config.upstream_timeout_s,
                retries=self.config.upstream_retries,
                backoff_s=self.config.upstream_backoff_s,
                counters=self._engine_counters,
                api_key=self.config.engine_api_key,
            )
            self._clients[url] = client
            while len(self._clients) > self.config.max_engine_clients:
                self._retire_client(next(iter(self._clients)))
        else:
            self._clients.move_to_end(url)
        return client

    def _retire_client(self, url: str) -> None:
        """Forget the engine at ``url``: its client closes once idle, its cached model and tier go."""
        self._models.pop(url, None)
        self._tokens_routes.pop(url, None)
        for key in [key for key in self._tiers if key[0] == url]:
            del self._tiers[key]
        client = self._clients.pop(url, None)
        if client is not None and (closing := client.retire()) is not None:
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    def _drop_unused_client(self, llm_url: str | None) -> None:
        """Retire the client of a session-pinned engine no live session uses (never the default engine's)."""
        if llm_url is None:
            return
        url = engine_base_url(llm_url)
        if url != engine_base_url(self.config.engine_url) and not self.sessions.uses_engine(url):
            self._retire_client(url)

    async def _served_model(self, client: EngineClient, wanted: str | None) -> str:
        if wanted:
            return wanted
        if client.base_url not in self._models:
            models = await client.get_json("/v1/models")
            data = models.get("data") or []
            if not isinstance(data, list) or not data or not isinstance(data[0], dict) or not data[0].get("id"):
                raise UpstreamError(502, f"engine serves no model: /v1/models answered {str(models)[:200]}")
            if not isinstance(data[0]["id"], str):
                raise UpstreamError(502, "engine's /v1/models names its model with something other than a string")
            self._models[client.base_url] = data[0]["id"]
        return self._models[client.base_url]

    # --- middleware and control plane ------------------------------------------------------------------------------

    @web.middleware
    async def _error_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            stream = request.get(_OPEN_STREAM)
            if isinstance(exc, ConnectionResetError) and _agent_gone(request):
                # A write to an agent that hung up: nothing was recorded (the call raised before its record) and
                # there is no one to answer; aiohttp ends a response to a closed transport quietly.
                log.debug("%s %s: the agent went away mid-reply", request.method, request.path)
                return stream if stream is not None else web.Response(status=499)
            if isinstance(exc, web.HTTPException) and exc.status < 400:
                raise
            if isinstance(exc, web.HTTPRequestEntityTooLarge):
                status, message, type_ = 413, f"request body exceeds {self.config.max_body_bytes} bytes", None
            elif isinstance(exc, web.HTTPException):
                status, message, type_ = exc.status, exc.reason, None
            else:  # a bug: still an answer in the caller's dialect, and a log line
                log.exception("unhandled error on %s %s", request.method, request.path)
                status, message, type_ = 500, f"internal proxy error: {type(exc).__name__}: {exc}", "api_error"
            if stream is not None:  # its headers went out: report in the stream, never a second response
                await _end_stream_with_error(stream, _dialect_for(request.path), status, message, type_)
                return stream
            return self._error_for(request, status, message, type_)

    def _error_for(self, request: web.Request, status: int, message: str, type_: str | None) -> web.Response:
        return _json(_dialect_for(request.path).render_error(status, message, type_), status)

    def _require_admin(self, request: web.Request) -> None:
        if not keys_equal(_agent_key(request), self.admin_key):
            raise web.HTTPUnauthorized(reason="admin key required")

    def _session_or_404(self, request: web.Request) -> Session:
        self._require_admin(request)
        session = self.sessions.get(request.match_info["sid"])
        if session is None:
            raise web.HTTPNotFound(reason="no such session")
        return session

    async def _create_session(self, request: web.Request) -> web.Response:
        self._require_admin(request)
        try:
            session_id, config = _session_request(orjson.loads(await self._read_body(request)))
        except _BodyError as exc:
            return _json(openai_chat.render_error(exc.status, str(exc)), exc.status)
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            return _json(openai_chat.render_error(400, f"invalid session request: {exc}"), 400)
        response = None
        try:
            response = await self._open_session(config, session_id)
            return response
        finally:
            if response is None or response.status != 201:  # a failed creation keeps no engine client
                self._drop_unused_client(config.llm_url)

    async def _open_session(self, config: SessionConfig, session_id: Any) -> web.Response:
        client = self._client(config.llm_url)
        try:
            model = await self._served_model(client, config.model or self.config.model)
            if self.config.probe_engines:
                tier = await self._probe(client, model)
                if config.purpose == "train" and not tier.trainable:
                    message = f"engine tier is '{tier.tier}' ({tier.detail}); a train session needs 'tokens'"
                    return _json(openai_chat.render_error(400, message), 400)
        except UpstreamError as exc:
            return _json(openai_chat.render_error(502, f"engine probe failed: {exc}"), 502)
        try:
            session, api_key = self.sessions.create(config, model, session_id)
        except (KeyError, ValueError) as exc:
            status = 409 if isinstance(exc, KeyError) else 400
            return _json(openai_chat.render_error(status, str(exc)), status)
        except OSError as exc:  # nothing was registered or left on disk
            log.error("could not create a session's journal: %s", exc)
            message = f"could not write the session's journal: {exc}"
            return _json(openai_chat.render_error(503, message, "api_error"), 503)
        self.metrics.sessions_created += 1
        return _json({"session_id": session.id, "api_key": api_key, **session.describe()}, 201)

    async def engine_tier(self) -> EngineTier:
        """The capture tier of the configured engine (probed once, as a session's creation probes it);
        ``UpstreamError`` when the engine does not answer."""
        client = self._client(None)
        return await self._probe(client, await self._served_model(client, self.config.model))

    async def _probe(self, client: EngineClient, model: str) -> EngineTier:
        key = (client.base_url, model)
        if key not in self._tiers:
            self._tiers[key] = await probe_tier(client, model)
        return self._tiers[key]

    async def _has_tokens_route(self, client: EngineClient) -> bool:
        """Whether the engine can sample from given ids (probed once per engine)."""
        if client.base_url not in self._tokens_routes:
            self._tokens_routes[client.base_url] = await has_tokens_route(client)
        return self._tokens_routes[client.base_url]

    async def _list_sessions(self, request: web.Request) -> web.Response:
        self._require_admin(request)
        return _json({"sessions": [s.describe() for s in self.sessions]})

    async def _get_session(self, request: web.Request) -> web.Response:
        return _json(self._session_or_404(request).describe())

    async def _delete_session(self, request: web.Request) -> web.Response:
        session = self._session_or_404(request)
        self.sessions.delete(session.id)
        self._drop_unused_client(session.config.llm_url)
        return _json({"deleted": session.id})

    async def _get_trace(self, request: web.Request) -> web.Response:
        """The session's trace, built and serialised on a worker thread: a large export never stalls the loop."""
        session = self._session_or_404(request)
        body = await asyncio.to_thread(session.graph.trace_json)
        return web.Response(body=body, content_type="application/json")

    async def _get_sequences(self, request: web.Request) -> web.Response:
        """The session's training sequences, built and serialised on a worker thread."""
        session = self._session_or_404(request)
        body = await asyncio.to_thread(lambda: orjson.dumps({"sequences": session.graph.training_sequences()}))
        return web.Response(body=body, content_type="application/json")

    async def _health(self, request: web.Request) -> web.Response:
        return _json({"status": "ok", "sessions": len(self.sessions)})

    async def _metrics(self, request: web.Request) -> web.Response:
        server = self._runner.server if self._runner is not None else None
        text = self.metrics.render(
            self.sessions,
            self._engine_counters.retries,
            quarantined_journals=len(self.sessions.quarantined),
            open_connections=len(server.connections) if server is not None else 0,
        )
        return web.Response(text=text, content_type="text/plain")

    async def _list_models(self, request: web.Request) -> web.Response:
        session = self.sessions.by_key(_agent_key(request))
        if session is None:
            return _json(openai_chat.render_error(401, "unknown API key", "authentication_error"), 401)
        return _json({"object": "list", "data": [{"id": session.model, "object": "model", "owned_by": "harness-grpo"}]})

    async def _count_tokens(self, request: web.Request) -> web.Response:
        if self.sessions.by_key(_agent_key(request)) is None:
            return _json(anthropic_messages.render_error(401, "unknown API key", "authentication_error"), 401)
        try:
            body = orjson.loads(await self._read_body(request))
        except _BodyError as exc:
            return _json(anthropic_messages.render_error(exc.status, str(exc)), exc.status)
        except orjson.JSONDecodeError as exc:
            return _json(anthropic_messages.render_error(400, f"malformed JSON: {exc}"), 400)
        try:
            return _json(anthropic_messages.estimate_tokens(body))
        except DialectError as exc:
            return _json(anthropic_messages.render_error(exc.status, str(exc), param=exc.param), exc.status)

    # --- agent plane -----------------------------------------------------------------------------------------------

    def _model_call_handler(self, dialect: ModuleType):
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self._model_call(request, dialect)

        return handler

    async def _read_body(self, request: web.Request) -> bytes:
        """The request body decoded per ``Content-Encoding``, at most ``max_body_bytes`` either way (``_BodyError``)."""
        try:
            if request.content.is_eof():  # the whole body is in: reading it can't wait, so no timer is set
                data = await request.read()  # raises HTTPRequestEntityTooLarge past client_max_size
            else:
                async with asyncio.timeout(self.config.body_timeout_s):
                    data = await request.read()
        except web.RequestPayloadError as exc:
            raise _BodyError(400, f"unreadable request body: {exc}") from None
        except TimeoutError:
            self.metrics.body_timeouts += 1
            raise _BodyError(408, f"the request body did not arrive within {self.config.body_timeout_s} s") from None
        return _decode_body(data, request.headers.get("Content-Encoding"), self.config.max_body_bytes)

    async def _model_call(self, request: web.Request, dialect: ModuleType) -> web.StreamResponse:
        self.metrics.requests += 1
        session = self.sessions.by_key(_agent_key(request))
        if session is None:
            self.metrics.unauthorized += 1
            return _json(dialect.render_error(401, "unknown API key: no such session", "authentication_error"), 401)
        try:
            data = await self._read_body(request)
            translate = functools.partial(_translate, data, dialect, session)
            if len(data) > INLINE_PARSE_BYTES:  # a large body is parsed on a worker thread: the loop serves others
                chat, upstream_body, requested, payload = await asyncio.to_thread(translate)
            else:
                chat, upstream_body, requested, payload = translate()
        except _BodyError as exc:
            return self._client_error(session, dialect, exc.status, str(exc), None)
        except orjson.JSONDecodeError as exc:
            return self._client_error(session, dialect, 400, f"malformed JSON: {exc}", None)
        except NestingError:
            return self._client_error(
                session, dialect, 400, f"request nests deeper than {MAX_REQUEST_DEPTH} levels", None
            )
        except (DialectError, PolicyError) as exc:
            status = getattr(exc, "status", 400)
            return self._client_error(session, dialect, status, str(exc), getattr(exc, "param", None))
        if session.budget_exhausted():
            session.stats.budget_refusals += 1
            reply = _render(dialect, chat, _budget_reply(session.model, chat))
            stream = await _open_stream(request) if chat.stream else None
            return await _send(stream, reply)
        with session.call_slot():  # concurrent calls of one session cannot overrun its budget
            return await self._engine_call(request, dialect, chat, session, payload, upstream_body, requested)

    async def _engine_call(
        self,
        request: web.Request,
        dialect: ModuleType,
        chat: ChatRequest,
        session: Session,
        payload: bytes,
        upstream_body: dict[str, Any],
        requested: dict[str, Any],
    ) -> web.StreamResponse:
        """Call the engine, render the reply, record the turn, send the reply: recorded iff replied.

        A streamed call passes the reply's text on as the engine samples it; its last frames (tool calls, stop
        reason, the end of the stream) are sent only once the turn is recorded.
        """
        started = time.perf_counter()
        client = self._client(session.config.llm_url)
        stream = None
        try:
            if chat.stream:
                stream = await _open_stream(request)
            engine, capture, plan, renderer, prompt_json = await self._sample(
                stream, dialect, chat, session, client, payload, upstream_body
            )
            # From here to the send nothing awaits: a cancelled call (the agent went away) records nothing, and
            # a recorded one is handed to the transport.
            if renderer is None:
                reply = _render(dialect, chat, engine, prompt_json)
            else:
                with _rendering(dialect):
                    reply = b"".join(renderer.finish(engine))
            if self.sessions.get(session.id) is not session:
                raise _CallFailed(404, "the session was deleted during the call; nothing was recorded", None)
            self._record(session, chat, capture, engine, upstream_body, requested, request, plan, prompt_json)
        except (UpstreamError, _CallFailed) as exc:
            session.stats.errors += 1
            if isinstance(exc, UpstreamError):
                self.metrics.upstream_errors += 1
                type_ = None if exc.status < 500 else "api_error"  # a 4xx upstream is the request's fault
            else:
                type_ = exc.type
            if stream is None:
                return _json(dialect.render_error(exc.status, str(exc), type_), exc.status)
            await _end_stream_with_error(stream, dialect, exc.status, str(exc), type_, chat)
            return stream
        self.metrics.observe_call(time.perf_counter() - started)
        return await _send(stream, reply)

    async def _sample(
        self,
        stream: web.StreamResponse | None,
        dialect: ModuleType,
        chat: ChatRequest,
        session: Session,
        client: EngineClient,
        payload: bytes,
        upstream_body: dict[str, Any],
    ) -> tuple[dict[str, Any], Capture, BridgePlan, StreamRenderer | None, bytes | None]:
        """Plan the prompt (``plan_prompt``) and sample it, relayed to ``stream`` when there is one: the engine's
        completion, its capture, the plan it followed, the stream's renderer and the open JSON of the prompt ids
        where they were matched as bytes (``proxy.known_prompt``). A speculative call whose prompt
        is not the bridged one is made again through the bridge before anything of it is sent or recorded."""
        while True:
            plan = await plan_prompt(
                upstream_body,
                index=session.bridge,
                graph=session.graph,
                client=client,
                enabled=session.config.bridge,
                reasoning=session.config.bridge_reasoning,
                has_route=functools.partial(self._has_tokens_route, client),
            )
            body, route, known = payload, CHAT_ROUTE, None
            if plan.tokens is not None:
                tokens = orjson.dumps(plan.tokens)
                body, route = dumps_bounded({**upstream_body, "tokens": orjson.Fragment(tokens)}), TOKENS_ROUTE
                known = KnownPrompt(plan.tokens, tokens[:-1])
            confirm = None if plan.expects is None else functools.partial(session.bridge.confirm, plan, session.graph)
            known = known or session.bridge.known_prompt(plan, session.graph)
            if stream is None:
                engine, prompt_json = await client.chat_known(body, route=route, known=known)
                capture = extract_capture(engine)
                # prompt_json: the engine's prompt started with the ids it was expected to start with
                if confirm is None or prompt_json is not None or confirm(capture.prompt_ids):
                    return engine, capture, plan, None, prompt_json
                continue
            renderer = dialect.stream_renderer(chat)
            try:
                engine, prompt_json = await self._relay(
                    stream, dialect, chat, renderer, client, body, route, known, confirm
                )
            except _SpeculationMissed:
                continue
            return engine, extract_capture(engine), plan, renderer, prompt_json

    async def _relay(
        self,
        stream: web.StreamResponse,
        dialect: ModuleType,
        chat: ChatRequest,
        renderer: StreamRenderer,
        client: EngineClient,
        payload: bytes,
        route: str,
        known: KnownPrompt | None = None,
        confirm: Callable[[Any], bool] | None = None,
    ) -> tuple[dict[str, Any], bytes | None]:
        """Stream the engine's reply to the agent as it is sampled; returns the assembled completion and the open
        JSON of its prompt ids where they started with ``known`` (``proxy.known_prompt``; else None).

        ``confirm`` (a speculative call): the engine's prompt ids, read from its first chunks, must pass it before
        anything is written (a match with ``known`` passes); ``_SpeculationMissed`` where they don't.

        The renderer's start frames and the first text are written as soon as they arrive; after that, text is
        written at most once per ``stream_flush_s`` (what arrived in between as one delta per run of a field),
        when the interval ends whether or not the engine sent more (a timer, not a task per chunk), and before
        this returns or raises an engine failure. Keepalives fill the engine's silences.
        """
        assembler = StreamAssembler()
        keepalive = _Keepalive(stream, dialect.KEEPALIVE, self.config.keepalive_s)
        loop = asyncio.get_running_loop()
        frames: list[bytes] = []  # rendered, not written yet
        texts: list[dict[str, str]] = []  # text deltas not rendered yet
        due = 0.0  # loop time from which pending output is written: the last text write + stream_flush_s
        timer: asyncio.TimerHandle | None = None  # writes what is pending at ``due`` unless a batch does first
        writing: asyncio.Future[None] | None = None  # the timer's write, awaited before the next one

        def take() -> bytes:
            """What is pending, rendered and taken; the next text write is due ``stream_flush_s`` from now."""
            nonlocal due, timer
            if timer is not None:
                timer.cancel()
                timer = None
            with _rendering(dialect):
                for delta in texts:
                    frames.extend(renderer.delta(delta))
            if texts:
                due = loop.time() + self.config.stream_flush_s
                texts.clear()
            output = b"".join(frames)
            frames.clear()
            return output

        async def write_after(previous: asyncio.Future[None] | None) -> None:
            if previous is not None:  # in order; its failure is this write's
                await previous
            if output := take():
                await stream.write(output)

        def on_due() -> None:
            nonlocal timer, writing
            timer = None
            writing = asyncio.ensure_future(write_after(writing))

        async def flush() -> None:
            nonlocal writing
            previous, writing = writing, None
            await write_after(previous)

        try:
            matched: list[bytes] = []
            async with aclosing(client.chat_stream(payload, route=route, known=known, matched=matched)) as batches:
                try:
                    async for batch in batches:
                        started = bool(assembler.head)
                        assembler.add_batch(batch, texts)
                        if not started:
                            prompt_ids = assembler.head.get("prompt_token_ids")  # taken from ``known`` if matched
                            if confirm is not None and not matched and not confirm(prompt_ids):
                                raise _SpeculationMissed
                            head = _echoing(chat, assembler.head, matched[0] if matched else None)
                            with _rendering(dialect):
                                frames.extend(renderer.start(head))
                        if frames or texts:
                            if due <= loop.time():
                                await flush()
                            elif timer is None:
                                timer = loop.call_at(due, on_due)
                except UpstreamError:
                    await flush()  # what the engine sent before it failed still reaches the agent
                    raise
            await flush()
        finally:  # nothing is written after this: a write under way is cut where it waits
            keepalive.cancel()
            if timer is not None:
                timer.cancel()
            if writing is not None and not writing.done():
                writing.cancel()
                await asyncio.wait((writing,))
            if writing is not None and not writing.cancelled():
                writing.exception()  # retrieved: the failure that ends the call is the one raised here
        return assembler.response(), matched[0] if matched else None

    def _record(
        self,
        session: Session,
        chat: ChatRequest,
        capture: Capture,
        engine: dict[str, Any],
        upstream_body: dict[str, Any],
        requested: dict[str, Any],
        request: web.Request,
        plan: BridgePlan,
        prompt_json: bytes | None,
    ) -> None:
        """Journal, then add to the graph, one checked and rendered call; all or nothing. Its index for the bridge
        (``metadata``: whether its prompt was bridged, and why not; ``prompt_json``: see ``_sample``) is built once
        the reply was handed to the transport: it is off the reply's path, and the session's next call, which
        reads it, is handled after it (a callback scheduled now runs before any I/O that follows)."""
        choice = engine["choices"][0]
        engine_turn = {"choices": [{"message": choice["message"], "finish_reason": choice.get("finish_reason")}]}
        tools = upstream_body.get("tools") or []
        metadata = {
            "model": session.model,
            "dialect": chat.dialect,
            "n_tools": len(tools),
            "harness_session_id": _harness_session_id(request),
            "sampling_params": {k: upstream_body[k] for k in _SAMPLING_KEYS if k in upstream_body},
            "requested_sampling_params": requested,
            **plan.metadata(),
        }
        if upstream_body.get("chat_template_kwargs"):  # they shape the prompt; the bridge's index reads them back
            metadata["chat_template_kwargs"] = upstream_body["chat_template_kwargs"]
        if capture.logprob_note:
            metadata["logprobs_dropped"] = capture.logprob_note
        try:
            node_id = session.record(
                capture,
                {"messages": upstream_body["messages"], "tools": tools},
                engine_turn,
                metadata,
                extends=plan.expects or (plan.matched if prompt_json is not None else None),
            )
        except CaptureContractError as exc:
            raise MalformedUpstream(str(exc)) from None
        except OSError as exc:
            log.error("session %s: journal write failed, turn not recorded: %s", session.id, exc)
            raise _CallFailed(
                500, f"the turn could not be journaled ({exc}); nothing was recorded", "api_error"
            ) from None
        self.metrics.captured_tokens += len(capture.sampled_ids)
        if plan.history is not None:
            asyncio.get_running_loop().call_soon(
                _index_turn, session, node_id, plan.history, engine_turn, capture, prompt_json, metadata
            )

    def _client_error(
        self, session: Session, dialect: ModuleType, status: int, message: str, param: str | None
    ) -> web.Response:
        session.stats.errors += 1
        self.metrics.client_errors += 1
        return _json(dialect.render_error(status, message, "invalid_request_error", param=param), status)


class _CappedSite(web.BaseSite):
    """A TCP site that keeps at most ``cap`` connections open: one accepted past it is answered 503 and closed
    at once (counted in ``metrics``, logged at most once per ``REFUSAL_LOG_INTERVAL_S``)."""

    __slots__ = ("_cap", "_host", "_last_note", "_metrics", "_noted", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, cap: int, metrics: ProxyMetrics) -> None:
        super().__init__(runner)
        self._host, self._port, self._cap, self._metrics = host, port, cap, metrics
        self._last_note = -REFUSAL_LOG_INTERVAL_S
        self._noted = 0  # refusals already logged

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None

        def protocol() -> asyncio.BaseProtocol:
            if len(server.connections) < self._cap:
                return server()
            self._refused()
            return _Refused()

        self._server = await asyncio.get_running_loop().create_server(
            protocol, self._host, self._port, backlog=self._backlog, reuse_address=True
        )

    async def start_serving(self) -> int:
        """Start; returns the bound port."""
        await self.start()
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def _refused(self) -> None:
        self._metrics.connections_refused += 1
        now = time.monotonic()
        if now - self._last_note >= REFUSAL_LOG_INTERVAL_S:
            refused = self._metrics.connections_refused - self._noted
            log.warning("connection cap (max_connections=%d) reached: %d connection(s) refused", self._cap, refused)
            self._last_note, self._noted = now, self._metrics.connections_refused


class _Refused(asyncio.Protocol):
    """A connection past the cap: a 503, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.WriteTransport, transport)  # uvloop's transports are not asyncio's subclasses
        transport.write(_REFUSED_REPLY)
        transport.close()


_REFUSED_REPLY = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 33\r\n\r\nproxy connection limit; try again"
)

_OPEN_STREAM = web.RequestKey("open_stream", web.StreamResponse)
"""The request's SSE response once its headers are sent: errors after that go into the stream."""


class _Keepalive:
    """``frame`` written to ``response`` every ``interval`` seconds until ``cancel()`` (a client gone ends it).

    Until the first one is due it is a timer, not a task: most streams end before a keepalive is due.
    """

    __slots__ = ("_task", "_timer")

    def __init__(self, response: web.StreamResponse, frame: bytes, interval: float) -> None:
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(interval, self._start, response, frame, interval)

    def _start(self, response: web.StreamResponse, frame: bytes, interval: float) -> None:
        self._task = asyncio.ensure_future(self._write(response, frame, interval))

    @staticmethod
    async def _write(response: web.StreamResponse, frame: bytes, interval: float) -> None:
        with suppress(ConnectionError):
            while True:
                await response.write(frame)
                await asyncio.sleep(interval)

    def cancel(self) -> None:
        """No keepalive is written after this; one being written is cut where it waits."""
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()


class _SpeculationMissed(Exception):
    """A speculative call's engine rendering was not the bridged prompt: nothing of it was sent."""


class _CallFailed(Exception):
    """A model call that fails after the engine answered; ``status`` and ``type`` are what the agent is told."""

    def __init__(self, status: int, message: str, type_: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_


class _BodyError(Exception):
    """A request body that can't be read or decoded; ``status`` is what the caller is told."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _translate(
    data: bytes, dialect: ModuleType, session: Session
) -> tuple[ChatRequest, dict[str, Any], dict[str, Any], bytes]:
    """``(chat, engine body, requested sampling, engine payload)`` of a request body; raises what it refuses."""
    chat = dialect.parse_request(orjson.loads(data), session.message_memo)
    upstream_body, requested = engine_request(
        chat.body,
        model=session.model,
        policy=session.policy,
        max_output_tokens=session.config.max_output_tokens,
        stream=chat.stream,
    )
    return chat, upstream_body, requested, dumps_bounded(upstream_body)  # the one serialisation, nesting bounded


def _index_turn(
    session: Session,
    node_id: str,
    history: History,
    engine_turn: dict[str, Any],
    capture: Capture,
    prompt_json: bytes | None,
    metadata: dict[str, Any],
) -> None:
    """Index a recorded turn for the session's bridge (``CaptureProxy._record``)."""
    session.bridge.add(node_id, history, engine_turn, capture.sampled_ids, metadata)
    session.bridge.remember_end(node_id, capture.prompt_ids, prompt_json, capture.sampled_ids)


def _agent_gone(request: web.Request) -> bool:
    """Whether the agent's connection is closed or closing (a write to it fails; nothing more can reach it)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _dialect_for(path: str) -> ModuleType:
    """The dialect whose error shape a path's caller reads (OpenAI's for the control plane)."""
    if path.startswith("/v1/messages"):
        return anthropic_messages
    return ROUTES.get(path, openai_chat)


def _render(dialect: ModuleType, chat: ChatRequest, engine: dict[str, Any], prompt_json: bytes | None = None) -> bytes:
    """The whole reply, JSON or every SSE frame, before anything is recorded or sent (``prompt_json``: see
    ``_echoing``)."""
    with _rendering(dialect):
        if chat.stream:
            return b"".join(dialect.render_stream(engine, chat))
        return orjson.dumps(_echoing(chat, dialect.render_response(engine, chat), prompt_json))


def _echoing(chat: ChatRequest, reply: dict[str, Any], prompt_json: bytes | None) -> dict[str, Any]:
    """``reply`` (or a stream's head) with the prompt ids it echoes to a ``return_token_ids`` agent as the engine's
    own bytes of them, where ``prompt_json`` holds their open JSON (``proxy.known_prompt``): thousands of ids are
    copied, not serialised again."""
    if prompt_json is not None and chat.return_token_ids and "prompt_token_ids" in reply:
        return {**reply, "prompt_token_ids": orjson.Fragment(prompt_json + b"]")}
    return reply


@contextmanager
def _rendering(dialect: ModuleType) -> Iterator[None]:
    """Rendering a reply: a failure is an engine reply the checks let through (502) or a bug (500, logged).

    The engine's chunks or reply were checked and the request validated; either way nothing is recorded.
    """
    try:
        yield
    except orjson.JSONEncodeError as exc:
        raise MalformedUpstream(f"the reply could not be rendered: {exc}") from None
    except Exception as exc:
        log.exception("rendering a %s reply failed", dialect.NAME)
        raise _CallFailed(
            500, f"internal proxy error rendering the reply: {type(exc).__name__}: {exc}", "api_error"
        ) from None


class _EventStream(web.StreamResponse):
    """An SSE response whose status line and headers go out with its first frames, in the same write: a write to
    the agent's socket is one of the dearest steps of a call. Its first frames are written as soon as the engine's
    first chunk arrives, or a keepalive or an error event when none does (aiohttp's opt-in to buffer headers)."""

    _send_headers_immediately = False


async def _open_stream(request: web.Request) -> web.StreamResponse:
    response = _EventStream(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    request[_OPEN_STREAM] = response
    return response


async def _send(stream: web.StreamResponse | None, reply: bytes) -> web.StreamResponse:
    """Send a rendered reply: as the body of a JSON response, or as the rest of the open stream."""
    if stream is None:
        return web.Response(body=reply, content_type="application/json")
    await stream.write_eof(reply)  # the last frames and the end of the stream in one write
    return stream


async def _end_stream_with_error(
    stream: web.StreamResponse,
    dialect: ModuleType,
    status: int,
    message: str,
    type_: str | None,
    chat: ChatRequest | None = None,
) -> None:
    """The dialect's stream error event, then the end of the stream (a client already gone is ignored)."""
    with suppress(ConnectionError, RuntimeError):  # RuntimeError: the stream had already ended
        await stream.write(dialect.render_stream_error(status, message, type_, request=chat))
        await stream.write_eof()


_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "max_tokens",
    "seed",
    "stop",
)


def _budget_reply(model: str, chat: ChatRequest) -> dict[str, Any]:
    """The terminal reply the proxy gives itself when a session's call budget is spent (never recorded)."""
    return {
        "id": "chatcmpl-budget",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": BUDGET_EXHAUSTED_TEXT},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _decode_body(data: bytes, content_encoding: str | None, limit: int) -> bytes:
    """``data`` decoded per ``content_encoding`` (codings applied in order, so undone in reverse)."""
    if not content_encoding:
        return data
    for coding in reversed([c.strip().lower() for c in content_encoding.split(",")]):
        if coding in ("", "identity"):
            continue
        if coding in ("gzip", "x-gzip"):
            data = _inflate(data, 16 + zlib.MAX_WBITS, limit, coding)
        elif coding == "deflate":  # zlib-wrapped, as HTTP says, or raw, as some clients send
            try:
                data = _inflate(data, zlib.MAX_WBITS, limit, coding)
            except _BodyError:
                data = _inflate(data, -zlib.MAX_WBITS, limit, coding)
        elif coding == "br" and brotli is not None:
            data = _unbrotli(data, limit)
        else:
            supported = "gzip, deflate" + (", br" if brotli is not None else "")
            raise _BodyError(415, f"unsupported Content-Encoding {coding!r} (supported: {supported})")
    return data


def _inflate(data: bytes, wbits: int, limit: int, coding: str) -> bytes:
    """zlib/gzip/raw-deflate decoding of every member of ``data``, refusing output past ``limit``."""
    out: list[bytes] = []
    size = 0
    while True:
        decoder = zlib.decompressobj(wbits)
        try:
            chunk = decoder.decompress(data, limit + 1 - size)
        except zlib.error as exc:
            raise _BodyError(400, f"body is not valid {coding}: {exc}") from None
        size += len(chunk)
        if size > limit:
            raise _BodyError(413, f"decoded request body exceeds {limit} bytes")
        if not decoder.eof:
            raise _BodyError(400, f"body is truncated {coding}")
        out.append(chunk)
        data = decoder.unused_data
        if not data:
            return b"".join(out)


def _unbrotli(data: bytes, limit: int) -> bytes:
    decoder = brotli.Decompressor()
    try:
        out = decoder.process(data, output_buffer_limit=limit + 1)
    except brotli.error as exc:
        raise _BodyError(400, f"body is not valid br: {exc}") from None
    if len(out) > limit:
        raise _BodyError(413, f"decoded request body exceeds {limit} bytes")
    if not decoder.is_finished():
        raise _BodyError(400, "body is truncated br")
    return out


def _session_request(body: Any) -> tuple[str | None, SessionConfig]:
    """The session id and config of a ``POST /sessions`` body; anything malformed is a ``ValueError`` (400)."""
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    check_depth(body)
    body = dict(body)
    session_id = body.pop("session_id", None)
    if session_id is not None and not isinstance(session_id, str):
        raise ValueError("session_id must be a string")
    if "api_key" in body:
        raise ValueError("api_key is minted by the proxy and returned by this call; a caller can't choose it")
    for key in ("llm_url", "model"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise ValueError(f"{key} must be a string")
    for key in ("sampling", "metadata"):
        if body.get(key) is not None and not isinstance(body[key], dict):
            raise ValueError(f"{key} must be an object")
    if body.get("metadata", {}) is None:
        del body["metadata"]
    if body.get("llm_url") is not None:
        url = urlsplit(body["llm_url"])
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError("llm_url must be an http(s) URL")
    return session_id, SessionConfig(**body)


_HARNESS_SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id", "session_id", "conversation_id")


def _harness_session_id(request: web.Request) -> str | None:
    """The agent's own session id, from whichever header its harness sends (recorded, never trusted)."""
    for name in _HARNESS_SESSION_HEADERS:
        value = request.headers.get(name)
        if value:
            return value
    return None
