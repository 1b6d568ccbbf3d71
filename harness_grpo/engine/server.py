"""The engine's HTTP server: vLLM's OpenAI routes plus the weight-sync control routes.

Contract. Routes: ``POST /v1/chat/completions``,
``POST /v1/chat/completions/tokens``, ``POST /v1/completions``,
``POST /tokenize``, ``POST /detokenize``,
``GET /v1/models`` (``max_model_len``, ``weight_version``, and ``owned_by:
"harness-grpo"``, which tells this engine from vLLM), ``GET /health``
(``weight_version``, ``paused``), ``POST /pause?mode=keep|wait``,
``POST /resume``, ``GET /is_paused``, ``POST /update_weights[?version=N][&rebase=true]``
with a safetensors-serialised (partial) state dict as the body (``version``
must rise, unless ``rebase``: a new trainer's first push). Every error,
including unknown routes and handler bugs, is a JSON ``{"error": {...}}`` with
its status (``errors.error_body``); the server never dies on a request. The
event loop never runs model compute: generation waits on the compute thread's
futures, and blocking control calls and template rendering run in the default
executor. Every wait is bounded (``request_timeout_s``, ``control_timeout_s``),
and a client that disconnects cancels its request. Connections are bounded in
time: one idle (no complete request head) for ``idle_timeout_s`` after opening
or after its last reply is closed, and a body that has not arrived within
``body_timeout_s`` (``control_timeout_s`` for a weight update) is a 408.

Streaming. A chat request with ``stream: true`` is validated, rendered and
queued before the headers (so refusals are still plain JSON errors), then
answered ``text/event-stream`` with the chunks of ``streaming.ChatStream``:
the compute thread's ``on_token`` hands each token to an unbounded asyncio
queue through ``call_soon_threadsafe`` and never waits on the client; the
handler sends what has queued since its last write as one chunk (so a slow
client gets fewer, larger chunks, not a slower engine). A failure or the
``request_timeout_s`` deadline after the headers is an error event and
``[DONE]``; a client that disconnects cancels its sequence. Pausing the engine
pauses the stream; it resumes with the engine. ``/v1/completions`` does not
stream.

Token in. ``/v1/chat/completions/tokens`` is prime-rl's route on vLLM: a chat
request plus ``tokens``, the prompt ids, sampled from exactly as given (the
messages are validated, never rendered) and answered exactly as
``/v1/chat/completions`` answers (tool calls parsed, streaming, ``prompt_token_ids``
== ``tokens``). ``/tokenize`` and ``/detokenize`` are vLLM's; a chat is
rendered by the same ``EmbeddedEngine.render_chat`` call as the chat route, so
``/tokenize`` of a chat request's messages, tools and ``chat_template_kwargs``
is that request's ``prompt_token_ids``. Discovery: ``POST
/v1/chat/completions/tokens`` with ``{}`` answers 400 (``param: "tokens"``)
where the route exists and 404 where it does not (plain vLLM), with no
generation either way.

``EngineServer`` starts and stops the app on a running loop (the trainer runs
it on its service loop); ``ServerThread`` runs it on a background thread with
its own loop, for tests and scripts. Neither starts or stops the engine itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import orjson
from aiohttp import web

from harness_grpo.engine.embedded import EmbeddedEngine
from harness_grpo.engine.errors import EngineError, bad_request, error_body
from harness_grpo.engine.generator import Completion
from harness_grpo.engine.requests import (
    ChatRequest,
    TokenizeText,
    parse_chat,
    parse_chat_tokens,
    parse_completion,
    parse_detokenize,
    parse_tokenize,
)
from harness_grpo.engine.responses import chat_response, completion_response
from harness_grpo.engine.sampling import SamplingParams
from harness_grpo.engine.streaming import SSE_DONE, ChatStream, Token, sse
from harness_grpo.engine.weights import state_dict_from_safetensors
from harness_grpo.service_loop import ServiceLoop

logger = logging.getLogger(__name__)

ENGINE_KEY = web.AppKey("engine", EmbeddedEngine)
SETTINGS_KEY = web.AppKey("settings", dict)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return _json(error_body(status, message, param), status)


@web.middleware
async def _error_middleware(request: web.Request, handler: Callable) -> web.StreamResponse:
    try:
        return await handler(request)
    except EngineError as exc:
        response = _error(exc.status, exc.message, exc.param)
        if exc.status == 408:  # the rest of the body may never come: don't wait for it on this connection
            response.force_close()
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.reason)
    except Exception as exc:
        logger.exception("unhandled error serving %s %s", request.method, request.path)
        return _error(500, f"internal engine error: {type(exc).__name__}: {exc}")


async def _body(request: web.Request, timeout_s: float) -> bytes:
    """The request body, or a 408 when it has not arrived within ``timeout_s`` (a stalled or trickling client)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise EngineError(408, f"the request body did not arrive within {timeout_s:g} s") from None


