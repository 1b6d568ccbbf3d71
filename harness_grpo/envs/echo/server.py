"""The echo environment: each step echoes the action's message back, rewarded 0.1 per character.

Mirrors OpenEnv's ``echo_env`` before its MCP rewrite (the variant TRL's ``echo.py`` example
drives with ``EchoAction``): ``reset`` answers "Echo environment ready!" with reward 0.0; a step
answers the message, its length and ``reward = 0.1 * len(message)``; episodes never end.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from fastapi import FastAPI
from openenv.core.env_server.http_server import create_app as create_openenv_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

from harness_grpo.envs.echo.models import EchoAction, EchoObservation


class EchoEnvironment(Environment):
    """One echo session; see the module docstring."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return EchoObservation(echoed_message="Echo environment ready!", message_length=0, done=False, reward=0.0)

    def step(self, action: EchoAction, timeout_s: float | None = None, **kwargs: Any) -> EchoObservation:  # type: ignore[override]
        self._state.step_count += 1
        message = action.message
        return EchoObservation(
            echoed_message=message,
            message_length=len(message),
            done=False,
            reward=len(message) * 0.1,
            metadata={"original_message": message, "step": self._state.step_count},
        )

    @property
    def state(self) -> State:
        return self._state


def create_app(max_concurrent_envs: int) -> FastAPI:
    """The echo server app, one ``EchoEnvironment`` per WebSocket session."""
    return create_openenv_app(
        EchoEnvironment, EchoAction, EchoObservation, env_name="echo_env", max_concurrent_envs=max_concurrent_envs
    )
