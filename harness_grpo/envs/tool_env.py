"""The base of the TRL-style tool classes: a server URL, one client, one server session per episode.

TRL's ``environment_factory`` builds these classes without arguments (one instance per rollout,
pooled and reused), calls ``reset(**row)`` at the start of each rollout and exposes every other
public method as a tool. So a subclass's only public methods are ``reset`` and its tools; the
server URL comes from ``base_url=`` or, for the no-argument construction, from the environment
variable named by ``url_variable`` (a spawned rollout worker inherits it). ``reward`` and ``done``
are plain attributes (not tools) that reward functions read.

Each ``reset`` starts a new server session (``EpisodeClient``); the session is closed as soon as
the game is over, so a finished rollout does not hold a server slot. A lost session raises
``SessionLostError`` from the tool call (TRL reports it to the model as a tool error) and never
continues in a fresh game.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, ClassVar

from openenv.core.client_types import StepResult
from openenv.core.sync_client import SyncEnvClient

from harness_grpo.envs.sessions import EpisodeClient


class EpisodeToolEnv:
    """Shared plumbing of the tool classes; see the module docstring."""

    url_variable: ClassVar[str]
    server_name: ClassVar[str]
    client_class: ClassVar[type[EpisodeClient]]

    def __init__(self, base_url: str | None = None) -> None:
        url = base_url or os.environ.get(self.url_variable, "")
        if not url:
            raise ValueError(
                f"{type(self).__name__} needs the {self.server_name} server's URL: pass base_url= or set "
                f"{self.url_variable} (`python -m harness_grpo.envs {self.server_name} --port 0` prints it)"
            )
        self.base_url = url
        self.reward = 0.0
        self.done = False
        self._client: SyncEnvClient | None = None

    def _start_episode(self, **reset_kwargs: Any) -> StepResult:
        if self._client is None:
            self._client = self.client_class(base_url=self.base_url).sync()
        self.reward = 0.0
        self.done = False
        result = self._client.reset(**reset_kwargs)
        self.done = bool(result.done)
        return result

    def _play(self, action: Any) -> StepResult:
        if self._client is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() before playing")
        if self.done:
            raise ValueError("The game is over; no more moves are allowed.")
        result = self._client.step(action)
        self.reward = float(result.reward or 0.0)
        self.done = bool(result.done)
        if self.done:
            self._client.disconnect()
        return result

    def _close(self) -> None:
        client, self._client = getattr(self, "_client", None), None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    def __del__(self) -> None:
        if not sys.is_finalizing():
            self._close()