async def _json_body(request: web.Request) -> dict[str, Any]:
    data = await _body(request, request.app[SETTINGS_KEY]["body_timeout_s"])
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"malformed JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


async def _in_executor[R](fn: Callable[..., R], *args: Any) -> R:
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))


def _engine(request: web.Request) -> EmbeddedEngine:
    return request.app[ENGINE_KEY]


def _check_model(engine: EmbeddedEngine, model: str | None) -> None:
    if model is not None and model != engine.served_model_name:
        raise EngineError(404, f"The model `{model}` does not exist.", "model")


async def _generate(request: web.Request, prompt_ids: list[int], params: SamplingParams) -> Completion:
    timeout_s = request.app[SETTINGS_KEY]["request_timeout_s"]
    future = _engine(request).submit(prompt_ids, params)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
    except TimeoutError:
        raise EngineError(504, f"generation did not finish within {timeout_s}s") from None


def _put_threadsafe(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item: Any) -> None:
    """Hand ``item`` to ``queue`` from another thread without waiting; RuntimeError once ``loop`` is closed."""
    loop.call_soon_threadsafe(queue.put_nowait, item)


async def _sampled(queue: asyncio.Queue) -> list[Token] | None:
    """The tokens queued so far (waiting for at least one); None once the sequence has ended."""
    tokens = []
    item = await queue.get()
    while item is not None:
        tokens.append(item)
        if queue.empty():
            return tokens
        item = queue.get_nowait()
    return None  # tokens drained with the end marker reach the client from the Completion


async def _stream_chat(
    request: web.Request, chat: ChatRequest, prompt_ids: list[int], params: SamplingParams
) -> web.StreamResponse:
    """Stream one chat completion as server-sent events (``streaming``); the compute thread never waits on us."""
    engine = _engine(request)
    timeout_s = request.app[SETTINGS_KEY]["request_timeout_s"]
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Token | None] = asyncio.Queue()  # unbounded: a slow client never holds up a decode step
    future = engine.submit(prompt_ids, params, lambda *token: _put_threadsafe(loop, queue, token))

    def ended(_: Future) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
            _put_threadsafe(loop, queue, None)

    future.add_done_callback(ended)
    stream = ChatStream(
        prompt_ids,
        model=engine.served_model_name,
        top_logprobs=chat.options.top_logprobs,
        return_token_ids=chat.options.return_token_ids,
        parse_tools=chat.parse_tool_calls,
        include_usage=chat.include_usage,
        stop=params.stop,
        decode=engine.decode,
        token_bytes=engine.token_bytes,
    )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
        await response.write(sse(stream.first()))
        try:
            async with asyncio.timeout(timeout_s):
                while (tokens := await _sampled(queue)) is not None:
                    if (chunk := stream.tokens(tokens)) is not None:
                        await response.write(sse(chunk))
            chunks = stream.finish(future.result())
        except TimeoutError:
            chunks = [error_body(504, f"generation did not finish within {timeout_s}s")]
        except EngineError as exc:
            chunks = [error_body(exc.status, exc.message, exc.param)]
        except ConnectionResetError:
            raise
        except Exception as exc:
            logger.exception("streaming a chat completion failed")
            chunks = [error_body(500, f"internal engine error: {type(exc).__name__}: {exc}")]
        for chunk in chunks:
            await response.write(sse(chunk))
        await response.write(SSE_DONE)
    except ConnectionResetError:
        logger.info("a streaming client disconnected; its request is cancelled")
    finally:
        future.cancel()  # a no-op once it finished
    return response


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions`` (``stream: true`` answers server-sent events)."""
    engine = _engine(request)
    chat = parse_chat(await _json_body(request))
    _check_model(engine, chat.model)
    prompt_ids = await _in_executor(engine.render_chat, chat.messages, chat.tools, chat.chat_template_kwargs)
    return await _answer_chat(request, chat, prompt_ids, "messages")


async def chat_completions_tokens(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions/tokens``: a chat request sampled from its ``tokens``, never a rendering."""
    engine = _engine(request)
    chat, prompt_ids = parse_chat_tokens(await _json_body(request), engine.vocab_size)
    _check_model(engine, chat.model)
    return await _answer_chat(request, chat, prompt_ids, "tokens")


