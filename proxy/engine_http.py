"""A lean HTTP/1.1 client for one engine: keep-alive connections on asyncio streams, pooled.

Every model call makes one or two engine requests, so their cost is the proxy's floor. On loopback under
uvloop one aiohttp client request costs about 3.5 times the CPU of the same request on a pooled asyncio
stream (0.55 against 0.16 ms for a 6.5 kB chat request on a busy 2-core machine,
``bench/engine_request_cost.py``). The engine is one known upstream speaking HTTP/1.1 (vLLM,
the embedded engine), so this client does only what that needs: requests with a ``Content-Length`` body;
responses framed by ``Content-Length``, by the chunked transfer coding or by the connection's end;
keep-alive; TLS for ``https`` URLs. No redirects, cookies, compression (it sends no ``Accept-Encoding``)
or HTTP proxies.

Contract: ``EngineHttp.request`` returns an ``EngineResponse`` once the status line and headers arrived; its
body is read whole (``read``) or piece by piece as it arrives (``readany``, b"" at the end), within a deadline
where ``expire_at`` set one (``DeadlinePassed``, a ``TimeoutError``, past it). Closing the
response (``async with``, ``close``) puts its connection back in the pool only if the body was read to its
end and the engine keeps the connection alive; otherwise the connection is dropped at once, which is how an
abandoned or cancelled request stops the engine's work. A failure to connect, a broken connection or an
answer that is not HTTP/1.x is ``EngineConnectionError``. A request sent on a pooled connection that the
engine had closed meanwhile (no byte of an answer came back) is sent once more on a new connection. At most
``max_connections`` connections are open at once (0: no bound); requests past it wait for one.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable
from types import TracebackType
from urllib.parse import urlsplit

HEAD_LIMIT = 1 << 20
"""Longest status line + headers (and chunk-size line) accepted from the engine, in bytes."""

IDLE_S = 4.0
"""A pooled connection idle this long is closed instead of reused: below the 5 s keep-alive of uvicorn
(vLLM's server), so the engine never closes one under a request."""

_PAYLOAD_END, _TRAILERS = -1, -2
"""``EngineResponse._chunk_left`` states of the chunked coding: a chunk's CRLF next; trailers next."""

_BROKEN = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)


class EngineConnectionError(ConnectionError):
    """The engine could not be reached, broke the connection, or answered something that is not HTTP/1.x."""


class DeadlinePassed(TimeoutError):
    """A response's deadline (``EngineResponse.expire_at``) passed before its body was read."""


class _StaleConnection(Exception):
    """A pooled connection the engine had closed: it answered no byte."""


class _Connection:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def drop(self) -> None:
        self.writer.transport.abort()


class EngineHttp:
    """Pooled HTTP/1.1 connections to the engine at ``base_url`` (``http(s)://host[:port][/prefix]``), each
    request sent with ``headers``."""

    def __init__(self, base_url: str, *, headers: dict[str, str], max_connections: int = 256) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"engine URL must be http(s)://host[:port], not {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/")
        fixed = {"Host": parts.netloc.rpartition("@")[2], **headers}
        self._headers = "".join(f"{name}: {value}\r\n" for name, value in fixed.items())
        self._slots = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self._idle: list[_Connection] = []
        self._closed = False

    async def request(self, method: str, path: str, body: bytes = b"") -> EngineResponse:
        """Send ``method path`` with ``body``; the response once its head arrived (close it when done)."""
        head = f"{method} {self._prefix}{path} HTTP/1.1\r\n{self._headers}Content-Length: {len(body)}\r\n\r\n"
        message = (head.encode("latin-1"), body)
        if self._slots is not None:
            await self._slots.acquire()
        try:
            connection = self._pooled()
            if connection is not None:
                try:
                    return await self._exchange(connection, message, reused=True)
                except _StaleConnection:
                    pass
            return await self._exchange(await self._connect(), message, reused=False)
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise

    def close(self) -> None:
        """Drop the idle connections; those in use are dropped when their responses close."""
        self._closed = True
        while self._idle:
            self._idle.pop().drop()

    def _pooled(self) -> _Connection | None:
        deadline = time.monotonic() - IDLE_S
        while self._idle:
            connection = self._idle.pop()
            if connection.idle_since > deadline and not connection.reader.at_eof():
                return connection
            connection.drop()
        return None

    def _release(self, connection: _Connection, reusable: bool) -> None:
        if reusable and not self._closed and not connection.reader.at_eof():
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
            while self._idle[0].idle_since < connection.idle_since - IDLE_S:
                self._idle.pop(0).drop()
        else:
            connection.drop()
        if self._slots is not None:
            self._slots.release()

    async def _connect(self) -> _Connection:
        try:
            reader, writer = await asyncio.open_connection(self._host, self._port, ssl=self._ssl, limit=HEAD_LIMIT)
        except OSError as exc:
            raise EngineConnectionError(f"cannot connect to {self._host}:{self._port}: {exc}") from None
        return _Connection(reader, writer)

    async def _exchange(self, connection: _Connection, message: tuple[bytes, bytes], reused: bool) -> EngineResponse:
        try:
            connection.writer.writelines(message)
            while True:
                head = await connection.reader.readuntil(b"\r\n\r\n")
                response = EngineResponse(self, connection, head)
                if response.status >= 200:
                    return response
        except asyncio.IncompleteReadError as exc:
            connection.drop()
            if reused and not exc.partial:
                raise _StaleConnection from None
            raise EngineConnectionError("the engine closed the connection before answering") from None
        except _BROKEN as exc:
            connection.drop()
            if reused and isinstance(exc, ConnectionResetError):
                raise _StaleConnection from None
            raise EngineConnectionError(f"the engine connection broke: {type(exc).__name__}: {exc}") from None
        except BaseException:
            connection.drop()
            raise


