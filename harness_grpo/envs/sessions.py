"""Clients that keep one episode on one server session, and say so when it is lost.

OpenEnv's ``EnvClient`` reconnects silently: after the server closed the socket or a reply timed
out, the next ``step`` opens a new WebSocket, which is a new server session with a fresh game, and
plays on in it (huggingface/OpenEnv#1103). ``EpisodeClient`` keeps OpenEnv's client API and wire
format and changes only that:

- an episode never spans two server sessions: ``reset()`` starts it on the client's open session
  (the server builds a fresh game there) or, when there is none or it was lost, on a new one; run
  concurrent episodes on separate clients, each holding one session (one WebSocket).
- once ``reset()`` has answered, any call that cannot be carried by that same socket (it was
  closed by the server, the server died, a reply did not come within ``message_timeout_s``)
  raises ``SessionLostError``, and so does every later call until the next ``reset()``.
- a server at its ``max_concurrent_envs`` refuses the new session with ``CAPACITY_REACHED``:
  ``ServerAtCapacityError`` (a ``SessionLostError``) says so with the server's counts.
- any other error frame is an ``EnvServerError`` carrying the server's code and message.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, TypeVar

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State as SocketState

ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")
StateT = TypeVar("StateT")


class EnvServerError(RuntimeError):
    """The environment server answered with an error frame (``code`` is OpenEnv's ``WSErrorCode``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"environment server error {code}: {message}")
        self.code = code
        self.server_message = message


class SessionLostError(ConnectionError):
    """The server session carrying this episode is gone; the episode cannot continue.

    Raised instead of reconnecting into a fresh game. Start a new episode with ``reset()``.
    """


class ServerAtCapacityError(SessionLostError):
    """The server refused a new session: it already holds ``max_sessions`` sessions."""

    def __init__(self, message: str, active_sessions: int | None, max_sessions: int | None) -> None:
        super().__init__(
            f"environment server at capacity ({active_sessions}/{max_sessions} sessions): {message}; "
            "start it with a larger --max-concurrent-envs or run fewer episodes at once"
        )
        self.active_sessions = active_sessions
        self.max_sessions = max_sessions


class EpisodeClient(EnvClient[ActT, ObsT, StateT]):
    """``EnvClient`` with one server session per episode and no silent reconnects (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._episode_open = False
        self._lost_reason: str | None = None

    async def _reset_async(self, **kwargs: Any) -> StepResult[ObsT]:
        if self._lost_reason is not None:
            await self._disconnect_async()
            self._lost_reason = None
        self._episode_open = False
        result = await super()._reset_async(**kwargs)
        self._episode_open = True
        return result

    async def _connect_async(self) -> EpisodeClient[ActT, ObsT, StateT]:
        if not self._episode_open:
            await super()._connect_async()
            return self
        ws = self._ws
        if ws is not None and ws.state is SocketState.OPEN and self._ws_loop is asyncio.get_running_loop():
            return self
        raise self._lose("the server closed the connection")

    async def _disconnect_async(self) -> None:
        self._episode_open = False
        await super()._disconnect_async()

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        if self._lost_reason is not None:
            raise SessionLostError(self._lost_reason)
        try:
            with contextlib.suppress(ConnectionClosed):  # a refusal is an error frame, then a close: read it
                await self._send(message)
            response = await self._receive()
        except TimeoutError as exc:
            raise self._lose(f"no reply within {self._message_timeout}s") from exc
        except ConnectionClosed as exc:
            raise self._lose(f"the connection closed ({exc})") from exc
        if response.get("type") == "error":
            data = response.get("data") or {}
            if data.get("code") == "CAPACITY_REACHED":
                self._drop_socket()
            raise self._server_error(data)
        return response

    def _drop_socket(self) -> None:
        """Forget a socket the server is closing (its close frame may not have arrived yet)."""
        ws, self._ws, self._ws_loop = self._ws, None, None
        self._episode_open = False
        if ws is not None:
            self._schedule_socket_close(ws)

    def _lose(self, why: str) -> SessionLostError:
        if not self._episode_open:
            return SessionLostError(f"environment session at {self._ws_url} lost before reset(): {why}")
        self._lost_reason = (
            f"environment session at {self._ws_url} lost mid-episode: {why}; "
            "the episode cannot continue (call reset() to start a new one)"
        )
        self._episode_open = False
        return SessionLostError(self._lost_reason)

    def _server_error(self, data: dict[str, Any]) -> Exception:
        code = str(data.get("code", "UNKNOWN"))
        message = str(data.get("message", "unknown error"))
        if code == "CAPACITY_REACHED":
            return ServerAtCapacityError(message, data.get("active_sessions"), data.get("max_sessions"))
        return EnvServerError(code, message)