async def _answer_chat(
    request: web.Request, chat: ChatRequest, prompt_ids: list[int], prompt_field: str
) -> web.StreamResponse:
    """Sample ``chat`` from ``prompt_ids`` and answer it, streamed or not; a 400 names ``prompt_field`` if too long."""
    engine = _engine(request)
    params = chat.options.sampling_params(len(prompt_ids), engine.max_model_len, prompt_field)
    if chat.stream:
        return await _stream_chat(request, chat, prompt_ids, params)
    completion = await _generate(request, prompt_ids, params)
    return _json(
        chat_response(
            completion,
            model=engine.served_model_name,
            top_logprobs=chat.options.top_logprobs,
            return_token_ids=chat.options.return_token_ids,
            parse_tools=chat.parse_tool_calls,
            token_bytes=engine.token_bytes,
        )
    )


async def completions(request: web.Request) -> web.Response:
    """``POST /v1/completions`` (token ids or text in)."""
    engine = _engine(request)
    req = parse_completion(await _json_body(request), engine.vocab_size)
    _check_model(engine, req.model)
    prompt_ids = req.prompt if isinstance(req.prompt, list) else await _in_executor(engine.encode, req.prompt)
    params = req.options.sampling_params(len(prompt_ids), engine.max_model_len, "prompt")
    completion = await _generate(request, prompt_ids, params)
    return _json(
        completion_response(
            completion,
            model=engine.served_model_name,
            logprobs=req.options.top_logprobs,
            return_token_ids=req.options.return_token_ids,
            token_bytes=engine.token_bytes,
        )
    )


async def tokenize(request: web.Request) -> web.Response:
    """``POST /tokenize`` (vLLM): a chat rendered as the chat route renders it, or a text ``prompt``."""
    engine = _engine(request)
    req = parse_tokenize(await _json_body(request))
    _check_model(engine, req.model)
    if isinstance(req, TokenizeText):
        token_ids = await _in_executor(engine.encode, req.prompt, req.add_special_tokens)
    else:
        render = functools.partial(
            engine.render_chat,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            add_special_tokens=req.add_special_tokens,
        )
        token_ids = await _in_executor(render, req.messages, req.tools, req.chat_template_kwargs)
    return _json(
        {
            "count": len(token_ids),
            "max_model_len": engine.max_model_len,
            "tokens": token_ids,
            "token_strs": engine.token_strs(token_ids) if req.return_token_strs else None,
        }
    )