class EngineResponse:
    """One engine response: ``status``, ``headers`` (names in lower case) and a body to read once."""

    __slots__ = (
        "_chunk_left",
        "_chunked",
        "_connection",
        "_done",
        "_keep_alive",
        "_left",
        "_pool",
        "_raw",
        "_timer",
        "headers",
        "status",
    )

    def __init__(self, pool: EngineHttp, connection: _Connection, head: bytes) -> None:
        lines = head[:-4].split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        if not version.startswith(b"HTTP/1.") or not rest[:3].isdigit():
            raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self.status = int(rest[:3])
        self.headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise ValueError(f"malformed header line {line[:80]!r}")
            self.headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        self._pool = pool
        self._connection: _Connection | None = connection
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        self._chunk_left = 0  # chunked: payload bytes of this chunk still to come, or 0 (a size line next) or a state
        self._raw = b""  # chunked: bytes read from the connection and not decoded yet
        self._timer: asyncio.TimerHandle | None = None
        self._left: int | None = None  # body bytes still to read; None: until the connection ends
        if self.status < 200 or self.status in (204, 304):
            self._left = 0
        elif not self._chunked and "content-length" in self.headers:
            self._left = int(self.headers["content-length"])
            if self._left < 0:
                raise ValueError(f"negative Content-Length {self._left}")
        self._keep_alive = (
            version == b"HTTP/1.1"
            and self.headers.get("connection", "").lower() != "close"
            and (self._chunked or self._left is not None)
        )
        self._done = self._left == 0

    async def read(self) -> bytes:
        """The whole (rest of the) body; the connection goes back to the pool."""
        try:
            if self._left and not self._chunked and self._connection is not None:
                data = await self._guarded(self._connection.reader.readexactly(self._left))
                self._left, self._done = 0, True
                return data
            pieces = []
            while piece := await self.readany():
                pieces.append(piece)
            return b"".join(pieces)
        finally:
            self.close()

    async def readany(self) -> bytes:
        """The next piece of the body as it arrives (of a chunked body, every chunk's payload that arrived, in one
        piece); b"" once all of it was read."""
        if self._done:
            return b""
        if self._connection is None:
            raise EngineConnectionError("the response was closed before its body was read")
        reader = self._connection.reader
        if self._chunked:
            while True:
                try:
                    piece = self._dechunk()
                except ValueError as exc:
                    raise self._broken(f"the engine broke the chunked coding: {exc}") from None
                if piece or self._done:
                    return piece
                data = await self._guarded(reader.read(1 << 16))
                if not data:
                    raise self._broken("the engine closed the connection inside a chunk")
                self._raw += data
        piece = await self._guarded(reader.read(self._left if self._left is not None else 1 << 16))
        if self._left is None:
            self._done = not piece
            return piece
        if not piece:
            raise self._broken("the engine closed the connection before the end of the body")
        self._left -= len(piece)
        self._done = not self._left
        return piece

    def _dechunk(self) -> bytes:
        """The payload of the chunks in ``_raw``, taken from it (a chunk cut short: what of it arrived); sets
        ``_done`` at the last chunk's end. ``ValueError`` for framing that is not the chunked coding."""
        raw, pieces, at = self._raw, [], 0
        while True:
            if self._chunk_left > 0:
                piece = raw[at : at + self._chunk_left]
                if not piece:
                    break
                pieces.append(piece)
                at += len(piece)
                self._chunk_left -= len(piece)
                if self._chunk_left:
                    break
                self._chunk_left = _PAYLOAD_END
            end = raw.find(b"\r\n", at)
            if end < 0:
                if len(raw) - at > HEAD_LIMIT:
                    raise ValueError(f"no line end in {HEAD_LIMIT} bytes")
                break
            line, at = raw[at:end], end + 2
            if self._chunk_left == _PAYLOAD_END:  # the CRLF after a chunk's payload
                if line:
                    raise ValueError(f"chunk payload longer than its size: {line[:80]!r}")
                self._chunk_left = 0
            elif self._chunk_left == _TRAILERS:  # after the last chunk: trailers, up to the empty line
                if not line:
                    self._done = True
                    if at < len(raw):  # bytes past the body's end: the connection is not clean
                        self._keep_alive = False
                    break
            else:
                size = int(line.split(b";", 1)[0], 16)
                if size < 0:
                    raise ValueError(f"negative chunk size {line[:80]!r}")
                self._chunk_left = size or _TRAILERS
        self._raw = raw[at:]
        return b"".join(pieces)

    def expire_at(self, when: float) -> None:
        """Reads of the body waiting at loop time ``when``, or made after it, raise ``DeadlinePassed`` and drop the
        connection: one timer bounds the whole body, where a timeout around each read would cost one per read."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(when, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self._connection is not None:
            self._connection.reader.set_exception(DeadlinePassed())

    def close(self) -> None:
        """Hand the connection back (reused only if the body was read whole and the engine keeps it alive)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool._release(connection, reusable=self._done and self._keep_alive)

    async def __aenter__(self) -> EngineResponse:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def _guarded[T](self, step: Awaitable[T]) -> T:
        try:
            return await step
        except BaseException as exc:
            self._done = False
            self.close()
            if isinstance(exc, _BROKEN) and not isinstance(exc, DeadlinePassed):  # that one is the call's budget
                raise EngineConnectionError(f"the engine broke the response: {type(exc).__name__}: {exc}") from None
            raise

    def _broken(self, why: str) -> EngineConnectionError:
        self._done = False
        self.close()
        return EngineConnectionError(why)