async def detokenize(request: web.Request) -> web.Response:
    """``POST /detokenize`` (vLLM): the text of ``tokens``, special tokens kept."""
    engine = _engine(request)
    model, token_ids = parse_detokenize(await _json_body(request), engine.vocab_size)
    _check_model(engine, model)
    return _json({"prompt": await _in_executor(engine.detokenize, token_ids)})


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``."""
    engine = _engine(request)
    card = {
        "id": engine.served_model_name,
        "object": "model",
        "created": engine.created,
        "owned_by": "harness-grpo",  # how weight_transports.weight_sync_for tells us from vLLM ("vllm")
        "root": engine.model_path,
        "parent": None,
        "max_model_len": engine.max_model_len,
        "weight_version": engine.weight_version,
    }
    return _json({"object": "list", "data": [card]})


async def health(request: web.Request) -> web.Response:
    """``GET /health``."""
    return _json(_engine(request).health())


async def is_paused(request: web.Request) -> web.Response:
    """``GET /is_paused``."""
    return _json({"is_paused": _engine(request).paused})


async def pause(request: web.Request) -> web.Response:
    """``POST /pause?mode=keep|wait``: returns once no forward pass runs."""
    engine = _engine(request)
    mode = request.query.get("mode", "keep")
    await _in_executor(engine.pause, mode, request.app[SETTINGS_KEY]["control_timeout_s"])
    return _json(engine.health())


async def resume(request: web.Request) -> web.Response:
    """``POST /resume``."""
    engine = _engine(request)
    engine.resume()
    return _json(engine.health())


async def update_weights(request: web.Request) -> web.Response:
    """``POST /update_weights[?version=N][&rebase=true]`` with a safetensors body; answers the new version."""
    engine = _engine(request)
    rebase = request.query.get("rebase", "false")
    if rebase not in ("true", "false"):
        raise bad_request("'rebase' must be true or false", "rebase")
    if request.content_type == "application/json":
        raise bad_request("send the weights inline as a safetensors body (application/octet-stream)")
    version = request.query.get("version")
    if version is not None and not version.isdigit():
        raise bad_request("'version' must be a non-negative integer", "version")
    body = await _body(request, request.app[SETTINGS_KEY]["control_timeout_s"])
    state_dict = await _in_executor(state_dict_from_safetensors, body)
    new_version = await _in_executor(
        functools.partial(engine.update_weights, rebase=rebase == "true"),
        state_dict,
        None if version is None else int(version),
        request.app[SETTINGS_KEY]["control_timeout_s"],
    )
    return _json({"weight_version": new_version})


def build_app(
    engine: EmbeddedEngine,
    *,
    request_timeout_s: float = 3600.0,
    control_timeout_s: float = 300.0,
    body_timeout_s: float = 60.0,
    client_max_size: int = 1 << 36,
) -> web.Application:
    """The aiohttp application serving ``engine``."""
    app = web.Application(middlewares=[_error_middleware], client_max_size=client_max_size)
    app[ENGINE_KEY] = engine
    app[SETTINGS_KEY] = {
        "request_timeout_s": request_timeout_s,
        "control_timeout_s": control_timeout_s,
        "body_timeout_s": body_timeout_s,
    }
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/chat/completions/tokens", chat_completions_tokens)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/is_paused", is_paused)
    app.router.add_post("/pause", pause)
    app.router.add_post("/resume", resume)
    app.router.add_post("/update_weights", update_weights)
    return app


class EngineServer:
    """``engine`` served on ``host:port`` (0 picks a free port) on the running event loop."""

    def __init__(
        self,
        engine: EmbeddedEngine,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        idle_timeout_s: float = 75.0,
        **app_kwargs: Any,
    ) -> None:
        self.engine = engine
        self.host = host
        self.port = port
        self.idle_timeout_s = idle_timeout_s
        self._app_kwargs = app_kwargs
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` (no ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        """Bind and serve; returns the base URL."""
        runner = web.AppRunner(
            build_app(self.engine, **self._app_kwargs),
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=self.idle_timeout_s,
            lingering_time=min(self._app_kwargs.get("body_timeout_s", 60.0), 10.0),  # draining an unread body
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        logger.info("engine serving %s at %s", self.engine.served_model_name, self.url)
        return self.url

    async def stop(self) -> None:
        """Stop serving (in-flight HTTP requests are cancelled)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class ServerThread:
    """An ``EngineServer`` on its own ``ServiceLoop`` (an event loop on a daemon thread); a context manager."""

    def __init__(self, engine: EmbeddedEngine, host: str = "127.0.0.1", port: int = 0, **app_kwargs: Any) -> None:
        self.server = EngineServer(engine, host, port, **app_kwargs)
        self._loop: ServiceLoop | None = None

    @property
    def url(self) -> str:
        return self.server.url

    def start(self, timeout_s: float = 30.0) -> str:
        """Start serving; returns the base URL once the socket is bound."""
        self._loop = ServiceLoop("engine-http")
        try:
            self._loop.run(self.server.start(), timeout_s)
        except BaseException:
            self._loop.close()
            self._loop = None
            raise
        return self.url

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop serving and end the loop's thread."""
        loop, self._loop = self._loop, None
        if loop is not None:
            try:
                loop.run(self.server.stop(), timeout_s)
            finally:
                loop.close(timeout_s)

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
